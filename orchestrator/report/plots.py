"""The report's plots: matplotlib figures rendered to SVG data URIs."""

from __future__ import annotations

import base64
import io
from typing import Any

from orchestrator.report.numbers import (
    JobData,
    JobSummary,
    fmt,
    fmt_efficiency,
    host_efficiency,
    labels,
    number,
    rank0_records,
    scaling_efficiency,
)

JOB_COLOURS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#17becf")
FIG_SIZE = (7.0, 3.4)
Series = dict[str, list[tuple[float, float | None, float | None]]]  # label -> [(t, utilization, memory)]


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
