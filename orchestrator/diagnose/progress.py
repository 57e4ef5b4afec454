"""A job's progress from its ranks' Flight Recorders (the hosts' `fr` events, remote/frpoll.py), for a
program that prints no metrics lines: where every rank is, how fast the job goes, and its step.

Every host reads its ranks in rounds that fall on the wall clock's multiples of the poll period, and
each event carries its round's time (`at`): positions are compared only within one round (the latest
round every rank answered), so ranks in lock-step never show apart because their hosts were read at
different moments. A rank leaves its record as it ends (`final` events): a finished job's positions
are those. The rate shown while the job runs is over the last RATE_S seconds; a finished job's is the
whole run's, from the first collective entered to the last position. Where the sequence of
collectives repeats (the same ops, the same long gap between steps), its period is the step: "4
collectives a step, 6.8 steps/s".
"""

from __future__ import annotations

import itertools
import math
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from orchestrator.console.display import rank_ranges
from orchestrator.remote.frpoll import POLL_EVERY

RATE_S = 30.0  # the rate shown while the job runs is over this many seconds of rounds
ROUNDS_KEPT = 8  # rounds kept per rank, to find the latest one every rank answered
PATTERN_KEPT = 512  # collectives kept to find the step's period
MAX_PERIOD = 64  # the longest step (in collectives) looked for
GAP_FACTOR = 3.0  # a step's boundary: long gaps this many times the short ones, on the mean
STEP_SHARE = 0.8  # the steps of one length, of every run between two long gaps (noise gives no such share)


@dataclass
class FlightProgress:
    """The hosts' `fr` events, fed as they arrive: each rank's readings by round, when the first
    collective was entered, and one rank's recent collectives (op and entry time) for the step.

    Args:
        world_size: The job's ranks (None: those seen); a rank value outside it is not a rank.
    """

    world_size: int | None = None
    readings: dict[int, deque[tuple[int, float, int]]] = field(default_factory=dict)  # rank -> (round, at, done)
    final: dict[int, tuple[float, int]] = field(default_factory=dict)  # rank -> (at, done) it left as it ended
    first: tuple[float, int] | None = None  # (when, seq) of the earliest collective seen entered
    pattern: deque[tuple[int, str, float]] = field(default_factory=lambda: deque(maxlen=PATTERN_KEPT))
    seen: list[tuple[float, int]] = field(default_factory=list)  # (round's time, slowest position), RATE_S

    def observe(self, event: Mapping[str, Any], now: float) -> None:
        """Take one host's `fr` event, seen at `now` (wall seconds; the event's own `at` is preferred)."""
        at = event.get("at")
        at = float(at) if isinstance(at, int | float) and not isinstance(at, bool) else now
        final = set(event.get("final") or ()) if isinstance(event.get("final"), list) else set()
        for rank, summary in _ranks(event, self.world_size):
            done = summary.get("done")
            if isinstance(done, int) and not isinstance(done, bool):
                self._reading(rank, at, done, rank in final)
            self._collectives(rank, summary.get("c"))
        view = self.view()
        if view is not None:
            self.seen = [s for s in self.seen if s[0] >= view[0] - RATE_S and s[0] < view[0]] + [
                (view[0], min(view[1].values()))]

    def _reading(self, rank: int, at: float, done: int, final: bool) -> None:
        if final:
            self.final[rank] = (at, done)
            self.readings.pop(rank, None)
            return
        if rank in self.final and at > self.final[rank][0]:
            del self.final[rank]  # restarted (torchrun's restarts): it runs again
        kept = self.readings.setdefault(rank, deque(maxlen=ROUNDS_KEPT))
        key = round(at / POLL_EVERY)
        if kept and kept[-1][0] == key:
            kept.pop()
        kept.append((key, at, done))

    def _collectives(self, rank: int, collectives: object) -> None:
        """The earliest entry seen, and the lowest rank's collectives in order for the step's period."""
        if not isinstance(collectives, list):
            return
        for item in collectives:
            if not isinstance(item, list) or len(item) < 3 or not isinstance(item[0], int) \
                    or not isinstance(item[2], int | float) or item[2] <= 0:
                continue
            seq, op, t = item[0], str(item[1]), item[2] / 1e6
            if self.first is None or t < self.first[0]:
                self.first = (t, seq)
            if rank == min(self.readings, default=rank) and (not self.pattern or seq == self.pattern[-1][0] + 1):
                self.pattern.append((seq, op, t))
            elif rank == min(self.readings, default=rank) and seq > self.pattern[-1][0] + 1:
                self.pattern.clear()
                self.pattern.append((seq, op, t))

    def ranks(self) -> set[int]:
        return set(self.readings) | set(self.final)

    def view(self) -> tuple[float, dict[int, int]] | None:
        """(when, each rank's position) compared like with like: what every rank left as it ended where it
        did, else the latest round every rank answered, else each rank's latest reading (None: none yet)."""
        ranks = self.ranks()
        if not ranks:
            return None
        live = {rank: kept for rank, kept in self.readings.items() if rank not in self.final}
        common = set.intersection(*(set(k for k, _, _ in kept) for kept in live.values())) if live else set()
        positions = {rank: done for rank, (_, done) in self.final.items()}
        if live and common:
            key = max(common)
            for rank, kept in live.items():
                positions[rank] = next(done for k, _, done in kept if k == key)
            at = max(a for kept in live.values() for k, a, _ in kept if k == key)
        else:
            positions.update({rank: kept[-1][2] for rank, kept in live.items()})
            at = max([kept[-1][1] for kept in live.values()] + [a for a, _ in self.final.values()])
        return at, positions

    def rate(self) -> float | None:
        """Collectives completed per second over the last RATE_S seconds (None: not yet two rounds apart)."""
        if len(self.seen) < 2 or self.seen[-1][0] <= self.seen[0][0]:
            return None
        return (self.seen[-1][1] - self.seen[0][1]) / (self.seen[-1][0] - self.seen[0][0])

    def whole(self) -> tuple[float, float] | None:
        """(seconds, collectives per second) from the first collective entered to the positions now."""
        view = self.view()
        if view is None or self.first is None or view[0] <= self.first[0]:
            return None
        done = min(view[1].values()) - (self.first[1] - 1)
        return view[0] - self.first[0], max(0, done) / (view[0] - self.first[0])

    def to_dict(self, ended: bool = False) -> dict[str, Any]:
        """`{"collectives_per_s", "collectives", "ranks": {rank: last completed}, "at", "seconds",
        "mean_collectives_per_s", "step": {"collectives", "steps_per_s"}}` for `ps`, `top` and the
        record; `ended`: a finished job's, whose rate is the whole run's."""
        view = self.view()
        rate, whole = self.rate(), self.whole()
        found: dict[str, Any] = {"collectives_per_s": None if rate is None else round(rate, 2),
                                 "collectives": min(view[1].values()) if view else 0,
                                 "ranks": {str(rank): seq for rank, seq in sorted(view[1].items())} if view else {}}
        if view is not None:
            found["at"] = round(view[0], 3)
        if whole is not None:
            found["seconds"], found["mean_collectives_per_s"] = round(whole[0], 1), round(whole[1], 2)
            if ended:
                found["collectives_per_s"] = found["mean_collectives_per_s"]
        period = step_period([(op, t) for _, op, t in self.pattern])
        rate_now = found["collectives_per_s"]
        if period and isinstance(rate_now, int | float) and rate_now > 0:
            found["step"] = {"collectives": period, "steps_per_s": round(rate_now / period, 2)}
        return found


def step_period(collectives: Sequence[tuple[str, float]]) -> int | None:
    """The step of a run of consecutive collectives ((op, entry time) in order): where the gaps between
    them fall in two kinds, short (within a step) and long (the next step's compute, GAP_FACTOR times
    longer at least), the number of collectives between two long gaps that most steps have (an epoch's
    own collective now and then aside); else the shortest period with which a mix of ops repeats
    exactly (that may be an epoch's). None when neither shows (every gap alike, one op)."""
    if len(collectives) < 16:
        return None
    gaps = [b - a for (_, a), (_, b) in itertools.pairwise(collectives)]
    threshold = _long_gap(gaps)
    if threshold is not None:
        lengths, length = [], 1
        for gap in gaps:
            if gap >= threshold:
                lengths.append(length)
                length = 0
            length += 1
        common = max(set(lengths), key=lengths.count) if lengths else 0
        if common and lengths.count(common) >= STEP_SHARE * len(lengths):
            return common
    ops = [op for op, _ in collectives]
    return next((period for period in range(2, min(MAX_PERIOD, len(ops) // 4) + 1)
                 if len(set(ops[:period])) > 1 and all(ops[i] == ops[i + period] for i in range(len(ops) - period))),
                None)


def _long_gap(gaps: Sequence[float]) -> float | None:
    """The shortest long gap where the gaps fall in two kinds (their logarithms split where the two
    kinds' means lie furthest apart for their sizes, Otsu's rule), each a tenth of them at least and
    the long ones' mean GAP_FACTOR times the short ones'; None where they do not."""
    logs = sorted(math.log(max(gap, 1e-6)) for gap in gaps)
    total, count, best = sum(logs), len(logs), None
    prefix = list(itertools.accumulate(logs, initial=0.0))
    for cut in range(max(1, count // 10), count - count // 10):
        short, long = prefix[cut] / cut, (total - prefix[cut]) / (count - cut)
        spread = cut * (count - cut) * (long - short) ** 2
        if best is None or spread > best[0]:
            best = (spread, cut, long - short)
    if best is None or best[2] < math.log(GAP_FACTOR):
        return None
    return math.exp(logs[best[1]])


def progress_line(progress: Mapping[str, Any]) -> str:
    """`12.5 collectives/s, ranks at #4501 (0-5)`, with the step where it shows (`4 collectives a step,
    3.1 steps/s`): a job's progress as its Flight Recorders tell."""
    at: dict[int, list[int]] = {}
    for rank, seq in (progress.get("ranks") or {}).items():
        at.setdefault(int(seq), []).append(int(rank))
    rate = progress.get("collectives_per_s")
    positions = ", ".join(f"#{seq} ({rank_ranges(sorted(ranks))})" for seq, ranks in sorted(at.items()))
    said = f"{rate:.1f} collectives/s" if isinstance(rate, int | float) else "collectives"
    step = progress.get("step") or {}
    if step.get("collectives") and step.get("steps_per_s"):
        said += f" ({step['collectives']} a step, {step['steps_per_s']:.1f} steps/s)"
    return f"{said}, ranks at {positions}" if positions else said


def progress_lines(progress: Mapping[str, Any], metrics: Mapping[str, Any] | None) -> list[str]:
    """The summary's line of the ranks' progress from their Flight Recorders, for a job whose metrics
    lines told none: `progress: 6.8 collectives/s (4 a step, 1.7 steps/s), ranks at #1201 (0-5) (1201
    collectives completed in 176 s)`."""
    if metrics or not progress.get("ranks"):
        return []
    seconds = progress.get("seconds")
    span = f" in {seconds:.0f} s" if isinstance(seconds, int | float) else ""
    return [f"  progress: {progress_line(progress)} ({progress.get('collectives', 0)} collectives completed{span})"]


def _ranks(event: Mapping[str, Any], world_size: int | None) -> list[tuple[int, dict[str, Any]]]:
    """(rank, its summary) of an `fr` event; malformed ones and ranks not of the job left out."""
    ranks = event.get("ranks")
    if not isinstance(ranks, dict):
        return []
    return [(int(rank), summary) for rank, summary in ranks.items()
            if str(rank).isdigit() and isinstance(summary, dict)
            and (world_size is None or int(rank) < world_size)]
