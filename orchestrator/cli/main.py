"""The `distrun` entry point: run the group (group.py) and map errors to exit codes and one line.

This module imports next to nothing when it loads: the commands' imports (seconds on a loaded
machine) happen inside `main`. Until the command takes SIGINT itself (a launch's run loop, exec),
or is one where Ctrl-C is the usual end (logs -f, top), a Ctrl-C is one line and exit 130 at once:
no traceback, and no wait for hosts still being connected to (nothing was started on them).
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import traceback
from types import FrameType
from typing import Any

from orchestrator.console import interrupts, terminal
from orchestrator.errors import ExitCode

# What a Ctrl-C says when it comes before the command started anything on a host: while the
# commands load (no command yet), or in a launch before its run loop takes SIGINT itself.
INTERRUPTED = "distrun: interrupted before anything started on the hosts"
SAID_FOR = {None, "launch"}  # elsewhere a Ctrl-C is the usual way to end (logs -f, top) or says its own


def main() -> None:
    """Entry point: run the command; errors for people become one line and an exit code."""
    said: dict[str, Any] = {}
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:  # not when started with SIGINT ignored
        signal.signal(signal.SIGINT, lambda signum, frame: _on_sigint(said, frame))
    try:
        _run(said)
    except KeyboardInterrupt:
        if said.get("command") in SAID_FOR:
            terminal.say_at_once(said.get("interrupted", INTERRUPTED))
        sys.exit(int(ExitCode.INTERRUPTED))
    sys.exit(0)


def _on_sigint(said: dict[str, Any], frame: FrameType | None) -> None:
    """Ctrl-C before the command took SIGINT: say so in one line and exit 130 now (for a command
    where Ctrl-C is the usual end, or once it took SIGINT and gave it back, unwind as Python would)."""
    if said.get("command") not in SAID_FOR or interrupts.taken(signal.SIGINT):
        signal.default_int_handler(signal.SIGINT, frame)
    with contextlib.suppress(Exception):  # the main thread may be inside a write to stdout
        sys.stdout.flush()
    terminal.say_at_once(said.get("interrupted", INTERRUPTED))
    os._exit(int(ExitCode.INTERRUPTED))


def _run(said: dict[str, Any]) -> None:
    """Load the commands and run the one asked for; `said` gets the command's name (and, from a
    launch, what a Ctrl-C must say) as it goes.

    Raises:
        KeyboardInterrupt: Ctrl-C (SIGINT) while loading or before the command took SIGINT itself.
        SystemExit: with the command's exit code.
    """
    import click

    from orchestrator.cli.group import COMPLETE_VAR, cli
    from orchestrator.cli.hints import one_line
    from orchestrator.cli.options import default_map
    from orchestrator.errors import DistrunError
    from orchestrator.spec.config import load_config

    debug = "--debug" in sys.argv
    try:
        config = load_config()
        if config.color:
            terminal.set_color_mode(config.color)
        said["config"] = config
        cli.main(prog_name="distrun", complete_var=COMPLETE_VAR, standalone_mode=False,
                 default_map=default_map(cli, config), obj=said)
    except click.exceptions.Abort:
        raise KeyboardInterrupt from None
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


def __getattr__(name: str) -> Any:
    """`cli`, the group, for those that import it from here (tests, bench), loaded when first asked for."""
    if name == "cli":
        from orchestrator.cli.group import cli

        return cli
    raise AttributeError(name)
