"""The per-host supervisor: runs on the host, starts torchrun, relays, and always cleans up.

Protocol (stdin, one JSON object per line): first `{"op": "config", ...}`, then `{"op": "hb"}`
heartbeats and `{"op": "stop"}`. End of stdin means the controller is gone.

Output (stdout, remote/stream.py): batches of whole lines framed by rank and stream, and events
(`started`, `hb`, `tel`, `exit`, `note`). torchrun runs with `--redirects 3 --log-dir` (plan.py
and `with_log_dir`): each rank writes its stdout and stderr to files of its own, which the
supervisor tails (remote/tail.py); torchrun's own output comes through its pipes. Every batch is
masked (the job's secret values become `***`), appended to the host-side copy
(`~/.distrun/jobs/<id>/<node>/`, the layout of remote/linestore.py) as it is read, and queued
for the controller; events go out ahead of queued batches, so heartbeats and telemetry never
wait behind a flood, and nothing that decides the job's fate waits on stdout.

The job's processes are found two ways: torchrun's process group, and every process whose
environment carries `DISTRUN_JOB_ID=<id>` and `DISTRUN_NODE=<node>` (torchrun starts each
worker in a session of its own, so the group alone would miss workers once torchrun itself
is gone). Another job on the same host has another id and is never touched; the node name
keeps apart hosts that share one process table (containers, namespaces).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from typing import Any, BinaryIO

from orchestrator.remote.linestore import Entry, LineStore
from orchestrator.remote.redact import Masker
from orchestrator.remote.stream import STDERR, STDOUT, Batch, StreamWriter
from orchestrator.remote.tail import Tailer

HEARTBEAT_EVERY = 1.0
CHUNK = 65536
TAIL_BUSY = 0.002  # seconds between two reads of the rank files while lines flow
TAIL_IDLE = 0.02  # ... and while they do not
TORCHRUN = "torch.distributed.run"


def job_processes(job_id: str, exclude: int, node: str | None = None) -> list[int]:
    """Pids of every process whose environment has DISTRUN_JOB_ID=job_id (and DISTRUN_NODE=node)."""
    marker = f"DISTRUN_JOB_ID={job_id}".encode()
    node_marker = f"DISTRUN_NODE={node}".encode() if node else marker
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == exclude:
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as fh:
                env = fh.read().split(b"\0")
        except OSError:
            continue
        if marker in env and node_marker in env:
            found.append(int(entry))
    return found


def _signal_all(pgid: int | None, pids: list[int], sig: int) -> None:
    if pgid is not None:
        with contextlib.suppress(OSError):
            os.killpg(pgid, sig)
    for pid in pids:
        with contextlib.suppress(OSError):
            os.kill(pid, sig)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            state = fh.read().rsplit(b")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in (b"Z", b"X")


def end_job(job_id: str, node: str, pgid: int | None, grace: float, reap: Any = None) -> int:
    """SIGTERM the job's processes, SIGKILL what is left after `grace` seconds.

    Returns:
        How many processes were still alive after the grace period.
    """
    me = os.getpid()
    _signal_all(pgid, job_processes(job_id, me, node), signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        if reap is not None:
            reap()
        if not [p for p in job_processes(job_id, me, node) if _alive(p)]:
            return 0
        time.sleep(0.05)
    left = [p for p in job_processes(job_id, me, node) if _alive(p)]
    _signal_all(pgid, left, signal.SIGKILL)
    return len(left)


def with_log_dir(argv: list[str], log_dir: str) -> list[str]:
    """torchrun's argv with `--log-dir log_dir` right after the module name (the directory is the
    host's, so the plan cannot name it); an argv that does not run torchrun is left as it is."""
    if TORCHRUN not in argv:
        return list(argv)
    at = argv.index(TORCHRUN) + 1
    return [*argv[:at], "--log-dir", log_dir, *argv[at:]]


def worker_rank(job_id: str, node: str, restart: int, local_rank: int) -> int | None:
    """The global rank torchrun gave a worker of this job and node (from its RANK), or None when
    no such worker runs now."""
    wanted = {f"DISTRUN_JOB_ID={job_id}".encode(), f"DISTRUN_NODE={node}".encode(),
              f"LOCAL_RANK={local_rank}".encode(), f"TORCHELASTIC_RESTART_COUNT={restart}".encode()}
    for pid in job_processes(job_id, os.getpid(), node):
        try:
            with open(f"/proc/{pid}/environ", "rb") as fh:
                env = fh.read().split(b"\0")
        except OSError:
            continue
        if wanted.issubset(env):
            rank = next((v for v in env if v.startswith(b"RANK=")), None)
            if rank is not None and rank[5:].isdigit():
                return int(rank[5:])
    return None


class RankMap:
    """Global ranks of a host's workers: `first_rank + local rank` where the plan knows it (static
    rendezvous), else what torchrun told the worker (c10d assigns ranks at rendezvous).

    Args:
        cfg: The supervisor's configuration: first_rank, exact_ranks (False under c10d).
    """

    def __init__(self, cfg: dict[str, Any]) -> None:
        self.first = int(cfg.get("first_rank") or 0)
        self.exact = bool(cfg.get("exact_ranks", True))
        self.job_id: str = cfg["job_id"]
        self.node: str = cfg["node"]
        self.known: dict[tuple[int, int], int] = {}

    def rank(self, restart: int, local_rank: int) -> int:
        if self.exact:
            return self.first + local_rank
        key = (restart, local_rank)
        if key not in self.known:
            found = worker_rank(self.job_id, self.node, restart, local_rank)
            if found is None:
                return self.first + local_rank  # the worker is gone already: the plan's guess
            self.known[key] = found
        return self.known[key]


class HostCopy:
    """The host-side copy of the job's lines, written as they are read; a write that fails (a full
    disk) stops the copy with one warning, and the lines still go to the controller.

    Args:
        root: The copy's directory (`~/.distrun/jobs/<id>/<node>`).
        node: The node's name.
        attempt: The controller's attempt number (DISTRUN_ATTEMPT).
        warn: Called once with the warning's text.
    """

    def __init__(self, root: str, node: str, attempt: int, warn: Any) -> None:
        self.node = node
        self.attempt = attempt
        self.warn = warn
        self.store: LineStore | None = None
        try:
            self.store = LineStore(root)
        except OSError as exc:
            self.failed(exc)

    def append(self, batch: Batch) -> None:
        if self.store is None:
            return
        entry = Entry(time.time(), self.attempt, self.node, batch.rank, batch.stream, batch.nlines, len(batch.data),
                      batch.partial)
        try:
            self.store.append(entry, batch.data)
        except OSError as exc:
            self.failed(exc)

    def failed(self, exc: OSError) -> None:
        store, self.store = self.store, None
        if store is not None:
            with contextlib.suppress(OSError):
                store.close()
        self.warn(f"warning: the host-side copy of the job's lines stopped ({exc.strerror or exc}); "
                  "every line still goes to the controller")

    def close(self) -> None:
        if self.store is not None:
            with contextlib.suppress(OSError):
                self.store.close()
            self.store = None


class Supervisor:
    def __init__(self, cfg: dict[str, Any], out: StreamWriter) -> None:
        self.cfg = cfg
        self.out = out
        self.job_id: str = cfg["job_id"]
        self.node: str = cfg["node"]
        self.grace = float(cfg.get("stop_grace", 5.0))
        # None: a scheduler (Slurm) owns the job's lifetime; no controller heartbeat on stdin.
        timeout = cfg.get("heartbeat_timeout", 15.0)
        self.hb_timeout = None if timeout is None else float(timeout)
        self.last_hb = time.monotonic()
        self.stop_reason: str | None = None
        self.stopping = threading.Event()
        self.done = threading.Event()
        self.child: subprocess.Popen[bytes] | None = None
        self.dir = os.path.expanduser(os.path.join(cfg.get("host_dir", "~/.distrun"), "jobs", self.job_id))
        os.makedirs(self.dir, exist_ok=True)
        env = cfg.get("env", {})
        self.masker = Masker(env.get(name, "") for name in cfg.get("secret_names", []))
        self.raw_dir = os.path.join(self.dir, self.node, "torchrun")
        self.copy = HostCopy(os.path.join(self.dir, self.node), self.node, int(cfg.get("attempt", 1)), self.warn)
        self.ranks = RankMap(cfg)
        self.tailer = Tailer(self.raw_dir, self._rank_lines)

    def warn(self, message: str) -> None:
        """A note for the controller (shown on the operator's screen and kept in the job's files)."""
        self.out.event("note", msg=message)

    def start_child(self) -> None:
        env = dict(os.environ)
        env.update(self.cfg.get("env", {}))
        env["DISTRUN_JOB_ID"] = self.job_id
        env["DISTRUN_NODE"] = self.node
        self.child = subprocess.Popen(
            with_log_dir(self.cfg["argv"], self.raw_dir),
            env=env,
            cwd=self.cfg.get("cwd") or None,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        self._write_state()
        self.out.event("started", pid=self.child.pid, supervisor=os.getpid(), host=os.uname().nodename)

    def _write_state(self) -> None:
        state = {"job_id": self.job_id, "supervisor": os.getpid(), "pgid": self.child.pid if self.child else None}
        with open(os.path.join(self.dir, f"{self.node}.state.json"), "w") as fh:
            json.dump(state, fh)

    def emit(self, batch: Batch) -> None:
        """A batch of lines, masked, to the host-side copy and then to the controller."""
        if self.masker:
            batch = Batch(batch.rank, batch.stream, batch.nlines, self.masker.bytes(batch.data), batch.partial)
        self.copy.append(batch)
        self.out.batch(batch)

    def _rank_lines(self, restart: int, local_rank: int, stream: str, data: bytes, nlines: int,
                    partial: bool) -> None:
        self.emit(Batch(self.ranks.rank(restart, local_rank), stream, nlines, data, partial))

    def relay(self) -> None:
        """Relay until torchrun exits: the rank files through the tailer, torchrun's own output
        through its pipes (one thread each)."""
        pipes = [threading.Thread(target=self._pipe, args=(fh, stream), daemon=True)
                 for fh, stream in ((self.child.stdout, STDOUT), (self.child.stderr, STDERR))]  # type: ignore[union-attr]
        for thread in pipes:
            thread.start()
        while self.child.poll() is None:  # type: ignore[union-attr]  # set in start_child
            time.sleep(TAIL_BUSY if self.tailer.sweep() else TAIL_IDLE)
        for thread in pipes:
            thread.join()

    def _pipe(self, fh: BinaryIO, stream: str) -> None:
        """torchrun's own stdout or stderr, whole lines at a time, as the host's lines."""
        fd, rest = fh.fileno(), b""
        while True:
            chunk = os.read(fd, CHUNK)
            if not chunk:
                break
            data = rest + chunk
            cut = data.rfind(b"\n") + 1
            rest = data[cut:]
            if cut:
                self.emit(Batch(None, stream, data.count(b"\n", 0, cut), data[:cut]))
        if rest:
            self.emit(Batch(None, stream, 1, rest + b"\n", partial=True))

    def finish_output(self) -> None:
        """Once the job's processes are gone: the rank files read to their end (partial last
        lines included), the copy closed, and torchrun's own files (unmasked) removed."""
        self.tailer.drain()
        self.tailer.close()
        self.copy.close()
        shutil.rmtree(self.raw_dir, ignore_errors=True)

    def control(self, stdin: BinaryIO) -> None:
        """Read heartbeats and stop requests; end of stdin means the controller is gone."""
        for raw in iter(stdin.readline, b""):
            try:
                op = json.loads(raw).get("op")
            except ValueError:
                continue
            self.last_hb = time.monotonic()
            if op == "stop":
                self.stop("stopped by the controller")
        self.stop("controller connection closed")

    def watchdog(self) -> None:
        """Send our heartbeat; end the job when the controller's heartbeat stops. Neither waits on
        stdout: the heartbeat is queued (StreamWriter), the decision reads only the clock."""
        while not self.done.wait(HEARTBEAT_EVERY):
            self.out.event("hb")
            if self.hb_timeout is not None and time.monotonic() - self.last_hb > self.hb_timeout:
                self.stop(f"controller heartbeat silent for more than {self.hb_timeout:g} s")

    def stop(self, reason: str) -> None:
        if self.stopping.is_set() or self.done.is_set():
            return
        self.stop_reason = reason
        self.stopping.set()
        threading.Thread(target=self._end, daemon=True).start()

    def _end(self) -> None:
        pgid = self.child.pid if self.child else None
        left = end_job(self.job_id, self.node, pgid, self.grace, reap=self.child.poll if self.child else None)
        self.out.event("note", msg=f"job processes ended ({self.stop_reason}); {left} needed SIGKILL")

    def run(self, stdin: BinaryIO) -> int:
        for sig in (signal.SIGHUP, signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda signum, _frame: self.stop(f"supervisor got signal {signum}"))
        try:
            self.start_child()
        except OSError as exc:
            self.copy.close()
            self.out.end("exit", self.last_words_wait(), rc=127, error=f"cannot start {self.cfg['argv'][0]}: {exc}")
            return 127
        if self.hb_timeout is not None:
            threading.Thread(target=self.control, args=(stdin,), daemon=True).start()
        threading.Thread(target=self.watchdog, daemon=True).start()
        sampler = start_telemetry(self.cfg, self.out, self.done, self.dir)
        self.relay()
        rc = self.child.wait()
        # Whatever the job left behind (a worker in its own session) goes with it.
        end_job(self.job_id, self.node, self.child.pid, min(self.grace, 2.0))
        self.finish_output()
        self.done.set()
        if sampler is not None:
            sampler.join(timeout=2)
        self.out.end("exit", self.last_words_wait(), rc=rc, reason=self.stop_reason)
        return 0

    def last_words_wait(self) -> float:
        """How long the last lines and the exit may wait for the controller to read them: a
        controller silent for longer than its heartbeat timeout is gone."""
        return self.hb_timeout if self.hb_timeout is not None else 60.0


def start_telemetry(cfg: dict[str, Any], out: StreamWriter, done: threading.Event,
                    keep_dir: str) -> threading.Thread | None:
    """Start the telemetry sampler when it was shipped and the job asks for it; it keeps a
    copy of its samples in keep_dir/<node>.telemetry.jsonl beside the host-side log."""
    interval = cfg.get("telemetry_interval")
    sampler = sys.modules.get("orchestrator.remote.sampler")
    if not interval or sampler is None:
        return None
    thread = threading.Thread(
        target=sampler.run,
        kwargs={"interval": float(interval), "job_id": cfg["job_id"], "node": cfg["node"], "emit": out.event,
                "done": done,
                "keep": os.path.join(keep_dir, f"{cfg['node']}.telemetry.jsonl")},
        daemon=True,
    )
    thread.start()
    return thread


def main(argv: list[str]) -> None:
    stdin = sys.stdin.buffer
    out = StreamWriter(sys.stdout.buffer)
    first = stdin.readline()
    try:
        cfg = json.loads(first)
    except ValueError:
        out.end("exit", 10.0, rc=2, error="no configuration received")
        sys.exit(2)
    code = Supervisor(cfg, out).run(stdin)
    # The control thread may sit in a blocking read of stdin; leave without joining it.
    os._exit(code)
