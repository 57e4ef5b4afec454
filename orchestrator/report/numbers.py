"""The report's numbers: a job's files read once (`JobData`), and pure functions over them
(`summarize`, `pick_baseline`, `scaling_efficiency`) that a test or a reader can recompute from
metrics.jsonl; and how the numbers are written."""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchestrator.diagnose.failures import Failure
from orchestrator.store import JobDir, JobRecord, JobState, Store

NO_VALUE = "—"


# ---------------------------------------------------------------- reading a job


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """The JSON objects of a .jsonl file; a missing file or a damaged line gives nothing."""
    if not path.exists():
        return []
    rows = []
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row, dict):
            rows.append(row)
    return rows


def read_json(path: Path) -> dict[str, Any]:
    """A JSON object from a file, or {} when the file is missing or not an object."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


@dataclass(frozen=True)
class JobData:
    """What the report reads of one job: its record and the files of its directory."""

    record: JobRecord
    plan: dict[str, Any] = field(default_factory=dict)
    facts: dict[str, Any] = field(default_factory=dict)
    metrics: list[dict[str, Any]] = field(default_factory=list)
    telemetry: list[dict[str, Any]] = field(default_factory=list)
    collectives: list[dict[str, Any]] = field(default_factory=list)
    root: Path | None = None  # the job directory, for what the figures say is missing from it

    @classmethod
    def load(cls, record: JobRecord, job_dir: JobDir) -> JobData:
        return cls(record, read_json(job_dir.plan), read_json(job_dir.facts), read_jsonl(job_dir.metrics),
                   read_jsonl(job_dir.telemetry), read_jsonl(job_dir.collectives), job_dir.root)


def load_jobs(store: Store, refs: Iterable[str]) -> list[JobData]:
    """Each job named by an id, unique prefix or `last`, with its files.

    Raises:
        UsageError: a reference matches no job or several.
    """
    records = [store.get(ref) for ref in refs]
    return [JobData.load(rec, store.job_dir(rec.id)) for rec in records]


# ---------------------------------------------------------------- the numbers


def number(value: Any) -> float | None:
    """`value` as a float when it is a JSON number (booleans are not), else None."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def rank0_records(metrics: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rank 0's interval records (the final summary record left out), in step order."""
    rows = [m for m in metrics
            if m.get("rank") in (0, None) and not m.get("final") and number(m.get("step")) is not None]
    return sorted(rows, key=lambda m: number(m["step"]) or 0.0)


def steady_records(metrics: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rank 0's interval records after warm-up that carry a throughput."""
    return [m for m in rank0_records(metrics) if not m.get("warmup") and number(m.get("samples_per_s")) is not None]


def mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def first_value(metrics: list[dict[str, Any]], key: str) -> Any:
    """The first value of `key` in the records that is not None."""
    return next((m[key] for m in metrics if m.get(key) is not None), None)


@dataclass(frozen=True)
class JobSummary:
    """One row of the table; `replicas` is the N of scaling efficiency."""

    job_id: str
    name: str
    state: str
    strategy: str
    device: str
    amp: str
    hosts: int
    procs_per_host: tuple[int, ...]
    world_size: int
    replicas: int
    global_batch: int | None
    steps: int | None
    steady_count: int
    step_time_s: float | None
    time_for_steps_s: float | None
    throughput: float | None
    peak_mem_mb: float | None
    notes: tuple[str, ...] = ()
    summary_throughput: float | None = None  # the launch summary's: the final record's mean_samples_per_s

    @property
    def succeeded(self) -> bool:
        return self.state == JobState.SUCCEEDED.value

    @property
    def layout(self) -> str:
        """`hosts x processes per host` (with a multiplication sign), or the per-host counts."""
        if not self.procs_per_host:
            return f"? × ? ({self.world_size} processes)" if self.world_size else NO_VALUE
        if len(set(self.procs_per_host)) == 1:
            return f"{self.hosts} × {self.procs_per_host[0]}"
        return f"{self.hosts} hosts, {self.world_size} processes ({'+'.join(map(str, self.procs_per_host))})"


def summarize(data: JobData) -> JobSummary:
    """The table's numbers for one job, from its metrics records and its plan."""
    metrics = data.metrics
    steady = steady_records(metrics)
    rank0 = rank0_records(metrics)
    procs = tuple(int(h.get("nproc") or 0) for h in data.plan.get("hosts") or [])
    world = sum(procs) or int(number(first_value(metrics, "world_size")) or 0)
    strategy = str(first_value(metrics, "strategy") or "")
    device = str(first_value(metrics, "device") or "")
    steps = max((int(number(m["step"]) or 0) for m in rank0), default=None)
    step_time = mean([v for m in steady if (v := number(m.get("step_time_s"))) is not None])
    peaks = [v for m in metrics if (v := number(m.get("peak_mem_mb"))) is not None]
    batch = number(first_value(list(reversed(rank0)), "global_batch"))
    replicas = dp_gpus(data) if strategy == "dp" and device.startswith("cuda") else world
    return JobSummary(
        job_id=data.record.id, name=data.record.name, state=data.record.state.value,
        strategy=strategy or NO_VALUE, device=device or NO_VALUE, amp=str(first_value(metrics, "amp") or ""),
        hosts=len(procs), procs_per_host=procs, world_size=world, replicas=replicas or 1,
        global_batch=int(batch) if batch is not None else None, steps=steps, steady_count=len(steady),
        step_time_s=step_time,
        time_for_steps_s=steps * step_time if steps is not None and step_time is not None else None,
        throughput=mean([number(m["samples_per_s"]) or 0.0 for m in steady]),
        peak_mem_mb=max(peaks) if peaks else None,
        notes=tuple(job_notes(data, strategy, device)),
        summary_throughput=number(first_value([m for m in metrics if m.get("final")], "mean_samples_per_s")),
    )


def dp_gpus(data: JobData) -> int:
    """The GPUs a DataParallel process drives: its CUDA_VISIBLE_DEVICES, else its host's GPUs (facts.json)."""
    hosts = data.plan.get("hosts") or [{}]
    visible = str((hosts[0].get("env") or {}).get("CUDA_VISIBLE_DEVICES") or "")
    if visible:
        return len([d for d in visible.split(",") if d.strip()])
    facts = data.facts.get(str(hosts[0].get("node"))) or {}
    return int(number(facts.get("gpus")) or 1)


def job_notes(data: JobData, strategy: str, device: str) -> list[str]:
    """What a reader of the row must know besides the numbers."""
    notes = []
    state = data.record.state
    if state is not JobState.SUCCEEDED:
        reason = failure_reason(data.record)
        notes.append(f"{state.value.upper()}" + (f": {reason}" if reason else ""))
    if strategy == "dp" and not device.startswith("cuda") and device != "":
        notes.append("DataParallel ran without GPUs: one process on the CPU, the same work as single")
    elif strategy == "dp":
        notes.append("DataParallel: GPU 0 holds more than the others (it gathers outputs and holds the "
                     "master copy)" + gpu_peaks_note(data.telemetry))
    if not data.metrics:
        notes.append("the program prints no DISTRUN_METRICS lines: its wall time and collective rate are under Runs")
    elif not steady_records(data.metrics):
        notes.append("no steady-state metrics records")
    return notes


def failure_reason(record: JobRecord) -> str:
    """The root cause in one line (`node1 (10.0.0.11) rank 3: exit code 1`) from the record's
    failures, else the summary's first line (a job stopped, or recorded before failures were kept)."""
    if record.failures:
        return Failure.from_dict(record.failures[0]).brief()
    return (record.detail.splitlines() or [""])[0]


def gpu_peaks_note(telemetry: list[dict[str, Any]]) -> str:
    """`; telemetry peak per GPU: node/gpu0 7800 MB, ...`, or '' without GPU samples."""
    peaks: dict[str, float] = {}
    for row in telemetry:
        used = number(row.get("mem_used_mb"))
        if row.get("kind") == "gpu" and used is not None:
            key = f"{row.get('node') or row.get('host') or '?'}/gpu{row.get('gpu', '?')}"
            peaks[key] = max(used, peaks.get(key, 0.0))
    if not peaks:
        return ""
    return "; telemetry peak per GPU: " + ", ".join(f"{k} {v:.1f} MB" for k, v in sorted(peaks.items()))


def pick_baseline(summaries: list[JobSummary]) -> JobSummary | None:
    """The single-process job that succeeded and measured a throughput; `single` first."""
    candidates = [s for s in summaries if s.replicas == 1 and s.world_size == 1 and s.succeeded
                  and s.throughput is not None]
    return next((s for s in candidates if s.strategy == "single"), candidates[0] if candidates else None)


def scaling_efficiency(job: JobSummary, baseline: JobSummary | None) -> float | None:
    """throughput_N / (N * baseline throughput), N = the job's replicas; None when unknown."""
    if baseline is None or job.throughput is None or not baseline.throughput:
        return None
    return job.throughput / (job.replicas * baseline.throughput)


def scaling_series(summaries: list[JobSummary]) -> dict[str, list[JobSummary]]:
    """Runs of one job at several host counts (`distrun bench --hosts`): name -> its runs that
    succeeded with a throughput, one per host count (the first given), fewest hosts first; only
    names with two host counts or more."""
    series: dict[str, dict[int, JobSummary]] = {}
    for summary in summaries:
        if summary.succeeded and summary.throughput and summary.hosts:
            series.setdefault(summary.name, {}).setdefault(summary.hosts, summary)
    return {name: [runs[h] for h in sorted(runs)] for name, runs in series.items() if len(runs) > 1}


def host_speedup(run: JobSummary, base: JobSummary) -> float:
    """Throughput against the run on the fewest hosts."""
    return (run.throughput or 0.0) / (base.throughput or 1.0)


def host_efficiency(run: JobSummary, base: JobSummary) -> float:
    """Speedup / (hosts / the base's hosts): 1.0 when throughput grows as fast as the host count."""
    return host_speedup(run, base) / (run.hosts / base.hosts)


# ---------------------------------------------------------------- formatting


def fmt(value: float | None, digits: int = 1) -> str:
    """A number with fixed decimals, or a dash when it is unknown."""
    return NO_VALUE if value is None else f"{value:.{digits}f}"


def fmt_efficiency(value: float | None) -> str:
    return NO_VALUE if value is None else f"{value * 100:.1f}%"


def labels(summaries: list[JobSummary]) -> dict[str, str]:
    """Legend labels: the job name, or the whole id where two jobs share a name."""
    names = [s.name for s in summaries]
    return {s.job_id: s.name if names.count(s.name) == 1 else s.job_id for s in summaries}
