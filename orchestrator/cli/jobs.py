"""The commands on recorded jobs: `ps`, `logs`, `stop`, `stack`, `top`, `metrics` and `prune`."""

from __future__ import annotations

import json
import sys
import time

import click

from orchestrator.cli.options import (
    STOP_ALL_HELP,
    NumberOption,
    color_option,
    complete_jobs,
    host_selection,
    json_option,
)
from orchestrator.console import terminal
from orchestrator.console.display import fold_hosts
from orchestrator.errors import ExitCode, UsageError
from orchestrator.run import recorded
from orchestrator.run.ft.state import group_lines, groups_view
from orchestrator.run.recorded import for_record, refresh_lost
from orchestrator.spec.select import HostSelection
from orchestrator.store import JobRecord, JobState, Store

PS_LIMIT = 20
STATE_COLOURS = {"succeeded": 32, "failed": 31, "running": 36, "pending": 36, "stopped": 33, "lost": 33, "stalled": 33}


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


@click.command(short_help="List jobs, newest first.")
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
    from orchestrator.cli.timespec import parse_since

    store = Store()
    states = _states(state)
    after = parse_since(since, "--since") if since else None
    records = store.list(None, internal=show_all)
    refresh_lost(store, [r for r in records if not r.state.finished])
    records = [r for r in records if (states is None or r.state in states) and (after is None or r.started >= after)]
    records = records if show_all else records[:PS_LIMIT]
    if as_json:
        terminal.show(json.dumps([r.to_dict() | (groups_view(store, r.id) or {}) for r in records], indent=2))
        return
    if not records:
        terminal.show("no jobs" + (" match" if states or after else " yet (start one with "
                                "`distrun launch jobs/resnet50.yaml`)"))
        return
    colour = terminal.colour(sys.stdout)
    for line in _ps_lines(store, records, colour):
        terminal.show(line)


def _ps_lines(store: Store, records: list[JobRecord], colour: bool) -> list[str]:
    """The table: the JOB column as wide as the longest id, hosts folded into ranges; under a
    fault-tolerant job its replica groups and latest quorum."""
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
        view = groups_view(store, rec.id)
        lines += group_lines(view) if view else []
    return lines


# ---------------------------------------------------------------- logs


@click.command(short_help="Print a job's logs.")
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
@click.option("--group", cls=NumberOption, type=click.IntRange(min=0), metavar="K",
              help="A fault-tolerant job's replica group K: the lines of its job <JOB>-g<K>.")
@color_option
def logs(job_ref: str, follow: bool, nodes: tuple[str, ...], ranks: tuple[str, ...], pattern: str | None,
         since: str | None, tail: int | None, stderr: bool, attempt: int | None, collapse: bool, timestamps: bool,
         bare: bool, recover: bool, group: int | None) -> None:
    """Print a job's lines, in the order they arrived (JOB_REF: an id, a unique prefix, or `last`).

    Filters combine (every one must hold). Lines are shown as `[node1 r3] text`, stderr lines
    as `[node1 r3 err] text`; without filters the job's summary follows them.

    \b
    Examples:
      distrun logs last --tail 20
      distrun logs last --rank 3 --grep Error
      distrun logs tiny-2026 -f
      distrun logs ft-2026 --group 1 --tail 20
    """
    from orchestrator.cli.logs import LogsRequest, show_logs

    request = LogsRequest(job_ref=job_ref, follow=follow, nodes=nodes, ranks=ranks, grep=pattern, since=since,
                          tail=tail, stderr=stderr, attempt=attempt, collapse=collapse, timestamps=timestamps,
                          bare=bare, recover=recover, group=group)
    sys.exit(show_logs(request))


# ---------------------------------------------------------------- stop, top


@click.command(short_help="Stop a job, or every job on some hosts.")
@click.argument("job_ref", required=False, shell_complete=complete_jobs)
@host_selection(STOP_ALL_HELP)
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
    stopped = recorded.stop(store, rec)
    for error in stopped.errors:
        terminal.show(error, err=True)
    if as_json:
        after = store.get(rec.id)
        terminal.show(json.dumps({"id": rec.id, "state": after.state.value, "exit_code": after.exit_code,
                                  "messages": list(stopped.messages), "gpus_freed": list(stopped.gpus_freed)}))
    else:
        terminal.show("\n".join([*stopped.messages, *stopped.gpus_freed]))
    return stopped.code


@click.command(short_help="Dump every rank's Python stack, ranks with the same stack folded.")
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
    from orchestrator.diagnose import ranks
    from orchestrator.diagnose import stack as stacks
    store = Store()
    rec = store.get(job_ref)
    refresh_lost(store, [rec])
    if rec.state.finished:
        kept = store.job_dir(rec.id).stacks
        where = f"its hang's stacks are kept in {kept}" if kept.is_dir() else "it kept none: no hang was diagnosed"
        raise UsageError(f"job {rec.id} is {rec.state.value}: only a running job's ranks have stacks ({where})")
    seen = ranks.look(for_record(store, rec), rec, [node] if node else None, native=native)
    gathered = seen.gathered
    if rank is not None:
        gathered.ranks = [r for r in gathered.ranks if r.rank == rank]
        seen.ranks = {r: now for r, now in seen.ranks.items() if r == rank}
        if not gathered.ranks and not gathered.failed:
            raise UsageError(f"--rank {rank}: no such rank of job {rec.id} is running")
    text = json.dumps({**stacks.to_json(gathered), "ranks": seen.to_json()}, indent=2) if as_json else None
    terminal.show(text or stacks.render(gathered))
    sys.exit(int(ExitCode.INFRA) if gathered.failed else int(ExitCode.OK))


@click.command(short_help="Show every host's and GPU's latest figures for a job.")
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


@click.command(short_help="Print every running job's figures for Prometheus.")
@json_option()
@color_option
def metrics(as_json: bool) -> None:
    """Print the current figures of every running job of this controller in Prometheus' text format
    (for node_exporter's textfile collector, or a look), as a launch's --metrics-port serves them.
    A job that ended prints nothing; no running job, nothing at all.

    --json prints the same metric families as JSON: name, type, help and samples (name, labels, value).

    \b
    Examples:
      distrun metrics
      distrun metrics > textfile/distrun.prom.tmp && mv textfile/distrun.prom.tmp textfile/distrun.prom
      distrun metrics --json
    """
    from orchestrator import metrics as figures

    store = Store()
    records = [rec for rec in store.list() if not rec.state.finished]
    refresh_lost(store, records)
    jobs = [figures.from_files(store.job_dir(rec.id), rec) for rec in records if not rec.state.finished]
    if as_json:
        terminal.show(json.dumps(figures.families_json(jobs), indent=2))
    else:
        terminal.show(figures.exposition(jobs), end="")



@click.command(short_help="Remove old finished jobs, here and on their hosts.")
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
    from orchestrator.cli.timespec import parse_since
    from orchestrator.run.prune import prune as prune_jobs

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
