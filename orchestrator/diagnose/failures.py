"""Failures as data: what went wrong on which host and rank, and which failure caused the others.

A `Failure` is built where a failure is observed (the launcher, a backend) and kept as a dict
in the job's record (`JobRecord.failures`, root cause first). A host's failed worker comes from
torchrun's own record (remote/workerfail.py: rank, exit code or signal, and the exception with
its traceback when the worker recorded one, else the one its own last lines end with: `own_error`).
Everything people read (the launch summary, summary.txt, `distrun report`) is rendered from that
data; nothing parses rendered text back. torch elastic's `ProcessFailure` is the model.

`root_cause` is pure: given the failures seen in the moments after the first one, it names the
likeliest origin (see its docstring for the rules).
"""

from __future__ import annotations

import re
import signal as signals
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from orchestrator.console.display import fold_hosts
from orchestrator.diagnose.flight import Lag
from orchestrator.remote.workerfail import WorkerRecord, final_exception

ROOT_CAUSE_TITLE = "Root Cause (first observed failure):"
# Lines a rank prints when it failed only because a peer went away (or it was told to stop).
COLLATERAL = re.compile(
    r"Connection closed by peer|Connection reset by peer|DistBackendError|Broken pipe|SIGTERM|Signal 15"
)
# Signals a process gets when someone ends it on purpose (a teardown), not when it crashes.
TEARDOWN_SIGNALS = frozenset({"SIGTERM", "SIGINT", "SIGHUP", "SIGPIPE"})
STOPPED_BY_DISTRUN = "stopped by distrun"
# `Failure.when` of a rank that crashed after its work was done, every other rank having exited 0.
AT_EXIT = "at exit"


class FailureKind(str, Enum):
    """How a host failed. Kinds other than exit and signal are rendered as a reason."""

    EXIT = "exit"  # a process exited with a non-zero code
    SIGNAL = "signal"  # a process was killed by a signal
    LOST = "lost"  # the host went silent or its channel closed
    INFRA = "infra"  # the machinery failed: a supervisor did not start, the scheduler ended the job
    HANG = "hang"  # no rank progressed for hang_timeout seconds (the host and rank whose stack differs)


@dataclass(frozen=True)
class Failure:
    """One host's failure.

    Attributes:
        host: The node name; "" when nothing observed points at one host (the summary says "unknown").
        kind: How it failed.
        rank: The global rank that failed first on the host, when known.
        exit_code: The exit code (kind `exit`).
        signal: The signal's name, e.g. "SIGKILL" (kind `signal`).
        reason: Why, in words (kinds `lost` and `infra`; may also explain an exit).
        address: The host's address as the controller reached it ("" when unknown).
        last_lines: The failed rank's (else the host's) last lines of output.
        time: When the failure was observed (seconds since the epoch).
        after_final: The job's final metrics line (`DISTRUN_METRICS {"final": true, ...}`) had
            arrived before this failure: the work was done and the process died at exit. Still
            a failure; the summary says so.
        barrier_hosts: Other hosts that distrun stopped while their torchrun waited in its exit
            barrier, every worker there already exited: their ranks had finished.
        stack: For a hang: the odd rank's stack, then where the other ranks wait (lines to show).
        flight: For a hang: what the ranks' Flight Recorder dumps say, per process group.
        when: `AT_EXIT` when every other rank had exited 0 and this rank's signal came after its
            last line, with no traceback of its own: the work finished, the process crashed at exit.
        message: The failed rank's exception in a line ("ValueError: boom"), when it recorded one.
        traceback: That exception's traceback, line by line.
        stopped: distrun had the host's processes stopped (the controller, or its supervisor on
            its own) before this failure was seen: an echo of the stop, not a cause.
    """

    host: str
    kind: FailureKind
    rank: int | None = None
    exit_code: int | None = None
    signal: str | None = None
    reason: str = ""
    address: str = ""
    last_lines: tuple[str, ...] = ()
    time: float = field(default_factory=time.time)
    after_final: bool = False
    barrier_hosts: tuple[str, ...] = ()
    stack: tuple[str, ...] = ()
    flight: tuple[Lag, ...] = ()
    when: str = ""
    message: str = ""
    traceback: tuple[str, ...] = ()
    stopped: bool = False

    @classmethod
    def from_returncode(cls, host: str, returncode: int, **fields: Any) -> Failure:
        """A failure from a process's return code: negative N is signal N, as subprocess reports it."""
        if returncode < 0:
            return cls(host, FailureKind.SIGNAL, signal=signal_name(-returncode), **fields)
        return cls(host, FailureKind.EXIT, exit_code=returncode, **fields)

    @classmethod
    def from_worker(cls, host: str, worker: WorkerRecord, **fields: Any) -> Failure:
        """A failure from torchrun's record of a failed worker: its rank, exit code or signal, and
        the exception when the worker recorded one (a traceback: torch elastic's `@record`)."""
        if worker.traceback:
            fields.update(message=worker.message, traceback=tuple(worker.traceback.splitlines()))
        return cls.from_returncode(host, worker.exitcode, rank=worker.rank, **fields)

    def describe(self) -> str:
        """What happened, in a few words: "exit code 1", "killed by SIGSEGV", "raised ValueError: boom,
        then SIGABRT at exit" (an exception, then a signal as the interpreter exited), or the reason.

        A SIGKILL is most often the kernel's OOM killer; when nothing tells more (no `reason`),
        the words say so as a question: "killed by SIGKILL (out of memory?)".
        """
        if self.kind is FailureKind.EXIT:
            return f"exit code {self.exit_code}"
        if self.kind is FailureKind.SIGNAL and self.message:
            return f"raised {self.message}, then {self.signal} at exit"
        if self.kind is FailureKind.SIGNAL:
            why = self.reason or ("out of memory?" if self.signal == "SIGKILL" else "")
            return f"killed by {self.signal}" + (f" ({why})" if why else "")
        return self.reason or self.kind.value

    def brief(self) -> str:
        """One line: `node1 (10.0.0.11) rank 3: exit code 1`."""
        rank = f" rank {self.rank}" if self.rank is not None else ""
        return f"{self.where()}{rank}: {self.describe()}"

    def where(self) -> str:
        """The host as named, with its address when that says more: `node1 (10.0.0.11)`, `localhost`;
        "unknown" when no host is known to be at fault."""
        if not self.host:
            return "unknown"
        return f"{self.host} ({self.address})" if self.address and self.address != self.host else self.host

    def render(self, above: bool = False) -> str:
        """The indented block a launch summary shows under its root-cause title; `above`: the
        last lines were the last this rank showed on the screen just above, so they are not repeated."""
        lines = [f"  host: {self.where() if self.host else 'unknown (distrun cannot tell which host is at fault)'}"]
        if self.rank is not None:
            lines.append(f"  rank: {self.rank}")
        label = "exit" if self.kind in (FailureKind.EXIT, FailureKind.SIGNAL) else "reason"
        lines.append(f"  {label}: {self.describe()}")
        if self.message and self.kind is not FailureKind.SIGNAL:  # a signal's describe() says it first
            lines.append(f"  error: {self.message}")
        if self.after_final:
            lines.append("  when: at exit, after the job's final metrics line (its work was done)")
        if self.barrier_hosts:
            lines.append(f"  finished: every rank of {fold_hosts(self.barrier_hosts)} had exited; distrun stopped "
                         "those hosts in torchrun's exit barrier")
        lines += [f"  flight recorder: {lag.line()}" for lag in self.flight]
        lines += [f"  {line}" for line in self.stack]
        if self.last_lines:
            whose = f"rank {self.rank}" if self.rank is not None else self.host
            if above:
                lines.append(f"  last {len(self.last_lines)} lines of {whose}: shown above (not repeated here)")
            else:
                lines.append(f"  last {len(self.last_lines)} lines of {whose}:")
                lines += [f"    {line}" for line in self.last_lines]
        elif self.kind is FailureKind.LOST:
            lines.append(f"  last lines of {self.host}: none arrived before it was lost")
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready data (kept in the job's record); `from_dict` reads it back."""
        return {"host": self.host, "kind": self.kind.value, "rank": self.rank, "exit_code": self.exit_code,
                "signal": self.signal, "reason": self.reason, "address": self.address,
                "last_lines": list(self.last_lines), "time": self.time, "after_final": self.after_final,
                "barrier_hosts": list(self.barrier_hosts), "stack": list(self.stack),
                "flight": [lag.to_dict() for lag in self.flight], "when": self.when, "message": self.message,
                "traceback": list(self.traceback), "stopped": self.stopped}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Failure:
        """A failure from `to_dict`'s data; keys it does not know are ignored.

        Raises:
            ValueError: `kind` is not a known kind, or `host` is missing.
        """
        if data.get("host") is None:
            raise ValueError("a failure needs a host")
        return cls(
            host=str(data["host"]), kind=FailureKind(data.get("kind")), rank=data.get("rank"),
            exit_code=data.get("exit_code"), signal=data.get("signal"), reason=str(data.get("reason") or ""),
            address=str(data.get("address") or ""), last_lines=tuple(data.get("last_lines") or ()),
            time=float(data.get("time") or 0.0), after_final=bool(data.get("after_final")),
            barrier_hosts=tuple(data.get("barrier_hosts") or ()), stack=tuple(data.get("stack") or ()),
            flight=tuple(Lag.from_dict(lag) for lag in data.get("flight") or ()), when=str(data.get("when") or ""),
            message=str(data.get("message") or ""), traceback=tuple(data.get("traceback") or ()),
            stopped=bool(data.get("stopped")),
        )


def own_error(lines: Sequence[str], signal: str | None = None) -> dict[str, Any]:
    """The exception a failed rank's own output ends with, for a failure whose record has none (no
    `@record`; a signal at exit after it): `{"message": ..., "traceback": ...}` for `Failure`, else {}.
    A teardown's `signal` (the rank was stopped) says nothing of how it ended."""
    raised = None if signal in TEARDOWN_SIGNALS else final_exception(lines)
    return {} if raised is None else {"message": raised[0], "traceback": raised[1]}


def oom_reason(oom_kills: int | None) -> str:
    """What a host's count of kernel OOM kills during the job says about a SIGKILL ("" when unknown)."""
    if oom_kills is None:
        return ""
    if oom_kills > 0:
        return f"out of memory: the kernel's OOM killer ended {oom_kills} process(es) on the host during the job"
    return "not the kernel's OOM killer: no OOM kill on the host during the job"


def signal_name(number: int) -> str:
    """`9` -> "SIGKILL"; a number Python does not name -> "signal 64"."""
    try:
        return signals.Signals(number).name
    except ValueError:
        return f"signal {number}"


def is_collateral(failure: Failure) -> bool:
    """Whether a failure looks like the echo of another: its process was ended on purpose
    (distrun had stopped the host, SIGTERM and the like; a supervisor that a signal ended, as a
    scheduler ends a step's other tasks once one failed), or its last lines say a peer went away.
    Other lost and infra failures are never collateral: nothing on the host itself said why."""
    if failure.kind is FailureKind.SIGNAL and failure.signal in TEARDOWN_SIGNALS:
        return True
    if failure.kind is FailureKind.INFRA and failure.stopped:
        return True
    if failure.kind not in (FailureKind.EXIT, FailureKind.SIGNAL):
        return False
    return failure.stopped or any(COLLATERAL.search(line) for line in failure.last_lines)


# Among failures seen at the same moment: a host that vanished or broke explains the others
# best, then a process killed outright (a crash, the OOM killer), then an exit code.
_KIND_ORDER = {FailureKind.LOST: 0, FailureKind.INFRA: 0, FailureKind.HANG: 0, FailureKind.SIGNAL: 1,
               FailureKind.EXIT: 2}


def root_cause(failures: Sequence[Failure]) -> Failure:
    """The failure that most likely caused the others.

    Rules, in order:
      1. A failure that is not collateral (see `is_collateral`) comes before one that is: a host
         lost at 15 s explains the `Connection reset by peer` exits it caused at 2 s.
      2. The earliest observed.
      3. At the same moment: lost or infra, then a signal, then an exit code (a crashed process
         explains the exit codes of the peers it left behind).
      4. The order given (host order).

    Args:
        failures: Every failure observed, in host order.

    Returns:
        The root cause.

    Raises:
        ValueError: no failures were given.
    """
    if not failures:
        raise ValueError("root_cause needs at least one failure")
    ranked = sorted(enumerate(failures),
                    key=lambda item: (is_collateral(item[1]), item[1].time, _KIND_ORDER.get(item[1].kind, 3), item[0]))
    return ranked[0][1]


def other_hosts_line(ends: Mapping[str, str]) -> str:
    """`Other hosts: node[0,2]: stopped by distrun, node3: exit code 1`: hosts that ended alike folded.

    Args:
        ends: Every other host -> how it ended, in host order.

    Returns:
        The line, or "" when there are no other hosts.
    """
    by_end: dict[str, list[str]] = {}
    for host, end in ends.items():
        by_end.setdefault(end, []).append(host)
    if not by_end:
        return ""
    return "Other hosts: " + ", ".join(f"{fold_hosts(hosts)}: {end}" for end, hosts in by_end.items())


def failed_summary(job_id: str, root: Failure, others: Mapping[str, str], above: bool = False) -> str:
    """The summary of a failed job: the root cause's block, then how every other host ended
    (`above`: the root cause's last lines were just shown on the screen, see `Failure.render`)."""
    lines = [f"job {job_id} FAILED"]
    if root.when == AT_EXIT:
        lines.append(f"the work finished on every rank; rank {root.rank} crashed at interpreter exit "
                     f"({root.signal or root.describe()})")
    lines += [ROOT_CAUSE_TITLE, root.render(above)]
    other = other_hosts_line(others)
    if other:
        lines.append(other)
    return "\n".join(lines)
