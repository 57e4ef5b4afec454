"""The supervisor's output side: from torchrun's files and pipes to the host-side copy and stdout.

torchrun runs with `--redirects 3 --log-dir <host job dir>/<node>/torchrun` (the plan's, or `with_log_dir`'s):
each rank writes its stdout and stderr to files of its own, which `Tailer` (remote/tail.py)
reads whole lines from; torchrun's own output comes through its pipes. Every batch of lines is
masked (the job's secret values become `***`), appended to the host-side copy
(`~/.distrun/jobs/<id>/<node>/`, remote/linestore.py's layout) as it is read, and queued for
the controller (remote/stream.py), labelled with its global rank (`RankMap`). When the job
ended, the files are read to their end and torchrun's own (unmasked) files are removed.

Stdlib-only (runs on the hosts); the supervisor's lifecycle (remote/supervisor.py) calls
`Relay.argv`, `Relay.run` and `Relay.finish`.
"""

from __future__ import annotations

import contextlib
import os
import select
import shutil
import subprocess
import threading
import time
from collections.abc import Callable
from typing import BinaryIO

from orchestrator.remote.config import SupervisorConfig
from orchestrator.remote.linestore import IndexEntry, LineStore
from orchestrator.remote.provenance import own_roots, proven
from orchestrator.remote.redact import Masker
from orchestrator.remote.stream import STDERR, STDOUT, Batch, StreamWriter
from orchestrator.remote.tail import Tailer

CHUNK = 65536
TAIL_BUSY = 0.002  # seconds between two reads of the rank files while lines flow
TAIL_IDLE = 0.02  # ... for QUIET_AFTER seconds after they stopped
TAIL_QUIET = 0.1  # ... and then: each wake-up costs the host CPU, which a job's ranks share
QUIET_AFTER = 1.0
TORCHRUN = "torch.distributed.run"
TORCHRUN_PROGRAM = "distrun_torchrun.py"  # = remote.TORCHRUN_PROGRAM (the package's own module is not shipped)


def with_log_dir(argv: list[str], log_dir: str) -> list[str]:
    """torchrun's argv with `--log-dir log_dir` as its first option, unless the plan put it there
    (Slurm's cannot: the node is named when the job runs); an argv that does not run torchrun is
    left as it is."""
    # torchrun is distrun's program (remote/distrun_torchrun.py), `python -P -m torch.distributed.run`,
    # or the `-c` line of remote.module_argv that runs it with runpy: its own arguments follow each.
    at = next((i + 1 for i, arg in enumerate(argv) if arg == TORCHRUN or arg.endswith(f"/{TORCHRUN_PROGRAM}")
               or f"run_module({TORCHRUN!r}" in arg), None)
    if at is None or argv[at:at + 1] == ["--log-dir"]:
        return list(argv)
    return [*argv[:at], "--log-dir", log_dir, *argv[at:]]


def worker_rank(job_id: str, node: str, restart: int, local_rank: int) -> int | None:
    """The global rank torchrun gave a worker of this job and node (its RANK), or None when no
    such worker runs now; only this supervisor's descendants are believed (remote/provenance.py)."""
    roots = own_roots()
    wanted = {f"DISTRUN_JOB_ID={job_id}".encode(), f"DISTRUN_NODE={node}".encode(),
              f"LOCAL_RANK={local_rank}".encode(), f"TORCHELASTIC_RESTART_COUNT={restart}".encode()}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as fh:
                env = fh.read().split(b"\0")
        except OSError:
            continue
        if wanted.issubset(env) and proven(int(entry), roots):
            rank = next((v for v in env if v.startswith(b"RANK=")), b"")
            if rank[5:].isdigit():
                return int(rank[5:])
    return None


class RankMap:
    """Global ranks of a host's workers: `first_rank + local rank` where the plan knows it (static
    rendezvous), else what torchrun told the worker (c10d assigns ranks at rendezvous).

    Args:
        cfg: The supervisor's configuration: job_id, node, first_rank, exact_ranks (False under c10d).
    """

    def __init__(self, cfg: SupervisorConfig) -> None:
        self.first = int(cfg.first_rank or 0)
        self.exact = bool(cfg.exact_ranks)
        self.job_id = cfg.job_id
        self.node = cfg.node
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


class CopyWriter:
    """The host-side copy of the job's lines, written as they are read; a write that fails (a full
    disk) stops the copy with one warning, and the lines still go to the controller.

    Args:
        root: The copy's directory (`~/.distrun/jobs/<id>/<node>`).
        node: The node's name.
        attempt: The controller's attempt number (DISTRUN_ATTEMPT).
        warn: Called once with the warning's text.
    """

    def __init__(self, root: str, node: str, attempt: int, warn: Callable[[str], None]) -> None:
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
        entry = IndexEntry(time.time(), self.attempt, self.node, batch.rank, batch.stream, batch.nlines,
                           len(batch.data), batch.partial)
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


class ExitWait:
    """Pauses that end early when a process exits (a pidfd, on Linux 5.3 and later; plain sleeps
    elsewhere), so that the relay's longer pauses while a job is quiet never delay its exit."""

    def __init__(self, pid: int) -> None:
        self.fd: int | None = None
        self.poll = select.poll()
        with contextlib.suppress(AttributeError, OSError):
            self.fd = os.pidfd_open(pid)
            self.poll.register(self.fd, select.POLLIN)

    def __enter__(self) -> ExitWait:
        return self

    def __exit__(self, *_: object) -> None:
        if self.fd is not None:
            os.close(self.fd)

    def pause(self, seconds: float) -> None:
        if self.fd is None:
            time.sleep(seconds)
        else:
            self.poll.poll(seconds * 1000)


class Relay:
    """One host's job output, from torchrun to the copy and the controller.

    Args:
        cfg: The supervisor's configuration (node, env, secret_names, first_rank, exact_ranks, attempt).
        out: The supervisor's output to the controller.
        job_dir: The job's directory on this host (`~/.distrun/jobs/<id>`).
        warn: Sends a note to the controller.
    """

    def __init__(self, cfg: SupervisorConfig, out: StreamWriter, job_dir: str, warn: Callable[[str], None]) -> None:
        node = cfg.node
        env = cfg.env
        self.out = out
        self.masker = Masker(env.get(name, "") for name in cfg.secret_names)
        self.raw_dir = os.path.join(job_dir, node, "torchrun")
        self.copy = CopyWriter(os.path.join(job_dir, node), node, int(cfg.attempt), warn)
        self.ranks = RankMap(cfg)
        self.tailer = Tailer(self.raw_dir, self._rank_lines, masker=self.masker)

    def argv(self, argv: list[str]) -> list[str]:
        """torchrun's argv with its log directory, which this relay reads."""
        return with_log_dir(argv, self.raw_dir)

    def emit(self, batch: Batch) -> None:
        """A batch of lines, masked, to the host-side copy and then to the controller."""
        if self.masker:
            batch = Batch(batch.rank, batch.stream, batch.nlines, self.masker.bytes(batch.data), batch.partial)
        self.copy.append(batch)
        self.out.batch(batch)

    def run(self, child: subprocess.Popen[bytes]) -> None:
        """Relay until torchrun exits: the rank files through the tailer, torchrun's own output
        through its pipes (a thread each)."""
        pipes = [threading.Thread(target=self._pipe, args=(fh, stream), daemon=True)
                 for fh, stream in ((child.stdout, STDOUT), (child.stderr, STDERR)) if fh is not None]
        for thread in pipes:
            thread.start()
        last_read = time.monotonic()
        with ExitWait(child.pid) as exited:
            while child.poll() is None:
                now = time.monotonic()
                if self.tailer.sweep():
                    last_read, pause = now, TAIL_BUSY
                else:
                    pause = TAIL_IDLE if now - last_read < QUIET_AFTER else TAIL_QUIET
                exited.pause(pause)
        for thread in pipes:
            thread.join()

    def finish(self) -> None:
        """Once the job's processes are gone: the rank files read to their end (partial last
        lines included), the copy closed, and torchrun's own (unmasked) files removed."""
        self.tailer.drain()
        self.tailer.close()
        self.copy.close()
        shutil.rmtree(self.raw_dir, ignore_errors=True)

    def _rank_lines(self, restart: int, local_rank: int, stream: str, data: bytes, nlines: int,
                    partial: bool) -> None:
        self.emit(Batch(self.ranks.rank(restart, local_rank), stream, nlines, data, partial))

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
