"""The per-host supervisor: runs on the host, starts torchrun, relays, and always cleans up.

Protocol (stdin, one JSON object per line): first `{"op": "config", ...}`, then `{"op": "hb"}`
heartbeats and `{"op": "stop"}`. End of stdin means the controller is gone.

Output (stdout): torchrun's output lines as they are, and events as lines that start with
the byte 0x1e followed by JSON: `started`, `hb`, `tel`, `exit`, `note`. An `exit` after a stop
carries `workers_at_stop`: how many of the job's processes besides torchrun were alive when the
stop came while torchrun still ran (0: every worker had exited and torchrun waited in its exit
barrier for the other hosts); null when torchrun had already exited or no stop came.

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
import signal
import subprocess
import sys
import threading
import time
from typing import Any, BinaryIO

from orchestrator.remote.output import Output
from orchestrator.remote.private import make_private_dirs, open_private

HEARTBEAT_EVERY = 1.0
CHUNK = 65536


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


class Supervisor:
    def __init__(self, cfg: dict[str, Any], out: Output) -> None:
        self.cfg = cfg
        self.out = out
        self.job_id: str = cfg["job_id"]
        self.grace = float(cfg.get("stop_grace", 5.0))
        # None: a scheduler (Slurm) owns the job's lifetime; no controller heartbeat on stdin.
        timeout = cfg.get("heartbeat_timeout", 15.0)
        self.hb_timeout = None if timeout is None else float(timeout)
        self.last_hb = time.monotonic()
        self.stop_reason: str | None = None
        self.workers_at_stop: int | None = None
        self.stopping = threading.Event()
        self.done = threading.Event()
        self.child: subprocess.Popen[bytes] | None = None
        self.dir = os.path.expanduser(os.path.join(cfg.get("host_dir", "~/.distrun"), "jobs", self.job_id))
        make_private_dirs(self.dir)
        self.log = open_private(os.path.join(self.dir, f"{cfg['node']}.log"), "ab")  # closed in run()

    def start_child(self) -> None:
        env = dict(os.environ)
        env.update(self.cfg.get("env", {}))
        env["DISTRUN_JOB_ID"] = self.job_id
        env["DISTRUN_NODE"] = self.cfg["node"]
        self.child = subprocess.Popen(
            self.cfg["argv"],
            env=env,
            cwd=self.cfg.get("cwd") or None,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self._write_state()
        self.out.event("started", pid=self.child.pid, supervisor=os.getpid(), host=os.uname().nodename)

    def _write_state(self) -> None:
        state = {"job_id": self.job_id, "supervisor": os.getpid(), "pgid": self.child.pid if self.child else None}
        with open_private(os.path.join(self.dir, f"{self.cfg['node']}.state.json"), "w") as fh:
            json.dump(state, fh)

    def relay(self) -> None:
        """Copy torchrun's output to stdout and the host-side log, whole lines at a time."""
        fd = self.child.stdout.fileno()  # type: ignore[union-attr]  # set in start_child
        rest = b""
        while True:
            chunk = os.read(fd, CHUNK)
            if not chunk:
                break
            data = rest + chunk
            cut = data.rfind(b"\n") + 1
            rest = data[cut:]
            if cut:
                self.log.write(data[:cut])
                self.out.raw(data[:cut])
        if rest:
            self.log.write(rest + b"\n")
            self.out.raw(rest + b"\n")
        self.log.flush()

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
        """Send our heartbeat; end the job when the controller's heartbeat stops."""
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
        if self.child is not None and self.child.poll() is None:
            workers = job_processes(self.job_id, os.getpid(), self.cfg["node"])
            self.workers_at_stop = len([p for p in workers if p != pgid and _alive(p)])
        left = end_job(self.job_id, self.cfg["node"], pgid, self.grace, reap=self.child.poll if self.child else None)
        self.out.event("note", msg=f"job processes ended ({self.stop_reason}); {left} needed SIGKILL")

    def run(self, stdin: BinaryIO) -> int:
        for sig in (signal.SIGHUP, signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda signum, _frame: self.stop(f"supervisor got signal {signum}"))
        try:
            self.start_child()
        except OSError as exc:
            self.out.event("exit", rc=127, error=f"cannot start {self.cfg['argv'][0]}: {exc}")
            return 127
        if self.hb_timeout is not None:
            threading.Thread(target=self.control, args=(stdin,), daemon=True).start()
        threading.Thread(target=self.watchdog, daemon=True).start()
        sampler = start_telemetry(self.cfg, self.out, self.done, self.dir)
        self.relay()
        rc = self.child.wait()
        # Whatever the job left behind (a worker in its own session) goes with it.
        end_job(self.job_id, self.cfg["node"], self.child.pid, min(self.grace, 2.0))
        self.done.set()
        if sampler is not None:
            sampler.join(timeout=2)
        self.log.close()
        self.out.event("exit", rc=rc, reason=self.stop_reason, workers_at_stop=self.workers_at_stop)
        return 0


def start_telemetry(cfg: dict[str, Any], out: Output, done: threading.Event, keep_dir: str) -> threading.Thread | None:
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
    out = Output(sys.stdout.buffer)
    first = stdin.readline()
    try:
        cfg = json.loads(first)
    except ValueError:
        out.event("exit", rc=2, error="no configuration received")
        sys.exit(2)
    code = Supervisor(cfg, out).run(stdin)
    # The control thread may sit in a blocking read of stdin; leave without joining it.
    os._exit(code)
