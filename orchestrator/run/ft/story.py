"""A replica group's story in one line, for the job's summary:
`lost node1 at step 212, relaunched on node3, healed from group 0 at step 231`.

Pure: the group's attempts (its own record's) say what failed and where it was relaunched; its
stints in the quorum (timeline.py) say the step it was lost at and how it came back. A stint
belongs to the attempt that ran when it began: attempts follow one another, and a group is in
no quorum between two of them.
"""

from __future__ import annotations

from collections.abc import Sequence

from orchestrator.console.display import fold_hosts
from orchestrator.diagnose.failures import Failure, FailureKind
from orchestrator.run.ft.timeline import Stint
from orchestrator.run.restarts import AttemptRecord


def cause(failure: Failure) -> str:
    """What ended an attempt, in a few words: `lost node1`, `rank 0 on b exited with code 3`."""
    if failure.kind in (FailureKind.LOST, FailureKind.INFRA):
        return f"lost {failure.host or 'a host'}"
    rank = f"rank {failure.rank} on " if failure.rank is not None else ""
    if failure.kind is FailureKind.EXIT:
        return f"{rank}{failure.host} exited with code {failure.exit_code}"
    if failure.kind is FailureKind.HANG:
        return f"hung on {failure.host}"
    return f"{rank}{failure.host} {failure.describe()}"


def _within(stints: Sequence[Stint], start: float, end: float | None) -> list[Stint]:
    return [s for s in stints if s.began >= start and (end is None or s.began < end)]


def comeback(stints: Sequence[Stint]) -> str:
    """How a relaunched group came back, from its stints since the relaunch."""
    if not stints:
        return "not back in the quorum"
    first = stints[0]
    if not first.healed:
        return f"back in the quorum at step {first.joined_step}"
    peer = "a peer" if first.source is None else f"group {first.source}"
    return f"healed from {peer} at step {first.top_step}"


def story(attempts: Sequence[AttemptRecord], stints: Sequence[Stint]) -> str:
    """The group's relaunches, each with the step it was lost at and how it came back; "" for a
    group never relaunched whose only attempt did not fail."""
    clauses: list[str] = []
    for number, attempt in enumerate(attempts):
        own = _within(stints, attempt.started, attempt.ended)
        if number:
            before = attempts[number - 1].hosts
            where = fold_hosts(attempt.hosts) if attempt.hosts != before else f"the same host(s), {fold_hosts(before)}"
            clauses += [f"relaunched on {where}", comeback(own)]
        if attempt.failure is not None:
            step = f" at step {own[-1].last_step}" if own else ""
            clauses.append(cause(attempt.failure) + step)
    return ", ".join(clauses)
