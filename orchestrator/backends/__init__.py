"""Backends by name (ssh, local, slurm), imported lazily; what the CLI calls to launch and stop."""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Protocol

from orchestrator.store import JobRecord, JobState, Store, controller_alive

BACKENDS = {"ssh": "orchestrator.backends.ssh", "local": "orchestrator.backends.ssh",
            "slurm": "orchestrator.backends.slurm"}


@dataclass
class LaunchRequest:
    """Everything `distrun launch` was asked, before any file is read."""

    job_file: str
    inventory: str | None = None
    nodes: list[str] | None = None
    nnodes: int | None = None
    dry_run: bool = False
    skip_preflight: bool = False
    backend: str | None = None
    live: bool = True
    job_id: str | None = None
    quiet: bool = False
    extra_args: list[str] = field(default_factory=list)
    slurm_overrides: dict[str, str | None] = field(default_factory=dict)


class Backend(Protocol):
    def launch(self, request: LaunchRequest, backend: str) -> int: ...

    def stop(self, store: Store, record: JobRecord) -> int: ...


def get(name: str) -> Backend:
    return importlib.import_module(BACKENDS[name])  # type: ignore[return-value]


def launch(request: LaunchRequest) -> int:
    """Launch with the requested backend, or the job's own (`backend:` in the job file)."""
    from orchestrator.spec import load_job

    name = request.backend or load_job(request.job_file).backend
    return get(name).launch(request, name)


def stop(store: Store, record: JobRecord) -> int:
    return get(record.backend).stop(store, record)


def refresh_lost(store: Store, records: list[JobRecord]) -> None:
    """Mark SSH/local jobs whose controller died while they ran as `lost`."""
    for rec in records:
        if rec.backend != "slurm" and not rec.state.finished and not controller_alive(rec):
            rec.state = JobState.LOST
            store.update(rec.id, state=JobState.LOST)
