"""Recorded jobs and their backends: the backend a record ran on (`for_record`), `distrun stop`
of a recorded job with the end it records (`stop`), and the `ps` settlement of unfinished
records whose job no longer runs (`refresh_lost`). The backends say what happened; this records it."""

from __future__ import annotations

import time
from dataclasses import fields

from orchestrator import backends, registry
from orchestrator.backends.base import Backend, Stopped
from orchestrator.errors import UsageError
from orchestrator.store import JobRecord, JobState, Store


def for_record(store: Store, record: JobRecord) -> Backend:
    """The backend a recorded job ran on, ready for per-job operations.

    Raises:
        UsageError: the record names a backend this distrun does not have.
    """
    if registry.target(record.backend) is None:
        raise UsageError(f"job {record.id} ran on backend {record.backend!r}, which this distrun does not have "
                         f"(it has {', '.join(registry.names())})")
    return backends.get(record.backend)(store.job_dir)


def stop(store: Store, record: JobRecord) -> Stopped:
    """Stop a recorded job through its backend (`stop_job`, which reads the record as it is now to
    see a live controller record the end); the end the backend settled on is recorded when no
    controller recorded one (the record is still pending, running or lost).

    Raises:
        UsageError: the record's backend is unknown, or cannot stop the job yet.
    """
    stopped = for_record(store, record).stop_job(record, lambda: store.get(record.id))
    settled = stopped.settled
    if settled is not None:
        extra = {"detail": settled.detail} if settled.detail else {}
        if settled.exit_code is not None:
            extra["exit_code"] = settled.exit_code
        store.settle_lost(record.id, settled.state, ended=time.time(), **extra)
    return stopped


def refresh_lost(store: Store, records: list[JobRecord]) -> None:
    """Settle the records of unfinished jobs that no longer run (`job_alive` says), in place.

    The end a controller wrote into the job's directory when the database could not take it
    (`Store.end`) comes first; else the backend tells how the job ended (`ended_as`: `lost`
    when nothing knows). A record that ended meanwhile is never overwritten (`Store.update`
    sets a state only on an unfinished record); each record is read back as it is now.
    """
    for record in records:
        if record.state.finished:
            continue
        try:
            backend = for_record(store, record)
            if backend.job_alive(record):
                continue
            settled = backend.ended_as(record)
        except UsageError:
            continue  # a backend this distrun does not know: leave its record as it is
        written = store.recorded_end(record.id)
        if written is not None:
            store.update(record.id, **{**written, "state": JobState(written["state"])})
        else:
            extra = {"detail": settled.detail} if settled.detail else {}
            if settled.exit_code is not None:
                extra["exit_code"] = settled.exit_code
            store.update(record.id, state=settled.state, **extra)
        fresh = store.get(record.id)
        for item in fields(record):
            setattr(record, item.name, getattr(fresh, item.name))
