"""The comparison report: one self-contained HTML page about finished jobs.

The table's numbers come from pure functions over a job's files (`summarize`,
`pick_baseline`, `scaling_efficiency`), so a test or a reader can recompute them from
metrics.jsonl. Plots are matplotlib SVGs inlined as data URIs and the CSS is inline: the
page opens with no network.
"""

from __future__ import annotations

import base64
import html
import io
import json
import shlex
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchestrator.display import fold_hosts
from orchestrator.failures import Failure
from orchestrator.plan import MASK
from orchestrator.store import JobDir, JobRecord, JobState, Store

TABLE_HEAD_COLOUR = "#30638e"
PLOT_FRAME_COLOUR = "#8e3063"
FACT_KEYS = ("hostname", "python", "torch", "cuda", "nccl", "gpus")
JOB_COLOURS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#17becf")
FIG_SIZE = (7.0, 3.4)
NO_VALUE = "—"
Series = dict[str, list[tuple[float, float | None, float | None]]]  # label -> [(t, utilization, memory)]

DEFINITIONS = (
    ("Steady-state records", "the metrics records of rank 0 (one per logging interval) whose "
     "<code>warmup</code> is false; the final summary record is not one of them."),
    ("Hosts × processes and global batch", "from the job's plan.json (processes per host) and its metrics "
     "(<code>global_batch</code>: samples per optimizer step, all processes together)."),
    ("Throughput", "the arithmetic mean of <code>samples_per_s</code> (samples per second of the whole "
     "job, every process together, over one logging interval) over the steady-state records. The launch "
     "summary's figure (the final record's <code>mean_samples_per_s</code>: steady-state samples divided "
     "by their total time) can differ slightly when intervals differ in length."),
    ("Steps N and time for N steps", "N is the last step rank 0 reported; the time is N × the mean "
     "<code>step_time_s</code> of the steady-state records: what N steps take once warmed up."),
    ("Peak memory per process", "the largest <code>peak_mem_mb</code> any rank reported, as the "
     "training script measures it (device memory on GPUs, resident memory on CPUs)."),
    ("Scaling across hosts", "for a job run at several host counts (<code>distrun bench JOB.yaml --hosts "
     "1,2,4</code>): speedup = throughput / the throughput on the fewest hosts k0, and scaling efficiency "
     "= speedup / (hosts / k0); 100% means throughput grew as fast as the host count."),
    ("Scaling efficiency", "throughput / (N × baseline throughput), where N is the number of "
     "processes (for DataParallel on GPUs: the GPUs its one process drives, from "
     "<code>CUDA_VISIBLE_DEVICES</code> or the host's facts) and the baseline is the single-process job "
     "of the set."),
)


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

    @classmethod
    def load(cls, record: JobRecord, job_dir: JobDir) -> JobData:
        return cls(record, read_json(job_dir.plan), read_json(job_dir.facts),
                   read_jsonl(job_dir.metrics), read_jsonl(job_dir.telemetry))


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
    if not steady_records(data.metrics):
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


def esc(value: Any) -> str:
    return html.escape(str(value))


def labels(summaries: list[JobSummary]) -> dict[str, str]:
    """Legend labels: the job name, or the whole id where two jobs share a name."""
    names = [s.name for s in summaries]
    return {s.job_id: s.name if names.count(s.name) == 1 else s.job_id for s in summaries}


# ---------------------------------------------------------------- plots


def svg_data_uri(fig: Any) -> str:
    """A matplotlib figure as an `<img>`-ready SVG data URI."""
    buf = io.BytesIO()
    fig.savefig(buf, format="svg", bbox_inches="tight", metadata={"Date": None})
    return "data:image/svg+xml;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def new_figure(ncols: int = 1) -> tuple[Any, list[Any]]:
    from matplotlib.figure import Figure

    fig = Figure(figsize=(FIG_SIZE[0] * ncols, FIG_SIZE[1]), layout="constrained")
    axes = fig.subplots(1, ncols, squeeze=False)[0]
    for ax in axes:
        ax.grid(True, color="#dddddd", linewidth=0.6)
    return fig, list(axes)


def bar_chart(summaries: list[JobSummary], values: list[float | None], texts: list[str], xlabel: str,
              title: str) -> str:
    """One horizontal bar per job, in the table's order, with its text written at the bar's end."""
    fig, (ax,) = new_figure()
    names = labels(summaries)
    bars = ax.barh(range(len(summaries)), [v or 0.0 for v in values],
                   color=[colour(i) for i in range(len(summaries))])
    ax.set_yticks(range(len(summaries)), [names[s.job_id] for s in summaries])
    ax.invert_yaxis()
    for bar, text in zip(bars, texts, strict=True):
        ax.annotate(text, (bar.get_width(), bar.get_y() + bar.get_height() / 2), xytext=(4, 0),
                    textcoords="offset points", va="center", fontsize=8)
    ax.set_xlabel(xlabel)
    ax.set_title(title)
    ax.margins(x=0.25)
    return svg_data_uri(fig)


def throughput_bars(summaries: list[JobSummary], baseline: JobSummary | None) -> str:
    """Mean steady-state throughput per job, scaling efficiency written on each bar."""
    texts = []
    for summary in summaries:
        eff = scaling_efficiency(summary, baseline)
        texts.append(fmt(summary.throughput) + (f"  ({fmt_efficiency(eff)})" if eff is not None else ""))
    return bar_chart(summaries, [s.throughput for s in summaries], texts,
                     "samples/s (mean over steady-state steps)", "Throughput per job (scaling efficiency)")


def memory_bars(summaries: list[JobSummary]) -> str:
    """Peak memory per process of each job."""
    return bar_chart(summaries, [s.peak_mem_mb for s in summaries], [fmt(s.peak_mem_mb) for s in summaries],
                     "MB (largest peak_mem_mb of any rank)", "Peak memory per process")


def step_series(data: list[JobData], summaries: list[JobSummary], key: str, ylabel: str, title: str) -> str:
    """One line per job of a rank-0 metric over steps; warm-up points drawn hollow."""
    fig, (ax,) = new_figure()
    names = labels(summaries)
    for i, (job, summary) in enumerate(zip(data, summaries, strict=True)):
        rows = [m for m in rank0_records(job.metrics) if number(m.get(key)) is not None]
        if not rows:
            continue
        steps = [number(m["step"]) for m in rows]
        ax.plot(steps, [number(m[key]) for m in rows], color=colour(i), label=names[summary.job_id], linewidth=1.4)
        warm = [m for m in rows if m.get("warmup")]
        ax.plot([number(m["step"]) for m in warm], [number(m[key]) for m in warm], "o", color=colour(i),
                markerfacecolor="white", markersize=4)
    ax.set_xlabel("step")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    if ax.lines:
        ax.legend(fontsize=8)
    return svg_data_uri(fig)


def telemetry_series(rows: list[dict[str, Any]]) -> tuple[str, Series]:
    """Samples per host (or per GPU when there are GPU samples): (kind, {label: [(t, util, mem)]})."""
    gpu_rows = [r for r in rows if r.get("kind") == "gpu"]
    kind = "gpu" if gpu_rows else "host"
    chosen = gpu_rows or [r for r in rows if r.get("kind", "host") == "host"]
    util_key = "util" if kind == "gpu" else "cpu_pct"
    series: Series = {}
    for row in chosen:
        t = number(row.get("t"))
        if t is None:
            continue
        label = str(row.get("node") or row.get("host") or "?") + (f"/gpu{row.get('gpu', '?')}" if kind == "gpu" else "")
        series.setdefault(label, []).append((t, number(row.get(util_key)), number(row.get("mem_used_mb"))))
    return kind, {k: sorted(v, key=lambda p: p[0]) for k, v in sorted(series.items())}


def telemetry_plot(job: JobData, label: str) -> str | None:
    """Utilization and memory over time for one job, or None when it has no usable samples."""
    kind, series = telemetry_series(job.telemetry)
    if not series:
        return None
    start = min(points[0][0] for points in series.values())
    fig, (util_ax, mem_ax) = new_figure(2)
    for i, (name, points) in enumerate(series.items()):
        times = [p[0] - start for p in points]
        util_ax.plot(times, [p[1] for p in points], color=colour(i), label=name, linewidth=1.2)
        mem_ax.plot(times, [p[2] for p in points], color=colour(i), label=name, linewidth=1.2)
    what = "GPU" if kind == "gpu" else "host CPU"
    util_ax.set_title(f"{label}: {what} utilization")
    util_ax.set_ylabel("%")
    util_ax.set_ylim(0, max(105.0, util_ax.get_ylim()[1]))
    mem_ax.set_title(f"{label}: {'GPU' if kind == 'gpu' else 'host'} memory used")
    mem_ax.set_ylabel("MB")
    for ax in (util_ax, mem_ax):
        ax.set_xlabel("seconds since the first sample")
        ax.legend(fontsize=8)
    return svg_data_uri(fig)


def scaling_plot(series: dict[str, list[JobSummary]]) -> str:
    """Throughput (with the ideal, linear in hosts) and scaling efficiency against the host count."""
    fig, (rate_ax, eff_ax) = new_figure(2)
    for i, (name, runs) in enumerate(series.items()):
        hosts = [r.hosts for r in runs]
        base = runs[0]
        rate_ax.plot(hosts, [r.throughput for r in runs], "o-", color=colour(i), label=name, linewidth=1.4)
        rate_ax.plot(hosts, [(base.throughput or 0.0) * h / base.hosts for h in hosts], "--", color=colour(i),
                     linewidth=0.9, label=f"{name}: linear in hosts")
        eff_ax.plot(hosts, [100 * host_efficiency(r, base) for r in runs], "o-", color=colour(i), label=name,
                    linewidth=1.4)
    for ax in (rate_ax, eff_ax):
        ax.set_xlabel("hosts")
        ax.xaxis.get_major_locator().set_params(integer=True)
        ax.legend(fontsize=8)
    rate_ax.set_ylabel("samples/s")
    rate_ax.set_title("Throughput against hosts")
    eff_ax.set_ylabel("%")
    eff_ax.set_ylim(0, max(110.0, eff_ax.get_ylim()[1]))
    eff_ax.set_title("Scaling efficiency against hosts")
    return svg_data_uri(fig)


def colour(index: int) -> str:
    return JOB_COLOURS[index % len(JOB_COLOURS)]


# ---------------------------------------------------------------- HTML

CSS = f"""
body {{ font-family: -apple-system, "Segoe UI", Roboto, "DejaVu Sans", Arial, sans-serif; margin: 24px 32px;
       color: #222; background: #fff; max-width: 1500px; }}
h1 {{ font-size: 1.5em; margin-bottom: 4px; }}
h2 {{ font-size: 1.2em; margin-top: 32px; border-bottom: 1px solid #ccc; padding-bottom: 4px; }}
h3 {{ font-size: 1.05em; margin-bottom: 6px; }}
.meta {{ color: #666; font-size: 0.9em; }}
table {{ border-collapse: collapse; margin: 8px 0 16px; font-size: 0.92em; max-width: 100%; }}
table#comparison {{ width: 100%; }}
th, td {{ border: 1px solid {TABLE_HEAD_COLOUR}; padding: 5px 9px; vertical-align: top; }}
th {{ background: {TABLE_HEAD_COLOUR}; color: #fff; text-align: left; }}
td.notes {{ min-width: 12em; overflow-wrap: anywhere; }}
td.num {{ text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }}
tr.failed td {{ background: #fde8e8; }}
.id {{ color: #666; font-size: 0.85em; overflow-wrap: anywhere; }}
.bad {{ color: #b00020; font-weight: bold; }}
.plots {{ display: grid; grid-template-columns: repeat(auto-fit, minmax(620px, 1fr)); gap: 16px; }}
figure.plot {{ border: 3px solid {PLOT_FRAME_COLOUR}; margin: 0; padding: 8px; background: #fff; }}
figure.wide {{ grid-column: 1 / -1; }}
figure.plot img {{ width: 100%; height: auto; display: block; }}
figcaption {{ font-size: 0.85em; color: #555; margin-top: 4px; }}
pre {{ background: #f5f5f5; padding: 8px; overflow-x: auto; white-space: pre-wrap; word-break: break-all;
      font-size: 0.85em; }}
dt {{ font-weight: bold; margin-top: 6px; }}
dd {{ margin-left: 16px; }}
"""

COLUMNS = ("Job", "Strategy", "Hosts × processes", "Global batch", "Steps N", "Time for N steps (s)",
           "Throughput (samples/s)", "Peak memory per process (MB)", "Scaling efficiency", "Notes")


def table_row(summary: JobSummary, baseline: JobSummary | None) -> str:
    """One `<tr>` of the comparison table."""
    device = summary.device + (f", AMP {summary.amp}" if summary.amp else "")
    job = f"{esc(summary.name)}<br><span class=id>{esc(summary.job_id)}</span>"
    if not summary.succeeded:
        job += f"<br><span class=bad>{esc(summary.state)}</span>"
    notes = [] if summary.device == NO_VALUE else [f"device: {device}"]
    if baseline is summary:
        notes.append("baseline")
    if summary.steady_count:
        notes.append(f"throughput over {summary.steady_count} steady-state interval(s)")
    notes += summary.notes
    cells = [
        (job, ""), (esc(summary.strategy), ""), (esc(summary.layout), ""),
        (fmt(summary.global_batch, 0), "num"), (fmt(summary.steps, 0), "num"),
        (fmt(summary.time_for_steps_s, 3), "num"), (fmt(summary.throughput), "num"),
        (fmt(summary.peak_mem_mb), "num"), (fmt_efficiency(scaling_efficiency(summary, baseline)), "num"),
        ("<br>".join(esc(n) for n in notes), "notes"),
    ]
    row_class = "" if summary.succeeded else " class=failed"
    body = "".join(f"<td class={cls}>{text}</td>" if cls else f"<td>{text}</td>" for text, cls in cells)
    return f"<tr{row_class} data-job={esc(summary.job_id)}>{body}</tr>"


def comparison_table(summaries: list[JobSummary], baseline: JobSummary | None) -> str:
    head = "".join(f"<th>{esc(c)}</th>" for c in COLUMNS)
    rows = "\n".join(table_row(s, baseline) for s in summaries)
    return f"<table id=comparison><thead><tr>{head}</tr></thead><tbody>\n{rows}\n</tbody></table>"


SCALING_COLUMNS = ("Job", "Hosts", "Processes", "Throughput (samples/s)", "Speedup", "Scaling efficiency")


def scaling_section(series: dict[str, list[JobSummary]]) -> str:
    """Throughput and scaling efficiency against the host count, per job run at several counts; "" when none."""
    if not series:
        return ""
    head = "".join(f"<th>{esc(c)}</th>" for c in SCALING_COLUMNS)
    rows = []
    for name, runs in series.items():
        base = runs[0]
        for run in runs:
            cells = [f"{esc(name)}<br><span class=id>{esc(run.job_id)}</span>", str(run.hosts),
                     str(run.world_size), fmt(run.throughput), f"{host_speedup(run, base):.2f}×",
                     fmt_efficiency(host_efficiency(run, base))]
            body = "".join(f"<td>{cells[0]}</td>" if i == 0 else f"<td class=num>{c}</td>"
                           for i, c in enumerate(cells))
            rows.append(f"<tr data-job={esc(run.job_id)}>{body}</tr>")
    figure_html = figure(scaling_plot(series), "throughput and scaling efficiency against hosts",
                         "Each job at every host count it ran; dashed: throughput growing linearly with the "
                         "hosts from the fewest.", wide=True)
    return (f"<h2>Scaling across hosts</h2>\n<table id=scaling><thead><tr>{head}</tr></thead><tbody>\n"
            + "\n".join(rows) + f"\n</tbody></table>\n<div class=plots>{figure_html}</div>")


def baseline_text(summaries: list[JobSummary], baseline: JobSummary | None) -> str:
    if baseline is not None:
        return (f"Baseline for scaling efficiency: <b>{esc(baseline.name)}</b> "
                f"(<span class=id>{esc(baseline.job_id)}</span>, {esc(baseline.strategy)}, "
                f"{fmt(baseline.throughput)} samples/s).")
    singles = [s for s in summaries if s.world_size == 1 and s.replicas == 1]
    why = " (the single-process job did not succeed or measured no throughput)" if singles else ""
    return f"No single-process baseline in this set{why}: scaling efficiency is not computed."


def figure(uri: str, alt: str, caption: str, wide: bool = False) -> str:
    """A framed plot; a wide one spans the whole row of the grid."""
    return (f"<figure class=\"plot{' wide' if wide else ''}\"><img src=\"{uri}\" alt=\"{esc(alt)}\">"
            f"<figcaption>{caption}</figcaption></figure>")


def plots_section(data: list[JobData], summaries: list[JobSummary], baseline: JobSummary | None) -> str:
    """Throughput, loss, memory and telemetry figures (a sentence instead where a job has no telemetry)."""
    figures = [
        figure(throughput_bars(summaries, baseline), "throughput per job",
               "Mean steady-state throughput per job; scaling efficiency in brackets."),
        figure(step_series(data, summaries, "samples_per_s", "samples/s", "Throughput over steps"),
               "throughput over steps", "Rank 0's <code>samples_per_s</code> per interval; hollow points "
               "are warm-up, left out of the mean."),
        figure(step_series(data, summaries, "loss", "loss", "Loss"), "loss curves", "Rank 0's loss per interval."),
        figure(memory_bars(summaries), "peak memory per job",
               "Peak memory per process (device memory on GPUs, resident memory on CPUs)."),
    ]
    missing = []
    names = labels(summaries)
    for job, summary in zip(data, summaries, strict=True):
        uri = telemetry_plot(job, names[summary.job_id])
        if uri is None:
            missing.append(summary.job_id)
            continue
        figures.append(figure(uri, f"telemetry of {summary.job_id}",
                              f"Per-host samples from <code>telemetry.jsonl</code> of {esc(summary.job_id)}.",
                              wide=True))
    note = "".join(f"<p>No telemetry recorded for job <span class=id>{esc(j)}</span>: "
                   "no utilization or memory plot for it.</p>" for j in missing)
    return f"<h2>Plots</h2>\n<div class=plots>\n{''.join(figures)}\n</div>\n{note}"


def versions_table(job: JobData) -> str:
    """Each host's versions from the probe facts (facts.json), else what the plan knows."""
    hosts = job.plan.get("hosts") or []
    if job.facts:
        keys = [k for k in FACT_KEYS if any(k in (f or {}) for f in job.facts.values())]
        head = "".join(f"<th>{esc(k)}</th>" for k in ["node", *keys])
        rows = "".join(
            "<tr>" + f"<td>{esc(node)}</td>" + "".join(f"<td>{esc((facts or {}).get(k, NO_VALUE))}</td>" for k in keys)
            + "</tr>" for node, facts in job.facts.items())
        return f"<table><tr>{head}</tr>{rows}</table>"
    if not hosts:
        return "<p>No plan and no host facts were recorded for this job.</p>"
    rows = "".join(f"<tr><td>{esc(h.get('node'))}</td><td>{esc(h.get('host'))}</td><td>{esc(h.get('python'))}</td></tr>"
                   for h in hosts)
    return ("<p>No host facts (facts.json) were recorded; the plan names each host's interpreter.</p>"
            f"<table><tr><th>node</th><th>address</th><th>python</th></tr>{rows}</table>")


def host_command(host: dict[str, Any]) -> str:
    """The shell line that reproduces one host's part: cd, non-secret environment, torchrun argv."""
    secret = set(host.get("secret_names") or [])
    env = {k: v for k, v in sorted((host.get("env") or {}).items()) if k not in secret and v != MASK}
    parts = ["cd", shlex.quote(str(host.get("workdir") or ".")), "&&"]
    if env:
        parts += ["env", *(f"{k}={shlex.quote(str(v))}" for k, v in env.items())]
    line = " ".join(parts) + " " + shlex.join(str(a) for a in host.get("argv") or [])
    header = (f"# {host.get('node')} ({host.get('host')}), node rank {host.get('node_rank')}, "
              f"{host.get('nproc')} process(es)")
    if secret:
        header += f"; secrets set from the controller's environment: {', '.join(sorted(secret))}"
    return f"{header}\n{line}"


def launch_command(record: JobRecord) -> str:
    """The command that starts the job again on the same hosts: as recorded at launch, else (a job
    recorded before distrun kept it) its job file, its inventory and its hosts as one range."""
    if record.command:
        return shlex.join(["distrun", "launch", *record.command])
    words = ["distrun", "launch", record.spec_path]
    words += [] if record.inventory in ("", "<built-in>") else ["-i", record.inventory]
    words += ["--nodes", fold_hosts(record.hosts)] if record.hosts else []
    return shlex.join(words)


def alerts_list(record: JobRecord) -> str:
    """The alerts kept in the job's record (telemetry's and stragglers'), as they were raised."""
    if not record.alerts:
        return "<p>Alerts while it ran: none.</p>"
    items = "".join(f"<li>{esc(alert)}</li>" for alert in record.alerts)
    return f"<h4>Alerts while it ran</h4>\n<ul class=alerts>{items}</ul>"


def job_section(job: JobData, summary: JobSummary) -> str:
    """Versions, commands, the alerts and the outcome of one job."""
    hosts = job.plan.get("hosts") or []
    commands = "\n\n".join(host_command(h) for h in hosts) or "no plan.json recorded"
    detail = f"<pre>{esc(job.record.detail)}</pre>" if job.record.detail else ""
    return (f"<h3 id=\"job-{esc(summary.job_id)}\">{esc(summary.name)} "
            f"<span class=id>{esc(summary.job_id)}</span> — {esc(summary.state)}</h3>\n"
            f"{versions_table(job)}\n<p>Launched as:</p><pre>{esc(launch_command(job.record))}</pre>\n"
            f"<p>Each host ran:</p><pre>{esc(commands)}</pre>\n{alerts_list(job.record)}\n{detail}")


def definitions() -> str:
    items = "".join(f"<dt>{esc(term)}</dt><dd>{text}</dd>" for term, text in DEFINITIONS)
    return f"<h2>How the numbers are computed</h2>\n<dl>{items}</dl>"


def render(data: list[JobData], generated: float | None = None) -> str:
    """The whole page."""
    summaries = [summarize(job) for job in data]
    baseline = pick_baseline(summaries)
    stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(generated or time.time()))
    failed = sum(not s.succeeded for s in summaries)
    status = f", <span class=bad>{failed} did not succeed</span>" if failed else ""
    sections = "\n".join(job_section(job, s) for job, s in zip(data, summaries, strict=True))
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>distrun report: {len(summaries)} job(s)</title>
<style>{CSS}</style></head>
<body>
<h1>distrun comparison report</h1>
<p class=meta>{len(summaries)} job(s){status}; generated {esc(stamp)} by <code>distrun report</code>.</p>
<p>{baseline_text(summaries, baseline)}</p>
{comparison_table(summaries, baseline)}
{scaling_section(scaling_series(summaries))}
{definitions()}
{plots_section(data, summaries, baseline)}
<h2>Hosts, versions and commands</h2>
{sections}
</body></html>
"""


def write_report(data: list[JobData], output: Path) -> Path:
    """Render the page for these jobs and write it; returns the absolute path written."""
    output = output.expanduser().resolve()
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(render(data), encoding="utf-8")
    return output
