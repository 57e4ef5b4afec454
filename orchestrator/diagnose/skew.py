"""The arrival skew of a job's collectives: for each collective every rank entered, how long after the
first rank the last one entered it, and which rank that was (the one the others waited for), kept as a
Prometheus histogram (`distrun_collective_arrival_skew_seconds`) and a count per rank, so a dashboard
shows a straggler growing before its alert fires."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)  # seconds; then +Inf


@dataclass
class Skew:
    """The skew histogram and the last ranks, fed one complete collective at a time."""

    counts: list[int] = field(default_factory=lambda: [0] * (len(BUCKETS) + 1))  # per bucket, not cumulative
    total: float = 0.0
    last: dict[tuple[str, int], int] = field(default_factory=dict)  # (node, rank) -> collectives it entered last

    def add(self, entries: dict[int, tuple[str, str, float]]) -> None:
        """One collective: each rank's (node, op, entry time in seconds)."""
        if len(entries) < 2:
            return
        first = min(t for _, _, t in entries.values())
        rank, (node, _, t) = max(entries.items(), key=lambda item: item[1][2])
        skew = max(0.0, t - first)
        self.counts[next((i for i, le in enumerate(BUCKETS) if skew <= le), len(BUCKETS))] += 1
        self.total += skew
        self.last[(node, rank)] = self.last.get((node, rank), 0) + 1

    def to_dict(self) -> dict[str, Any]:
        """{"buckets": [[le, cumulative count], ..., ["+Inf", count]], "sum_s", "count", "last": [[node,
        rank, collectives], ...]}, as the record's progress keeps it (`skew`)."""
        cumulative, running = [], 0
        for le, count in zip([*BUCKETS, "+Inf"], self.counts, strict=True):
            running += count
            cumulative.append([le, running])
        last = sorted(self.last.items(), key=lambda item: item[0][1])
        return {"buckets": cumulative, "sum_s": round(self.total, 6), "count": running,
                "last": [[node, rank, count] for (node, rank), count in last]}
