"""What happened to a job, as timed events from its record: alerts (read back as telemetry/alerts.py
reads them: the fields of an alert kept as data, or the sentence an older distrun kept), failures,
and each attempt's start and end (restarts)."""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from orchestrator.diagnose.failures import Failure
from orchestrator.store import JobRecord
from orchestrator.telemetry.alerts import recorded

DAY_S = 86400.0


@dataclass(frozen=True)
class JobEvent:
    """One thing that happened at a time: kind is an alert's rule, `failure` or `attempt`."""

    t: float
    kind: str
    text: str
    node: str = ""
    rank: int | None = None
    args: dict[str, Any] = field(default_factory=dict)


def clock_time(stamp: str, near: float) -> float | None:
    """`HH:MM:SS` (local time) as seconds since the epoch: the one within a day after `near`."""
    parts = stamp.split(":")
    if len(parts) != 3 or not all(p.isdigit() for p in parts):
        return None
    day = time.localtime(near)
    at = time.mktime((day.tm_year, day.tm_mon, day.tm_mday, int(parts[0]), int(parts[1]), int(parts[2]), 0, 0, -1))
    return at + DAY_S if at < near - 1.0 else at


def alert_event(alert: Any, started: float) -> JobEvent | None:
    """An alert of the record, as telemetry/alerts.py reads one back (its fields, or an older
    `HH:MM:SS node: message`, dated on the day of the job's start); None when it has no time."""
    if not isinstance(alert, Mapping | str):
        return None
    found = recorded(alert)
    t = found.t or (clock_time(found.stamp, started) if found.stamp else None)
    if not t:
        return None
    return JobEvent(t, found.rule, found.message, found.node, found.rank,
                    {"figures": found.figures} if isinstance(alert, Mapping) else {})


def failure_event(failure: Failure) -> JobEvent:
    return JobEvent(failure.time, "failure", f"failure: {failure.brief()}", failure.host, failure.rank)


def attempt_events(attempts: list[dict[str, Any]]) -> list[JobEvent]:
    """Each attempt's start and, when it ended, its end with its state (a restart is attempt 2 on)."""
    events = []
    for attempt in attempts:
        number, hosts = attempt.get("number"), ",".join(map(str, attempt.get("hosts") or ()))
        if isinstance(attempt.get("started"), int | float):
            word = "restart: attempt" if isinstance(number, int) and number > 1 else "attempt"
            events.append(JobEvent(float(attempt["started"]), "attempt", f"{word} {number} started on {hosts}"))
        if isinstance(attempt.get("ended"), int | float):
            events.append(JobEvent(float(attempt["ended"]), "attempt",
                                   f"attempt {number} ended: {attempt.get('state') or '?'}"))
    return events


def job_events(record: JobRecord) -> tuple[list[JobEvent], list[Failure]]:
    """Every timed event of the record in time order, and its failures (the root cause first)."""
    failures = []
    for data in record.failures:
        try:
            failures.append(Failure.from_dict(data))
        except (ValueError, TypeError, KeyError):
            continue
    alerts = [e for a in record.alerts if (e := alert_event(a, record.started)) is not None]
    events = alerts + [failure_event(f) for f in failures if f.time > 0] + attempt_events(record.attempts)
    return sorted(events, key=lambda e: e.t), failures
