"""A job's collectives on one clock, from what its hosts' Flight Recorder rounds left in
collectives.jsonl (store.py `JobDir.collectives`): each rank's collectives with the time it entered
them, where each one ended at the earliest, how late each rank entered, and the job's progress read
by read. Pure over the file's rows; the trace (trace.py) and the report's plots read the result.

A row is {"t": the controller's time of the round, "node", "ranks": {"<rank>": {"done", "entered",
"c": [[seq, op, entered_us, ...], ...]}}, "skipped": {"<rank>": why}}; elements after the third of a
collective are kept, not read. Gloo records no completion time, so a collective's slice ends when
the last rank of the job entered it (`Collective.end_us`): no rank can leave a collective before
every rank has entered it, so the time a rank waited for the others is exact and what the transfer
took after the last one came is not drawn. docs/trace.md says so for the reader.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

STEP_PERIODS = range(1, 65)  # the step periods (collectives a step) looked for
STEP_MATCH = 0.95  # the share of the sequence a period must repeat to be the step's
SKEW_SHIFTED_S = 1.0  # a host whose clock is further off the controller's than this is shifted onto it


@dataclass(frozen=True)
class Collective:
    """One collective as one rank entered it.

    Attributes:
        entered_us: The rank's host's wall clock when it entered (µs since the epoch).
        end_us: When the last rank of the job that recorded it entered it (the earliest it can
            have completed); None until `Timeline` placed it.
        late_us: How long after the first rank it entered (0 for the first).
        ranks_seen: How many ranks' records hold this collective.
        completed: Whether the rank's last read showed it completed.
        extra: The record's elements after the third, as they came.
    """

    rank: int
    seq: int
    op: str
    entered_us: int
    end_us: int | None = None
    late_us: int = 0
    ranks_seen: int = 1
    completed: bool = True
    extra: tuple[Any, ...] = ()


@dataclass(frozen=True)
class Read:
    """One rank's position at one round: the controller's time, last completed and last entered."""

    t: float
    rank: int
    done: int
    entered: int


@dataclass
class Rounds:
    """What collectives.jsonl holds, by rank (`read_rounds`)."""

    collectives: dict[int, dict[int, Collective]] = field(default_factory=dict)  # rank -> seq -> collective
    nodes: dict[int, str] = field(default_factory=dict)  # rank -> its host
    reads: list[Read] = field(default_factory=list)
    skipped: dict[int, str] = field(default_factory=dict)  # rank -> why its last round skipped it

    @property
    def empty(self) -> bool:
        return not any(self.collectives.values())


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _collective(rank: int, raw: Any) -> Collective | None:
    """`[seq, op, entered_us, ...]` as a Collective, or None when it is not one."""
    if not isinstance(raw, list | tuple) or len(raw) < 3:
        return None
    seq, entered = _int(raw[0]), _int(raw[2])
    if seq is None or entered is None or seq <= 0 or entered <= 0:
        return None
    return Collective(rank, seq, str(raw[1]), entered, extra=tuple(raw[3:]))


def _take_rank(rounds: Rounds, t: float, node: str, rank: int, data: Mapping[str, Any]) -> None:
    rounds.nodes[rank] = node
    rounds.skipped.pop(rank, None)
    kept = rounds.collectives.setdefault(rank, {})
    for raw in data.get("c") or ():
        collective = _collective(rank, raw)
        if collective is not None:
            kept[collective.seq] = collective
    rounds.reads.append(Read(t, rank, _int(data.get("done")) or 0, _int(data.get("entered")) or 0))


def read_rounds(rows: Iterable[Mapping[str, Any]]) -> Rounds:
    """Every rank's collectives and reads from collectives.jsonl's rows; rows or parts of rows that
    are not what the file holds are passed over."""
    rounds = Rounds()
    for row in rows:
        t, node = row.get("t"), str(row.get("node") or "?")
        if not isinstance(t, int | float) or isinstance(t, bool):
            continue
        ranks = row.get("ranks") if isinstance(row.get("ranks"), dict) else {}
        for key, data in ranks.items():
            if str(key).isdigit() and isinstance(data, dict):
                _take_rank(rounds, float(t), node, int(key), data)
        skipped = row.get("skipped") if isinstance(row.get("skipped"), dict) else {}
        for key, why in skipped.items():
            if str(key).isdigit():
                rounds.nodes.setdefault(int(key), node)
                rounds.skipped[int(key)] = str(why)
    return rounds


def clock_shifts(facts: Mapping[str, Any]) -> dict[str, int]:
    """µs to add to a host's clock to put it on the controller's, for hosts whose probe found it off
    by more than SKEW_SHIFTED_S (facts.json's `clock_skew`; nearer than that, the probe's own latency
    is as large as the skew it measures)."""
    shifts = {}
    for node, data in facts.items():
        skew = data.get("clock_skew") if isinstance(data, dict) else None
        if isinstance(skew, int | float) and abs(skew) > SKEW_SHIFTED_S:
            shifts[node] = -int(skew * 1e6)
    return shifts


def shifted(rounds: Rounds, shifts: Mapping[str, int]) -> Rounds:
    """The rounds with each collective's entry on the controller's clock where its host's is off."""
    for rank, kept in rounds.collectives.items():
        shift = shifts.get(rounds.nodes.get(rank, ""), 0)
        if shift:
            rounds.collectives[rank] = {seq: replace(c, entered_us=c.entered_us + shift) for seq, c in kept.items()}
    return rounds


@dataclass(frozen=True)
class Timeline:
    """Every rank's collectives placed on one clock (`place`)."""

    ranks: dict[int, list[Collective]]  # rank -> its collectives in sequence order
    nodes: dict[int, str]
    reads: list[Read]
    skipped: dict[int, str]
    last_read_us: int  # the last round's time: where a collective not completed when read ends

    def first_us(self) -> int | None:
        starts = [c[0].entered_us for c in self.ranks.values() if c]
        return min(starts) if starts else None


def _last_done(reads: list[Read]) -> dict[int, int]:
    done: dict[int, int] = {}
    for read in reads:
        done[read.rank] = max(done.get(read.rank, 0), read.done)
    return done


def place(rounds: Rounds) -> Timeline:
    """Each collective's end (the last rank's entry), lateness (after the first rank's entry) and
    whether it completed; one not completed by the rank's last read ends at that read."""
    first: dict[int, int] = {}
    last: dict[int, int] = {}
    seen: dict[int, int] = {}
    for kept in rounds.collectives.values():
        for seq, c in kept.items():
            first[seq] = min(first.get(seq, c.entered_us), c.entered_us)
            last[seq] = max(last.get(seq, c.entered_us), c.entered_us)
            seen[seq] = seen.get(seq, 0) + 1
    last_read_us = int(max((r.t for r in rounds.reads), default=0.0) * 1e6)
    done = _last_done(rounds.reads)
    placed: dict[int, list[Collective]] = {}
    for rank, kept in sorted(rounds.collectives.items()):
        row = []
        for seq in sorted(kept):
            c = kept[seq]
            completed = seq <= done.get(rank, 0)
            end = last[seq] if completed else max(last_read_us, c.entered_us)
            row.append(Collective(rank, seq, c.op, c.entered_us, max(end, c.entered_us), c.entered_us - first[seq],
                                  seen[seq], completed, c.extra))
        placed[rank] = row
    return Timeline(placed, dict(rounds.nodes), list(rounds.reads), dict(rounds.skipped), last_read_us)


# ---------------------------------------------------------------- progress


def progress_points(reads: list[Read]) -> list[tuple[float, int]]:
    """(time, collectives every rank had completed by then) after each round (the reads of one
    time): each rank's latest read, the least of them."""
    latest: dict[int, int] = {}
    points: list[tuple[float, int]] = []
    for read in sorted(reads, key=lambda r: r.t):
        latest[read.rank] = max(latest.get(read.rank, 0), read.done)
        point = (read.t, min(latest.values()))
        if points and points[-1][0] == read.t:
            points[-1] = point
        else:
            points.append(point)
    return points


def rate_series(reads: list[Read]) -> list[tuple[float, float]]:
    """Collectives every rank completed per second over time, between rounds at least a second apart."""
    series: list[tuple[float, float]] = []
    last: tuple[float, int] | None = None
    for t, done in progress_points(reads):
        if last is None or t - last[0] >= 1.0:
            if last is not None:
                series.append((t, (done - last[1]) / (t - last[0])))
            last = (t, done)
    return series


def step_period(ops: list[str]) -> int | None:
    """The fewest collectives after which the sequence of ops repeats (a training step's
    collectives), or None when no period up to 64 repeats STEP_MATCH of a long enough sequence."""
    for period in STEP_PERIODS:
        pairs = len(ops) - period
        if pairs < 3 * period:
            return None
        same = sum(ops[i] == ops[i + period] for i in range(pairs))
        if same >= STEP_MATCH * pairs:
            return period
    return None


def contiguous_ops(collectives: list[Collective]) -> list[str]:
    """The ops of the longest run of consecutive sequence ids among a rank's recorded collectives
    (a round keeps only the latest of what a rank entered since the last)."""
    best = (0, 0)
    start = 0
    for i in range(1, len(collectives) + 1):
        if i == len(collectives) or collectives[i].seq != collectives[i - 1].seq + 1:
            best = max(best, (i - start, start))
            start = i
    length, begin = best
    return [c.op for c in collectives[begin:begin + length]]
