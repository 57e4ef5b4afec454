"""The progress watchdog: a job whose ranks stop making progress is stalled (explained, never
stopped), and with `hang_timeout` hung.

Progress is a line from any rank (DISTRUN_METRICS lines included; torchrun's own lines are not
a rank's, nor are the warnings distrun folds as harmless, logs/fold.py) reaching the controller,
or a collective a rank's Flight Recorder shows entered; the watchdog is armed by the first line,
so a slow start (imports, rendezvous) is never a stall.
`stall_after: S` (default 300 s): after S seconds without progress `look_at_stall` looks at every
rank (ranks.py: stacks, Flight Recorder); where a collective was entered lately the job still moves,
else the stall is kept (`Stalls`): the job shows `stalled` (live view, `ps`) with the odd rank named,
its stacks and dumps in the job directory, until it progresses again. With `hang_timeout: T` a job
that made none for T/3 seconds is shown `stalled` too; after T seconds `diagnose` dumps every rank's
stack into the job directory (stacks/), with the Flight Recorder dump of every rank that serves one
(flight/, flight.py), and returns the failure of kind `hang` (`verdict`, which a stall's explanation
shares): the rank the Flight Recorder finds behind the collective the others wait in (or that gave
no record while they wait: a stopped rank cannot answer), else the rank whose stack differs from the
majority's; its stack, where the others wait, and what the records say. The run loop (run/attempt.py)
calls `Watchdog.check` from its run loop, and `diagnose` and `look_at_stall` in threads of their
own, so the hosts keep being heartbeaten while their ranks are dumped.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import Enum
from typing import TYPE_CHECKING

from orchestrator.diagnose import flight as flights
from orchestrator.diagnose import ranks
from orchestrator.diagnose import stack as stacks
from orchestrator.diagnose.failures import Failure, FailureKind
from orchestrator.errors import DistrunError, one_line
from orchestrator.remote.redact import Masker

if TYPE_CHECKING:
    from orchestrator.store import JobDir, JobRecord

STALLED_FRACTION = 1 / 3
STALL_REASON = "stall: "
# A collective a rank entered within this share of stall_after is progress; the rest is a margin for
# the others entering the collective a stuck rank never reaches, just after their last line.
MOVED_WITHIN = 0.75
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
class Stall:
    """One stall: no rank progressed for `stall_after`, and what the look at every rank found then.

    Attributes:
        since: When the job last progressed before it (seconds since the epoch).
        failure: The verdict, as a hang's (`verdict`); never recorded as a failure: the job went on.
        kept: Where its stacks and Flight Recorder dumps are kept.
        about: The last progress it is about (time.monotonic()): progress after it ends the stall.
        ended: When the job progressed again (seconds since the epoch); None: it has not.
    """

    since: float
    failure: Failure
    kept: tuple[str, ...]
    about: float
    ended: float | None = None

    def verdict(self) -> str:
        """`no progress from any rank for 20 s; rank 3 on node1 is not where the others wait`."""
        return self.failure.reason.removeprefix(STALL_REASON)

    def lines(self, now: float | None = None) -> list[str]:
        """Its part of the job's summary: when, for how long, the verdict, the evidence, the files."""
        end = self.ended if self.ended is not None else (time.time() if now is None else now)
        until = "until " + clock(self.ended) if self.ended is not None else "still stalled at the end"
        evidence = [f"flight recorder: {lag.line()}" for lag in self.failure.flight] + list(self.failure.stack)
        kept = [f"kept in: {', '.join(self.kept)}"] if self.kept else []
        return [f"  stalled at {clock(self.since)} for {end - self.since:.0f} s ({until}): {self.verdict()}",
                *(f"    {line}" for line in evidence + kept)]


@dataclass
class Looked:
    """What a look at a silent job found: collectives still entered (`moved`, time.monotonic()), or a
    stall's verdict and where its files are kept."""

    moved: float | None = None
    failure: Failure | None = None
    kept: tuple[str, ...] = ()


@dataclass
class Stalls:
    """The stalls of one attempt: when to look at every rank, and what each look found.

    Args:
        after: stall_after in seconds (None: off).
    """

    after: float | None
    flight_progress: float | None = None  # when a look last found a collective entered (time.monotonic())
    looked_for: float | None = None  # the last progress the latest look was taken for
    collectives: int = 0  # the collectives every rank completed, as the hosts' `fr` events last said
    current: Stall | None = None
    past: list[Stall] = field(default_factory=list)

    def completed(self, collectives: int, now: float | None = None) -> None:
        """The collectives every rank completed (the slowest rank's count, from the hosts' periodic
        Flight Recorder reads): one more than before is progress, printed or not."""
        if collectives > self.collectives:
            self.collectives = collectives
            self.flight_progress = time.monotonic() if now is None else now

    def due(self, last: float | None, now: float | None = None) -> bool:
        """Whether to look at every rank now: no progress for `after` since `last`, not looked at yet."""
        if self.after is None or last is None or last == self.looked_for:
            return False
        return (time.monotonic() if now is None else now) - last >= self.after

    def looking(self, last: float) -> None:
        """A look is taken for the silence since `last`."""
        self.looked_for = last

    def found(self, looked: Looked, now: float | None = None) -> Stall | None:
        """What the look found: collectives entered since (progress: None), else the stall, which begins."""
        if looked.moved is not None or looked.failure is None or self.looked_for is None:
            self.flight_progress = max(self.flight_progress or 0.0, looked.moved or 0.0)
            return None
        mono = time.monotonic() if now is None else now
        self.current = Stall(time.time() - (mono - self.looked_for), looked.failure, looked.kept, self.looked_for)
        return self.current

    def progressed(self, last: float | None) -> Stall | None:
        """The current stall, ended, when the job progressed since it began; else None."""
        if self.current is None or last == self.current.about:
            return None
        ended, self.current = self.current, None
        ended.ended = time.time()
        self.past.append(ended)
        return ended

    def stalled(self, last: float | None) -> bool:
        return self.current is not None and last == self.current.about

    def lines(self) -> list[str]:
        """Every stall's part of the summary, in order."""
        return [line for stall in [*self.past, *([self.current] if self.current else [])] for line in stall.lines()]


@dataclass
class Watchdog:
    """Watches when the job last progressed.

    Args:
        timeout: hang_timeout in seconds (None: never hung, nor stalled but through `stalls`).
        last_progress: When any rank last progressed (time.monotonic()); None before the first time.
        stalls: The stalls that a look at every rank confirmed (stall_after).
    """

    timeout: float | None
    last_progress: Callable[[], float | None]
    stalls: Stalls = field(default_factory=lambda: Stalls(None))

    def check(self, now: float | None = None) -> Progress:
        """Moving, stalled (silent for a third of the timeout, or a stall confirmed), or hung
        (silent for all of the timeout)."""
        last = self.last_progress()
        if last is None:
            return Progress.MOVING
        silent = (time.monotonic() if now is None else now) - last
        if self.timeout is not None and silent >= self.timeout:
            return Progress.HUNG
        if self.stalls.stalled(last) or (self.timeout is not None and silent >= self.timeout * STALLED_FRACTION):
            return Progress.STALLED
        return Progress.MOVING

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
        seen = ranks.look(backend, record, masker=masker)
    except DistrunError as exc:
        return unseen(reason, exc)
    return verdict(seen, job_dir, reason, addresses)


def look_at_stall(backend: stacks.ReachesRanks, record: JobRecord, job_dir: JobDir, after: float,
                  addresses: dict[str, str], masker: Masker | None = None,
                  last_lines: Mapping[int, float] | None = None) -> Looked:
    """Look at every rank of a job silent for `after` seconds: where a rank's Flight Recorder shows a
    collective entered within the last MOVED_WITHIN of them, the job still moves; else the stall's
    verdict, its stacks and dumps kept in the job directory. The job is never stopped here.

    Args:
        backend: The job's backend (it reaches the ranks' hosts).
        record: The job.
        job_dir: Its directory (stacks/, flight/).
        after: stall_after, in seconds.
        addresses: Each node's address.
        masker: The job's secrets.
        last_lines: When each rank's last line arrived (seconds since the epoch).
    """
    reason = f"{STALL_REASON}no progress from any rank for {after:g} s"
    try:
        seen = ranks.look(backend, record, masker=masker, last_lines=last_lines)
    except DistrunError as exc:
        return Looked(failure=unseen(reason, exc))
    entered = seen.last_collective()
    ago = None if entered is None else time.time() - entered
    if ago is not None and ago < after * MOVED_WITHIN:
        return Looked(moved=time.monotonic() - max(ago, 0.0))
    gathered = seen.gathered
    kept = (str(job_dir.stacks),) * bool(gathered.ranks) + (str(job_dir.flight),) * bool(gathered.flight.dumps)
    return Looked(failure=verdict(seen, job_dir, reason, addresses), kept=kept)


def clock(when: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(when))


def unseen(reason: str, exc: DistrunError) -> Failure:
    """The verdict when no rank could be looked at: nobody named, and how to find the stuck rank."""
    return Failure("", FailureKind.HANG, reason=f"{reason}; unknown: {NO_EVIDENCE} ({one_line(exc)})",
                   stack=(HOW_TO_FIND,))


def verdict(seen: ranks.Look, job_dir: JobDir, reason: str, addresses: dict[str, str]) -> Failure:
    """The rank that is not where the others are, from what a look found (kept in the job directory's
    stacks/ and flight/), as the hang's failure: reason, odd stack, where the others wait, lags.

    The ranks' positions in their collectives (the Flight Recorder) decide which rank is odd, where
    they name one; the stacks say where it is. Without a Flight Recorder that names a rank, the
    stacks alone decide (`stack_failure`)."""
    gathered = seen.gathered
    flight = gathered.flight
    lags = flights.lags(flight.dumps, silent=sorted(set(flight.nodes) - set(flight.dumps)))
    stack_notes, flight_notes = seen.keep(job_dir, lags)
    blamed = [rank for rank in flights.blamed(lags) if rank in flight.nodes]
    if blamed:
        failure = flight_failure(gathered, blamed, lags, reason, addresses, stack_notes)
    else:
        failure = stack_failure(gathered, reason, addresses, stack_notes)
    failure = replace(failure, flight=tuple(lags), stack=failure.stack + tuple(flight_findings(flight) + flight_notes))
    if failure.host or (gathered.ranks and not gathered.failed):
        return failure  # named, or every rank's stack shows them all in one place: py-spy is there
    return replace(failure, stack=(*failure.stack, HOW_TO_FIND))


def flight_failure(gathered: stacks.Gathered, blamed: Sequence[int], lags: Sequence[flights.Lag], reason: str,
                   addresses: dict[str, str], notes: Sequence[str] = ()) -> Failure:
    """The hang on the ranks the Flight Recorder finds the likeliest cause (`blamed`): the reason says
    what their records say, the stacks where they are and where the others wait.

    Args:
        gathered: What the look found.
        blamed: The ranks to name (each in `gathered.flight.nodes`).
        lags: What the records say.
        reason: The reason's start ("hang: no progress from any rank for 15 s").
        addresses: Each node's address.
        notes: What could not be kept.
    """
    nodes = gathered.flight.nodes
    hosts = list(dict.fromkeys(nodes[rank] for rank in blamed))
    odd = [r for r in gathered.ranks if r.rank in blamed]
    lines = [line for group in stacks.fold(odd) for line in
             [f"stack of {group.label()} ({group.sample.where()}):", *stacks.stack_lines(group.sample)]]
    lines += where_the_others_wait(stacks.fold([r for r in gathered.ranks if r.rank not in blamed]))
    lines += [f"{node}: no stacks: {why}" for node, why in gathered.failed.items()] + list(notes)
    return Failure(hosts[0], FailureKind.HANG, rank=blamed[0] if len(blamed) == 1 else None,
                   reason=f"{reason}; {flights.label(blamed)} on {', '.join(hosts)} is not where the others "
                          f"wait: {flight_words(blamed, lags)}",
                   address=addresses.get(hosts[0], ""), stack=tuple(lines))


def flight_words(blamed: Sequence[int], lags: Sequence[flights.Lag]) -> str:
    """What the Flight Recorder says of the blamed ranks, for the reason: `it has not entered
    collective #31 gloo:all_reduce`, `it gave no Flight Recorder record`, `it is still in collective #104`."""
    lag = next(lag for lag in lags if set(lag.blamed()) & set(blamed))
    one = len(blamed) == 1
    what = f"collective #{lag.seq} {lag.collective}"
    if lag.behind:
        return f"{'it has' if one else 'they have'} not entered {what} (Flight Recorder)"
    if lag.silent:
        return f"{'it' if one else 'they'} gave no Flight Recorder record while the others wait in {what}"
    earlier = ", ".join(f"#{seq}" for seq in dict.fromkeys(lag.blocked_in))
    return f"{'it is' if one else 'they are'} still in collective {earlier}, behind {what} (Flight Recorder)"


def where_the_others_wait(groups: Sequence[stacks.StackGroup]) -> list[str]:
    """Where each group of the other ranks waits, the majority last."""
    lines = []
    for group in groups:
        verb = "wait" if len(group.ranks) > 1 else "waits"
        mark = " (the majority)" if group is groups[-1] and len(groups) > 1 else ""
        lines.append(f"{group.label()}{mark} {verb} in: {group.sample.where()}")
    return lines


def stack_failure(gathered: stacks.Gathered, reason: str, addresses: dict[str, str],
                  notes: Sequence[str] = ()) -> Failure:
    """The hang as the stacks tell it; `notes` (stacks not kept) go after the hosts that gave none.
    A group is the odd one only when it alone is the smallest (and, among the smallest, alone
    outside torch.distributed): a tie is never broken by rank order, and names no rank."""
    groups = stacks.fold(gathered.ranks)
    lines = [f"{node}: no stacks: {why}" for node, why in gathered.failed.items()] + list(notes)
    if not groups:
        return Failure("", FailureKind.HANG, reason=f"{reason}; unknown: {NO_EVIDENCE}", stack=tuple(lines))
    if len(groups) == 1:
        only = groups[0]
        verb = "wait" if len(only.ranks) > 1 else "waits"
        return Failure("", FailureKind.HANG, reason=f"{reason}; every rank waits in the same place",
                       stack=(f"{only.label()} {verb} in: {only.sample.where()}", *lines))
    odd = groups[0]
    if odd_key(odd) == odd_key(groups[1]):
        return Failure("", FailureKind.HANG, reason=f"{reason}; the ranks wait in {len(groups)} places, "
                                                    "none of them the odd one out",
                       stack=(*where_the_others_wait(groups), *lines))
    return Failure(odd.sample.node, FailureKind.HANG,
                   rank=odd.sample.rank if len(odd.ranks) == 1 else None,
                   reason=f"{reason}; {odd.label()} on {', '.join(odd.hosts())} is not where the others wait",
                   address=addresses.get(odd.sample.node, ""),
                   stack=tuple(odd_lines(odd, groups[1:]) + lines))


def odd_key(group: stacks.StackGroup) -> tuple[int, bool]:
    """What makes a group the odd one out: fewer ranks, then being outside torch.distributed."""
    return len(group.ranks), group.sample.in_collective()


def flight_findings(flight: stacks.Flight) -> list[str]:
    """Notes on the Flight Recorder dumps: the ranks that gave none and why; a job whose ranks
    serve none gets one short note, never an error."""
    whys = flights.by_reason(flight.errors)
    if not flight.dumps:
        said = "; ".join(f"{flights.label(numbers)}: {why}" for why, numbers in whys.items())
        return [f"no Flight Recorder: {said or 'no rank found'}; see jobs/README.md"]
    return [f"{flights.label(numbers)}: no Flight Recorder dump ({why})" for why, numbers in whys.items()]


def odd_lines(odd: stacks.StackGroup, rest: Sequence[stacks.StackGroup]) -> list[str]:
    """The odd group's stack, then where every other group waits (the majority last)."""
    return [f"stack of {odd.label()} ({odd.sample.where()}):", *stacks.stack_lines(odd.sample),
            *where_the_others_wait(rest)]
