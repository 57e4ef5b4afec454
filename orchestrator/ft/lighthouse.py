"""The torchft lighthouse of a fault-tolerant job: started beside the parent controller, kept
alive (started again whenever it exits while the job runs), and ended with the job.

It dies with the controller too: the kernel sends it SIGKILL when its parent dies
(PR_SET_PDEATHSIG), so a controller killed with SIGKILL leaves no lighthouse behind. Its lines go
to the job directory's `lighthouse.log`, each as `[lighthouse] ...`.
"""

from __future__ import annotations

import ctypes
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from orchestrator.errors import InfraError

PR_SET_PDEATHSIG = 1
RESTART_PAUSE = 0.5  # between the lighthouse's exit and its next start
STOP_WAIT = 5.0
# Quorum timings for a job that steps in seconds, not minutes: heartbeating stragglers get 5 s to
# join a quorum (a restarted lighthouse waits that long for every group to come back, not one
# group alone), and a group silent for 5 s is out of it (torchft's defaults: 60 s and 5 s).
TUNING = ("--join_timeout_ms", "5000", "--quorum_tick_ms", "100", "--heartbeat_timeout_ms", "5000")
READY_WAIT = 60.0  # how long a starting lighthouse may take to listen (its python imports torch)


QUORUM = re.compile(rb"Quorum! Quorum \{ quorum_id: (\d+), participants: \[(.*)")
MEMBER = re.compile(rb'replica_id: "([^":]*)[^"]*",.*?step: (\d+)')


@dataclass(frozen=True)
class Quorum:
    """The lighthouse's latest quorum, as its log line tells it.

    Attributes:
        id: torchft's quorum id (it grows when the participants change).
        participants: The replica ids in it (`group0`, ... as the scripts name them).
        step: The highest step of a participant.
    """

    id: int
    participants: tuple[str, ...]
    step: int


def quorum_of(line: bytes) -> Quorum | None:
    """The quorum a lighthouse line announces (`Quorum! Quorum { quorum_id: ...`), else None."""
    found = QUORUM.search(line)
    if found is None:
        return None
    members = MEMBER.findall(found.group(2))
    return Quorum(int(found.group(1)), tuple(m[0].decode(errors="replace") for m in members),
                  max((int(m[1]) for m in members), default=0))


def address_towards(host: str) -> str:
    """This machine's address on the route to `host` (what the hosts reach the lighthouse at)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect((socket.gethostbyname(host), 9))
        return str(probe.getsockname()[0])


def argv(min_replicas: int, port: int) -> list[str]:
    """The lighthouse's command line: the `torchft_lighthouse` beside this python (else on PATH),
    on every address at `port`."""
    beside = Path(sys.executable).parent / "torchft_lighthouse"
    program = str(beside) if beside.exists() else (shutil.which("torchft_lighthouse") or "torchft_lighthouse")
    return [program, "--min_replicas", str(min_replicas), "--bind", f"0.0.0.0:{port}", *TUNING]


def listening(port: int) -> bool:
    """Whether something accepts connections on this machine's `port`."""
    with socket.socket() as probe:
        probe.settimeout(0.5)
        return probe.connect_ex(("127.0.0.1", port)) == 0


def die_with_parent() -> None:
    """In a child before exec: the kernel sends it SIGKILL when this process dies."""
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL))


class Lighthouse:
    """The job's lighthouse process, restarted each time it exits until `stop`."""

    def __init__(self, command: list[str], log: Path, say: Callable[[str], None]) -> None:
        self.command = command
        self.log = log
        self.say = say
        self.starts = 0
        self.quorum: Quorum | None = None  # the latest, once one formed
        self.proc: subprocess.Popen[bytes] | None = None
        self.stopping = threading.Event()
        self.keeper = threading.Thread(target=self._keep, daemon=True, name="lighthouse")

    def start(self, port: int) -> None:
        """Start it and wait until it listens on `port`.

        Raises:
            InfraError: the port is taken, or it did not listen within READY_WAIT seconds (its last
                line said why).
        """
        if listening(port):
            raise InfraError(f"port {port} on this machine is taken, so the torchft lighthouse cannot listen there "
                             "(set fault_tolerance.lighthouse_port to a free port)")
        self._spawn()
        self.keeper.start()
        deadline = time.monotonic() + READY_WAIT
        while not listening(port):
            if time.monotonic() > deadline:
                self.stop()
                last = self.log.read_text(errors="replace").strip().splitlines()[-1:] if self.log.exists() else []
                raise InfraError(f"the torchft lighthouse did not listen on port {port} within {READY_WAIT:g} s"
                                 f"{': ' + last[0] if last else ''} (see {self.log})")
            time.sleep(0.1)

    def _spawn(self) -> None:
        if self.stopping.is_set():
            return
        self.starts += 1
        self.proc = subprocess.Popen(self.command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, preexec_fn=die_with_parent)
        again = f", start {self.starts}" if self.starts > 1 else ""
        self.say(f"lighthouse started (pid {self.proc.pid}{again})")

    def _keep(self) -> None:
        """Copy its lines to the log; start it again whenever it exits before `stop`."""
        with self.log.open("ab") as kept:
            while True:
                proc = self.proc
                if proc is None or proc.stdout is None:
                    return
                for line in proc.stdout:
                    kept.write(b"[lighthouse] " + line)
                    kept.flush()
                    self.quorum = quorum_of(line) or self.quorum
                rc = proc.wait()
                if self.stopping.is_set():
                    return
                self.say(f"lighthouse exited ({_ended(rc)}); starting it again")
                time.sleep(RESTART_PAUSE)
                if self.stopping.is_set():
                    return
                self._spawn()

    def stop(self) -> None:
        """End it (SIGTERM, then SIGKILL after STOP_WAIT) and wait for its lines."""
        self.stopping.set()
        proc = self.proc
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(STOP_WAIT)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if self.keeper.is_alive():
            self.keeper.join(STOP_WAIT)


def _ended(rc: int) -> str:
    return f"signal {signal.Signals(-rc).name}" if rc < 0 else f"exit code {rc}"
