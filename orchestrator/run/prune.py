"""`distrun prune`: forget old finished jobs, here and on their hosts (`--local`: here only).

A job is removed only once its backend removed what the hosts keep of it (for the SSH backend,
`~/.distrun/jobs/<id>/` on each host); a job whose hosts could not all be cleaned keeps its
record, so a later prune tries again. A job that has not finished is never touched: records
are first checked against their backends (`refresh_lost`), so a job whose controller died
counts as finished (`lost`) and a running one as running.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from orchestrator.errors import UsageError
from orchestrator.run.recorded import for_record, refresh_lost
from orchestrator.store import JobRecord, Store, prunable


@dataclass
class PruneResult:
    """What a prune did: the jobs removed, and the jobs kept because their hosts could not be cleaned."""

    removed: list[str] = field(default_factory=list)
    kept: dict[str, str] = field(default_factory=dict)  # job id -> why
    dry_run: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {"removed": self.removed, "kept": self.kept, "dry_run": self.dry_run}


def prune(store: Store, older_than: float | None, keep: int | None, dry_run: bool = False,
          now: float | None = None, local: bool = False) -> PruneResult:
    """Remove the finished jobs chosen by age and count (see `store.prunable`), hosts' copies first.

    Args:
        store: The job records.
        older_than: Seconds; only jobs that ended longer ago.
        keep: Keep the newest this many finished jobs whatever their age.
        dry_run: Only say which jobs would go.
        now: The time ages are measured from (default: now).
        local: Forget the jobs here only, leaving their hosts' copies (hosts that are gone).

    Returns:
        The jobs removed (or that would be) and the jobs kept with the reason.
    """
    records = store.list(None, internal=True)
    refresh_lost(store, records)
    chosen = prunable(records, older_than, keep, now)
    if dry_run:
        return PruneResult([r.id for r in chosen], dry_run=True)
    kept = {} if local else _remove_copies(store, chosen)
    removed = [r.id for r in chosen if r.id not in kept]
    for job_id in removed:
        store.delete(job_id)
    return PruneResult(removed, kept)


def _remove_copies(store: Store, records: Sequence[JobRecord]) -> dict[str, str]:
    """Each backend removes its jobs' host copies; {job id: why not} for the jobs where that failed."""
    by_backend: dict[str, list[JobRecord]] = {}
    for record in records:
        by_backend.setdefault(record.backend, []).append(record)
    kept: dict[str, str] = {}
    for jobs in by_backend.values():
        try:
            backend = for_record(store, jobs[0])
        except UsageError as exc:
            kept.update({job.id: str(exc) for job in jobs})
            continue
        with backend:
            kept.update(backend.remove_copies(jobs))
    return kept
