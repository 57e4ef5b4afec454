"""The torchft lighthouse of a fault-tolerant job: run on a host of the job, kept alive, ended
with the job.

The lighthouse is a job of its own (`<job>-lh`): `torchft_lighthouse` beside the hosts' python,
one process under torchrun, launched by a child distrun controller as any job is (`lighthouse_job`).
So it is supervised on its host like every rank (it ends when the controller's heartbeat goes
silent, a SIGKILLed controller included), and it is started again by that controller's
`restarts`: on the same host when it exits, on the next of its hosts when its host is lost. Its
hosts are the job's spares first (hosts that do not train), then the training hosts. The groups
reach it through a forwarder on their own hosts (remote/ftforward.py), so a move needs nothing of
them. Its lines go to the job directory's `lighthouse.log`, each as `[lighthouse] ...`.
"""

from __future__ import annotations

import ctypes
import json
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict
from enum import Enum
from pathlib import Path, PurePosixPath

from orchestrator.diagnose.failures import FailureKind
from orchestrator.errors import InfraError
from orchestrator.logs.format import rank_prefixes
from orchestrator.run.restarts import AttemptRecord
from orchestrator.spec.model import JobSpec, NodeSpec, Restarts

# Starts of the lighthouse after its first: as many as a job could need, each host lost at most once.
PR_SET_PDEATHSIG = 1
PROGRAM = "torchft_lighthouse"
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
RESTARTS = Restarts(max=100, backoff=0.0, on=("host-lost", "rank-failed"))
# Quorum timings for a job that steps in seconds, not minutes: heartbeating stragglers get 5 s to
# join a quorum (a restarted lighthouse waits that long for every group to come back, not one
# group alone), and a group silent for 5 s is out of it (torchft's defaults: 60 s and 5 s).
TUNING = ("--join_timeout_ms", "5000", "--quorum_tick_ms", "100", "--heartbeat_timeout_ms", "5000")
READY_WAIT = 120.0  # how long a starting lighthouse may take to listen (ssh, torchrun, its imports)
STOP_WAIT = 60.0  # beyond the job's stop grace, how long its controller gets to stop its host


def program(node: NodeSpec) -> str:
    """`torchft_lighthouse` beside the host's python (where pip installed torchft's scripts), else
    as the host's PATH finds it (an inventory's python given by a bare name)."""
    return str(PurePosixPath(node.python).parent / PROGRAM) if "/" in node.python else PROGRAM


def args(min_replicas: int, port: int) -> tuple[str, ...]:
    """The lighthouse's arguments: on every address of its host at `port`."""
    return ("--min_replicas", str(min_replicas), "--bind", f"0.0.0.0:{port}", *TUNING)


def places(training: Sequence[NodeSpec], spares: Sequence[NodeSpec]) -> list[NodeSpec]:
    """The hosts the lighthouse may run on, the first first: spares (they do not train), then the
    training hosts."""
    return [*spares, *training]


def inventory_text(hosts: Sequence[NodeSpec]) -> str:
    """An inventory of `hosts` in this order (JSON, which is YAML): a launch takes its first host
    and keeps the others as spares in inventory order, so this order is the lighthouse's."""
    nodes = [{key: value.value if isinstance(value, Enum) else value
              for key, value in asdict(node).items() if key != "line" and value not in (None, (), {})}
             for node in hosts]
    return json.dumps({"nodes": nodes}, indent=1) + "\n"


def upstreams(hosts: Sequence[NodeSpec], port: int) -> str:
    """DISTRUN_LIGHTHOUSE_UPSTREAMS for the groups' forwarders (remote/ftforward.py)."""
    return ",".join(f"{node.host}:{port}" for node in hosts)


def lighthouse_job(job: JobSpec, hosts: Sequence[NodeSpec], path: Path, scripts: str | None = None) -> JobSpec:
    """The lighthouse's own job: one process under torchrun on one of `hosts`, restarted (RESTARTS).

    torchrun starts a process as `$PYTHON_EXEC -u -m MODULE ARGS`, and the lighthouse's command line
    parser reads the process's own argv, which `python -u ...` garbles. So PYTHON_EXEC is `env`:
    torchrun starts `env -u -m torchft_lighthouse ARGS` (`-u -m`: a variable named `-m` unset), the
    lighthouse as a shell would, on a PATH of `scripts` (the PATH prefix the preflight found:
    where pip put it, and the python's own directories), beside the host's python, then the
    system's directories. Not a torch program: no worker entry (`flight_recorder` off), which
    `env` could not start.
    """
    ft = job.fault_tolerance
    assert ft is not None
    dirs = [*(scripts.split(":") if scripts else []),
            *([str(PurePosixPath(program(hosts[0])).parent)] if "/" in hosts[0].python else [])]
    beside = {"PATH": ":".join([*dict.fromkeys(dirs), SYSTEM_PATH])} if dirs else {}
    return JobSpec(path=str(path), name=f"{job.name}-lh", module=PROGRAM,
                   args=args(ft.min_replicas, ft.lighthouse_port), nnodes=1, nproc_per_node=1,
                   env={"PYTHON_EXEC": "/usr/bin/env", **beside}, flight_recorder=False,
                   heartbeat_timeout=job.heartbeat_timeout, stop_grace=job.stop_grace, restarts=RESTARTS)


def listening(hosts: Sequence[NodeSpec], port: int) -> bool:
    """Whether one of `hosts` accepts connections on `port`."""
    for node in hosts:
        try:
            with socket.create_connection((node.host, port), timeout=0.5):
                return True
        except OSError:
            continue
    return False


def crashed_first(attempts: Sequence[dict]) -> str | None:
    """How the lighthouse's process failed in its first attempt, from its record's `attempts`
    (`node2 (10.0.0.12) rank 0: exit code 1, last line: RuntimeError: Address already in use`); None
    while that attempt runs, and when its host failed, not the process. A lighthouse that exits
    before it ever listened (its port bound, a torchft that refuses its arguments, a broken install)
    would do the same again on every restart."""
    first = AttemptRecord.from_dict(attempts[0]).failure if attempts else None
    if first is None or first.kind not in (FailureKind.EXIT, FailureKind.SIGNAL):
        return None
    last = [line.strip() for line in first.last_lines if line.strip()]
    return first.brief() + (f", last line: {last[-1]}" if last else "")


def die_with_parent() -> None:
    """In a child before exec: the kernel sends it SIGKILL when this process dies."""
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL))


class Lighthouse:
    """The lighthouse job's controller (job `job_id`) as the parent follows it: its lines. It dies
    with the parent (PR_SET_PDEATHSIG), and its host's supervisor then ends the lighthouse."""

    def __init__(self, argv: list[str], job_id: str, log: Path, say: Callable[[str], None],
                 crashed: Callable[[], str | None]) -> None:
        self.argv = argv
        self.job_id = job_id
        self.log = log
        self.say = say
        self.crashed = crashed  # how its first start's process failed, once it did (crashed_first)
        self.proc: subprocess.Popen[bytes] | None = None
        self.pump: threading.Thread | None = None
        self.own: tuple[bytes, ...] = ()  # what the lines of the lighthouse itself (rank 0 of its host) begin with

    def start(self, hosts: Sequence[NodeSpec], port: int) -> None:
        """Start its controller and wait until the lighthouse listens on one of `hosts`.

        Raises:
            InfraError: the port is taken on one of `hosts` already, its controller ended first, its
                process exited before it listened, or it did not listen within READY_WAIT seconds.
        """
        taken = [node.name for node in hosts if listening([node], port)]
        if taken:
            raise InfraError(f"port {port} on {', '.join(taken)} is taken, so the torchft lighthouse cannot listen "
                             "there (set fault_tolerance.lighthouse_port to a port free on every host of the job)")
        self.own = tuple(prefix.encode() for node in hosts for prefix in rank_prefixes(node.name, 0))
        self.proc = subprocess.Popen(self.argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, preexec_fn=die_with_parent, start_new_session=True)
        self.pump = threading.Thread(target=self._pump, daemon=True, name="lighthouse")
        self.pump.start()
        deadline = time.monotonic() + READY_WAIT
        while not listening(hosts, port):
            why = self._not_starting(port, deadline)
            if why:
                self.stop(0)
                raise InfraError(f"the torchft lighthouse did not start: {why} (see {self.log})")
            time.sleep(0.2)

    def _not_starting(self, port: int, deadline: float) -> str | None:
        """Why waiting on for the lighthouse to listen is pointless, else None."""
        assert self.proc is not None
        if self.proc.poll() is not None:
            return f"its launch ended ({_ended(self.proc.returncode)})"
        crashed = self.crashed()
        if crashed:
            return f"it exited before it listened: {crashed}"
        if time.monotonic() > deadline:
            return f"it did not listen on port {port} within {READY_WAIT:g} s"
        return None

    def _pump(self) -> None:
        """Every line of its controller to the log; distrun's own (not the lighthouse's) to `say` too."""
        assert self.proc is not None and self.proc.stdout is not None
        with self.log.open("ab") as kept:
            for line in self.proc.stdout:
                kept.write(b"[lighthouse] " + line)
                kept.flush()
                if not line.startswith(self.own):
                    self.say(line.decode(errors="replace").rstrip("\n"))

    def ended(self) -> int | None:
        """Its controller's exit code once it ended (its restarts spent), else None."""
        return None if self.proc is None else self.proc.poll()

    def stop(self, grace: float) -> None:
        """End it: SIGTERM its controller (which stops its host), SIGKILL after `grace` + STOP_WAIT."""
        proc = self.proc
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(grace + STOP_WAIT)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if self.pump is not None:
            self.pump.join(5)


def _ended(rc: int) -> str:
    return f"signal {signal.Signals(-rc).name}" if rc < 0 else f"exit code {rc}"
