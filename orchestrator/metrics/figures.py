"""`JobFigures`: one job's figures at one moment, whether the live controller or a job directory's files
(`distrun metrics`) give them."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from orchestrator.store import JobDir, JobRecord
from orchestrator.telemetry.alerts import RULES, HostState
from orchestrator.telemetry.top import History

ALERT_KINDS = (*RULES, "other")


@dataclass(frozen=True)
class JobFigures:
    """One job's figures: the attempt's hosts' latest samples, every rank's latest metrics record,
    and what the job's record says (state, attempts, quarantined hosts, alerts).

    Attributes:
        state: A `JobState` value.
        attempt: The attempt running (1, 2, ...).
        hosts_lost: Attempts that ended with a host lost.
        ranks: Each rank's latest metrics record (`node`, `step`, `step_time_s`, `busy_s`, ...).
        throughput: The job's latest job-wide metrics record (rank 0's), None before one.
        progress: The job's progress from its ranks' Flight Recorders (`FlightProgress.to_dict`:
            `collectives_per_s`, and each rank's last completed collective in `ranks`).
    """

    job: str
    state: str
    attempt: int
    hosts: Sequence[HostState]
    hosts_lost: int = 0
    quarantined: Sequence[str] = ()
    alerts: Sequence[Any] = ()  # as the record keeps them: `Alert.record()` objects, an older one's sentences
    ranks: Mapping[int, Mapping[str, Any]] = field(default_factory=dict)
    throughput: Mapping[str, Any] | None = None
    progress: Mapping[str, Any] = field(default_factory=dict)


def hosts_lost(attempts: Sequence[Mapping[str, Any]]) -> int:
    """How many of the record's attempts ended with a lost host (`restarts.AttemptRecord.to_dict()`)."""
    return sum(1 for a in attempts if (a.get("failure") or {}).get("kind") in ("lost", "infra"))


def from_files(job_dir: JobDir, record: JobRecord) -> JobFigures:
    """A running job's figures from its job directory's telemetry and metrics files and its record,
    as `distrun top --json` reads them."""
    history = History(job_dir, record.hosts)
    try:
        history.poll()
    finally:
        history.close()
    hosts, throughput = history.aggregator.snapshot()
    ended = sum(1 for a in record.attempts if a.get("ended"))  # the running attempt is recorded when it ends
    return JobFigures(job=record.id, state=record.state.value, attempt=ended + 1,
                      hosts=hosts, hosts_lost=hosts_lost(record.attempts), quarantined=tuple(record.quarantined),
                      alerts=tuple(record.alerts), ranks=history.aggregator.rank_records(), throughput=throughput,
                      progress=record.progress)
