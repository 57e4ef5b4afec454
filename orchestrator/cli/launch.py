"""`distrun launch`: in the foreground, or (--detach) as a background controller whose job is
recorded before the command returns."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time

import click

from orchestrator import registry, remote
from orchestrator.backends.base import LaunchRequest
from orchestrator.cli.options import (
    LaunchCommand,
    NodeCount,
    color_option,
    context_guard,
    host_selection,
    inventory_option,
    json_option,
)
from orchestrator.console import terminal
from orchestrator.console.session import ORIGIN_ENV, origin_here
from orchestrator.errors import UsageError
from orchestrator.spec.model import JobSpec
from orchestrator.spec.overrides import job_for_launch
from orchestrator.spec.select import HostSelection
from orchestrator.store import Store, new_job_id

DETACH_WAIT = 120.0


@click.command(cls=LaunchCommand, short_help="Start a job (a job file, or a training script) on the hosts.")
@click.argument("target", metavar="JOB.yaml|SCRIPT.py", type=click.Path(dir_okay=False))
@inventory_option
@host_selection()
@click.option("--nnodes", type=NodeCount(), metavar="K|MIN:MAX", help="Use the first K selected hosts (MIN:MAX: "
              "up to MAX, and go on with MIN when restarts leave fewer).")
@click.option("--nproc-per-node", "--nproc_per_node", "nproc_per_node", metavar="N|auto",
              help="Processes per host, over the job's (auto: one per GPU, else 2).")
@click.option("--name", metavar="NAME", help="The job's name, over the job's (job ids start with it).")
@click.option("--env", multiple=True, metavar="KEY=VALUE", help="An environment variable for every process, over "
              "the job's (repeatable); KEY='${env:NAME}' is a secret read from this shell.")
@click.option("--workdir", metavar="DIR", help="Where the ranks start on each host (an absolute path), over "
              "the job's `workdir` (default: the path of the current directory).")
@click.option("--sync", is_flag=True, help="Copy the current directory to each host's workdir first, as the "
              "job's `sync: true` (only the files that differ travel).")
@click.option("--dry-run", is_flag=True, help="Print every host's argv and environment without reaching the hosts "
              "(values only their probe gives show as <probe>); start nothing.")
@click.option("--probe", is_flag=True, help="With --dry-run: reach and probe the hosts to fill in every value.")
@click.option("--detach", is_flag=True, help="Run the controller in the background; print the job id.")
@json_option()
@click.option("--skip-preflight", is_flag=True, help="Do not check versions and the port before starting.")
@click.option("--backend", type=click.Choice(registry.names()), help="Where to run (default: the job's, else ssh).")
@click.option("-o", "--option", "options", multiple=True, metavar="KEY=VALUE",
              help="A backend option, over the job file's section of that backend (repeatable; "
                   "`distrun backends` lists them), e.g. -o partition=gpu.")
@click.option("--no-live", is_flag=True, help="No live status area; plain log lines.")
@click.option("--collapse", is_flag=True, help="Fold identical lines of several ranks into one [node0-2 r0-5] line.")
@click.option("--metrics-lines", is_flag=True, help="Show the ranks' DISTRUN_METRICS and DISTRUN_CHECKSUM lines "
              "(the live view, the summary and the job's files have them anyway).")
@click.option("--metrics-port", type=click.IntRange(1, 65535), metavar="PORT",
              help="Serve the job's figures for Prometheus at http://127.0.0.1:PORT/metrics while it runs "
                   "(over the job's metrics_port).")
@click.option("--metrics-addr", metavar="ADDR", default="127.0.0.1", show_default=True,
              help="The address the metrics endpoint listens on (0.0.0.0: every interface).")
@click.option("--job-id", hidden=True)
@click.option("--detached-child", is_flag=True, hidden=True)
@color_option
@click.argument("extra", nargs=-1, type=click.UNPROCESSED, metavar="[-- ARGS]")
@click.pass_context
def launch(ctx: click.Context, target: str, inventory: str | None, selection: HostSelection,
           nnodes: int | tuple[int, int] | None,
           nproc_per_node: str | None, name: str | None, env: tuple[str, ...], workdir: str | None, sync: bool,
           dry_run: bool, probe: bool,
           detach: bool, as_json: bool, skip_preflight: bool, backend: str | None, options: tuple[str, ...],
           no_live: bool, collapse: bool, metrics_lines: bool, metrics_port: int | None, metrics_addr: str,
           job_id: str | None, detached_child: bool, extra: tuple[str, ...]) -> None:
    """Start a job on the selected hosts: JOB.yaml, or SCRIPT.py with the job built from the flags.

    Arguments after `--` go to the training script. Without --nodes, --label, --nnodes or --all,
    a job without `nnodes` uses every host of the inventory; above `confirm_above` hosts (8)
    distrun asks first on a terminal, and refuses elsewhere. With --detach, --json prints the
    job's record instead of its id.

    \b
    Examples:
      distrun launch jobs/resnet50.yaml
      distrun launch jobs/tiny.yaml -i lab.yaml --nodes 'node[0,2]' -- --steps 20
      distrun launch train.py -i lab.yaml --nnodes 2 --nproc-per-node 2 --env OMP_NUM_THREADS=1 -- --lr 0.1
      distrun launch train.py --nnodes 2 --dry-run > job.yaml     # the job file, ready to save
      distrun launch train.py -i lab.yaml --nnodes 2 --sync --workdir /srv/project
      distrun launch jobs/tiny.yaml -i lab.yaml --detach --json
      distrun launch jobs/tiny.yaml -i lab.yaml --metrics-port 9400   # Prometheus scrapes 127.0.0.1:9400
    """
    from orchestrator.run.launch import launch as launch_job

    if probe and not dry_run:
        raise UsageError("--probe: only with --dry-run (a launch always probes the hosts)")
    if as_json and not detach:
        raise UsageError("--json: only with --detach (a launch in the foreground prints the job's lines)")
    request = LaunchRequest(
        job_file=target, inventory=inventory, selection=selection, nnodes=nnodes if isinstance(nnodes, int) else None,
        nnodes_range=nnodes if isinstance(nnodes, tuple) else None, dry_run=dry_run, probe=probe,
        skip_preflight=skip_preflight, backend=backend, live=not no_live, collapse=collapse,
        metrics_lines=metrics_lines, job_id=job_id or None, quiet=detached_child, extra_args=list(extra),
        options=list(options), name=name, nproc_per_node=nproc_per_node, env=list(env), workdir=workdir, sync=sync,
        guard=None if detached_child else context_guard(ctx), metrics_port=metrics_port, metrics_addr=metrics_addr,
    )
    if detach and not dry_run:
        sys.exit(_detach(request, as_json))
    with terminal.no_control_echo():  # a `^C` echoed into the live view would leave its title behind
        code = launch_job(request)
    sys.exit(code)


def _detach(request: LaunchRequest, as_json: bool) -> int:
    """Re-run this launch as a background controller and wait until its job is recorded.

    The host selection is checked here first (asking when the guard would), so the controller,
    which no one can answer, is started only for a launch that may go ahead. A controller that
    ends before recording its job leaves nothing behind: its output is shown and its directory
    removed.
    """
    job = job_for_launch(request.job_file, request.name, request.nproc_per_node, request.env,
                         request.nnodes_range, request.workdir, request.sync)
    _check_selection(request, job)
    job_id = request.job_id or new_job_id(job.name)
    store = Store()
    job_dir = store.job_dir(job_id)
    job_dir.create()
    argv = _child_argv(sys.argv[1:])
    at = argv.index("launch")
    argv[at + 1:at + 1] = ["--job-id", job_id, "--detached-child", "--no-live"]
    with job_dir.open(job_dir.controller_log, "ab") as log:
        child = subprocess.Popen(
            [*remote.module_argv(sys.executable, "orchestrator", sys.version_info >= (3, 11)), *argv],
            stdin=subprocess.DEVNULL, stdout=log,
            stderr=subprocess.STDOUT, start_new_session=True,
            env={**os.environ, ORIGIN_ENV: origin_here()},  # in a session of its own, it records this terminal's
        )
    # A Ctrl-C from here on leaves that controller running in its own session: the line says so (cli/main.py).
    click.get_current_context().ensure_object(dict)["interrupted"] = (
        f"distrun: interrupted; job {job_id} goes on in the background (`distrun stop {job_id}` ends it)")
    deadline = time.monotonic() + DETACH_WAIT
    while time.monotonic() < deadline:
        if _recorded(store, job_id):
            terminal.show(json.dumps(store.get(job_id).to_dict(), indent=2) if as_json else job_id)
            return 0
        if child.poll() is not None:
            terminal.show(job_dir.controller_log.read_text(encoding="utf-8", errors="replace"), err=True, end="")
            if not _recorded(store, job_id):
                shutil.rmtree(job_dir.root, ignore_errors=True)
            return child.returncode
        time.sleep(0.1)
    terminal.show(json.dumps({"id": job_id, "state": "starting"}) if as_json else job_id)
    return 0


def _child_argv(argv: list[str]) -> list[str]:
    """This command line without --detach and --json (the script's arguments after `--` kept as given)."""
    split = argv.index("--") if "--" in argv else len(argv)
    return [a for a in argv[:split] if a not in ("--detach", "--json")] + argv[split:]


def _check_selection(request: LaunchRequest, job: JobSpec) -> None:
    """The selection errors and the guard's question of the launch, before anything is started."""
    from orchestrator.spec import default_inventory, resolve_inventory_path, select_nodes

    local = (request.backend or job.backend) == "local"
    if local and request.inventory:
        return  # the controller says why this is refused
    inventory = default_inventory() if local else resolve_inventory_path(request.inventory)
    select_nodes(job, inventory, request.selection, request.nnodes, request.guard)


def _recorded(store: Store, job_id: str) -> bool:
    try:
        store.get(job_id)
    except UsageError:
        return False
    return True
