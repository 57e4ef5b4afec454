"""How a host other than the root cause's ended, from torchrun's own records (issue 41).

After one rank fails, the ranks of the other hosts end one of three ways, and the summary's
`Other hosts` line must say which, the same way every time:

- they failed on their own, as a consequence (gloo's `Connection closed by peer` once the first
  rank's process was gone, their torchrun raising `ChildFailedError`): a worker had raised when
  distrun's stop reached the host (its `@record` error file was written, or, in a program without
  `@record`, its stderr ended in a traceback; its process may take seconds more to exit), or
  torchrun recorded a worker that failed by itself (not a teardown's signal) and had ended before
  the stop (its pid was not alive then, or no stop reached a running torchrun). The error quoted is
  the worker's own: its record's, else the exception its last lines end with;
- distrun stopped them: the stop reached the host while a worker still ran;
- they had all returned from their main: the stop found torchrun alone, recording no failed
  worker and still running after its supervisor gave it time to end on its own (torchrun
  enters its exit barrier only once every worker exited 0).

The evidence is the supervisor's `exit` event (remote/supervisor.py): torchrun's records of the
failed workers (remote/workerfail.py, each with its pid and time), the pids alive when the stop
signalled torchrun, and the ranks that had raised by then. Nothing depends on which host's
message reached the controller first.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum

from orchestrator.diagnose.failures import STOPPED_BY_DISTRUN, TEARDOWN_SIGNALS
from orchestrator.remote.workerfail import WorkerRecord, first_failure

# A C++ source location torch and gloo put in their messages: "[/__w/pytorch/.../pair.cc:553] ".
SOURCE_LOCATION = re.compile(r"\[[^\]\s]*\.(?:cc|cpp|h|hpp):\d+\] ")
ERROR_WIDTH = 120  # the most of a consequence's error line the summary quotes


class Ending(str, Enum):
    """How another host's ranks ended."""

    CONSEQUENCE = "consequence"  # a rank failed on its own before any stop reached it
    STOPPED = "stopped"  # distrun's stop reached it while a rank still ran
    BARRIER = "barrier"  # every rank had returned from its main: torchrun waited in its exit barrier
    OWN = "own"  # it ended by itself with no failed worker recorded (its exit code says how)


@dataclass(frozen=True)
class HostEnd:
    """What a host's supervisor reported of its end.

    Attributes:
        workers: torchrun's records of its failed workers.
        alive_at_stop: The job's pids alive when distrun's stop signalled its torchrun ([]: torchrun
            alone; None: no stop reached a running torchrun).
        raised_at_stop: The ranks that had raised when the stop came (an `@record` error file, or a
            traceback their stderr ended with), their processes exiting or not.
    """

    workers: Sequence[WorkerRecord] = ()
    alive_at_stop: Sequence[int] | None = None
    raised_at_stop: Sequence[int] = ()


def failed_alone(end: HostEnd) -> list[WorkerRecord]:
    """The workers that failed on their own: they had raised when the stop came, or they ended
    before it (or with no stop) and not by a teardown's signal."""
    alive = set(end.alive_at_stop or ())
    return [w for w in end.workers if w.rank in end.raised_at_stop
            or (w.signal not in TEARDOWN_SIGNALS and w.pid not in alive)]


def ending(end: HostEnd) -> Ending:
    """How the host's ranks ended (see the module's docstring for the rules)."""
    if failed_alone(end):
        return Ending.CONSEQUENCE
    if end.alive_at_stop is None:
        return Ending.OWN
    return Ending.STOPPED if end.alive_at_stop or end.workers else Ending.BARRIER


def first_line(message: str) -> str:
    """A failure's message as the summary quotes it: the first sentence of its first line, without
    C++ source locations, cut at ERROR_WIDTH characters."""
    line = SOURCE_LOCATION.sub("", (message.strip().splitlines() or [""])[0]).strip()
    line = line.split(". ", 1)[0]  # gloo goes on: "This is typically caused by a remote worker crashing. ..."
    return line if len(line) <= ERROR_WIDTH else line[:ERROR_WIDTH - 1] + "…"


def describe(end: HostEnd, own_exit: str) -> str:
    """The host's ending for the `Other hosts` line.

    Args:
        end: What its supervisor reported.
        own_exit: How it exited, in words ("exit code 1"), for a host that ended by itself with
            no failed worker recorded.
    """
    kind = ending(end)
    if kind is Ending.CONSEQUENCE:
        worker = first_failure(failed_alone(end))
        assert worker is not None  # CONSEQUENCE has one
        what = first_line(worker.message) or f"exit code {worker.exitcode}"
        return f"failed as a consequence (rank {worker.rank}: {what})"
    if kind is Ending.OWN:
        return own_exit
    return STOPPED_BY_DISTRUN  # in its exit barrier too: the root cause's block says they had finished
