"""The `distrun` command: one small function per command; `main` maps errors to exit codes.

Options several commands share (host selection, -i, --json, --color) come from cli_options.py
with one wording each; the config file ($XDG_CONFIG_HOME/distrun/config.yaml) gives defaults.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
import traceback
from pathlib import Path

import click

from orchestrator import backends, remote, terminal
from orchestrator.backends.base import LaunchRequest
from orchestrator.cli_hints import HintedGroup, one_line
from orchestrator.cli_options import (
    LaunchCommand,
    NodeCount,
    NumberOption,
    color_option,
    complete_jobs,
    default_map,
    host_selection,
    inventory_option,
    json_option,
)
from orchestrator.cli_options import guard as terminal_guard
from orchestrator.display import fold_hosts
from orchestrator.errors import DistrunError, ExitCode, UsageError
from orchestrator.recorded import for_record, refresh_lost
from orchestrator.spec.config import Config, load_config
from orchestrator.spec.model import JobSpec
from orchestrator.spec.overrides import job_for_launch
from orchestrator.spec.select import HostSelection
from orchestrator.store import JobRecord, JobState, Store, new_job_id

DETACH_WAIT = 120.0
PS_LIMIT = 20
STATE_COLOURS = {"succeeded": 32, "failed": 31, "running": 36, "pending": 36, "stopped": 33, "lost": 33, "stalled": 33}

EPILOG = """\b
Exit codes:
  0    success
  1    the job failed (or a doctor check, or a command run by exec)
  2    bad input or usage (nothing was started)
  3    infrastructure: a host unreachable, authentication failed, a port busy
  130  interrupted (Ctrl-C)
  143  terminated (SIGTERM)

\b
Environment:
  DISTRUN_INVENTORY    the inventory when -i is not given
  DISTRUN_HOME         where jobs are recorded (default ~/.distrun)
  DISTRUN_SSH_CONFIG   the ssh_config file to read (default ~/.ssh/config)
  DISTRUN_SSH_TIMEOUT  seconds a host has to answer (default 10)
  NO_COLOR             no colour, unless --color or the config file says otherwise
  XDG_CONFIG_HOME      the config file is $XDG_CONFIG_HOME/distrun/config.yaml
                       (default ~/.config/distrun/config.yaml)

\b
Shell completion (job ids, node names): eval "$(distrun completion bash)"
"""


def _config(ctx: click.Context) -> Config:
    """The config file main() read (an empty one when the group is invoked some other way)."""
    config = (ctx.find_root().obj or {}).get("config")
    return config if isinstance(config, Config) else Config()


@click.group(cls=HintedGroup, context_settings={"help_option_names": ["-h", "--help"]}, epilog=EPILOG)
@click.option("--debug", is_flag=True, help="Show tracebacks.")
@color_option
@click.version_option(package_name="distrun")
@click.pass_context
def cli(ctx: click.Context, debug: bool) -> None:
    """Run PyTorch distributed jobs across hosts over SSH, locally or on Slurm.

    \b
    Examples:
      distrun doctor -i lab.yaml
      distrun launch jobs/tiny.yaml -i lab.yaml --nodes 'node[0-1]'
      distrun launch train.py -i lab.yaml --nnodes 2 -- --steps 20
      distrun ps
    """
    ctx.obj = {**(ctx.obj or {}), "debug": debug}


# ---------------------------------------------------------------- launch


@cli.command(cls=LaunchCommand, short_help="Start a job (a job file, or a training script) on the hosts.")
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
@click.option("--dry-run", is_flag=True, help="Print every host's argv and environment without reaching the hosts "
              "(values only their probe gives show as <probe>); start nothing.")
@click.option("--probe", is_flag=True, help="With --dry-run: reach and probe the hosts to fill in every value.")
@click.option("--detach", is_flag=True, help="Run the controller in the background; print the job id.")
@json_option()
@click.option("--skip-preflight", is_flag=True, help="Do not check versions and the port before starting.")
@click.option("--backend", type=click.Choice(backends.names()), help="Where to run (default: the job's, else ssh).")
@click.option("-o", "--option", "options", multiple=True, metavar="KEY=VALUE",
              help="A backend option, over the job file's section of that backend (repeatable; "
                   "`distrun backends` lists them), e.g. -o partition=gpu.")
@click.option("--no-live", is_flag=True, help="No live status area; plain log lines.")
@click.option("--collapse", is_flag=True, help="Fold identical lines of several ranks into one [node0-2 r0-5] line.")
@click.option("--job-id", hidden=True)
@click.option("--detached-child", is_flag=True, hidden=True)
@color_option
@click.argument("extra", nargs=-1, type=click.UNPROCESSED, metavar="[-- ARGS]")
@click.pass_context
def launch(ctx: click.Context, target: str, inventory: str | None, selection: HostSelection,
           nnodes: int | tuple[int, int] | None,
           nproc_per_node: str | None, name: str | None, env: tuple[str, ...], dry_run: bool, probe: bool,
           detach: bool, as_json: bool, skip_preflight: bool, backend: str | None, options: tuple[str, ...],
           no_live: bool, collapse: bool, job_id: str | None, detached_child: bool, extra: tuple[str, ...]) -> None:
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
      distrun launch jobs/tiny.yaml -i lab.yaml --detach --json
    """
    from orchestrator.launch import launch as launch_job

    if probe and not dry_run:
        raise UsageError("--probe: only with --dry-run (a launch always probes the hosts)")
    if as_json and not detach:
        raise UsageError("--json: only with --detach (a launch in the foreground prints the job's lines)")
    request = LaunchRequest(
        job_file=target, inventory=inventory, selection=selection, nnodes=nnodes if isinstance(nnodes, int) else None,
        nnodes_range=nnodes if isinstance(nnodes, tuple) else None, dry_run=dry_run, probe=probe,
        skip_preflight=skip_preflight, backend=backend, live=not no_live, collapse=collapse, job_id=job_id or None,
        quiet=detached_child, extra_args=list(extra), options=list(options), name=name,
        nproc_per_node=nproc_per_node, env=list(env),
        guard=None if detached_child else terminal_guard(_config(ctx)),
    )
    if detach and not dry_run:
        sys.exit(_detach(request, as_json))
    sys.exit(launch_job(request))


def _detach(request: LaunchRequest, as_json: bool) -> int:
    """Re-run this launch as a background controller and wait until its job is recorded.

    The host selection is checked here first (asking when the guard would), so the controller,
    which no one can answer, is started only for a launch that may go ahead. A controller that
    ends before recording its job leaves nothing behind: its output is shown and its directory
    removed.
    """
    job = job_for_launch(request.job_file, request.name, request.nproc_per_node, request.env,
                         request.nnodes_range)
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
        )
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


# ---------------------------------------------------------------- ps


def _age(rec: JobRecord) -> str:
    seconds = int((rec.ended or time.time()) - rec.started)
    if seconds >= 3600:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    return f"{seconds // 60}m{seconds % 60:02d}s"


def _states(value: str | None) -> set[JobState] | None:
    if not value:
        return None
    from orchestrator.spec.fields import suggestion

    known = [s.value for s in JobState]
    chosen = set()
    for word in (w.strip() for w in value.split(",") if w.strip()):
        if word not in known:
            raise UsageError(f"--state {word}: not a state ({suggestion(word, known, 'states')})")
        chosen.add(JobState(word))
    return chosen


@cli.command(short_help="List jobs, newest first.")
@json_option()
@click.option("--all", "show_all", is_flag=True, help="Every recorded job, distrun's own runs included "
              "(doctor --bandwidth's), not only the latest 20.")
@click.option("--state", metavar="STATES", help="Only jobs in these states, e.g. running or 'failed,lost' "
              "(pending, running, succeeded, failed, stopped, lost).")
@click.option("--since", metavar="WHEN", help="Only jobs started since WHEN: a time ago (30m, 2h, 7d), a time today "
              "(14:30) or a local date and time ('2026-11-21 14:30').")
@color_option
def ps(as_json: bool, show_all: bool, state: str | None, since: str | None) -> None:
    """List jobs, newest first: state, start, run time, exit code, hosts as a range.

    \b
    Examples:
      distrun ps
      distrun ps --state running
      distrun ps --since 2h --json
    """
    from orchestrator.timespec import parse_since

    store = Store()
    states = _states(state)
    after = parse_since(since, "--since") if since else None
    records = store.list(None, internal=show_all)
    refresh_lost(store, [r for r in records if not r.state.finished])
    records = [r for r in records if (states is None or r.state in states) and (after is None or r.started >= after)]
    records = records if show_all else records[:PS_LIMIT]
    if as_json:
        terminal.show(json.dumps([r.to_dict() for r in records], indent=2))
        return
    if not records:
        terminal.show("no jobs" + (" match" if states or after else " yet (start one with "
                                "`distrun launch jobs/resnet50.yaml`)"))
        return
    colour = terminal.colour(sys.stdout)
    for line in _ps_lines(records, colour):
        terminal.show(line)


def _ps_lines(records: list[JobRecord], colour: bool) -> list[str]:
    """The table: the JOB column as wide as the longest id, hosts folded into ranges."""
    width = max(len("JOB"), *(len(r.id) for r in records))
    lines = [f"{'JOB':<{width}}  {'STATE':<9}  {'STARTED':<16}  {'TIME':>7}  {'EXIT':>4}  HOSTS"]
    for rec in records:
        exit_code = "" if rec.exit_code is None else str(rec.exit_code)
        state = f"{rec.state.value:<9}"
        if colour:
            state = f"\x1b[{STATE_COLOURS[rec.state.value]}m{state}\x1b[0m"
        started = time.strftime("%Y-%m-%d %H:%M", time.localtime(rec.started))
        extra = f"  restarts={rec.restarts}" if rec.restarts else ""
        extra += f"  attempts={len(rec.attempts)}" if len(rec.attempts) > 1 else ""
        extra += f"  quarantined={fold_hosts(rec.quarantined)}" if rec.quarantined else ""
        extra += f"  {rec.backend}={rec.backend_ref}" if rec.backend_ref else ""
        extra += f"  alerts={len(rec.alerts)}" if rec.alerts else ""
        extra += "  (internal)" if rec.internal else ""
        lines.append(f"{rec.id:<{width}}  {state}  {started:<16}  {_age(rec):>7}  {exit_code:>4}  "
                     f"{fold_hosts(rec.hosts) or '-'}{extra}")
    return lines


# ---------------------------------------------------------------- logs


@cli.command(short_help="Print a job's logs.")
@click.argument("job_ref", shell_complete=complete_jobs)
@click.option("-f", "--follow", is_flag=True,
              help="Keep printing new lines until the job ends; exit with its exit code.")
@click.option("--node", "nodes", multiple=True, metavar="NODE",
              help="Only this node's lines (repeatable, or comma-separated).")
@click.option("--rank", "ranks", multiple=True, metavar="R[,R...]",
              help="Only these global ranks' lines (repeatable, or comma-separated).")
@click.option("--grep", "pattern", metavar="REGEX", help="Only lines whose text matches this regular expression.")
@click.option("--since", metavar="TIME", help="Only lines that arrived since TIME: a time ago (90s, 2h, 7d), a time "
              "today (14:30) or a local date and time ('2026-11-21 14:30').")
@click.option("--tail", cls=NumberOption, type=click.IntRange(min=1), metavar="N",
              help="Only the last N lines (after the other filters).")
@click.option("--stderr", is_flag=True, help="Only the lines the ranks and hosts wrote to stderr.")
@click.option("--attempt", cls=NumberOption, type=click.IntRange(min=1), metavar="K",
              help="Only the lines of attempt K.")
@click.option("--collapse", is_flag=True, help="Fold identical lines of several ranks into one [node0-2 r0-5] line.")
@click.option("--timestamps", is_flag=True, help="Show each line's arrival time first.")
@click.option("--bare", is_flag=True, help="The text of each line only, without [node rank].")
@click.option("--recover", is_flag=True, help="First rebuild the finished job's files from the copies its hosts kept.")
@color_option
def logs(job_ref: str, follow: bool, nodes: tuple[str, ...], ranks: tuple[str, ...], pattern: str | None,
         since: str | None, tail: int | None, stderr: bool, attempt: int | None, collapse: bool, timestamps: bool,
         bare: bool, recover: bool) -> None:
    """Print a job's lines, in the order they arrived (JOB_REF: an id, a unique prefix, or `last`).

    Filters combine (every one must hold). Lines are shown as `[node1 r3] text`, stderr lines
    as `[node1 r3 err] text`; without filters the job's summary follows them.

    \b
    Examples:
      distrun logs last --tail 20
      distrun logs last --rank 3 --grep Error
      distrun logs tiny-2026 -f
    """
    from orchestrator.logs_command import LogsRequest, show_logs

    request = LogsRequest(job_ref=job_ref, follow=follow, nodes=nodes, ranks=ranks, grep=pattern, since=since,
                          tail=tail, stderr=stderr, attempt=attempt, collapse=collapse, timestamps=timestamps,
                          bare=bare, recover=recover)
    sys.exit(show_logs(request))


# ---------------------------------------------------------------- stop, top


@cli.command(short_help="Stop a job, or every job on some hosts.")
@click.argument("job_ref", required=False, shell_complete=complete_jobs)
@host_selection()
@json_option()
@color_option
def stop(job_ref: str | None, selection: HostSelection, as_json: bool) -> None:
    """Stop a job (JOB_REF: an id, a unique prefix, or `last`), or every running job on the selected hosts.

    Through the job's controller when it is alive, else directly on its hosts (found by the job id).
    --json prints one object per job stopped: id, state, exit_code (the job's, as `ps` shows it), messages.

    \b
    Examples:
      distrun stop last
      distrun stop --nodes node3            # every running job that uses node3
      distrun stop --all --json
    """
    store = Store()
    if job_ref and selection != HostSelection():
        raise UsageError("stop: give a job or hosts (--nodes, -x, --label, --all), not both")
    if job_ref:
        records = [store.get(job_ref)]
    elif selection.explicit:
        records = _running_on(store, selection)
    else:
        raise UsageError("stop: which job? Give an id, a prefix or `last`, or hosts with --nodes, --label or --all")
    if not records:
        terminal.show("no running job on those hosts", err=True)
    codes = [_stop_one(store, rec, as_json) for rec in records]
    sys.exit(max(codes, default=0))


def _running_on(store: Store, selection: HostSelection) -> list[JobRecord]:
    """Unfinished jobs with a host among the selected ones (names and labels from each job's inventory)."""
    from orchestrator.spec.select import expand_option

    running = [r for r in store.list(None, internal=True) if not r.state.finished]
    refresh_lost(store, running)
    named = set(expand_option("--nodes", selection.nodes))
    dropped = set(expand_option("--exclude", selection.exclude))
    chosen = []
    for rec in (r for r in running if not r.state.finished):
        hosts = [h for h in rec.hosts if (not named or h in named) and h not in dropped]
        if selection.labels:
            hosts = _with_labels(rec, hosts, selection.labels)
        if hosts:
            chosen.append(rec)
    return chosen


def _with_labels(rec: JobRecord, hosts: list[str], labels: tuple[str, ...]) -> list[str]:
    from orchestrator.backends.ssh import record_inventory
    from orchestrator.spec.select import expand_option

    try:
        inventory = record_inventory(rec.inventory)
    except UsageError:
        return []
    wanted = [set(expand_option("--label", [value])) for value in labels]
    known = {node.name: set(node.labels) for node in inventory.nodes}
    return [h for h in hosts if all(w & known.get(h, set()) for w in wanted)]


def _stop_one(store: Store, rec: JobRecord, as_json: bool) -> int:
    stopped = for_record(store, rec).stop_job(rec)
    for error in stopped.errors:
        terminal.show(error, err=True)
    if as_json:
        after = store.get(rec.id)
        terminal.show(json.dumps({"id": rec.id, "state": after.state.value, "exit_code": after.exit_code,
                                  "messages": list(stopped.messages), "gpus_freed": list(stopped.gpus_freed)}))
    else:
        terminal.show("\n".join([*stopped.messages, *stopped.gpus_freed]))
    return stopped.code


@cli.command(short_help="Dump every rank's Python stack, ranks with the same stack folded.")
@click.argument("job_ref", shell_complete=complete_jobs)
@click.option("--node", metavar="NODE", help="Only this node's ranks.")
@click.option("--rank", cls=NumberOption, type=click.IntRange(min=0), metavar="R", help="Only this global rank.")
@click.option("--native", is_flag=True, help="Also native (C/C++) frames (py-spy --native).")
@json_option()
@color_option
def stack(job_ref: str, node: str | None, rank: int | None, native: bool, as_json: bool) -> None:
    """Dump the Python stack of every rank of a running job with py-spy, on every host at once.

    Ranks with the same stack are shown once under their rank range, the odd ones out first.
    Exit 3 when a host gave no stacks (each named).

    \b
    Examples:
      distrun stack last
      distrun stack last --rank 3 --native
    """
    from orchestrator import stack as stacks

    store = Store()
    rec = store.get(job_ref)
    refresh_lost(store, [rec])
    if rec.state.finished:
        kept = store.job_dir(rec.id).stacks
        where = f"its hang's stacks are kept in {kept}" if kept.is_dir() else "it kept none: no hang was diagnosed"
        raise UsageError(f"job {rec.id} is {rec.state.value}: only a running job's ranks have stacks ({where})")
    gathered = stacks.gather(for_record(store, rec), rec, [node] if node else None, native)
    if rank is not None:
        gathered.ranks = [r for r in gathered.ranks if r.rank == rank]
        if not gathered.ranks and not gathered.failed:
            raise UsageError(f"--rank {rank}: no such rank of job {rec.id} is running")
    terminal.show(json.dumps(stacks.to_json(gathered), indent=2) if as_json else stacks.render(gathered))
    sys.exit(int(ExitCode.INFRA) if gathered.failed else int(ExitCode.OK))


@cli.command(short_help="Show every host's and GPU's latest figures for a job.")
@click.argument("job_ref", shell_complete=complete_jobs)
@click.option("--once", is_flag=True, help="Print one frame and exit, even for a running job.")
@json_option()
@color_option
def top(job_ref: str, once: bool, as_json: bool) -> None:
    """Show every host's and GPU's latest figures: live for a running job, the last samples of a finished one.

    --json prints one sample (each host's and GPU's latest figures) and exits.

    \b
    Examples:
      distrun top last
      distrun top last --once
      distrun top last --json
    """
    from rich.console import Console

    from orchestrator.telemetry.top import top as show
    from orchestrator.telemetry.top import top_sample

    store = Store()
    job_id = store.get(job_ref).id

    def current() -> JobRecord:
        rec = store.get(job_id)
        refresh_lost(store, [rec])
        return rec

    if as_json:
        terminal.show(json.dumps(top_sample(store.job_dir(job_id), current()), indent=2))
        return
    mode = terminal.color_mode()
    console = Console(force_terminal=True if mode is terminal.ColorMode.ALWAYS else None,
                      no_color=not terminal.colour(sys.stdout))
    show(store.job_dir(job_id), current, console, once=once)


# ---------------------------------------------------------------- exec, doctor


@cli.command("exec", context_settings={"allow_interspersed_args": False},
             short_help="Run a command on the selected hosts at once.")
@inventory_option
@host_selection()
@click.option("--timeout", cls=NumberOption, type=click.FloatRange(min=0, min_open=True), metavar="SECONDS",
              help="Stop the command after SECONDS.")
@json_option()
@color_option
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
@click.pass_context
def exec_command(ctx: click.Context, inventory: str | None, selection: HostSelection, timeout: float | None,
                 as_json: bool, command: tuple[str, ...]) -> None:
    """Run COMMAND on the selected hosts at once; hosts with identical output are shown together.

    Every word of COMMAND arrives as one argument; for pipes or globs use `-- sh -c '...'`.
    Exit status: 0 all succeeded, 1 the command failed on some host, 3 a host was not reached.

    \b
    Examples:
      distrun exec -i lab.yaml -- hostname
      distrun exec -i lab.yaml --nodes 'node[0-1]' -- nvidia-smi -L
      distrun exec -i lab.yaml --label h100 -x node3 --timeout 10 -- sh -c 'df -h /tmp'
    """
    from orchestrator.execute import ExecRequest, execute

    request = ExecRequest(argv=command, inventory=inventory, selection=selection,
                          guard=terminal_guard(_config(ctx)), timeout=timeout, as_json=as_json)
    sys.exit(execute(request))


@cli.command(short_help="Check the hosts for what makes multi-host jobs hang.")
@inventory_option
@click.option("--job", "job_file", type=click.Path(dir_okay=False), help="Check with this job's hosts, port, nproc.")
@host_selection()
@json_option()
@click.option("--strict", is_flag=True, help="Exit 1 on warnings too.")
@click.option("--bandwidth", is_flag=True, help="Also time a short all-reduce across the hosts.")
@click.option("--min-busbw", cls=NumberOption, type=click.FloatRange(min=0), metavar="GBPS",
              help="Warn under this all-reduce busbw, GB/s.")
@color_option
@click.pass_context
def doctor(ctx: click.Context, inventory: str | None, job_file: str | None, selection: HostSelection,
           as_json: bool, strict: bool, bandwidth: bool, min_busbw: float | None) -> None:
    """Check the selected hosts for what makes multi-host jobs hang; one row per check.

    Exit status: 0 no errors, 1 a check failed (warnings too with --strict), 3 a host was not reached.
    A check that could not run (its host was not reached) shows as skipped (-).

    \b
    Examples:
      distrun doctor -i lab.yaml
      distrun doctor -i lab.yaml --nodes 'node[0-1]' --json
      distrun doctor -i lab.yaml --job jobs/tiny.yaml --bandwidth
    """
    from orchestrator.doctor import DoctorRequest, run_doctor

    request = DoctorRequest(inventory=inventory, job_file=job_file, selection=selection,
                            guard=terminal_guard(_config(ctx)), as_json=as_json, strict=strict,
                            bandwidth=bandwidth, min_busbw=min_busbw)
    sys.exit(run_doctor(request))


# ---------------------------------------------------------------- report, bench, prune


@cli.command(short_help="Write an HTML page comparing finished jobs.")
@click.argument("job_refs", nargs=-1, required=True, metavar="JOB_REF...", shell_complete=complete_jobs)
@click.option("-o", "--output", default="report.html", show_default=True, type=click.Path(dir_okay=False),
              help="The HTML file to write.")
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


@cli.command(short_help="Run jobs one after another and write the comparison report.")
@click.argument("jobs", nargs=-1, required=True, metavar="JOBS...")
@inventory_option
@host_selection()
@click.option("--hosts", "host_counts", metavar="K,K,...", help="Run each job file at each of these host counts "
              "(the first K selected hosts); the report adds throughput and scaling efficiency against hosts.")
@click.option("-o", "--output", default="report.html", show_default=True, type=click.Path(dir_okay=False),
              help="The HTML file to write.")
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
    from orchestrator.compare import BenchRequest, run_bench

    request = BenchRequest(jobs, inventory, Path(output), selection, _host_counts(host_counts),
                           terminal_guard(_config(ctx)))
    sys.exit(run_bench(request))


@cli.command(short_help="Remove old finished jobs, here and on their hosts.")
@click.option("--older-than", metavar="AGE", help="Only jobs that ended before AGE: a time ago (30m, 12h, 7d), a time "
              "today (14:30) or a local date ('2026-11-21'); default 7d unless --keep is given.")
@click.option("--keep", cls=NumberOption, type=click.IntRange(min=0), metavar="N",
              help="Keep the newest N finished jobs whatever their age.")
@click.option("--dry-run", is_flag=True, help="Only list the jobs that would be removed.")
@click.option("--local", is_flag=True, help="Forget the jobs here only, leaving what their hosts keep (for hosts "
              "that are gone).")
@json_option()
@color_option
def prune(older_than: str | None, keep: int | None, dry_run: bool, local: bool, as_json: bool) -> None:
    """Remove finished jobs' directories here and the copies their hosts keep; running jobs are never touched.

    A job whose hosts could not all be reached keeps its record, so a later prune tries again;
    --local forgets it anyway.

    \b
    Examples:
      distrun prune                      # jobs that ended more than 7 days ago
      distrun prune --keep 20            # all but the newest 20 finished jobs
      distrun prune --older-than 1d --keep 5 --dry-run
      distrun prune --local              # hosts are gone: forget their jobs here only
    """
    from orchestrator.housekeeping import prune as prune_jobs
    from orchestrator.timespec import parse_since

    age = time.time() - parse_since(older_than or "7d", "--older-than") if older_than or keep is None else None
    result = prune_jobs(Store(), age, keep, dry_run, local=local)
    if as_json:
        terminal.show(json.dumps(result.to_dict(), indent=2))
    else:
        verb = "would remove" if dry_run else "removed"
        terminal.show(f"{verb} {len(result.removed)} job(s)" + "".join(f"\n  {job_id}" for job_id in result.removed))
        for job_id, why in result.kept.items():
            terminal.show(f"kept {job_id}: {why}", err=True)
        if result.kept:
            terminal.show("distrun: hosts gone for good? `distrun prune --local` with the same options forgets those "
                          "jobs here only", err=True)
    sys.exit(int(ExitCode.INFRA) if result.kept else 0)


# ---------------------------------------------------------------- backends, completion


@cli.command("backends", short_help="List the backends and their options.")
@color_option
def list_backends() -> None:
    """List the backends `--backend` takes, and the options (`-o KEY=VALUE`) each declares.

    \b
    Examples:
      distrun backends
    """
    from orchestrator.backends.options import describe

    for name in backends.names():
        cls = backends.get(name)
        default = " (default)" if name == backends.DEFAULT else ""
        terminal.show(f"{name}{default}: {cls.DESCRIPTION}")
        for line in describe(cls.OPTIONS) or ["no options"]:
            terminal.show(f"  {line}")


@cli.command(short_help="Copy the bundled example jobs into a directory (default ./jobs).")
@click.argument("directory", default="jobs", type=click.Path(file_okay=False))
@color_option
def examples(directory: str) -> None:
    """Copy the example jobs that ship with distrun (jobs/ of its source) into DIRECTORY,
    default ./jobs, where their job files name their script: `distrun launch jobs/tiny.yaml`
    then runs from here. A file already there is never overwritten.

    \b
    Examples:
      distrun examples && distrun launch jobs/tiny.yaml
      distrun examples ~/distrun-jobs
    """
    from orchestrator.bundled import copy_examples

    written = copy_examples(Path(directory))
    terminal.show(f"copied {len(written)} files to {directory}/ (see {directory}/README.md)")


@cli.command(short_help="Print the shell completion script (bash, zsh or fish).")
@click.argument("shell", type=click.Choice(["bash", "zsh", "fish"]))
@color_option
def completion(shell: str) -> None:
    """Print the completion script for SHELL: commands, options, job ids and node names complete.

    \b
    Examples:
      eval "$(distrun completion bash)"                                  # in ~/.bashrc
      eval "$(distrun completion zsh)"                                   # in ~/.zshrc
      distrun completion fish > ~/.config/fish/completions/distrun.fish
    """
    from click.shell_completion import get_completion_class

    cls = get_completion_class(shell)
    if cls is None:
        raise UsageError(f"completion: no completion for {shell}")
    terminal.show(cls(cli, {}, "distrun", COMPLETE_VAR).source())


COMPLETE_VAR = "_DISTRUN_COMPLETE"


def main() -> None:
    """Entry point: run the command; errors for people become one line and an exit code."""
    debug = "--debug" in sys.argv
    try:
        config = load_config()
        if config.color:
            terminal.set_color_mode(config.color)
        cli.main(prog_name="distrun", complete_var=COMPLETE_VAR, standalone_mode=False,
                 default_map=default_map(cli, config), obj={"config": config})
    except click.exceptions.Abort:
        sys.exit(int(ExitCode.INTERRUPTED))
    except click.exceptions.NoArgsIsHelpError as exc:
        exc.show()
        sys.exit(int(ExitCode.USAGE))
    except click.ClickException as exc:
        terminal.show(one_line(exc), err=True)
        sys.exit(int(ExitCode.USAGE))
    except DistrunError as exc:
        if debug:
            traceback.print_exc()
        # An error may quote a host (its stderr, a banner): shown as text, never as terminal controls.
        terminal.show(f"distrun: error: {exc}", err=True)
        sys.exit(int(exc.exit_code))
    except KeyboardInterrupt:
        sys.exit(int(ExitCode.INTERRUPTED))
    except SystemExit:
        raise
    sys.exit(0)
