"""The report's page: self-contained HTML, the plots inlined as data URIs and the CSS inline, so
that it opens with no network."""

from __future__ import annotations

import html
import shlex
import time
from pathlib import Path
from typing import Any

from orchestrator.console.display import fold_hosts
from orchestrator.plan import MASK, shell_word
from orchestrator.report.numbers import (
    NO_VALUE,
    JobData,
    JobSummary,
    fmt,
    fmt_efficiency,
    host_efficiency,
    host_speedup,
    labels,
    number,
    pick_baseline,
    rank0_records,
    scaling_efficiency,
    scaling_series,
    summarize,
)
from orchestrator.report.plots import (
    memory_bars,
    scaling_plot,
    step_series,
    telemetry_plot,
    throughput_bars,
)
from orchestrator.report.runplots import lateness_plot, rate_plot
from orchestrator.report.runs import RunFigures, run_figures
from orchestrator.store import JobDir, JobRecord
from orchestrator.telemetry.alerts import recorded

TABLE_HEAD_COLOUR = "#30638e"
PLOT_FRAME_COLOUR = "#8e3063"
FACT_KEYS = ("hostname", "python", "torch", "cuda", "nccl", "gpus")

DEFINITIONS = (
    ("Steady-state records", "the metrics records of rank 0 (one per logging interval) whose "
     "<code>warmup</code> is false; the final summary record is not one of them."),
    ("Hosts × processes and global batch", "from the job's plan.json (processes per host) and its metrics "
     "(<code>global_batch</code>: samples per optimizer step, all processes together)."),
    ("Throughput", "the arithmetic mean of <code>samples_per_s</code> (samples per second of the whole "
     "job, every process together, over one logging interval) over the steady-state records. The launch "
     "summary's figure, written in the row's notes, is another: the final record's "
     "<code>mean_samples_per_s</code>, steady-state samples divided by their total time; the two differ "
     "when intervals differ in length or speed."),
    ("Collective rate and step", "from the ranks' Flight Recorders (collectives.jsonl), for any program: "
     "the collectives per second from the first to the last one a rank's records hold, counted by sequence "
     "id; a step is the period after which the sequence of collectives repeats (e.g. 11 = 10 all-reduces and "
     "a broadcast), and steps/s is the rate divided by it. A rank's lateness is how long after the first "
     "rank it entered a collective."),
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


def esc(value: Any) -> str:
    return html.escape(str(value))


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
p.empty {{ color: #555; font-style: italic; }}
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
        notes.append(f"throughput: the mean of {summary.steady_count} steady-state interval(s)")
    if summary.summary_throughput is not None:
        notes.append(f"the launch summary's {fmt(summary.summary_throughput)} samples/s: steady-state samples "
                     "divided by their total time")
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


METRICS_FILL = ("a training script that prints <code>DISTRUN_METRICS {...}</code> lines (<code>samples_per_s</code>, "
                "<code>loss</code>, <code>peak_mem_mb</code>) fills it")


def metric_figures(data: list[JobData], summaries: list[JobSummary], baseline: JobSummary | None) -> list[str]:
    """Throughput, loss and memory figures, each where some job has its numbers, else a line saying
    what would fill it."""
    def has(key: str) -> bool:
        return any(number(m.get(key)) is not None for job in data for m in rank0_records(job.metrics))

    figures = []
    if any(s.throughput is not None for s in summaries):
        figures.append(figure(throughput_bars(summaries, baseline), "throughput per job",
                              "Mean steady-state throughput per job; scaling efficiency in brackets."))
    if has("samples_per_s"):
        figures.append(figure(step_series(data, summaries, "samples_per_s", "samples/s", "Throughput over steps"),
                              "throughput over steps", "Rank 0's <code>samples_per_s</code> per interval; hollow "
                              "points are warm-up, left out of the mean."))
    if has("loss"):
        figures.append(figure(step_series(data, summaries, "loss", "loss", "Loss"), "loss curves",
                              "Rank 0's loss per interval."))
    if any(s.peak_mem_mb is not None for s in summaries):
        figures.append(figure(memory_bars(summaries), "peak memory per job",
                              "Peak memory per process (device memory on GPUs, resident memory on CPUs)."))
    return figures


def plots_section(data: list[JobData], summaries: list[JobSummary], baseline: JobSummary | None) -> str:
    """Throughput, loss, memory and telemetry figures; a line instead of each that has no data."""
    figures = metric_figures(data, summaries, baseline)
    notes = [] if len(figures) == 4 else [f"<p class=empty>No throughput, loss or memory plot where no job has "
                                          f"the numbers: {METRICS_FILL}.</p>"]
    names = labels(summaries)
    for job, summary in zip(data, summaries, strict=True):
        uri = telemetry_plot(job, names[summary.job_id])
        if uri is None:
            notes.append(f"<p class=empty>No telemetry recorded for job <span class=id>{esc(summary.job_id)}</span>: "
                         "no utilization or memory plot for it (<code>telemetry: {interval: 5}</code> fills it).</p>")
            continue
        figures.append(figure(uri, f"telemetry of {summary.job_id}",
                              f"Per-host samples from <code>telemetry.jsonl</code> of {esc(summary.job_id)}.",
                              wide=True))
    shown = f"<div class=plots>\n{''.join(figures)}\n</div>\n" if figures else ""
    return f"<h2>Plots</h2>\n{''.join(notes)}\n{shown}"


RUN_COLUMNS = ("Job", "Wall time (s)", "Collectives completed", "Collectives/s", "Step (collectives)", "Steps/s",
               "What is missing")


def run_row(run: RunFigures) -> str:
    """One `<tr>` of the runs table."""
    wall = fmt(run.wall_s) + (" so far" if run.running else "")
    cells = [f"<span class=id>{esc(run.job_id)}</span>", wall, fmt(run.collectives, 0), fmt(run.rate),
             fmt(run.period, 0), fmt(run.steps_per_s, 2)]
    body = f"<td>{cells[0]}</td>" + "".join(f"<td class=num>{c}</td>" for c in cells[1:])
    missing = "<br>".join(esc(line) for line in run.missing) or "nothing"
    return f"<tr data-job={esc(run.job_id)}>{body}<td class=notes>{missing}</td></tr>"


def run_plots(run: RunFigures, label: str) -> tuple[list[str], str]:
    """The run's rate and lateness figures, and a line saying what would fill them when it has none."""
    rate, late = rate_plot(run, label), lateness_plot(run, label)
    figures = []
    if rate is not None:
        figures.append(figure(rate, f"collective rate of {run.job_id}", "Collectives every rank had completed, "
                              "per second between two Flight Recorder reads; vertical lines: alerts, stalls, "
                              "failures and attempts.", wide=True))
    if late is not None:
        figures.append(figure(late, f"lateness of {run.job_id}", "Each rank's mean lateness entering its "
                              "collectives (ms after the first rank), per time column; white: no collective "
                              "kept there (each read keeps a rank's latest 200); triangles: stragglers named.",
                              wide=True))
    if figures:
        return figures, ""
    return [], (f"<p class=empty>No collective rate or lateness plot for job <span class=id>{esc(run.job_id)}"
                "</span>: its ranks' Flight Recorder reads (collectives.jsonl) would fill them.</p>")


def runs_section(data: list[JobData], summaries: list[JobSummary]) -> str:
    """Wall time, collective and step rate of every job, whatever its program prints, and per job the
    collective rate and each rank's lateness over time."""
    runs = [run_figures(job, JobDir(job.root)) for job in data if job.root is not None]
    if not runs:
        return ""
    head = "".join(f"<th>{esc(c)}</th>" for c in RUN_COLUMNS)
    rows = "\n".join(run_row(run) for run in runs)
    names = labels(summaries)
    drawn = [run_plots(run, names.get(run.job_id, run.job_id)) for run in runs]
    figures, notes = "".join(f for figs, _ in drawn for f in figs), "".join(note for _, note in drawn)
    return (f"<h2>Runs: what the ranks did</h2>\n<table id=runs><thead><tr>{head}</tr></thead><tbody>\n{rows}\n"
            f"</tbody></table>\n{notes}" + (f"<div class=plots>{figures}</div>" if figures else ""))


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


def host_command(host: dict[str, Any], job_id: str) -> str:
    """The shell line that reproduces one host's part: cd, non-secret environment, torchrun argv."""
    secret = set(host.get("secret_names") or [])
    env = {k: v for k, v in sorted((host.get("env") or {}).items()) if k not in secret and v != MASK}
    parts = ["cd", shlex.quote(str(host.get("workdir") or ".")), "&&"]
    if env:
        parts += ["env", *(f"{k}={shlex.quote(str(v))}" for k, v in env.items())]
    line = " ".join(parts) + " " + " ".join(shell_word(str(a), job_id) for a in host.get("argv") or [])
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
    items = "".join(f"<li>{esc(recorded(alert).text())}</li>" for alert in record.alerts)
    return f"<h4>Alerts while it ran</h4>\n<ul class=alerts>{items}</ul>"


def job_section(job: JobData, summary: JobSummary) -> str:
    """Versions, commands, the alerts and the outcome of one job."""
    hosts = job.plan.get("hosts") or []
    commands = "\n\n".join(host_command(h, str(job.plan.get("job_id"))) for h in hosts) or "no plan.json recorded"
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
{runs_section(data, summaries)}
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
