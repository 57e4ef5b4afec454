"""The `distrun` command: one small function per command; `main` maps errors to exit codes."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
import traceback
from pathlib import Path

import click

from orchestrator import backends
from orchestrator.backends.base import LaunchRequest, for_record, refresh_lost
from orchestrator.errors import DistrunError, ExitCode, UsageError
from orchestrator.store import JobRecord, Store, new_job_id

DETACH_WAIT = 120.0


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--debug", is_flag=True, help="Show tracebacks.")
@click.version_option(package_name="distrun")
@click.pass_context
def cli(ctx: click.Context, debug: bool) -> None:
    """Run PyTorch distributed jobs across hosts over SSH, locally or on Slurm."""
    ctx.obj = {"debug": debug}


def _split_names(value: str | None) -> list[str] | None:
    return [n.strip() for n in value.split(",") if n.strip()] if value else None


@cli.command(context_settings={"ignore_unknown_options": False})
@click.argument("job_file", type=click.Path(dir_okay=False))
@click.option("-i", "--inventory", help="Inventory YAML (default: $DISTRUN_INVENTORY, else this machine).")
@click.option("--nodes", help="Comma-separated node names to use.")
@click.option("--nnodes", type=click.IntRange(min=1), help="Use the first K selected nodes.")
@click.option("--dry-run", is_flag=True, help="Print every host's argv and environment; start nothing.")
@click.option("--detach", is_flag=True, help="Run the controller in the background; print the job id.")
@click.option("--skip-preflight", is_flag=True, help="Do not check versions and the port before starting.")
@click.option("--backend", type=click.Choice(backends.names()), help="Where to run (default: the job's).")
@click.option("-o", "--option", "options", multiple=True, metavar="KEY=VALUE",
              help="A backend option, over the job file's section of that backend (repeatable; "
                   "`distrun backends` lists them), e.g. -o partition=gpu.")
@click.option("--no-live", is_flag=True, help="No live status area; plain log lines.")
@click.option("--job-id", hidden=True)
@click.option("--detached-child", is_flag=True, hidden=True)
@click.argument("extra", nargs=-1, type=click.UNPROCESSED)
def launch(job_file: str, inventory: str | None, nodes: str | None, nnodes: int | None, dry_run: bool,
           detach: bool, skip_preflight: bool, backend: str | None, options: tuple[str, ...], no_live: bool,
           job_id: str | None, detached_child: bool, extra: tuple[str, ...]) -> None:
    """Start JOB_FILE on the inventory's hosts. Arguments after `--` go to the training script."""
    from orchestrator.launch import launch as launch_job

    job_id = job_id or None
    if detach and not dry_run:
        sys.exit(_detach(job_file, job_id))
    request = LaunchRequest(
        job_file=job_file, inventory=inventory, nodes=_split_names(nodes), nnodes=nnodes,
        dry_run=dry_run, skip_preflight=skip_preflight, backend=backend, live=not no_live,
        job_id=job_id, quiet=detached_child, extra_args=list(extra), options=list(options),
    )
    sys.exit(launch_job(request))


def _detach(job_file: str, job_id: str | None) -> int:
    """Re-run this launch as a background controller and wait until its job is recorded."""
    from orchestrator.spec import load_job

    job = load_job(job_file)
    job_id = job_id or new_job_id(job.name)
    store = Store()
    job_dir = store.job_dir(job_id)
    job_dir.root.mkdir(parents=True, exist_ok=True)
    argv = [a for a in sys.argv[1:] if a != "--detach"]
    at = argv.index("launch")
    argv[at + 1:at + 1] = ["--job-id", job_id, "--detached-child", "--no-live"]
    with open(job_dir.controller_log, "ab") as log:
        child = subprocess.Popen(
            [sys.executable, "-m", "orchestrator", *argv], stdin=subprocess.DEVNULL, stdout=log,
            stderr=subprocess.STDOUT, start_new_session=True,
        )
    deadline = time.monotonic() + DETACH_WAIT
    while time.monotonic() < deadline:
        if _recorded(store, job_id):
            click.echo(job_id)
            return 0
        if child.poll() is not None:
            sys.stderr.write(job_dir.controller_log.read_text(encoding="utf-8", errors="replace"))
            return child.returncode
        time.sleep(0.1)
    click.echo(job_id)
    return 0


def _recorded(store: Store, job_id: str) -> bool:
    try:
        store.get(job_id)
    except UsageError:
        return False
    return True


def _age(rec: JobRecord) -> str:
    seconds = int((rec.ended or time.time()) - rec.started)
    if seconds >= 3600:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    return f"{seconds // 60}m{seconds % 60:02d}s"


@cli.command()
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output (documented in the README).")
@click.option("--all", "show_all", is_flag=True, help="Every recorded job, not only the latest 20.")
def ps(as_json: bool, show_all: bool) -> None:
    """List jobs, newest first."""
    store = Store()
    records = store.list(None if show_all else 20)
    refresh_lost(store, records)
    if as_json:
        click.echo(json.dumps([r.to_dict() for r in records], indent=2))
        return
    if not records:
        click.echo("no jobs yet (start one with `distrun launch jobs/resnet50.yaml`)")
        return
    click.echo(f"{'JOB':<36} {'STATE':<10} {'TIME':>8} {'EXIT':>4}  HOSTS")
    for rec in records:
        exit_code = "" if rec.exit_code is None else str(rec.exit_code)
        extra = f"  restarts={rec.restarts}" if rec.restarts else ""
        extra += f"  {rec.backend}={rec.backend_ref}" if rec.backend_ref else ""
        alerts = f"  alerts={len(rec.alerts)}" if rec.alerts else ""
        click.echo(f"{rec.id:<36} {rec.state.value:<10} {_age(rec):>8} {exit_code:>4}  "
                   f"{','.join(rec.hosts)}{extra}{alerts}")


@cli.command()
@click.argument("job_ref")
@click.option("-f", "--follow", is_flag=True, help="Keep printing new lines until the job ends.")
@click.option("--node", help="Only this node's lines.")
@click.option("--rank", type=int, help="Only this global rank's lines.")
@click.option("--grep", "pattern", help="Only lines matching this regular expression.")
@click.option("--tail", type=click.IntRange(min=1), help="Only the last N lines.")
@click.option("--recover", is_flag=True, help="First rebuild the job's files from the copies its hosts kept.")
def logs(job_ref: str, follow: bool, node: str | None, rank: int | None, pattern: str | None,
         tail: int | None, recover: bool) -> None:
    """Print a job's logs (JOB_REF: an id, a unique prefix, or `last`)."""
    from orchestrator.logs import follow as follow_file
    from orchestrator.logs import read_lines, select_file

    store = Store()
    rec = store.get(job_ref)
    if node is not None and node not in rec.hosts:
        raise UsageError(f"--node {node}: job {rec.id} ran on {', '.join(rec.hosts)}")
    if recover:
        _recover(store, rec)
    try:
        regex = re.compile(pattern) if pattern else None
    except re.error as exc:
        raise UsageError(f"--grep {pattern!r}: not a regular expression: {exc}") from exc
    path = select_file(store.job_dir(rec.id), node, rank)
    for line in read_lines(path, regex, tail):
        click.echo(line)
    if follow:
        def finished() -> bool:
            current = store.get(rec.id)
            refresh_lost(store, [current])
            return current.state.finished

        with open(path, "a", encoding="utf-8"):
            pass
        skip = sum(1 for _ in read_lines(path, None, None))
        for index, line in enumerate(follow_file(path, finished, None)):
            if index >= skip and (regex is None or regex.search(line)):
                click.echo(line)


def _recover(store: Store, rec: JobRecord) -> None:
    for name, count in for_record(store, rec).recover(rec).items():
        click.echo(f"[{name}] distrun: recovered {count} line(s) from the host's copy", err=True)


@cli.command()
@click.argument("job_ref")
def stop(job_ref: str) -> None:
    """Stop a job: through its controller when alive, otherwise directly on its hosts."""
    store = Store()
    rec = store.get(job_ref)
    sys.exit(for_record(store, rec).stop_job(rec))


@cli.command()
@click.argument("job_ref")
@click.option("--once", is_flag=True, help="Print one frame and exit, even for a running job.")
def top(job_ref: str, once: bool) -> None:
    """Show every host's and GPU's latest figures: live for a running job, the last samples of a finished one."""
    from rich.console import Console

    from orchestrator.telemetry import top as show

    store = Store()
    job_id = store.get(job_ref).id

    def current() -> JobRecord:
        rec = store.get(job_id)
        refresh_lost(store, [rec])
        return rec

    show(store.job_dir(job_id), current, Console(), once=once)


@cli.command("exec", context_settings={"allow_interspersed_args": False})
@click.option("-i", "--inventory", help="Inventory YAML (default: $DISTRUN_INVENTORY, else this machine).")
@click.option("--nodes", help="Comma-separated node names to run on (default: every node).")
@click.option("--label", "labels", multiple=True, help="Only nodes with this label (repeatable: all must match).")
@click.option("--timeout", type=click.FloatRange(min=0, min_open=True), help="Stop the command after S seconds.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output (documented in the README).")
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
def exec_command(inventory: str | None, nodes: str | None, labels: tuple[str, ...], timeout: float | None,
                 as_json: bool, command: tuple[str, ...]) -> None:
    """Run COMMAND on the selected hosts at once; hosts with identical output are shown together.

    Every word of COMMAND arrives as one argument; for pipes or globs use `-- sh -c '...'`.
    Exit status: 0 all succeeded, 1 the command failed on some host, 3 a host was not reached.
    """
    from orchestrator.execute import ExecRequest, execute

    request = ExecRequest(argv=command, inventory=inventory, nodes=tuple(_split_names(nodes) or ()),
                          labels=labels, timeout=timeout, as_json=as_json)
    sys.exit(execute(request))


@cli.command()
@click.argument("job_refs", nargs=-1, required=True, metavar="JOB_REF...")
@click.option("-o", "--output", default="report.html", show_default=True, type=click.Path(dir_okay=False),
              help="The HTML file to write.")
def report(job_refs: tuple[str, ...], output: str) -> None:
    """Write one self-contained HTML page comparing finished jobs (JOB_REF: an id, a unique prefix, or `last`)."""
    from orchestrator.report import load_jobs, write_report

    path = write_report(load_jobs(Store(), job_refs), Path(output))
    click.echo(f"report written to {path}")


@cli.command()
@click.argument("jobs", nargs=-1, required=True, metavar="JOBS...")
@click.option("-i", "--inventory", help="Inventory YAML (default: $DISTRUN_INVENTORY, else this machine).")
@click.option("-o", "--output", default="report.html", show_default=True, type=click.Path(dir_okay=False),
              help="The HTML file to write.")
def bench(jobs: tuple[str, ...], inventory: str | None, output: str) -> None:
    """Run job files one after another (or take finished job ids) and write the comparison report.

    JOBS: job YAMLs, directories of job YAMLs, or finished job ids. Exit status 1 when any job
    did not succeed; the report is written either way, with that row marked.
    """
    from orchestrator.compare import run_bench

    sys.exit(run_bench(jobs, inventory, Path(output)))


@cli.command()
@click.option("-i", "--inventory", help="Inventory YAML (default: $DISTRUN_INVENTORY, else this machine).")
@click.option("--job", "job_file", type=click.Path(dir_okay=False), help="Check with this job's hosts, port, nproc.")
@click.option("--nodes", help="Comma-separated node names to check (default: every node, or the job's).")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output (documented in the README).")
@click.option("--strict", is_flag=True, help="Exit 1 on warnings too.")
@click.option("--bandwidth", is_flag=True, help="Also time a short all-reduce across the hosts.")
@click.option("--min-busbw", type=click.FloatRange(min=0), help="Warn under this all-reduce busbw, GB/s.")
def doctor(inventory: str | None, job_file: str | None, nodes: str | None, as_json: bool, strict: bool,
           bandwidth: bool, min_busbw: float | None) -> None:
    """Check every host for what makes multi-host jobs hang; one row per check.

    Exit status: 0 no errors, 1 a check failed (warnings too with --strict), 3 a host was not reached.
    """
    from orchestrator.doctor import DoctorRequest, run_doctor

    request = DoctorRequest(inventory=inventory, job_file=job_file, nodes=_split_names(nodes), as_json=as_json,
                            strict=strict, bandwidth=bandwidth, min_busbw=min_busbw)
    sys.exit(run_doctor(request))


@cli.command("backends")
def list_backends() -> None:
    """List the backends `--backend` takes, and the options (`-o KEY=VALUE`) each declares."""
    from orchestrator.backends.options import describe

    for name in backends.names():
        cls = backends.get(name)
        default = " (default)" if name == backends.DEFAULT else ""
        click.echo(f"{name}{default}: {cls.DESCRIPTION}")
        for line in describe(cls.OPTIONS) or ["no options"]:
            click.echo(f"  {line}")


def main() -> None:
    """Entry point: run the command; errors for people become one line and an exit code."""
    debug = "--debug" in sys.argv
    try:
        cli.main(standalone_mode=False)
    except click.exceptions.Abort:
        sys.exit(int(ExitCode.INTERRUPTED))
    except click.ClickException as exc:
        exc.show()
        sys.exit(int(ExitCode.USAGE))
    except DistrunError as exc:
        if debug:
            traceback.print_exc()
        sys.stderr.write(f"distrun: error: {exc}\n")
        sys.exit(int(exc.exit_code))
    except KeyboardInterrupt:
        sys.exit(int(ExitCode.INTERRUPTED))
    except SystemExit:
        raise
    sys.exit(0)
