"""The report's figures of a run that need nothing from the program: wall time, the collectives its
ranks completed and their rate, the step (the period of the collective sequence) and its rate, the
rate over time, each rank's lateness over time, and the alerts, stalls and attempts on the same axis;
from the job's record and collectives.jsonl (timeline.py), pure."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

from orchestrator.report.events import JobEvent, job_events
from orchestrator.report.numbers import JobData
from orchestrator.report.sources import missing_lines, plan_ranks
from orchestrator.report.timeline import (
    Timeline,
    clock_shifts,
    contiguous_ops,
    place,
    rate_series,
    read_rounds,
    shifted,
    step_period,
)
from orchestrator.store import JobDir, JobState

HEAT_BINS = 60  # time columns of the lateness heat map
Grid = list[list[float]]  # rank row -> time column -> mean ms late (nan: no collective there)


@dataclass(frozen=True)
class RunFigures:
    """One job's run as its ranks' Flight Recorders and its record tell it; times are seconds since
    the job started."""

    job_id: str
    wall_s: float
    running: bool
    collectives: int | None
    rate: float | None
    period: int | None
    rate_series: list[tuple[float, float]] = field(default_factory=list)
    heat: Grid = field(default_factory=list)
    heat_span: tuple[float, float] = (0.0, 0.0)
    ranks: list[int] = field(default_factory=list)
    nodes: dict[int, str] = field(default_factory=dict)
    events: list[JobEvent] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)

    @property
    def steps_per_s(self) -> float | None:
        return self.rate / self.period if self.rate is not None and self.period else None


def whole_rate(timeline: Timeline) -> float | None:
    """Collectives per second over the run: from the first to the last collective that a rank's
    records hold, counted by sequence id (so gaps in what was kept do not count against it)."""
    longest = max(timeline.ranks.values(), key=len, default=[])
    if len(longest) < 2:
        return None
    first, last = longest[0], longest[-1]
    seconds = (last.entered_us - first.entered_us) / 1e6
    return (last.seq - first.seq) / seconds if seconds > 0 else None


def completed(timeline: Timeline) -> int | None:
    """The collectives every rank read had completed by its last read."""
    done: dict[int, int] = {}
    for read in timeline.reads:
        done[read.rank] = max(done.get(read.rank, 0), read.done)
    return min(done.values()) if done else None


def lateness_grid(timeline: Timeline, start: float) -> tuple[Grid, tuple[float, float], list[int]]:
    """Each rank's mean lateness at entry (ms) in HEAT_BINS columns from its first to last collective."""
    every = [c for row in timeline.ranks.values() for c in row]
    ranks = sorted(r for r, row in timeline.ranks.items() if row)
    if not every:
        return [], (0.0, 0.0), []
    first = min(c.entered_us for c in every) / 1e6 - start
    last = max(c.entered_us for c in every) / 1e6 - start
    width = max(last - first, 1e-6) / HEAT_BINS
    sums = {r: [0.0] * HEAT_BINS for r in ranks}
    counts = {r: [0] * HEAT_BINS for r in ranks}
    for c in every:
        column = min(int((c.entered_us / 1e6 - start - first) / width), HEAT_BINS - 1)
        sums[c.rank][column] += c.late_us / 1000
        counts[c.rank][column] += 1
    grid = [[s / n if n else math.nan for s, n in zip(sums[r], counts[r], strict=True)] for r in ranks]
    return grid, (first, last), ranks


def best_period(timeline: Timeline) -> int | None:
    """The step period of the longest unbroken run of collectives any rank's records hold."""
    ops = max((contiguous_ops(row) for row in timeline.ranks.values()), key=len, default=[])
    return step_period(ops)


def run_figures(data: JobData, job_dir: JobDir) -> RunFigures:
    """The run's figures for the report."""
    record = data.record
    timeline = place(shifted(read_rounds(data.collectives), clock_shifts(data.facts)))
    start = record.started
    running = record.state in (JobState.PENDING, JobState.RUNNING, JobState.STALLED)
    wall = (time.time() if running or record.ended is None else record.ended) - start
    events, _ = job_events(record)
    grid, span, ranks = lateness_grid(timeline, start)
    ranks_by_plan = plan_ranks(data.plan, timeline)
    return RunFigures(
        job_id=record.id, wall_s=wall, running=running, collectives=completed(timeline), rate=whole_rate(timeline),
        period=best_period(timeline), rate_series=[(t - start, r) for t, r in rate_series(timeline.reads)],
        heat=grid, heat_span=span, ranks=ranks, nodes=ranks_by_plan,
        events=[JobEvent(e.t - start, e.kind, e.text, e.node, e.rank, e.args) for e in events],
        missing=missing_lines(record, job_dir, data.plan, timeline, ranks_by_plan))
