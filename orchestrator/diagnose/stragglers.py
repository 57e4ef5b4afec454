"""Stragglers: a rank whose own step time stays well above the other ranks', or that enters the
collectives last, by a margin, interval after interval (from the ranks' Flight Recorders, below).

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

from orchestrator.diagnose.skew import Skew

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

    def figures(self) -> dict[str, Any]:
        """What the rule measured, for the alert's record."""
        return {"step_s": round(self.step_s, 4), "median_s": round(self.median_s, 4), "step": self.step,
                "intervals": self.intervals}

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
        if sample is None or (self.world_size is not None and not 0 <= sample[1].rank < self.world_size):
            return []  # a rank value not of the job is not a rank
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
        # Only ranks in a run of slow intervals keep a streak: a rank without evidence this interval
        # starts again, so each interval costs its own ranks, never every rank ever seen.
        kept = {}
        for rank, streak in self.streaks.items():
            if rank not in samples:
                streak.slow = 0  # no evidence this interval: the run of slow ones starts again
            if streak.slow or streak.named:
                kept[rank] = streak
        self.streaks = kept
        return named


# ---------------------------------------------------------------- from the ranks' Flight Recorders

LATE_MARGIN_S = 0.05  # a rank that enters a collective this much after the median rank is late in it
LATE_SHARE = 0.25  # a rank late in this share of an interval's collectives is late in the interval,
LATE_TIME_SHARE = 0.1  # or whose lateness (past the margin) adds up to this share of the interval's time
WINDOW_S = 5.0  # the collectives of one interval span this much time (of their median entry)
WINDOW_MAX = 500  # or this many collectives, whichever comes first
FLIGHT_INTERVALS = 3  # consecutive late intervals before a rank is named
OUTLIER = 3.0  # a late rank is late this many times more than any other rank of the interval


@dataclass(frozen=True)
class LateRank:
    """A rank named as a straggler from the times it entered the collectives (its Flight Recorder)."""

    node: str
    rank: int
    late_s: float  # the median, over the collectives it was late in, of how long after the median rank it entered
    op: str  # the op it entered late most often ("all_reduce")
    late: int  # collectives it entered late in its late intervals
    collectives: int  # collectives of those intervals
    intervals: int

    def figures(self) -> dict[str, Any]:
        """What the rule measured, for the alert's record."""
        return {"late_ms": round(self.late_s * 1000, 1), "op": self.op, "late": self.late,
                "collectives": self.collectives, "intervals": self.intervals}

    def message(self, evidence: str = "") -> str:
        """As an alert line of its host: `straggler: rank 4 on node2 enters all_reduce 180 ms after ...`."""
        said = (f"straggler: rank {self.rank} on {self.node} enters {self.op} {self.late_s * 1000:.0f} ms after "
                f"the others (median over the {self.late} of {self.collectives} collectives it entered late, "
                f"{self.intervals} intervals in a row)")
        return f"{said}; {evidence}" if evidence else said


@dataclass
class LateStreak:
    """One rank's run of late intervals: how late it entered the collectives it was late in, and their ops."""

    late: list[float] = field(default_factory=list)
    ops: list[str] = field(default_factory=list)
    collectives: int = 0
    intervals: int = 0
    named: bool = False


@dataclass
class FlightDetector:
    """Names stragglers from the `fr` events of the hosts (remote/frpoll.py), fed as they arrive.

    A collective is judged once every rank reported entering it: each rank's lateness is its entry
    time less the median rank's (hosts' clocks are assumed in step, as NTP keeps them, well within
    the margin). In a collective the slow rank enters last and the others wait for it. torch records
    time_created_ns when the rank calls the collective; gloo leaves the started and completed times
    0, so entry is what every backend has. The collectives judged together span WINDOW_S; a rank
    that entered at least LATE_SHARE of them over `margin` late is late in that interval (a step's
    later collectives follow its first at once: only the first may show the wait), and so is one
    whose late entries kept the others waiting LATE_TIME_SHARE of the interval's time (a host
    whose CPU comes in slices, as a CPU quota gives it, is late only where a slice ended between
    two collectives, which in a job of many short steps is a few of them, each by much). Either holds
    only where the rank is OUTLIER times later than any other rank of the interval: on a loaded host
    every rank is late now and then, a straggler nearly always. It is named after `intervals` late
    intervals in a row, once per run of them. A collective a rank will never report (it reported
    later ones) is passed over. A rank held inside its collectives, which enters them on time, is
    diagnose/held.py's.

    Args:
        world_size: The job's ranks (a collective is judged when all of them entered it).
    """

    world_size: int
    margin: float = LATE_MARGIN_S
    intervals: int = FLIGHT_INTERVALS
    entered: dict[int, dict[int, tuple[str, str, float]]] = field(default_factory=dict)  # seq -> rank -> entry
    window: list[dict[int, tuple[str, str, float]]] = field(default_factory=list)
    judged: int = 0  # the last collective judged
    streaks: dict[int, LateStreak] = field(default_factory=dict)
    latest: dict[int, int] = field(default_factory=dict)  # rank -> the latest collective it reported
    skew: Skew = field(default_factory=Skew)  # every judged collective's arrival skew
    lock: threading.Lock = field(default_factory=threading.Lock)

    def observe(self, node: str, event: dict[str, Any]) -> list[LateRank]:
        """Take one host's `fr` event; returns the ranks it lets us name."""
        with self.lock:
            for rank, summary in _ranks(event):
                if rank >= self.world_size:
                    continue  # a rank value not of the job is not a rank
                for seq, op, entered_us, *_ in summary.get("c") or ():
                    if isinstance(seq, int) and seq > self.judged and isinstance(entered_us, int | float):
                        self.entered.setdefault(seq, {})[rank] = (node, str(op), entered_us / 1e6)
                        self.latest[rank] = max(self.latest.get(rank, 0), seq)
            return self._judge_ready()

    def _judge_ready(self) -> list[LateRank]:
        """Judge the collectives every rank reported, in order; one that a rank will never report (it
        reported later ones: its entry fell out of an event) is passed over, never waited for."""
        named = []
        for seq in sorted(self.entered):
            if len(self.entered[seq]) < self.world_size:
                if any(self.latest.get(rank, 0) <= seq for rank in range(self.world_size) if rank not in
                       self.entered[seq]):
                    break  # judged in order: a later one waits for this one
                del self.entered[seq]
                continue
            self.window.append(self.entered.pop(seq))
            self.skew.add(self.window[-1])
            self.judged = seq
            if _middle(self.window[-1]) - _middle(self.window[0]) >= WINDOW_S or len(self.window) >= WINDOW_MAX:
                named += self._judge(self.window)
                self.window = []
        return named

    def _judge(self, window: list[dict[int, tuple[str, str, float]]]) -> list[LateRank]:
        """Count each rank's interval as late or not; the ranks whose run of late ones names them now."""
        late: dict[int, list[tuple[float, str]]] = {}
        for entries in window:
            middle = _middle(entries)
            for rank, (_, op, t) in entries.items():
                if t - middle > self.margin:
                    late.setdefault(rank, []).append((t - middle, op))
        span = _middle(window[-1]) - _middle(window[0])
        named = []
        for rank in window[-1]:
            found = late.get(rank, [])
            if not self._late_in(rank, late, len(window), span):
                self.streaks[rank] = LateStreak()
                continue
            streak = self.streaks.setdefault(rank, LateStreak())
            if streak.named:
                continue  # named once for this run of late intervals
            streak.late += [value for value, _ in found]
            streak.ops += [op for _, op in found]
            streak.collectives += len(window)
            streak.intervals += 1
            if streak.intervals >= self.intervals:
                streak.named = True
                op = max(set(streak.ops), key=streak.ops.count)
                named.append(LateRank(window[-1][rank][0], rank, statistics.median(streak.late), op,
                                      len(streak.late), streak.collectives, streak.intervals))
        return named


    def _late_in(self, rank: int, late: dict[int, list[tuple[float, str]]], collectives: int, span: float) -> bool:
        """Whether `rank` was late in the interval: in LATE_SHARE of its collectives, or keeping the others
        waiting LATE_TIME_SHARE of its time, and in that OUTLIER times what any other rank was (the margin
        held against what the job's lateness already varies by: on a loaded host every rank is late now
        and then, the straggler nearly always)."""
        count, waited = len(late.get(rank, ())), sum(value for value, _ in late.get(rank, ()))
        others = [found for other, found in late.items() if other != rank]
        most = max((len(found) for found in others), default=0)
        longest = max((sum(value for value, _ in found) for found in others), default=0.0)
        return (count >= LATE_SHARE * collectives and count >= OUTLIER * most) or (
            waited >= LATE_TIME_SHARE * span and waited >= OUTLIER * longest)


def _ranks(event: dict[str, Any]) -> list[tuple[int, dict[str, Any]]]:
    """(rank, its summary) of an `fr` event, malformed ones left out."""
    ranks = event.get("ranks")
    if not isinstance(ranks, dict):
        return []
    return [(int(rank), summary) for rank, summary in ranks.items()
            if str(rank).isdigit() and isinstance(summary, dict)]


def _middle(entries: dict[int, tuple[str, str, float]]) -> float:
    """When the median rank entered a collective."""
    return statistics.median(t for _, _, t in entries.values())
