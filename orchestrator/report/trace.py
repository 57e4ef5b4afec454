"""`distrun trace`: a job as a trace in the Chrome Trace Event format (JSON), which Perfetto and
chrome://tracing open: a process per host, a thread per rank with each collective as a complete
("X") slice, the failed rank's lines, failures, alerts, stalls and attempts as instant ("i")
events, host and GPU telemetry as counters ("C"), names as metadata ("M"); `ts` in µs since the
first event. Read from the job directory and the record as they are, so a running job gives the
trace so far. docs/trace.md is the reader's side.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchestrator.diagnose.failures import Failure
from orchestrator.report.events import JobEvent, job_events
from orchestrator.report.numbers import read_json, read_jsonl
from orchestrator.report.sources import missing_lines, plan_ranks, rank_lines
from orchestrator.report.timeline import Collective, Timeline, clock_shifts, place, read_rounds, shifted
from orchestrator.store import JobDir, JobRecord

JOB_PID = 0  # the job's own track: attempts, stalls, failures that name no host
LINES_SHOWN = 300  # the most lines of a failed rank drawn (its last)
LINE_CHARS = 200
COUNTERS = {"host": (("cpu_pct", "cpu %"), ("load1", "load"), ("mem_used_mb", "memory used MB")),
            "gpu": (("util", "util %"), ("mem_used_mb", "memory used MB"))}
Event = dict[str, Any]


@dataclass
class Tracks:
    """Where each host and rank is drawn: a pid per host, its ranks as tids."""

    pids: dict[str, int] = field(default_factory=dict)  # node -> pid
    ranks: dict[int, str] = field(default_factory=dict)  # rank -> node
    addresses: dict[str, str] = field(default_factory=dict)

    def pid(self, node: str) -> int:
        return self.pids.setdefault(node, len(self.pids) + 1)

    def metadata(self, job_id: str) -> list[Event]:
        """Process and thread names, hosts in order and ranks in order within them."""
        events = [_meta(JOB_PID, None, "process_name", f"job {job_id}"), _meta(JOB_PID, None, "process_sort_index", 0)]
        for node, pid in self.pids.items():
            address = self.addresses.get(node)
            name = f"{node} ({address})" if address and address != node else node
            events += [_meta(pid, None, "process_name", name), _meta(pid, None, "process_sort_index", pid)]
        for rank, node in sorted(self.ranks.items()):
            events += [_meta(self.pid(node), rank, "thread_name", f"rank {rank}"),
                       _meta(self.pid(node), rank, "thread_sort_index", rank)]
        return events


def _meta(pid: int, tid: int | None, name: str, value: Any) -> Event:
    key = "sort_index" if name.endswith("sort_index") else "name"
    return {"ph": "M", "name": name, "pid": pid, "tid": 0 if tid is None else tid, "args": {key: value}}


def plan_tracks(plan: dict[str, Any], timeline: Timeline) -> Tracks:
    """The plan's hosts in node-rank order, then any host the collectives name that the plan does
    not; each rank on its host (`plan_ranks`)."""
    tracks = Tracks()
    for host in sorted(plan.get("hosts") or [], key=lambda h: int(h.get("node_rank") or 0)):
        tracks.pid(str(host.get("node")))
        tracks.addresses[str(host.get("node"))] = str(host.get("host") or "")
    tracks.ranks = plan_ranks(plan, timeline)
    for node in tracks.ranks.values():
        tracks.pid(node)
    return tracks


def slice_event(c: Collective, pid: int) -> Event:
    """A collective as a complete event from the rank's entry to the last rank's."""
    args: dict[str, Any] = {"seq": c.seq, "late_ms": round(c.late_us / 1000, 3), "ranks_recorded": c.ranks_seen}
    if not c.completed:
        args["completed"] = "not when last read"
    if c.extra:
        args["extra"] = list(c.extra)
    end = c.end_us if c.end_us is not None else c.entered_us
    return {"ph": "X", "name": c.op, "cat": "collective", "ts": c.entered_us,
            "dur": max(end - c.entered_us, 1), "pid": pid, "tid": c.rank, "args": args}


def collective_events(timeline: Timeline, tracks: Tracks) -> Iterator[Event]:
    for rank, collectives in timeline.ranks.items():
        pid = tracks.pid(tracks.ranks.get(rank, "?"))
        for c in collectives:
            yield slice_event(c, pid)


def instant(name: str, t: float, pid: int, tid: int | None, cat: str, args: dict[str, Any]) -> Event:
    """An instant event: on a rank's thread, on a host's process, or across the whole trace."""
    scope = "t" if tid is not None else ("p" if pid != JOB_PID else "g")
    return {"ph": "i", "name": name, "cat": cat, "ts": int(t * 1e6), "pid": pid, "tid": 0 if tid is None else tid,
            "s": scope, "args": args}


def job_event_instants(events: list[JobEvent], tracks: Tracks) -> Iterator[Event]:
    """Alerts, stalls, failures and attempts: on the rank they name, else their host, else the job."""
    for event in events:
        pid = tracks.pid(event.node) if event.node else JOB_PID
        tid = event.rank if event.rank is not None and event.node else None
        if event.kind in ("stall", "attempt"):
            pid, tid = JOB_PID, None
        yield instant(event.text, event.t, pid, tid, event.kind, {"text": event.text, **event.args})


def counter_events(telemetry: list[dict[str, Any]], tracks: Tracks) -> Iterator[Event]:
    """Each telemetry sample as counters on its host's process (GPU ones named by GPU)."""
    for row in telemetry:
        t, node, kind = row.get("t"), row.get("node") or row.get("host"), row.get("kind", "host")
        if not isinstance(t, int | float) or node is None or kind not in COUNTERS:
            continue
        prefix = f"gpu{row.get('gpu', '?')} " if kind == "gpu" else ""
        for key, name in COUNTERS[kind]:
            value = row.get(key)
            if isinstance(value, int | float) and not isinstance(value, bool):
                yield {"ph": "C", "name": prefix + name, "ts": int(t * 1e6), "pid": tracks.pid(str(node)),
                       "tid": 0, "args": {"value": value}}


def failed_rank_lines(job_dir: JobDir, failures: list[Failure], tracks: Tracks) -> Iterator[Event]:
    """The last LINES_SHOWN lines of each rank a failure names, at the time they arrived."""
    for failure in failures:
        if failure.rank is None:
            continue
        pid = tracks.pid(tracks.ranks.get(failure.rank, failure.host))
        for t, stream, text in rank_lines(job_dir.root, failure.rank, LINES_SHOWN):
            yield instant(text[:LINE_CHARS] or " ", t, pid, failure.rank, "line",
                          {"stream": "stderr" if stream == "e" else "stdout", "line": text})


def build(record: JobRecord, job_dir: JobDir) -> tuple[dict[str, Any], list[str]]:
    """The trace of a job (the JSON object) and what it lacks, a line each."""
    plan, facts = read_json(job_dir.plan), read_json(job_dir.facts)
    timeline = place(shifted(read_rounds(read_jsonl(job_dir.collectives)), clock_shifts(facts)))
    tracks = plan_tracks(plan, timeline)
    events, failures = job_events(record)
    body = [*collective_events(timeline, tracks), *job_event_instants(events, tracks),
            *counter_events(read_jsonl(job_dir.telemetry), tracks), *failed_rank_lines(job_dir, failures, tracks)]
    start = min((e["ts"] for e in body), default=int(record.started * 1e6))
    for event in body:
        event["ts"] -= start
    missing = missing_lines(record, job_dir, plan, timeline, tracks.ranks)
    other = {"job": record.id, "state": record.state.value, "epoch_us": start, "missing": missing,
             "clock": "µs since epoch_us; collectives on each host's wall clock, lines and alerts on the controller's"}
    return {"traceEvents": tracks.metadata(record.id) + body, "displayTimeUnit": "ms", "otherData": other}, missing


def write_trace(record: JobRecord, job_dir: JobDir, output: Path) -> tuple[Path, int, list[str]]:
    """Write the job's trace; returns the absolute path, the number of events and what is missing."""
    trace, missing = build(record, job_dir)
    output = output.expanduser().resolve()
    output.parent.mkdir(parents=True, exist_ok=True)
    # json.dumps encodes in C; json.dump to a file goes through the pure-Python encoder, 5x slower.
    output.write_text(json.dumps(trace, separators=(",", ":"), ensure_ascii=False), encoding="utf-8")
    return output, len(trace["traceEvents"]), missing
