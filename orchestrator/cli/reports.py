"""The commands that compare and draw jobs: `report`, `bench` and `trace`."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from orchestrator.cli.options import (
    color_option,
    complete_jobs,
    context_guard,
    host_selection,
    inventory_option,
)
from orchestrator.console import terminal
from orchestrator.errors import UsageError
from orchestrator.spec.select import HostSelection
from orchestrator.store import Store


@click.command(short_help="Write an HTML page comparing finished jobs.")
@click.argument("job_refs", nargs=-1, required=True, metavar="JOB_REF...", shell_complete=complete_jobs)
@click.option("-o", "--output", default="report.html", show_default=True, type=click.Path(dir_okay=False),
              help="The file to write.")
@color_option
def report(job_refs: tuple[str, ...], output: str) -> None:
    """Write one self-contained HTML page comparing finished jobs (JOB_REF: an id, a unique prefix, or `last`).

    \b
    Examples:
      distrun report last -o report.html
      distrun report tiny-2026 resnet50-2026 -o compare.html
    """
    from orchestrator.report.numbers import load_jobs
    from orchestrator.report.page import write_report

    path = write_report(load_jobs(Store(), job_refs), Path(output))
    terminal.show(f"report written to {path}")


@click.command(short_help="Write a job as a trace for Perfetto or chrome://tracing.")
@click.argument("job_ref", metavar="JOB_REF", shell_complete=complete_jobs)
@click.option("-o", "--output", default="trace.json", show_default=True, type=click.Path(dir_okay=False),
              help="The file to write.")
@color_option
def trace(job_ref: str, output: str) -> None:
    """Write a job's run as one timeline in the Chrome Trace Event format (JSON; JOB_REF: an id, a
    unique prefix, or `last`): a track per rank grouped by host with every collective it entered,
    the failed rank's lines, alerts, stalls and restarts, and host and GPU telemetry as counters.
    A running job gives the trace so far. Open the file in https://ui.perfetto.dev or chrome://tracing.

    \b
    Examples:
      distrun trace last -o trace.json
      distrun trace tiny-2026 -o tiny.json
    """
    from orchestrator.report.trace import write_trace

    store = Store()
    record = store.get(job_ref)
    path, events, missing = write_trace(record, store.job_dir(record.id), Path(output))
    for line in missing:
        terminal.show(f"trace: {line}")
    terminal.show(f"trace written to {path} ({events} events): open it in https://ui.perfetto.dev or chrome://tracing")


def _host_counts(value: str | None) -> list[int] | None:
    if not value:
        return None
    try:
        counts = [int(part) for part in value.split(",") if part.strip()]
    except ValueError:
        raise UsageError(f"--hosts {value}: give host counts separated by commas, e.g. 1,2,4") from None
    if not counts or min(counts) < 1:
        raise UsageError(f"--hosts {value}: every host count must be 1 or more")
    return counts


@click.command(short_help="Run jobs one after another and write the comparison report.")
@click.argument("jobs", nargs=-1, required=True, metavar="JOBS...")
@inventory_option
@host_selection()
@click.option("--hosts", "host_counts", metavar="K,K,...", help="Run each job file at each of these host counts "
              "(the first K selected hosts); the report adds throughput and scaling efficiency against hosts.")
@click.option("-o", "--output", default="report.html", show_default=True, type=click.Path(dir_okay=False),
              help="The file to write.")
@color_option
@click.pass_context
def bench(ctx: click.Context, jobs: tuple[str, ...], inventory: str | None, selection: HostSelection,
          host_counts: str | None, output: str) -> None:
    """Run job files one after another (or take finished job ids) and write the comparison report.

    JOBS: job YAMLs, directories of job YAMLs, or finished job ids. Exit status 1 when any job
    did not succeed; the report is written either way, with that row marked.

    \b
    Examples:
      distrun bench jobs/compare -o report.html
      distrun bench jobs/tiny.yaml -i lab.yaml --hosts 1,2,3 -o scaling.html
    """
    from orchestrator.report.compare import BenchRequest, run_bench

    request = BenchRequest(jobs, inventory, Path(output), selection, _host_counts(host_counts),
                           context_guard(ctx))
    sys.exit(run_bench(request))
