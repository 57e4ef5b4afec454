"""`distrun bench`: run a set of jobs one after another (or take finished ones) and write the report.

Every job file is checked before the first job starts, so a typo in the last file does not
surface after the others have run for an hour. With `--hosts 1,2,4` each job file runs once per
host count (the first K hosts of the selection), and the report adds throughput and scaling
efficiency against the host count.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from orchestrator.console.terminal import show
from orchestrator.errors import DistrunError, ExitCode, UsageError
from orchestrator.report.numbers import JobData
from orchestrator.report.page import write_report
from orchestrator.run.request import LaunchRequest
from orchestrator.spec import load_job
from orchestrator.spec.select import HostSelection, SelectionGuard
from orchestrator.store import JobRecord, JobState, Store, new_job_id

JOB_SUFFIXES = (".yaml", ".yml")
INTERRUPTED = (int(ExitCode.INTERRUPTED), int(ExitCode.TERMINATED))


@dataclass(frozen=True)
class BenchRequest:
    """What `distrun bench` was asked."""

    jobs: Sequence[str]
    inventory: str | None = None
    output: Path = Path("report.html")
    selection: HostSelection = field(default_factory=HostSelection)
    host_counts: list[int] | None = None  # --hosts: run each job file at each of these host counts
    guard: SelectionGuard | None = None


@dataclass(frozen=True)
class BenchItem:
    """One member of the set: a job file to run (on `nnodes` hosts, when given), or a job that already finished."""

    job_file: str | None = None
    job_name: str = ""
    record: JobRecord | None = None
    nnodes: int | None = None


def expand(args: Sequence[str]) -> list[str]:
    """A directory of job files stands for its *.yaml files in name order; other arguments as given."""
    expanded = []
    for arg in args:
        path = Path(arg)
        if path.is_dir() and not (path / "plan.json").exists():
            files = sorted(str(p) for p in path.iterdir() if p.suffix in JOB_SUFFIXES)
            if not files:
                raise UsageError(f"{arg}: a directory with no job files (*.yaml) in it")
            expanded += files
        else:
            expanded.append(arg)
    return expanded


def resolve(arg: str, store: Store) -> BenchItem:
    """A job file (loaded and checked), a job directory, or a finished job's id.

    Raises:
        UsageError: a job file is invalid or missing, or no job has this id.
    """
    path = Path(arg)
    if path.is_file():
        return BenchItem(job_file=arg, job_name=load_job(arg).name)
    if path.is_dir():
        return BenchItem(record=store.get(path.name))
    if path.suffix in JOB_SUFFIXES or "/" in arg:
        raise UsageError(f"{arg}: no such job file")
    return BenchItem(record=store.get(arg))


def with_host_counts(items: list[BenchItem], counts: list[int] | None) -> list[BenchItem]:
    """Each job file once per host count, in the order given; finished jobs as they are."""
    if not counts:
        return items
    return [replace(item, nnodes=count) for item in items for count in (counts if item.job_file else [None])]


def run_job(item: BenchItem, request: BenchRequest, store: Store, say: Callable[[str], None]) -> JobRecord:
    """Launch one job file to its end with the normal launch path; its record afterwards.

    A launch that fails before the job is recorded (a host unreachable, a preflight check)
    gives a failed record that is not stored, so the report still shows the row.
    """
    from orchestrator.run import launch
    job_id = new_job_id(item.job_name)
    on = f" on {item.nnodes} host(s)" if item.nnodes else ""
    say(f"bench: running {item.job_file}{on} as {job_id}")
    launch_request = LaunchRequest(job_file=item.job_file or "", inventory=request.inventory, live=False,
                                   job_id=job_id, selection=request.selection, nnodes=item.nnodes,
                                   guard=request.guard)
    try:
        launch.launch(launch_request)
    except DistrunError as exc:
        say(f"bench: {item.job_file} did not run: {exc}")
        try:
            return store.get(job_id)
        except UsageError:
            return JobRecord(id=job_id, name=item.job_name, spec_path=item.job_file or "",
                             inventory=request.inventory or "", hosts=[], state=JobState.FAILED,
                             ended=time.time(), exit_code=int(exc.exit_code), detail=f"did not start: {exc}")
    return store.get(job_id)


def exit_code(records: list[JobRecord], interrupted: int | None) -> int:
    """Interrupted wins; otherwise 1 when any job of the set did not succeed."""
    if interrupted is not None:
        return interrupted
    ok = all(r.state is JobState.SUCCEEDED for r in records)
    return int(ExitCode.OK if ok else ExitCode.FAILED)


def run_bench(request: BenchRequest, say: Callable[[str], None] = lambda text: show(text, err=True)) -> int:
    """Run the set in order, write the report, and return the exit code.

    Raises:
        UsageError: an argument is neither a valid job file nor a known job, or a host count is
            more than the selection has (nothing ran).
    """
    from orchestrator.spec import resolve_inventory_path, select_nodes

    store = Store()
    items = with_host_counts([resolve(arg, store) for arg in expand(request.jobs)], request.host_counts)
    if any(item.job_file for item in items):
        inventory = resolve_inventory_path(request.inventory)
        for item in (i for i in items if i.job_file):
            select_nodes(load_job(item.job_file or ""), inventory, request.selection, item.nnodes)
    records: list[JobRecord] = []
    interrupted = None
    for item in items:
        record = item.record or run_job(item, request, store, say)
        records.append(record)
        if item.job_file and record.exit_code in INTERRUPTED:
            interrupted = record.exit_code
            say("bench: interrupted; the remaining jobs were not run")
            break
    path = write_report([JobData.load(r, store.job_dir(r.id)) for r in records], request.output)
    failed = [r.id for r in records if r.state is not JobState.SUCCEEDED]
    say(f"bench: report written to {path}" + (f" ({len(failed)} job(s) did not succeed: {', '.join(failed)})"
                                              if failed else ""))
    return exit_code(records, interrupted)
