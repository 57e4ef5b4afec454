"""What a finished attempt records and says besides its verdict: failures and attempts with the
job's secrets masked, and a succeeded job's summary (the ranks' progress line is diagnose/progress.py's)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from orchestrator.diagnose.failures import Failure
from orchestrator.plan import LaunchPlan
from orchestrator.remote.redact import Masker
from orchestrator.run.restarts import AttemptHistory


def masked(failure: Failure, mask: Masker) -> Failure:
    """The failure with its reason, message, traceback and last lines masked."""
    return replace(failure, reason=mask.text(failure.reason), message=mask.text(failure.message),
                   last_lines=tuple(mask.text(line) for line in failure.last_lines),
                   traceback=tuple(mask.text(line) for line in failure.traceback))


def masked_attempts(history: AttemptHistory, mask: Masker) -> list[dict[str, Any]]:
    """The record's attempts, each failure's reason and lines masked."""
    records = history.records()
    for record, attempt in zip(records, history.attempts, strict=True):
        if attempt.failure is not None:
            record["failure"] = masked(attempt.failure, mask).to_dict()
    return records


def succeeded_summary(plan: LaunchPlan, metrics: dict[str, Any] | None, restarts: int) -> str:
    """A succeeded job's summary: its hosts and world size, then rank 0's throughput and peak memory
    from its final (else last) metrics line, and torchrun's restarts when there were any."""
    lines = [f"job {plan.job_id} succeeded: {plan.nnodes} host(s), world size {plan.world_size}"]
    if metrics:
        rate = metrics.get("mean_samples_per_s", metrics.get("samples_per_s"))
        if rate is not None:
            lines.append(f"  throughput: {float(rate):.1f} samples/s (mean over steady-state steps)")
        if metrics.get("peak_mem_mb") is not None:
            lines.append(f"  peak memory: {float(metrics['peak_mem_mb']):.0f} MB per process")
    if restarts:
        lines.append(f"  restarts: {restarts}")
    return "\n".join(lines)
