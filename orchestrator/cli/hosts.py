"""The commands on hosts: `exec` and `doctor`."""

from __future__ import annotations

import sys

import click

from orchestrator.cli.options import (
    NumberOption,
    color_option,
    context_guard,
    host_selection,
    inventory_option,
    json_option,
)
from orchestrator.spec.select import HostSelection


@click.command("exec", context_settings={"allow_interspersed_args": False},
               short_help="Run a command on the selected hosts at once.")
@inventory_option
@host_selection()
@click.option("--timeout", cls=NumberOption, type=click.FloatRange(min=0, min_open=True), metavar="SECONDS",
              help="Stop the command after SECONDS.")
@click.option("--prefix", is_flag=True, help="Each line as pdsh prints it, `node: line`, hosts in inventory "
              "order, not gathered.")
@json_option()
@color_option
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
@click.pass_context
def exec_command(ctx: click.Context, inventory: str | None, selection: HostSelection, timeout: float | None,
                 prefix: bool, as_json: bool, command: tuple[str, ...]) -> None:
    """Run COMMAND on the selected hosts at once; hosts with identical output are shown together.

    Every word of COMMAND arrives as one argument; for pipes or globs use `-- sh -c '...'`.
    Exit status: 0 all succeeded, 1 the command failed on some host, 3 a host was not reached.

    \b
    Examples:
      distrun exec -i lab.yaml -- hostname
      distrun exec -i lab.yaml --nodes 'node[0-1]' -- nvidia-smi -L
      distrun exec -i lab.yaml --label h100 -x node3 --timeout 10 -- sh -c 'df -h /tmp'
      distrun exec -i lab.yaml --prefix -- uptime | sort
    """
    from orchestrator.fanout.execute import ExecRequest, exec_on_hosts

    request = ExecRequest(argv=command, inventory=inventory, selection=selection,
                          guard=context_guard(ctx), timeout=timeout, as_json=as_json, prefix=prefix)
    sys.exit(exec_on_hosts(request))


@click.command(short_help="Check the hosts for what makes multi-host jobs hang.")
@inventory_option
@click.option("--job", "job_file", type=click.Path(dir_okay=False), help="Check with this job's hosts, port, nproc.")
@host_selection()
@json_option()
@click.option("--strict", is_flag=True, help="Exit 1 on warnings too.")
@click.option("--bandwidth", is_flag=True, help="Also time a short all-reduce across the hosts.")
@click.option("--min-busbw", cls=NumberOption, type=click.FloatRange(min=0), metavar="GBPS",
              help="Warn under this all-reduce busbw, GB/s.")
@click.option("--links", is_flag=True, help="Also measure each host's own link against the others' (a few s).")
@color_option
@click.pass_context
def doctor(ctx: click.Context, inventory: str | None, job_file: str | None, selection: HostSelection,
           as_json: bool, strict: bool, bandwidth: bool, min_busbw: float | None, links: bool) -> None:
    """Check the selected hosts for what makes multi-host jobs hang; one row per check.

    Exit status: 0 no errors, 1 a check failed (warnings too with --strict), 3 a host was not reached.
    A check that could not run (its host was not reached) shows as skipped (-).

    \b
    Examples:
      distrun doctor -i lab.yaml
      distrun doctor -i lab.yaml --nodes 'node[0-1]' --json
      distrun doctor -i lab.yaml --job jobs/tiny.yaml --bandwidth
      distrun doctor -i lab.yaml --links
    """
    from orchestrator.doctor.command import DoctorRequest, run_doctor
    request = DoctorRequest(inventory=inventory, job_file=job_file, selection=selection,
                            guard=context_guard(ctx), as_json=as_json, strict=strict,
                            bandwidth=bandwidth, min_busbw=min_busbw, links=links)
    sys.exit(run_doctor(request))
