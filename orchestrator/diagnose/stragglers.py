"""Stragglers: a rank whose own step time stays well above the other ranks'.

Every rank of the bundled training script prints its own metrics line each logging interval
(jobs/README.md): `busy_s` is the rank's own work per step, without the time it waited for the
others in DDP's collectives. Under DDP every rank's wall time per step is the slowest rank's, so
wall time cannot tell a straggler from its victims; `busy_s` can. Scripts that print only
`step_time_s` per rank are judged on that.

A rank is named once it was slow (above SLOW_FACTOR x the median of all ranks of the same
interval) for SLOW_INTERVALS consecutive intervals, and named again only after an interval that
was not slow ended its streak. An interval is judged when every rank reported it, or when a
later interval began (a rank that did not report it then breaks its run of slow intervals: it
is named on evidence only).
"""

from __future__ import annotations

import statistics
import threading
from dataclasses import dataclass, field
from typing import Any

SLOW_FACTOR = 1.5
SLOW_INTERVALS = 5
TIME_KEYS = ("busy_s", "step_time_s")  # a rank's own time per step, best first


@dataclass(frozen=True)
class Straggler:
    """A rank named as a straggler at the interval ending at `step`."""

    node: str
    rank: int
    step: int
    step_s: float  # the rank's own time per step in that interval
    median_s: float  # the median over all ranks in that interval
    intervals: int

    def message(self) -> str:
        """As an alert line of its host: `straggler: rank 3 ...`."""
        ratio = f"{self.step_s / self.median_s:.1f}x" if self.median_s > 0 else "above"
        return (f"straggler: rank {self.rank} takes {self.step_s:.3f} s a step, {ratio} the median "
                f"{self.median_s:.3f} s of all ranks, for {self.intervals} intervals in a row (to step {self.step})")


@dataclass
class SlowStreak:
    """One rank's run of slow intervals, and whether it was named in this run."""

    slow: int = 0
    named: bool = False


@dataclass(frozen=True)
class Sample:
    """One rank's own time per step in one interval."""

    node: str
    rank: int
    step_s: float


def rank_sample(node: str, record: dict[str, Any]) -> tuple[int, Sample] | None:
    """(step, the rank's sample) of a per-interval metrics record; None for other records."""
    rank, step = record.get("rank"), record.get("step")
    if record.get("final") or not isinstance(rank, int) or not isinstance(step, int):
        return None
    value = next((record[key] for key in TIME_KEYS if isinstance(record.get(key), int | float)), None)
    if value is None or isinstance(value, bool):
        return None
    return step, Sample(node, rank, float(value))


@dataclass
class Detector:
    """Names stragglers from every rank's metrics records, fed as they arrive (thread-safe).

    Args:
        world_size: Ranks expected per interval (an interval is judged once all reported); None:
            judged only when a later interval begins.
        factor: How many times the median counts as slow.
        intervals: Consecutive slow intervals before a rank is named.
    """

    world_size: int | None = None
    factor: float = SLOW_FACTOR
    intervals: int = SLOW_INTERVALS
    pending: dict[int, dict[int, Sample]] = field(default_factory=dict)
    judged: int = 0  # the last step judged
    streaks: dict[int, SlowStreak] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def observe(self, node: str, record: dict[str, Any]) -> list[Straggler]:
        """Take one metrics record of `node`; returns the stragglers it lets us name."""
        sample = rank_sample(node, record)
        if sample is None:
            return []
        step, value = sample
        with self.lock:
            if step <= self.judged:
                return []  # its interval was judged without it
            self.pending.setdefault(step, {})[value.rank] = value
            # A record of a later interval closes every earlier one, so intervals are judged in order.
            ready = [s for s in sorted(self.pending) if s < step or self._complete(s)]
            return [named for s in ready for named in self._judge(s, self.pending.pop(s))]

    def _complete(self, step: int) -> bool:
        return self.world_size is not None and len(self.pending[step]) >= self.world_size

    def _judge(self, step: int, samples: dict[int, Sample]) -> list[Straggler]:
        """Count each rank's interval as slow or not; the ranks whose run of slow ones names them now."""
        self.judged = step
        median = statistics.median(s.step_s for s in samples.values())
        named = []
        for rank, sample in samples.items():
            streak = self.streaks.setdefault(rank, SlowStreak())
            if sample.step_s <= self.factor * median:
                streak.slow, streak.named = 0, False
            else:
                streak.slow += 1
                if streak.slow >= self.intervals and not streak.named:
                    streak.named = True
                    named.append(Straggler(sample.node, rank, step, sample.step_s, median, streak.slow))
        for rank, streak in self.streaks.items():
            if rank not in samples:
                streak.slow = 0  # no evidence this interval: the run of slow ones starts again
        return named
