"""The progress watchdog: a job whose ranks stop making progress is stalled, then hung.

Progress is a line from any rank (DISTRUN_METRICS lines included; torchrun's own lines are not
a rank's) reaching the controller; the watchdog is armed by the first one, so a slow start
(imports, rendezvous) is never a hang. With
`hang_timeout: T` a job that made none for T/3 seconds is shown `stalled` (live view, `ps`); after
T seconds `diagnose` dumps every rank's stack into the job directory (stacks/), with the Flight
Recorder dump of every rank that serves one (flight/, orchestrator/diagnose/flight.py), and returns the
failure of kind `hang`: the rank whose stack differs from the majority's, that stack, where the
others wait, and the ranks that have not entered the collective the others wait in. The run loop
(run/attempt.py) calls `Watchdog.check` from its run loop and `diagnose` in a thread of its own, so the
hosts keep being heartbeaten while their ranks are dumped.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING

from orchestrator.diagnose import flight as flights
from orchestrator.diagnose import stack as stacks
from orchestrator.diagnose.failures import Failure, FailureKind
from orchestrator.errors import DistrunError, one_line
from orchestrator.remote.private import make_private_dirs, write_private
from orchestrator.remote.redact import Masker

if TYPE_CHECKING:
    from orchestrator.store import JobDir, JobRecord

STALLED_FRACTION = 1 / 3
NO_EVIDENCE = "every rank silent, no stacks"
HOW_TO_FIND = ("to find the stuck rank: install py-spy on the hosts (pip install py-spy; distrun then dumps every "
               "rank's stack, and `distrun stack JOB` shows them), or turn the Flight Recorder back on "
               "(flight_recorder: true, the default; jobs/README.md)")


class Progress(str, Enum):
    """Where a job stands, as the watchdog sees it."""

    MOVING = "moving"
    STALLED = "stalled"
    HUNG = "hung"


@dataclass
class Watchdog:
    """Watches when the job last progressed.

    Args:
        timeout: hang_timeout in seconds (None: never stalled nor hung).
        last_progress: When any rank last progressed (time.monotonic()); None before the first time.
    """

    timeout: float | None
    last_progress: Callable[[], float | None]

    def check(self, now: float | None = None) -> Progress:
        """Moving, stalled (silent for a third of the timeout), or hung (silent for all of it)."""
        last = self.last_progress()
        if self.timeout is None or last is None:
            return Progress.MOVING
        silent = (time.monotonic() if now is None else now) - last
        if silent >= self.timeout:
            return Progress.HUNG
        return Progress.STALLED if silent >= self.timeout * STALLED_FRACTION else Progress.MOVING

    def silent_for(self) -> float:
        last = self.last_progress()
        return 0.0 if last is None else time.monotonic() - last


def diagnose(backend: stacks.ReachesRanks, record: JobRecord, job_dir: JobDir, timeout: float,
             addresses: dict[str, str], masker: Masker | None = None) -> Failure:
    """Dump every rank's stack (and Flight Recorder) into the job directory and name the rank that
    is not where the others are.

    Args:
        backend: The job's backend (it reaches the ranks' hosts).
        record: The job.
        job_dir: Its directory; the stacks go to its stacks/ folder, the Flight Recorder dumps to flight/.
        timeout: The hang_timeout that expired (for the reason's words).
        addresses: Each node's address, for the failure.
        masker: The job's secrets: masked in the stacks and dumps before anything keeps or shows them.

    Returns:
        The failure of kind `hang`. Its host and rank are the odd rank's; when every rank waits in
        the same place (or no stack could be taken), the one rank the Flight Recorder finds behind,
        else no host ("unknown"), with how to find the stuck rank. Its `flight` holds what the dumps say.
    """
    reason = f"hang: no progress from any rank for {timeout:g} s"
    try:
        gathered = stacks.gather(backend, record, flight=True, masker=masker)
    except DistrunError as exc:
        return Failure("", FailureKind.HANG, reason=f"{reason}; unknown: {NO_EVIDENCE} ({one_line(exc)})",
                       stack=(HOW_TO_FIND,))
    failure = stack_failure(gathered, job_dir, reason, addresses)
    lags, notes = flight_findings(gathered.flight, job_dir.flight)
    failure = replace(failure, flight=tuple(lags), stack=failure.stack + tuple(notes))
    failure = with_flight_rank(failure, gathered.flight.nodes, addresses)
    return failure if failure.host else replace(failure, stack=(*failure.stack, HOW_TO_FIND))


def with_flight_rank(failure: Failure, nodes: dict[int, str], addresses: dict[str, str]) -> Failure:
    """The failure on the one rank its Flight Recorder lags find behind, where the stacks named no
    rank (every rank alike, or py-spy missing); as it was otherwise (no host named stays unnamed).

    Args:
        failure: The hang, its `flight` filled in.
        nodes: Each rank's node.
        addresses: Each node's address.
    """
    behind = {rank for lag in failure.flight for rank in lag.behind}
    if failure.rank is not None or len(behind) != 1 or min(behind) not in nodes:
        return failure
    rank = min(behind)
    return replace(failure, host=nodes[rank], rank=rank, address=addresses.get(nodes[rank], ""))


def stack_failure(gathered: stacks.Gathered, job_dir: JobDir, reason: str, addresses: dict[str, str]) -> Failure:
    """The hang as the stacks tell it (kept in the job directory's stacks/)."""
    groups = stacks.fold(gathered.ranks)
    lines = [f"{node}: no stacks: {why}" for node, why in gathered.failed.items()]
    try:
        keep(gathered, job_dir.stacks)
    except OSError as exc:  # a full disk must not hide which rank hung
        lines.append(f"stacks not kept in {job_dir.stacks}: {exc}")
    if not groups:
        return Failure("", FailureKind.HANG, reason=f"{reason}; unknown: {NO_EVIDENCE}", stack=tuple(lines))
    if len(groups) == 1:
        only = groups[0]
        return Failure("", FailureKind.HANG, reason=f"{reason}; every rank waits in the same place",
                       stack=(f"{only.label()} wait in: {only.sample.where()}", *lines))
    odd, majority = groups[0], groups[-1]
    return Failure(odd.sample.node, FailureKind.HANG,
                   rank=odd.sample.rank if len(odd.ranks) == 1 else None,
                   reason=f"{reason}; {odd.label()} on {', '.join(odd.hosts())} is not where the others wait",
                   address=addresses.get(odd.sample.node, ""),
                   stack=tuple(odd_lines(odd, groups[1:], majority) + lines))


def flight_findings(flight: stacks.Flight, folder: Path) -> tuple[list[flights.Lag], list[str]]:
    """What the Flight Recorder dumps say, and notes: ranks that gave none, dumps not kept. The dumps
    are kept in `folder`; a job whose ranks serve none gets one short note, never an error."""
    if not flight.dumps:
        whys = "; ".join(f"{flights.label(ranks)}: {why}" for why, ranks in flights.by_reason(flight.errors).items())
        return [], [f"no Flight Recorder: {whys or 'no rank found'}; see jobs/README.md"]
    lags = flights.lags(flight.dumps)
    notes = [f"{flights.label(ranks)}: no Flight Recorder dump ({why})"
             for why, ranks in flights.by_reason(flight.errors).items()]
    try:
        keep_flight(flight, lags, folder)
    except OSError as exc:
        notes.append(f"Flight Recorder dumps not kept in {folder}: {exc}")
    return lags, notes


def keep_flight(flight: stacks.Flight, lags: Sequence[flights.Lag], folder: Path) -> None:
    """Write every rank's dump (rank<R>.json) and what they say (flight.json: lags, errors, seconds),
    private (0700/0600) as every file of the job."""
    make_private_dirs(folder)
    for rank, dump in flight.dumps.items():
        write_private(folder / f"rank{rank}.json", json.dumps(dump) + "\n")
    summary = {"lags": [lag.to_dict() for lag in lags], "errors": {str(r): why for r, why in flight.errors.items()},
               "seconds": round(flight.seconds, 3)}
    write_private(folder / "flight.json", json.dumps(summary, indent=2) + "\n")


def odd_lines(odd: stacks.StackGroup, rest: Sequence[stacks.StackGroup], majority: stacks.StackGroup) -> list[str]:
    """The odd group's stack, then where every other group waits (the majority last)."""
    lines = [f"stack of {odd.label()} ({odd.sample.where()}):", *stacks.stack_lines(odd.sample)]
    for group in rest:
        verb = "wait" if len(group.ranks) > 1 else "waits"
        mark = " (the majority)" if group is majority and len(rest) > 1 else ""
        lines.append(f"{group.label()}{mark} {verb} in: {group.sample.where()}")
    return lines


def keep(gathered: stacks.Gathered, folder: Path) -> None:
    """Write every rank's stack (rank<R>.txt), the folded view (folded.txt) and the JSON (stacks.json),
    private (0700/0600) as every file of the job."""
    make_private_dirs(folder)
    for rank in gathered.ranks:
        text = "\n".join([f"rank {rank.rank} on {rank.node} (pid {rank.pid})", *stacks.stack_lines(rank)])
        write_private(folder / f"rank{rank.rank}.txt", text + "\n")
    write_private(folder / "folded.txt", stacks.render(gathered) + "\n")
    write_private(folder / "stacks.json", json.dumps(stacks.to_json(gathered), indent=2) + "\n")
