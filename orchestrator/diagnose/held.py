"""Stragglers seen from beside the ranks: a rank held off its CPU from outside (stopped in a duty
cycle, throttled by a CFS quota) more than the job's other ranks.

A rank held inside its collectives enters them on time (the others wait for it in the collective,
which gloo's records do not time), so lateness at entry cannot see it; its process's scheduler
figures can. The host's poller (remote/frpoll.py) sends, with each rank's record, its process's
counters (`sched`): CPU time, time waiting for a CPU, its cgroup's throttled time, and how many of
its looks (every 0.1 s) found it stopped. Between two rounds a rank's held share is the share of the
wall time it was stopped plus the share its cgroup was throttled. A rank is held in a round when
that share is at least HELD_SHARE and passes the median of the other ranks' by HELD_SHARE (a host
whose ranks are all throttled alike, or a loaded machine that delays every rank, names nobody); it
is named after HELD_ROUNDS rounds in a row. Time spent waiting for a CPU is said as evidence, never
a cause: on a loaded host every rank waits. A rank that did not answer a round is not left out: the
poller sends its process's figures all the same (a rank throttled to 4 % of a CPU answered no read
in time), and the lateness rule waits for its collectives.
Not answering is no sign of its own: at load 60 a healthy rank 0 missed three rounds in a row.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any

HELD_SHARE = 0.3  # a rank held off its CPU this share of a round, this much more than the others' median
HELD_ROUNDS = 3  # consecutive rounds before a held rank is named


@dataclass(frozen=True)
class HeldRank:
    """A rank named because it was held off its CPU from outside.

    Attributes:
        held: Its mean held share over the rounds (stopped + throttled), 0-1.
        stopped, throttled, waiting: Its mean shares of each.
        others: The other ranks' median held share.
    """

    node: str
    rank: int
    rounds: int
    held: float
    stopped: float = 0.0
    throttled: float = 0.0
    waiting: float = 0.0
    others: float = 0.0

    def figures(self) -> dict[str, Any]:
        """What the rule measured, for the alert's record."""
        return {"held_pct": round(self.held * 100), "stopped_pct": round(self.stopped * 100),
                "throttled_pct": round(self.throttled * 100), "waiting_pct": round(self.waiting * 100),
                "others_held_pct": round(self.others * 100), "rounds": self.rounds}

    def message(self, evidence: str = "") -> str:
        """As an alert line of its host: `straggler: rank 4 on node2 is held off its CPU 74% of the time ...`."""
        said = (f"straggler: rank {self.rank} on {self.node} is held off its CPU {self.held:.0%} of the time "
                f"(stopped {self.stopped:.0%}, throttled by its CPU quota {self.throttled:.0%}; waiting for a "
                f"CPU {self.waiting:.0%}), the other ranks {self.others:.0%}, {self.rounds} rounds in a row")
        return f"{said}; {evidence}" if evidence else said


@dataclass
class Reading:
    """One rank's scheduler counters at one round."""

    at: float
    figures: dict[str, int]


@dataclass
class HeldStreak:
    shares: list[tuple[float, float, float]] = field(default_factory=list)  # (stopped, throttled, waiting)
    others: list[float] = field(default_factory=list)
    named: bool = False


@dataclass
class HeldDetector:
    """Names held ranks from the hosts' `fr` events (their ranks' `sched`), fed as they arrive.

    Args:
        world_size: The job's ranks: a rank value outside it is not a rank.
    """

    world_size: int
    last: dict[int, Reading] = field(default_factory=dict)
    held: dict[int, float] = field(default_factory=dict)  # rank -> its latest round's held share
    streaks: dict[int, HeldStreak] = field(default_factory=dict)

    def observe(self, node: str, event: dict[str, Any]) -> list[HeldRank]:
        """Take one host's `fr` event; the ranks it lets us name."""
        at = event.get("at")
        if not isinstance(at, int | float) or event.get("final"):
            return []
        named = []
        ranks = event.get("ranks") if isinstance(event.get("ranks"), dict) else {}
        unanswered = event.get("sched") if isinstance(event.get("sched"), dict) else {}
        seen = {key: summary.get("sched") for key, summary in ranks.items() if isinstance(summary, dict)}
        for key, sched in {**unanswered, **seen}.items():
            rank = int(key) if str(key).isdigit() else -1
            if 0 <= rank < self.world_size:
                named += self._round(node, rank, float(at), sched)
        return named

    def _round(self, node: str, rank: int, at: float, sched: object) -> list[HeldRank]:
        streak = self.streaks.setdefault(rank, HeldStreak())
        if not isinstance(sched, dict):
            return []
        before, self.last[rank] = self.last.get(rank), Reading(at, {k: v for k, v in sched.items()
                                                                    if isinstance(v, int)})
        shares = _shares(before, self.last[rank])
        if shares is None:
            return []
        self.held[rank] = min(1.0, shares[0] + shares[1])
        others = [share for other, share in self.held.items() if other != rank]
        median = statistics.median(others) if others else 0.0
        if self.held[rank] < HELD_SHARE or self.held[rank] - median < HELD_SHARE:
            self.streaks[rank] = HeldStreak()
            return []
        streak.shares.append(shares)
        streak.others.append(median)
        if len(streak.shares) < HELD_ROUNDS or streak.named:
            return []
        streak.named = True
        stopped, throttled, waiting = (statistics.mean(s[i] for s in streak.shares) for i in range(3))
        return [HeldRank(node, rank, len(streak.shares), min(1.0, stopped + throttled), stopped, throttled, waiting,
                         statistics.mean(streak.others))]


def _shares(before: Reading | None, now: Reading) -> tuple[float, float, float] | None:
    """(stopped, throttled, waiting) shares of the wall time between two readings of one process; None
    without an earlier reading of it (a first round, or a new process: its looks counted again)."""
    if before is None or now.at <= before.at or now.figures.get("looks", 0) < before.figures.get("looks", 0):
        return None
    wall_ms = (now.at - before.at) * 1000

    def grew(key: str) -> int:
        return max(0, now.figures.get(key, 0) - before.figures.get(key, 0))

    looks = grew("looks")
    stopped = grew("stopped") / looks if looks else 0.0
    return stopped, min(1.0, grew("throttled_ms") / wall_ms), min(1.0, grew("wait_ms") / wall_ms)
