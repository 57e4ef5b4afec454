"""The `distrun` group: one small function per command; main.py runs it and maps errors to exit codes.

The commands live by family beside this module (launch, jobs, hosts, reports, logs),
which import nothing from here; this module adds them to the group.

Options several commands share (host selection, -i, --json, --color) come from options.py
with one wording each; the config file ($XDG_CONFIG_HOME/distrun/config.yaml) gives defaults.
"""

from __future__ import annotations

from pathlib import Path

import click

from orchestrator import backends, registry
from orchestrator.cli.hints import HintedGroup
from orchestrator.cli.hosts import doctor, exec_command
from orchestrator.cli.jobs import logs, metrics, prune, ps, stack, stop, top
from orchestrator.cli.launch import launch
from orchestrator.cli.options import color_option
from orchestrator.cli.reports import bench, report, trace
from orchestrator.console import terminal
from orchestrator.errors import UsageError

EPILOG = """\b
Exit codes:
  0    success
  1    the job failed (or a doctor check, or a command run by exec)
  2    bad input or usage, a port in use (nothing was started)
  3    infrastructure: a host unreachable, authentication failed, a port cut off
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
    ctx.ensure_object(dict).update(debug=debug, command=ctx.invoked_subcommand)


for command in (launch, ps, logs, stop, stack, top, metrics, exec_command, doctor, report, bench, trace, prune):
    cli.add_command(command)


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

    for name in registry.names():
        cls = backends.get(name)
        default = " (default)" if name == registry.DEFAULT else ""
        terminal.show(f"{name}{default}: {cls.DESCRIPTION}")
        for line in describe(cls.OPTIONS) or ["no options"]:
            terminal.show(f"  {line}")


@cli.command(short_help="Copy the bundled example jobs into a directory (default ./jobs).")
@click.argument("directory", default="jobs", type=click.Path(file_okay=False))
@color_option
def examples(directory: str) -> None:
    """Copy the example jobs that ship with distrun (jobs/ of its source) into DIRECTORY,
    default ./jobs; their job files name their script relative to themselves, so
    `distrun launch jobs/tiny.yaml` then runs from here or anywhere. A file already there is
    never overwritten.

    \b
    Examples:
      distrun examples && distrun launch jobs/tiny.yaml
      distrun examples ~/distrun-jobs
    """
    from orchestrator.cli.bundled import copy_examples

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
