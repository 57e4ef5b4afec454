"""`distrun bench`: run a set of jobs one after another (or take finished ones) and write the report.

Every job file is checked before the first job starts, so a typo in the last file does not
surface after the others have run for an hour.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from orchestrator.backends.base import LaunchRequest
from orchestrator.errors import DistrunError, ExitCode, UsageError
from orchestrator.report import JobData, write_report
from orchestrator.store import JobRecord, JobState, Store, new_job_id

JOB_SUFFIXES = (".yaml", ".yml")
INTERRUPTED = (int(ExitCode.INTERRUPTED), int(ExitCode.TERMINATED))


@dataclass(frozen=True)
class BenchItem:
    """One member of the set: a job file to run, or a job that already finished."""

    job_file: str | None = None
    job_name: str = ""
    record: JobRecord | None = None


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
    from orchestrator.spec import load_job

    path = Path(arg)
    if path.is_file():
        return BenchItem(job_file=arg, job_name=load_job(arg).name)
    if path.is_dir():
        return BenchItem(record=store.get(path.name))
    if path.suffix in JOB_SUFFIXES or "/" in arg:
        raise UsageError(f"{arg}: no such job file")
    return BenchItem(record=store.get(arg))


def run_job(item: BenchItem, inventory: str | None, store: Store, say: Callable[[str], None]) -> JobRecord:
    """Launch one job file to its end with the normal launch path; its record afterwards.

    A launch that fails before the job is recorded (a host unreachable, a preflight check)
    gives a failed record that is not stored, so the report still shows the row.
    """
    from orchestrator import launch

    job_id = new_job_id(item.job_name)
    say(f"bench: running {item.job_file} as {job_id}")
    request = LaunchRequest(job_file=item.job_file or "", inventory=inventory, live=False, job_id=job_id)
    try:
        launch.launch(request)
    except DistrunError as exc:
        say(f"bench: {item.job_file} did not run: {exc}")
        try:
            return store.get(job_id)
        except UsageError:
            return JobRecord(id=job_id, name=item.job_name, spec_path=item.job_file or "", inventory=inventory or "",
                             hosts=[], state=JobState.FAILED, ended=time.time(), exit_code=int(exc.exit_code),
                             detail=f"did not start: {exc}")
    return store.get(job_id)


def exit_code(records: list[JobRecord], interrupted: int | None) -> int:
    """Interrupted wins; otherwise 1 when any job of the set did not succeed."""
    if interrupted is not None:
        return interrupted
    ok = all(r.state is JobState.SUCCEEDED for r in records)
    return int(ExitCode.OK if ok else ExitCode.FAILED)


def run_bench(args: Sequence[str], inventory: str | None, output: Path,
              say: Callable[[str], None] = lambda text: print(text, file=sys.stderr)) -> int:
    """Run the set in order, write the report, and return the exit code.

    Raises:
        UsageError: an argument is neither a valid job file nor a known job (nothing ran).
    """
    from orchestrator.spec import resolve_inventory_path

    store = Store()
    items = [resolve(arg, store) for arg in expand(args)]
    if any(item.job_file for item in items):
        resolve_inventory_path(inventory)
    records: list[JobRecord] = []
    interrupted = None
    for item in items:
        record = item.record or run_job(item, inventory, store, say)
        records.append(record)
        if item.job_file and record.exit_code in INTERRUPTED:
            interrupted = record.exit_code
            say("bench: interrupted; the remaining jobs were not run")
            break
    path = write_report([JobData.load(r, store.job_dir(r.id)) for r in records], output)
    failed = [r.id for r in records if r.state is not JobState.SUCCEEDED]
    say(f"bench: report written to {path}" + (f" ({len(failed)} job(s) did not succeed: {', '.join(failed)})"
                                              if failed else ""))
    return exit_code(records, interrupted)
