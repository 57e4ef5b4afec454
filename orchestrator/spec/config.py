"""The operator's config file: `$XDG_CONFIG_HOME/distrun/config.yaml` (default `~/.config/distrun/`).

Every key is optional:

    inventory: ~/clusters/lab.yaml   # the inventory when neither -i nor $DISTRUN_INVENTORY says one
    color: auto                      # auto | always | never, as --color
    confirm_above: 8                 # hosts an implicit selection may reach before distrun asks
    commands:                        # default option values per command, by option name
      launch: {no-live: true, backend: ssh}
      ps: {all: true}

What the command line says wins over the file. A wrong key or value is an error at its line,
like any other file distrun reads; the option names under `commands` are checked by the CLI,
which knows them.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from orchestrator.errors import UsageError
from orchestrator.spec.fields import Source
from orchestrator.spec.yamlsrc import Map, Node, Scalar, Seq, join_path, load_yaml

CONFIG_NAME = Path("distrun") / "config.yaml"
COLOR_MODES = ("auto", "always", "never")
_NEEDS = "a config file holds some of: inventory, color, confirm_above, commands"


@dataclass(frozen=True)
class CommandDefault:
    """A default option value for a command, and where the file sets it."""

    value: object
    line: int


@dataclass(frozen=True)
class Config:
    """What the config file sets; every field None (or empty) when it does not set it."""

    path: str = ""
    inventory: str | None = None
    inventory_line: int = 0
    color: str | None = None
    confirm_above: int | None = None
    commands: dict[str, dict[str, CommandDefault]] = field(default_factory=dict)
    command_lines: dict[str, int] = field(default_factory=dict)

    def error(self, line: int, path: str, what: str, hint: str = "") -> UsageError:
        return Source(self.path).error(line, path, what, hint)


def config_path() -> Path:
    """Where the config file is: $XDG_CONFIG_HOME/distrun/config.yaml, else ~/.config/distrun/config.yaml."""
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.expanduser("~/.config")
    return Path(base) / CONFIG_NAME


def load_config(path: Path | None = None) -> Config:
    """Read the config file; a missing file is an empty config.

    Raises:
        UsageError: the file exists but cannot be read.
        SpecError: a key or value is wrong (at its line).
    """
    path = path or config_path()
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return Config()
    except OSError as err:
        raise UsageError(f"cannot read config file {path}: {err.strerror or err}") from None
    root = load_yaml(data, str(path))
    if root is None:
        return Config(path=str(path))
    return _config(root, Source(str(path)))


def _config(root: Node, src: Source) -> Config:
    top = src.mapping(src.document(root, _NEEDS), "", ("inventory", "color", "confirm_above", "commands"))
    entries = top.entries
    commands, lines = _commands(src, entries["commands"]) if "commands" in entries else ({}, {})
    return Config(
        path=src.file,
        inventory=src.string(entries["inventory"], "inventory") if "inventory" in entries else None,
        inventory_line=entries["inventory"].line if "inventory" in entries else 0,
        color=src.choice(entries["color"], "color", COLOR_MODES) if "color" in entries else None,
        confirm_above=src.integer(entries["confirm_above"], "confirm_above", 0) if "confirm_above" in entries
        else None,
        commands=commands,
        command_lines=lines,
    )


def _commands(src: Source, node: Node) -> tuple[dict[str, dict[str, CommandDefault]], dict[str, int]]:
    if not isinstance(node, Map):
        raise src.error(node.line, "commands", "must be a mapping of command names to options",
                        "e.g. commands: {ps: {all: true}}")
    commands: dict[str, dict[str, CommandDefault]] = {}
    for name, options in node.entries.items():
        path = join_path("commands", name)
        if not isinstance(options, Map):
            raise src.error(options.line, path, "must be a mapping of option names to values",
                            f"e.g. {name}: {{json: true}}")
        commands[name] = {key.replace("-", "_"): CommandDefault(_plain(value), options.key_lines[key])
                          for key, value in options.entries.items()}
    return commands, dict(node.key_lines)


def _plain(node: Node) -> object:
    """A value as click takes a default: a scalar's value (text as written), a list of them."""
    if isinstance(node, Seq):
        return [_plain(item) for item in node.items]
    if isinstance(node, Scalar):
        return node.value if isinstance(node.value, (bool, int, float)) or node.value is None else node.text
    return {key: _plain(value) for key, value in node.entries.items()}
