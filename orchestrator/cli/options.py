"""What several `distrun` commands share: their options (one wording each), shell completion of
job ids and node names, the config file's defaults, and the guard against every host by accident.

Host selection is one decorator, `host_selection`, so that every command that picks hosts takes
`--nodes`, `-x/--exclude`, `--label` and `--all` with the same words and meaning; the command
receives them as one `selection` argument (a `HostSelection`).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from typing import Any, TypeVar

import click
from click.shell_completion import CompletionItem

from orchestrator.cli.hints import launch_flag_hint, near_options, node_count_hint
from orchestrator.console import terminal
from orchestrator.console.terminal import ColorMode
from orchestrator.errors import DistrunError
from orchestrator.spec.config import Config
from orchestrator.spec.select import DEFAULT_CONFIRM_ABOVE, HostSelection, SelectionGuard

F = TypeVar("F", bound=Callable[..., Any])
NODE_COUNT = re.compile(r"(\d+)(?::(\d+))?")

INVENTORY_HELP = "Inventory YAML (default: $DISTRUN_INVENTORY, else the config file's, else this machine)."
JSON_HELP = "Machine-readable output (documented in docs/commands.md)."
NODES_HELP = "Only these hosts: a host range, e.g. 'node[0-7,12]' or 'node[0-3],gpu-b' (repeatable)."
EXCLUDE_HELP = "Not these hosts: a host range, as --nodes (repeatable)."
LABEL_HELP = "Only hosts with one of these labels, e.g. h100 or 'h100,a100' (repeatable: each must match)."
ALL_HELP = "Every host of the inventory, on purpose (needed above `confirm_above` hosts, default 8)."
# `stop` takes no inventory: its hosts are those of the jobs recorded here.
STOP_ALL_HELP = "Every running job of this DISTRUN_HOME, on every host it uses."
COLOR_HELP = "Colour: auto (a terminal without NO_COLOR), always or never."


def inventory_option(fn: F) -> F:
    """`-i/--inventory`, with node names completed from it."""
    return click.option("-i", "--inventory", help=INVENTORY_HELP, metavar="INVENTORY")(fn)


def json_option(help_text: str = JSON_HELP) -> Callable[[F], F]:
    """`--json`, received as `as_json`."""
    return click.option("--json", "as_json", is_flag=True, help=help_text)


def color_option(fn: F) -> F:
    """`--color auto|always|never` on a command (the group takes it too); it sets the process's mode."""

    def apply(_ctx: click.Context, _param: click.Parameter, value: str | None) -> None:
        if value is not None:
            terminal.set_color_mode(value)

    return click.option("--color", type=click.Choice([m.value for m in ColorMode]), default=None, expose_value=False,
                        is_eager=True, callback=apply, help=COLOR_HELP)(fn)


def host_selection(all_help: str = ALL_HELP) -> Callable[[F], F]:
    """`--nodes`, `-x/--exclude`, `--label` and `--all`, given to the command as `selection`.

    Args:
        all_help: What `--all` means on this command (every host of the inventory, unless the
            command takes none).
    """

    def decorate(fn: F) -> F:
        @functools.wraps(fn)
        def wrapper(*args: Any, nodes: tuple[str, ...], exclude: tuple[str, ...], labels: tuple[str, ...],
                    all_hosts: bool, **kwargs: Any) -> Any:
            return fn(*args, selection=HostSelection(nodes, exclude, labels, all_hosts), **kwargs)

        options = [
            click.option("--nodes", multiple=True, metavar="RANGE", help=NODES_HELP, shell_complete=complete_nodes),
            click.option("-x", "--exclude", multiple=True, metavar="RANGE", help=EXCLUDE_HELP,
                         shell_complete=complete_nodes),
            click.option("--label", "labels", multiple=True, metavar="LABELS", help=LABEL_HELP,
                         shell_complete=complete_labels),
            click.option("--all", "all_hosts", is_flag=True, help=all_help),
        ]
        for option in reversed(options):
            wrapper = option(wrapper)
        return wrapper  # type: ignore[return-value]

    return decorate


def guard(config: Config) -> SelectionGuard:
    """The guard for this terminal: it asks when someone can answer, else it refuses."""
    above = config.confirm_above if config.confirm_above is not None else DEFAULT_CONFIRM_ABOVE
    return SelectionGuard(above, terminal.ask_yes_no if terminal.can_ask() else None)


def context_guard(ctx: click.Context) -> SelectionGuard:
    """`guard` with the config file main() read (the defaults when the group is invoked some other way)."""
    config = (ctx.find_root().obj or {}).get("config")
    return guard(config if isinstance(config, Config) else Config())


# ---------------------------------------------------------------- shell completion


def complete_jobs(_ctx: click.Context, _param: click.Parameter, incomplete: str) -> list[CompletionItem]:
    """Job ids recorded here (newest first) and `last`."""
    from orchestrator.store import Store

    try:
        ids = Store().ids(incomplete)
    except Exception:
        ids = []
    items = ["last"] if "last".startswith(incomplete) else []
    return [CompletionItem(value) for value in items + ids]


def _inventory_for(ctx: click.Context) -> Any:
    from orchestrator.spec import resolve_inventory_path

    return resolve_inventory_path(ctx.params.get("inventory"))


def _complete_list(incomplete: str, words: list[str]) -> list[CompletionItem]:
    """Complete the last item of a comma-separated value."""
    head, _, last = incomplete.rpartition(",")
    prefix = f"{head}," if head else ""
    return [CompletionItem(prefix + word) for word in words if word.startswith(last)]


def complete_nodes(ctx: click.Context, _param: click.Parameter, incomplete: str) -> list[CompletionItem]:
    """The inventory's node names (-i, else the default inventory)."""
    try:
        names = [node.name for node in _inventory_for(ctx).nodes]
    except (DistrunError, OSError):
        return []
    return _complete_list(incomplete, names)


def complete_labels(ctx: click.Context, _param: click.Parameter, incomplete: str) -> list[CompletionItem]:
    """The labels of the inventory's nodes."""
    try:
        labels = sorted({label for node in _inventory_for(ctx).nodes for label in node.labels})
    except (DistrunError, OSError):
        return []
    return _complete_list(incomplete, labels)


# ---------------------------------------------------------------- the config file


def default_map(group: click.Group, config: Config) -> dict[str, dict[str, object]]:
    """The config file's `commands:` as click's default_map, every name checked.

    Raises:
        SpecError: a command or option the CLI does not have (at its line, with the closest name).
    """
    from orchestrator.spec.fields import suggestion

    defaults: dict[str, dict[str, object]] = {}
    for name, options in config.commands.items():
        command = group.commands.get(name)
        if command is None:
            raise config.error(config.command_lines[name], f"commands.{name}", "no such command",
                               suggestion(name, list(group.commands), "commands"))
        params = _option_names(command)
        for key, value in options.items():
            if key not in params:
                raise config.error(value.line, f"commands.{name}.{key}", f"distrun {name} has no such option",
                                   suggestion(key, sorted(params), "options"))
        defaults[name] = {params[key]: value.value for key, value in options.items()}
    return defaults


def _option_names(command: click.Command) -> dict[str, str]:
    """A command's options by their long names (`no_live`, `all`) and parameter names -> parameter name."""
    names: dict[str, str] = {}
    for param in command.params:
        if isinstance(param, click.Option) and param.name and not param.hidden:
            for opt in param.opts:
                if opt.startswith("--"):
                    names[opt[2:].replace("-", "_")] = param.name
            names.setdefault(param.name, param.name)
    return names


class LaunchCommand(click.Command):
    """`distrun launch`: an unknown option is most often a training script's, given without `--`."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        given = list(args)  # the parser consumes `args`
        try:
            rest = super().parse_args(ctx, args)
        except click.NoSuchOption as exc:
            habit = launch_flag_hint(exc.option_name)
            if habit:
                raise click.UsageError(f"{exc.option_name}: not an option of distrun launch ({habit})", ctx) from None
            close = near_options(exc.option_name, ctx)
            hint = f" (did you mean {', '.join(close)}?)" if close else ""
            target = next((a for a in given if a.endswith((".py", ".yaml", ".yml"))), "train.py")
            raise click.UsageError(
                f"{exc.option_name}: not an option of distrun launch{hint}. Arguments for the training script "
                f"go after `--`: distrun launch {target} [OPTIONS] -- {exc.option_name} ...", ctx) from None
        count = node_count_hint(ctx.params.get("nodes") or ())
        if count:
            raise click.UsageError(count, ctx)
        return rest


class NodeCount(click.ParamType):
    """`--nnodes`: K hosts, or MIN:MAX as torchrun and job files write it."""

    name = "K|MIN:MAX"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int | tuple[int, int]:
        if isinstance(value, (int, tuple)):
            return value
        match = NODE_COUNT.fullmatch(str(value).strip())
        low, high = (int(match.group(1)), int(match.group(2) or match.group(1))) if match else (0, 0)
        if match is None or not 1 <= low <= high:
            self.fail(f"{value!r}: give a number of hosts from 1, or MIN:MAX with 1 <= MIN <= MAX "
                      "(the job may go on with MIN hosts)", param, ctx)
        return (low, high) if match.group(2) else low


class NumberOption(click.Option):
    """A number option whose help shows its metavar (N, SECONDS) only, not click's `[x>=1]`: the
    bounds are said in words where they matter, and a value out of them is refused anyway."""

    def get_help_extra(self, ctx: click.Context) -> Any:
        extra = super().get_help_extra(ctx)
        extra.pop("range", None)
        return extra
