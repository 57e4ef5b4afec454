"""Each replica group's turns in the quorum, as the lighthouse's lines tell them: when it joined,
at which step, whether it had to heal and from which group, and the last step it was seen at.

The parent controller reads the job's `lighthouse.log` as it grows (`QuorumTail`) and feeds every
quorum to a `Timeline`; the live view (view.py) and the summary's stories (story.py) read it.
Every quorum line counts (the one in which a relaunched group heals is a single line); the latest is
also what `groups.json` and the summary show.
"""

from __future__ import annotations

import re
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from orchestrator.remote.follow import Follower

QUORUM = re.compile(rb"Quorum! Quorum \{ quorum_id: (\d+), participants: \[(.*)")
# The whole replica id (torchft orders a quorum's members by it), and the member's step.
MEMBER = re.compile(rb'replica_id: "([^"]*)",.*?step: (\d+)')
TRAILING_DIGITS = re.compile(r"(\d+)$")


@dataclass(frozen=True)
class Member:
    """A quorum's member: its replica id as the script named it (`group1:<uuid>`) and its step."""

    replica_id: str
    step: int

    @property
    def group(self) -> int | None:
        """The group's index: the digits that end the id's name (`group1` -> 1, as torchft reads it)."""
        found = TRAILING_DIGITS.search(self.replica_id.split(":")[0])
        return int(found[1]) if found else None


@dataclass(frozen=True)
class Quorum:
    """A quorum the lighthouse formed, as its log line tells it.

    Attributes:
        id: torchft's quorum id (it grows when the participants change).
        members: Its members in the line's order.
    """

    id: int
    members: tuple[Member, ...]

    @property
    def participants(self) -> tuple[str, ...]:
        """The members' names (`group0`, ... as the scripts name them), without torchft's uuid."""
        return tuple(m.replica_id.split(":")[0] for m in self.members)

    @property
    def step(self) -> int:
        """The highest step of a member."""
        return max((m.step for m in self.members), default=0)


def quorum_of(line: bytes) -> Quorum | None:
    """The quorum a lighthouse line announces (`Quorum! Quorum { quorum_id: ...`), else None."""
    found = QUORUM.search(line)
    if found is None:
        return None
    return Quorum(int(found.group(1)), tuple(Member(rid.decode(errors="replace"), int(step))
                                             for rid, step in MEMBER.findall(found.group(2))))


def heal_source(members: Sequence[Member], healing: Member) -> Member | None:
    """The member that rank 0 of a group behind the others pulls its state from: torchft 0.2's
    assignment (manager.rs): members sorted by replica id, the i-th of those behind the highest step
    takes the i-th (round robin) of those at it. None when `healing` is not behind."""
    ordered = sorted(members, key=lambda m: m.replica_id)
    top = max(m.step for m in ordered)
    behind = [m for m in ordered if m.step != top]
    ahead = [m for m in ordered if m.step == top]
    if healing not in behind:
        return None
    return ahead[behind.index(healing) % len(ahead)]


@dataclass(frozen=True)
class Stint:
    """A run of consecutive quorums one group was in.

    Attributes:
        began: When its first quorum line was read (seconds since the epoch).
        joined_step: The group's step when it joined.
        top_step: The quorum's highest step then; above `joined_step`, the group healed to it.
        source: The group it healed from (None when it did not heal, or the source is not a group).
        last_step: Its step in the latest quorum of the run.
    """

    began: float
    joined_step: int
    top_step: int
    source: int | None
    last_step: int

    @property
    def healed(self) -> bool:
        return self.joined_step < self.top_step


@dataclass
class Timeline:
    """Every group's stints, from the quorums in the order the lighthouse formed them. A stint ends
    with a quorum the group is not in, or when its replica id changes (torchft's id ends with a
    uuid of the process: a relaunched group is a new member even when no quorum formed between)."""

    stints: dict[int, list[Stint]] = field(default_factory=dict)
    ids: dict[int, str] = field(default_factory=dict)  # each group's latest replica id
    latest: tuple[int, ...] = ()  # the groups in the latest quorum
    last: Quorum | None = None  # the latest quorum

    @property
    def top_step(self) -> int | None:
        """The latest quorum's highest step; None before the first."""
        return None if self.last is None else self.last.step

    def observe(self, quorum: Quorum, when: float) -> None:
        """One quorum, read at `when`."""
        members, top = quorum.members, quorum.step
        current = []
        for member in members:
            index = member.group
            if index is None:
                continue
            current.append(index)
            runs = self.stints.setdefault(index, [])
            same = self.ids.get(index) == member.replica_id
            self.ids[index] = member.replica_id
            if index in self.latest and runs and same:
                runs[-1] = replace(runs[-1], last_step=member.step)
                continue
            source = heal_source(members, member)
            runs.append(Stint(when, member.step, top, source.group if source else None, member.step))
        self.latest, self.last = tuple(sorted(current)), quorum

    def of(self, index: int) -> list[Stint]:
        return self.stints.get(index, [])

    def last_step(self, index: int) -> int | None:
        """The group's step in the latest quorum it was in; None before its first."""
        runs = self.of(index)
        return runs[-1].last_step if runs else None


class QuorumTail:
    """Reads a lighthouse log as it grows and feeds its quorums to a timeline."""

    def __init__(self, path: Path, timeline: Timeline) -> None:
        self.follower = Follower(path)
        self.timeline = timeline

    def poll(self) -> None:
        """Read the whole lines written since the last poll (none while the log is missing)."""
        now = time.time()
        for line in self.follower.lines().splitlines():
            quorum = quorum_of(line)
            if quorum is not None and quorum.members:
                self.timeline.observe(quorum, now)

    def close(self) -> None:
        self.follower.close()
