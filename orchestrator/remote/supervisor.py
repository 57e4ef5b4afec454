"""The per-host supervisor: runs on the host, starts torchrun, relays, and always cleans up.

Protocol (stdin, one JSON object per line): first `{"op": "config", ...}`, then `{"op": "hb"}`
heartbeats and `{"op": "stop"}`. End of stdin means the controller is gone.

Output (stdout, remote/stream.py): batches of whole lines framed by rank and stream, and events
(`started`, `hb`, `tel`, `fr` (remote/frpoll.py), `failing`, `exit`, `note`): `failing` carries
torchrun's records of its failed workers as soon as it has written them, before it exits.
remote/relay.py carries the job's lines from torchrun's per-rank files to the host-side copy and
stdout. Events go out ahead of queued batches, so heartbeats and telemetry never wait behind a
flood, and nothing that decides the job's fate (the watchdog, a stop) waits on stdout. An `exit` after a stop carries
`workers_at_stop`: how many of the job's processes besides torchrun were alive when the stop
came while torchrun still ran (0: every worker had exited and torchrun waited in its exit
barrier for the other hosts); null when torchrun had already exited or no stop came. With it,
`stop_at` (when the stop reached the running torchrun, the host's clock) and `alive_at_stop`: the
pids of the job's processes alive when the stop signalled torchrun, so that each failed worker's
record (its pid) tells whether it ended before the stop ([]: torchrun alone, in its exit barrier:
a torchrun whose workers are all gone is first given OWN_END seconds to end on its own, as it does
once it has recorded their failure; null: torchrun ended on its own, or no stop came). A torchrun
that the stop ended records no worker: `workers` then holds those that had raised before the stop
(an elastic `@record` error file, or a traceback their stderr ended with; pid 0: remote/workerfail.py's
`raised_workers`); `raised_at_stop` lists those ranks either way.
It also carries `stop_cause` (a `StopCause`: who had the supervisor end the job; null when
nobody did) and `workers`: torchrun's record of each failed worker (remote/workerfail.py),
the job's secrets masked.
Every `exit` carries `restarts`: how many times torchrun restarted its workers (`--max-restarts`),
by torchrun's own count (remote/tail.py's `restart_count`), and `gpus_freed`: for each GPU's
memory a process of the job held when the supervisor ended it, the line remote/gpu.py words
("freed 2.1 GB on gpu0 held by pid 4242").

The job's processes are found two ways: torchrun's process group, and every process of this
user's that descends from the supervisor (or, for `distrun stop` and `stack`, from the supervisor
and torchrun it recorded), found by walking /proc's parent links (remote/provenance.py). Descent
is enough: torchrun starts each worker in a session of its own, and a rank may start children
with an environment of its own, in a session of their own or not; the supervisor is their
subreaper, so whatever outlives its parent is reparented to it and stays the job's. Each is
ended at the job's end and on every stop or failure. The markers (`DISTRUN_JOB_ID=<id>`,
`DISTRUN_NODE=<node>`) prove nothing, as anyone who reads `ps` can claim them; a descendant that
names another job or node is left alone (a job the job started). Another job on the same host,
or another user's process, does not descend from this supervisor and is never touched.
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
from enum import Enum
from typing import Any, BinaryIO

from orchestrator.remote.config import SupervisorConfig
from orchestrator.remote.frpoll import run as poll_flight_recorders
from orchestrator.remote.ftforward import forward_lighthouse
from orchestrator.remote.gpu import GpuHolders
from orchestrator.remote.leader import Leader
from orchestrator.remote.programs import expand_job_words, write_programs
from orchestrator.remote.provenance import (
    Root,
    become_subreaper,
    children,
    descendants,
    own_roots,
    proven_root,
    record,
    record_path,
    root_of,
)
from orchestrator.remote.rdzvconn import endpoint
from orchestrator.remote.relay import Relay
from orchestrator.remote.safedirs import UnsafeDirError, expand_var, make_job_dirs, make_safe_dir
from orchestrator.remote.sockdir import record_fallback, remove_recorded, remove_sockets, socket_dir
from orchestrator.remote.stream import StreamWriter
from orchestrator.remote.tail import restart_count
from orchestrator.remote.workerfail import RECORDS, WorkerRecord, raised_workers, read_records

HEARTBEAT_EVERY = 1.0
# A stop that finds torchrun alone (its workers gone) gives it this long to end on its own first.
OWN_END = 2.0
RECORDS_EVERY = 0.1  # how often the supervisor looks for torchrun's records of failed workers


class StopCause(str, Enum):
    """Who had the supervisor end the job before torchrun ended on its own (the `exit` event's `stop_cause`)."""

    CONTROLLER = "controller"  # the controller's `stop`
    CHANNEL = "channel"  # the controller's connection closed
    HEARTBEAT = "heartbeat"  # the controller's heartbeat went silent
    SIGNAL = "signal"  # the supervisor got SIGHUP, SIGTERM or SIGINT


def _claims_another(pid: int, job_id: str, node: str | None) -> bool:
    """Whether the process's environment names another job or node (DISTRUN_JOB_ID, DISTRUN_NODE):
    a job the job itself started, with markers of its own. One that names none (a child given an
    environment of its own) or this job's claims nothing else; a process gone claims nothing."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as fh:
            env = fh.read().split(b"\0")
    except OSError:
        return False
    for key, value in ((b"DISTRUN_JOB_ID=", job_id), (b"DISTRUN_NODE=", node)):
        named = [item[len(key):] for item in env if item.startswith(key)]
        if value is not None and named and value.encode() not in named:
            return True
    return False


def _is_job_process(pid: int, job_id: str, node: str | None, roots: list[Root]) -> bool:
    return proven_root(pid, roots) is not None and not _claims_another(pid, job_id, node)


def job_processes(job_id: str, exclude: int, node: str | None = None, roots: list[Root] | None = None) -> list[int]:
    """Pids of every process of the job: this user's, descending from `roots` (None: from this
    process, the supervisor), whatever its environment, unless it names another job or node."""
    return pin_job_processes(job_id, exclude, node, own_roots() if roots is None else list(roots))


def pin_job_processes(job_id: str, exclude: int, node: str | None, roots: list[Root]) -> list[int]:
    """`job_processes`, each also added to `roots` (pid and start time): a process found the job's
    stays so for the rest of a stop when its parent exits outside the job's tree (a torchrun that
    dies before its workers while no supervisor is there to adopt them, a rank's child whose rank
    the stop ended first)."""
    found = []
    for root in descendants(roots, exclude):
        if not _claims_another(root.pid, job_id, node):
            found.append(root.pid)
            if root not in roots:
                roots.append(root)
    return found


def signal_job_process(pid: int, sig: int, job_id: str, node: str | None, roots: list[Root] | None = None) -> None:
    """Signal `pid` only while it is a process of the job.

    A pid found by a scan of /proc may exit and be reused before the signal is sent: the pid
    is pinned with a pidfd, and its environment read again, before the signal goes through
    the pidfd (Python 3.9+ on Linux 5.3+; elsewhere the window is the one since the scan).
    """
    pidfd_open = getattr(os, "pidfd_open", None)
    send = getattr(signal, "pidfd_send_signal", None)
    if pidfd_open is None or send is None:
        with contextlib.suppress(OSError):
            os.kill(pid, sig)
        return
    try:
        fd = pidfd_open(pid)
    except OSError:
        return
    try:
        if _is_job_process(pid, job_id, node, own_roots() if roots is None else roots):
            send(fd, sig)
    except OSError:
        pass
    finally:
        os.close(fd)


def oom_kills() -> int | None:
    """Processes the kernel's OOM killer has ended on this host since boot (None: unknown)."""
    try:
        with open("/proc/vmstat", "rb") as fh:
            for line in fh:
                if line.startswith(b"oom_kill "):
                    return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return None


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            state = fh.read().rsplit(b")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in (b"Z", b"X")


def _signal_all(job_id: str, node: str, leader: Leader | None, pids: list[int], sig: int,
                roots: list[Root] | None) -> None:
    if leader is not None:
        leader.signal_group(sig)
    for pid in pids:
        signal_job_process(pid, sig, job_id, node, roots)


def end_job(job_id: str, node: str, leader: Leader | None, grace: float, roots: list[Root] | None = None) -> int:
    """SIGTERM the job's processes, SIGKILL what is left after `grace` seconds.

    Args:
        job_id: The job (DISTRUN_JOB_ID in its processes' environment).
        node: The job's node on this host (DISTRUN_NODE).
        leader: torchrun, when this process started it: its group is signalled too, and it
            is reaped as it exits.
        grace: Seconds between SIGTERM and SIGKILL.
        roots: What the job's processes descend from (None: this process, the supervisor); each
            process found is held on to by its pid and start time for the rest of the stop.

    Returns:
        How many processes were still alive after the grace period.
    """
    me = os.getpid()
    known = own_roots() if roots is None else list(roots)
    _signal_all(job_id, node, leader, pin_job_processes(job_id, me, node, known), signal.SIGTERM, known)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        if leader is not None:
            leader.poll()
        if not [p for p in pin_job_processes(job_id, me, node, known) if _alive(p)]:
            return 0
        time.sleep(0.05)
    left = [p for p in pin_job_processes(job_id, me, node, known) if _alive(p)]
    _signal_all(job_id, node, leader, left, signal.SIGKILL, known)
    return len(left)


def end_job_freeing_gpus(job_id: str, node: str, leader: Leader | None, grace: float,
                         roots: list[Root] | None = None) -> tuple[int, list[str]]:
    """`end_job`, and a line for each GPU's memory a process of the job held ("freed 2.1 GB on
    gpu0 held by pid 4242", or that it was not freed); no lines on a host without NVIDIA GPUs."""
    holders = GpuHolders.open()
    if holders is None:
        return end_job(job_id, node, leader, grace, roots), []
    try:
        held = holders.held_by(set(job_processes(job_id, os.getpid(), node, roots)))
        left = end_job(job_id, node, leader, grace, roots)
        return left, holders.released(held)
    finally:
        holders.close()


def make_dirs(paths: list[str], cwd: str | None) -> None:
    """Create each directory the job needs (its checkpoint_dir), relative to its workdir, where no
    other user can write (remote/safedirs.py).

    Raises:
        OSError: one is unsafe or could not be created (the job does not start).
    """
    for path in paths:
        make_safe_dir(path, cwd)


class Supervisor:
    def __init__(self, cfg: SupervisorConfig, out: StreamWriter) -> None:
        self.cfg = cfg
        self.out = out
        self.job_id = cfg.job_id
        self.node = cfg.node
        self.grace = float(cfg.stop_grace)
        # None: a scheduler (Slurm) owns the job's lifetime; no controller heartbeat on stdin.
        timeout = cfg.heartbeat_timeout
        self.hb_timeout = None if timeout is None else float(timeout)
        self.last_hb = time.monotonic()
        self.oom_at_start = oom_kills()
        self.stop_reason: str | None = None
        self.stop_cause: StopCause | None = None
        self.workers: list[WorkerRecord] = []
        self.restarts = 0  # torchrun's restarts of its workers, counted once it has ended
        self.sockets: tuple[str, str] | None = None  # the ranks' socket directory: (as asked, as made)
        self.workers_at_stop: int | None = None
        self.roots: list[Root] = []  # this supervisor, its torchrun, and what it adopted (recorded)
        self.stop_at: float | None = None  # when the stop reached a running torchrun (time.time())
        self.alive_at_stop: list[int] | None = None  # the job's pids alive when the stop signalled torchrun
        self.raised_at_stop: list[WorkerRecord] = []  # workers that had raised (@record) when the stop came
        self.gpus_freed: list[str] = []
        self.stopping = threading.Event()
        self.done = threading.Event()
        self.child: subprocess.Popen[bytes] | None = None
        self.leader: Leader | None = None
        self.ender: threading.Thread | None = None
        self.dir = os.path.expanduser(os.path.join(cfg.host_dir, "jobs", self.job_id))
        try:
            make_job_dirs(cfg.host_dir, self.job_id, self.node)  # UnsafeDirError: nothing of the job runs
        except UnsafeDirError:
            raise
        except OSError:
            pass  # a full disk: the host-side copy warns and the job goes on
        self.relay = Relay(cfg, out, self.dir, self.warn)
        self.record_path = os.path.join(self.relay.raw_dir, RECORDS)  # torchrun's failed workers

    def warn(self, message: str) -> None:
        """A note for the controller (shown on the operator's screen and kept in the job's files)."""
        self.out.event("note", msg=message)

    def start_child(self) -> None:
        """Start torchrun in a process group of its own, in the job's workdir (`~` is the host's home).

        Raises:
            OSError: it could not be started (nothing of the job runs then).
        """
        env = dict(os.environ)
        env.update(self.cfg.env)
        env["DISTRUN_JOB_ID"] = self.job_id
        env["DISTRUN_NODE"] = self.node
        expand_var(env)
        self.resolve_sockets(env)
        forward_lighthouse(env)  # a replica group's: TORCHFT_LIGHTHOUSE, wherever the lighthouse moves
        cwd = self.cfg.cwd
        make_dirs(self.cfg.make_dirs, cwd)
        with contextlib.suppress(OSError):
            os.remove(self.record_path)  # a dead supervisor's, not this run's
        self.child = subprocess.Popen(
            self.argv(),
            env=env,
            cwd=os.path.expanduser(cwd) if cwd else None,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        self.leader = Leader(self.child)
        self.record_roots()
        self.out.event("started", pid=self.child.pid, supervisor=os.getpid(), host=os.uname().nodename)

    def argv(self) -> list[str]:
        """torchrun's argv as the plan shows it, `~` expanded in the job directory's words, with the
        programs it names written to the job's bin/ and its log directory (remote/programs.py).

        Raises:
            OSError: a program could not be written.
        """
        write_programs(os.path.join(self.dir, "bin"), self.cfg.programs)
        job_dir = f"{self.cfg.host_dir.rstrip('/')}/jobs/{self.job_id}"
        return self.relay.argv(expand_job_words(self.cfg.argv, job_dir))

    def record_roots(self) -> None:
        """Record this supervisor and its torchrun (pid and start time) for the programs that find
        the job's processes later (remote/provenance.py); a full disk leaves them none to find."""
        self.roots = [r for r in (root_of(os.getpid()), root_of(self.child.pid)) if r is not None]  # type: ignore[union-attr]
        with contextlib.suppress(OSError):
            record(record_path(self.dir, self.node), self.roots)

    def record_adopted(self) -> None:
        """Record beside them each process the supervisor adopted as subreaper (a rank's detached
        child, a worker whose torchrun died): SIGKILLed, the supervisor's adoptions go to init, and
        the cleanup that follows finds them (and what descends from them) only by this record."""
        new = [r for r in (root_of(pid) for pid in children(os.getpid()) if pid != self.child.pid)  # type: ignore[union-attr]
               if r is not None and r not in self.roots]
        if new:
            self.roots += new
            with contextlib.suppress(OSError):
                record(record_path(self.dir, self.node), self.roots)

    def resolve_sockets(self, env: dict[str, str]) -> None:
        """DISTRUN_WORKER_SOCKETS made on this host (remote/sockdir.py), or dropped with a note."""
        wanted = env.get("DISTRUN_WORKER_SOCKETS")
        if wanted is None:
            return
        made = socket_dir(wanted, self.job_id)
        if made is None:
            del env["DISTRUN_WORKER_SOCKETS"]
            self.warn(f"no directory for the ranks' Flight Recorder sockets ({wanted}): hangs get stacks only")
        else:
            env["DISTRUN_WORKER_SOCKETS"] = made
            self.sockets = (wanted, made)
            if made != os.path.expanduser(wanted):
                with contextlib.suppress(OSError):  # a full disk: only a SIGKILL would leave it then
                    record_fallback(self.dir, self.node, made)

    def start_flight_polls(self) -> None:
        """Read the ranks' Flight Recorders every few seconds (remote/frpoll.py) where they serve them."""
        if self.sockets is None:
            return
        threading.Thread(target=poll_flight_recorders, args=(self.sockets[1], own_roots(), self.out.event, self.done),
                         daemon=True).start()

    def control(self, stdin: BinaryIO) -> None:
        """Read heartbeats and stop requests; end of stdin means the controller is gone."""
        for raw in iter(stdin.readline, b""):
            try:
                op = json.loads(raw).get("op")
            except ValueError:
                continue
            self.last_hb = time.monotonic()
            if op == "stop":
                self.stop("stopped by the controller", StopCause.CONTROLLER)
        self.stop("controller connection closed", StopCause.CHANNEL)

    def watchdog(self) -> None:
        """Send our heartbeat, and record what the supervisor adopted; end the job when the
        controller's heartbeat stops. Neither waits on stdout: the heartbeat is queued
        (StreamWriter), the decision reads only the clock."""
        while not self.done.wait(HEARTBEAT_EVERY):
            self.out.event("hb")
            self.record_adopted()
            if self.hb_timeout is not None and time.monotonic() - self.last_hb > self.hb_timeout:
                self.stop(f"controller heartbeat silent for more than {self.hb_timeout:g} s", StopCause.HEARTBEAT)

    def watch_records(self) -> None:
        """Send torchrun's records of its failed workers (a `failing` event) as soon as it has written
        them: it raises ChildFailedError, and only then tears itself down, which takes seconds on a
        busy host; the controller stops the other hosts on this event, not on torchrun's exit."""
        while not self.done.wait(RECORDS_EVERY):
            if os.path.exists(self.record_path):
                records = read_records(self.record_path)
                if records:
                    self.out.event("failing", workers=[self._masked(record) for record in records])
                    return

    def stop(self, reason: str, cause: StopCause) -> None:
        if self.stopping.is_set() or self.done.is_set():
            return
        self.stop_reason = reason
        self.stop_cause = cause
        self.stopping.set()
        self.ender = threading.Thread(target=self._end, daemon=True)
        self.ender.start()

    def _end(self) -> None:
        if self.child is not None and _alive(self.child.pid):
            self.stop_at = time.time()
            self.raised_at_stop = raised_workers(self.relay.raw_dir, self.relay.ranks.rank)
            # torchrun's workers and theirs; not what the supervisor adopted (a rank's child whose rank is gone)
            torchrun = [r for r in (root_of(self.child.pid),) if r is not None]
            workers = job_processes(self.job_id, os.getpid(), self.node, torchrun)
            alive = sorted(p for p in workers if p != self.child.pid and _alive(p))
            self.workers_at_stop = len(alive)
            if alive or not self._ends_alone(self.child.pid, min(self.grace, OWN_END)):
                self.alive_at_stop = alive
        left, freed = end_job_freeing_gpus(self.job_id, self.node, self.leader, self.grace)
        self.out.event("note", msg=f"job processes ended ({self.stop_reason}); {left} needed SIGKILL")
        self._freed(freed)

    def _end_leftovers(self) -> None:
        """Once torchrun has exited, end what of the job it left (a rank's children in a session or
        an environment of their own, reparented to the supervisor): they may hold torchrun's pipes
        open, which the relay reads to their end."""
        self.leader.wait_exit()  # type: ignore[union-attr]  # set by start_child
        self._freed(end_job_freeing_gpus(self.job_id, self.node, self.leader, min(self.grace, 2.0))[1])

    @staticmethod
    def _ends_alone(pid: int, wait: float) -> bool:
        """Whether torchrun (`pid`), its workers all gone, exits on its own within `wait` seconds:
        one that is handling their failure writes its record of them and exits; one in its exit
        barrier waits there for the other hosts (it is not reaped here: its group stays signallable)."""
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            if not _alive(pid):
                return True
            time.sleep(0.02)
        return not _alive(pid)

    def _freed(self, lines: list[str]) -> None:
        """Say each GPU's memory the end freed, once (the end at torchrun's exit and the final one
        may both see a process the driver still lists)."""
        for line in lines:
            if line not in self.gpus_freed:
                self.warn(line)
                self.gpus_freed.append(line)

    def _catch_signals(self) -> None:
        for sig in (signal.SIGHUP, signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda signum, _frame: self.stop(f"supervisor got signal {signum}",
                                                                StopCause.SIGNAL))

    def run(self, stdin: BinaryIO) -> int:
        """Start torchrun, follow it to its end, and end whatever of the job is left, whatever
        failed on the way (a `finally`): a job never outlives its supervisor's run."""
        self._catch_signals()
        become_subreaper()
        error: str | None = None
        refused = False
        sampler: threading.Thread | None = None
        try:
            self.start_child()
            if self.hb_timeout is not None:
                threading.Thread(target=self.control, args=(stdin,), daemon=True).start()
            threading.Thread(target=self.watchdog, daemon=True).start()
            threading.Thread(target=self.watch_records, daemon=True).start()
            threading.Thread(target=self._end_leftovers, daemon=True).start()
            sampler = start_telemetry(self.cfg, self.out, self.done, self.dir)
            self.start_flight_polls()
            self.relay.run(self.child)  # type: ignore[arg-type]  # set by start_child
            self.leader.wait()  # type: ignore[union-attr]  # set by start_child
        except Exception as exc:
            what = "supervisor failed" if self.leader is not None else f"cannot start {self.cfg.argv[0]}"
            error = f"{what}: {type(exc).__name__}: {exc}" if self.leader else f"{what}: {exc}"
            refused = isinstance(exc, UnsafeDirError)  # the job's own settings, not the host: a usage error
            error = str(exc) if refused else error
        finally:
            rc = self._finish(sampler)
        self.out.end("exit", self.last_words_wait(), rc=rc, reason=self.stop_reason, stop_cause=self.stop_cause,
                     oom_kills=self._oom_kills_since_start(), workers_at_stop=self.workers_at_stop,
                     stop_at=self.stop_at, alive_at_stop=self.alive_at_stop,
                     raised_at_stop=[worker.rank for worker in self.raised_at_stop],
                     gpus_freed=self.gpus_freed, workers=[self._masked(record) for record in self.workers],
                     restarts=self.restarts,
                     **({"error": error} if error else {}), **({"refused": True} if refused else {}))
        return 0

    def _masked(self, record: WorkerRecord) -> dict[str, Any]:
        """A failed worker's record for the controller, the job's secrets masked in its words."""
        event = record.to_event()
        event["message"] = self.relay.masker.text(record.message)
        event["traceback"] = self.relay.masker.text(record.traceback)
        return event

    def _oom_kills_since_start(self) -> int | None:
        now = oom_kills()
        return None if now is None or self.oom_at_start is None else now - self.oom_at_start

    def _finish(self, sampler: threading.Thread | None) -> int:
        """End every process of the job still running, then read its last lines and release the
        rest; torchrun's status (127 when it never started)."""
        if self.ender is not None:
            self.ender.join()
        if self.leader is not None:
            # Whatever the job left behind (a worker in its own session) goes with it.
            self._freed(end_job_freeing_gpus(self.job_id, self.node, self.leader, min(self.grace, 2.0))[1])
        rc = self.leader.wait() if self.leader is not None else 127
        self.workers = read_records(self.record_path)  # before the relay removes torchrun's files
        # A torchrun that the stop ended records nothing: the workers that had raised before it still tell.
        recorded = {worker.rank for worker in self.workers}
        self.workers += [worker for worker in self.raised_at_stop if worker.rank not in recorded]
        self.restarts = restart_count(self.relay.raw_dir)
        self.relay.finish()
        if self.sockets is not None:
            remove_sockets(*self.sockets)
            remove_recorded(self.dir, self.job_id, self.node)
        self.done.set()
        if sampler is not None:
            sampler.join(timeout=2)
        return rc

    def last_words_wait(self) -> float:
        """How long the last lines and the exit may wait for the controller to read them: a
        controller silent for longer than its heartbeat timeout is gone."""
        return self.hb_timeout if self.hb_timeout is not None else 60.0


def start_telemetry(cfg: SupervisorConfig, out: StreamWriter, done: threading.Event,
                    keep_dir: str) -> threading.Thread | None:
    """Start the telemetry sampler when it was shipped and the job asks for it; it keeps a
    copy of its samples in keep_dir/<node>.telemetry.jsonl beside the host-side log."""
    interval = cfg.telemetry_interval
    sampler = sys.modules.get("orchestrator.remote.sampler")
    if not interval or sampler is None:
        return None
    thread = threading.Thread(
        target=sampler.run,
        kwargs={"interval": float(interval), "job_id": cfg.job_id, "node": cfg.node, "emit": out.event,
                "done": done, "rdzv": endpoint(cfg.argv),
                "keep": os.path.join(keep_dir, f"{cfg.node}.telemetry.jsonl")},
        daemon=True,
    )
    thread.start()
    return thread


def start(cfg: SupervisorConfig, out: StreamWriter) -> Supervisor | None:
    """The supervisor of `cfg`'s job, or None when a directory it would run programs from or write
    into is unsafe (remote/safedirs.py's `make_job_dirs`): the `exit` event then says why in one
    line, marked `refused` (the controller's usage error, exit 2), and nothing of the job ran."""
    try:
        return Supervisor(cfg, out)
    except UnsafeDirError as exc:
        out.end("exit", 10.0, rc=2, error=str(exc), refused=True)
        return None


def main(argv: list[str]) -> None:
    stdin = sys.stdin.buffer
    out = StreamWriter(sys.stdout.buffer)
    first = stdin.readline()
    try:
        cfg = SupervisorConfig.from_line(first)
    except ValueError as exc:
        out.end("exit", 10.0, rc=2, error=f"no configuration received ({exc})" if first.strip() else
                "no configuration received")
        sys.exit(2)
    supervisor = start(cfg, out)
    code = supervisor.run(stdin) if supervisor is not None else 2
    # The control thread may sit in a blocking read of stdin; leave without joining it.
    os._exit(code)
