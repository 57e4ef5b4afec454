"""What the trace and the report read besides the collectives: a rank's lines with the time each
arrived, and a line for each thing a job's records lack (no Flight Recorder, a rank never read),
saying why, so that what is drawn is never taken for the whole."""

from __future__ import annotations

from collections import deque
from pathlib import Path
from typing import Any

from orchestrator.console.display import rank_ranges
from orchestrator.logs.query import JobLog
from orchestrator.remote import WORKER_PROGRAM
from orchestrator.report.timeline import Timeline
from orchestrator.store import JobDir, JobRecord, JobState

NO_CONTROL_PLANE = ("no rank served its Flight Recorder: a torch without the control plane "
                    "(torch.distributed.elastic.control_plane, torch 2.7 on) serves none; `distrun doctor` names "
                    "such hosts")


def rank_lines(root: Path, rank: int, last: int) -> list[tuple[float, str, str]]:
    """A rank's last `last` lines of stdout and stderr as (time arrived, stream, text), in arrival order."""
    log = JobLog(root)
    kept: deque[tuple[float, str, str]] = deque(maxlen=last)
    try:
        for located in log.new_entries():
            entry = located.entry
            if entry.rank != rank:
                continue
            text = log.read(located).decode("utf-8", "replace")
            kept.extend((entry.time, entry.stream, line) for line in text.split("\n")[:entry.nlines])
    finally:
        log.close()
    return list(kept)


def plan_ranks(plan: dict[str, Any], timeline: Timeline) -> dict[int, str]:
    """rank -> host: the plan's hosts in node-rank order, their ranks as torchrun's static
    assignment gives them, and where the collectives' records say otherwise, what they say."""
    ranks: dict[int, str] = {}
    first = 0
    for host in sorted(plan.get("hosts") or [], key=lambda h: int(h.get("node_rank") or 0)):
        nproc = int(host.get("nproc") or 0)
        ranks.update({rank: str(host.get("node")) for rank in range(first, first + nproc)})
        first += nproc
    return {**ranks, **timeline.nodes}


def flight_recorder_on(plan: dict[str, Any]) -> bool:
    """Whether the job's ranks ran under distrun's worker entry (not `flight_recorder: false`);
    True without a plan, which says nothing either way."""
    hosts = plan.get("hosts") or []
    return not hosts or any(any(str(a).endswith(WORKER_PROGRAM) for a in h.get("argv") or ()) for h in hosts)


def no_collectives(job_dir: JobDir, plan: dict[str, Any], timeline: Timeline) -> str:
    """Why a job has no collectives at all."""
    if not flight_recorder_on(plan):
        return "no collectives: the job ran with `flight_recorder: false`, so no rank's Flight Recorder was read"
    if not job_dir.collectives.exists():
        return ("no collectives: this job directory has no collectives.jsonl (written by an older distrun, "
                "which did not keep the ranks' Flight Recorder rounds)")
    if timeline.skipped:
        rank, why = sorted(timeline.skipped.items())[0]
        return f"no collectives: no rank answered its Flight Recorder read (rank {rank}: {why})"
    return f"no collectives: {NO_CONTROL_PLANE}"


def unread_ranks(timeline: Timeline, ranks: dict[int, str]) -> list[str]:
    """A line for each host whose ranks left no collective while others did."""
    silent: dict[str, list[int]] = {}
    for rank, node in sorted(ranks.items()):
        if not timeline.ranks.get(rank):
            silent.setdefault(node, []).append(rank)
    lines = []
    for node, listed in silent.items():
        why = next((timeline.skipped[r] for r in listed if r in timeline.skipped), "")
        said = f"its last Flight Recorder read: {why}" if why else "never answered a Flight Recorder read"
        lines.append(f"rank {rank_ranges(listed)} ({node}): no collectives recorded ({said})")
    return lines


def missing_lines(record: JobRecord, job_dir: JobDir, plan: dict[str, Any], timeline: Timeline,
                  ranks: dict[int, str]) -> list[str]:
    """What the job's records lack, a line each; [] when nothing is."""
    lines = []
    if record.state in (JobState.PENDING, JobState.RUNNING, JobState.STALLED):
        lines.append(f"the job is {record.state.value}: what it recorded so far")
    if not job_dir.root.is_dir():
        return [*lines, f"no job directory ({job_dir.root} is gone: `distrun prune` removes it): only the record's "
                        "alerts, failures and attempts"]
    if not any(timeline.ranks.values()):
        lines.append(no_collectives(job_dir, plan, timeline))
    else:
        lines += unread_ranks(timeline, ranks)
    if not job_dir.telemetry.exists():
        lines.append("no telemetry: the job directory has no telemetry.jsonl (telemetry off, or an older distrun)")
    return lines
