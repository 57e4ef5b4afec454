"""Load and validate an inventory file: the hosts a job can run on.

`defaults` apply to every node unless the node sets the key itself; `env` mappings merge,
the node's value winning. A node's `host` defaults to its `name`. Every problem is a
SpecError at the file and line of the offending key.
"""

from __future__ import annotations

import dataclasses
import os
import re
import sys
from pathlib import Path
from typing import cast

from orchestrator.errors import UsageError
from orchestrator.spec.config import load_config
from orchestrator.spec.fields import Reader, Source, describe, near_file, suggestion
from orchestrator.spec.hostfile import hostfile_inventory, looks_like_hostfile
from orchestrator.spec.model import HostKeyPolicy, Inventory, NodeSpec, TransportKind
from orchestrator.spec.yamlsrc import Map, Node, Seq, collect_lines, join_path, load_yaml

BUILT_IN_PATH = "<built-in>"
INVENTORY_ENV = "DISTRUN_INVENTORY"
# Kept identical to inventory/local.yaml, which documents it.
BUILT_IN_TEXT = """\
# The built-in inventory: this machine, reached without SSH.
nodes:
  - name: localhost
    host: localhost
    transport: local
"""

NODE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
_NODE_NAME_HINT = "names appear in --nodes and in log file names: use letters, digits, '.', '_' and '-'"
_NEEDS = "an inventory needs a 'nodes' list, e.g. 'nodes: [{name: node0, host: 10.0.0.10}]'"
_TOP_KEYS = ("defaults", "master", "nodes")
# Keys that identify one node; every other node key may also be set in `defaults`.
_IDENTITY_KEYS = ("name", "host")


def load_inventory(path: str | Path) -> Inventory:
    """Read and validate an inventory file: distrun's YAML or a DeepSpeed hostfile (spec/hostfile.py).

    Args:
        path: The inventory file; shown in errors as given.

    Returns:
        The inventory, `defaults` applied to every node.

    Raises:
        UsageError: The file cannot be read.
        SpecError: The file is not a valid inventory.
    """
    data = _read(Path(path))
    text = data.decode("utf-8", errors="replace")
    if looks_like_hostfile(text):
        return hostfile_inventory(text, str(path))
    return _inventory(load_yaml(data, str(path)), str(path))


def inventory_from_text(text: str, path: str) -> Inventory:
    """Validate inventory text.

    Args:
        text: The YAML text.
        path: The file name shown in errors.

    Returns:
        The inventory, `defaults` applied to every node.

    Raises:
        SpecError: The text is not a valid inventory.
    """
    return _inventory(load_yaml(text, path), path)


def default_inventory() -> Inventory:
    """The built-in inventory: one node `localhost` with the local transport (no SSH).

    Its `python` is the interpreter running distrun, so a virtual environment that holds
    distrun and torch (what `make demo` builds) runs the job too.

    Returns:
        The inventory, its path shown as `<built-in>`.
    """
    inventory = inventory_from_text(BUILT_IN_TEXT, BUILT_IN_PATH)
    nodes = tuple(dataclasses.replace(n, python=sys.executable) for n in inventory.nodes)
    return dataclasses.replace(inventory, nodes=nodes)


def resolve_inventory_path(cli_value: str | None) -> Inventory:
    """Find and load the inventory: `-i` first, then $DISTRUN_INVENTORY, then the config file's
    `inventory`, then the built-in one.

    Args:
        cli_value: The `-i` option's value, or None when not given.

    Returns:
        The inventory.

    Raises:
        UsageError: The chosen file cannot be read.
        SpecError: The chosen file is not a valid inventory.
    """
    if cli_value:
        return load_inventory(os.path.expanduser(cli_value))
    from_env = os.environ.get(INVENTORY_ENV)
    if not from_env:
        return _configured_inventory()
    path = Path(os.path.expanduser(from_env))
    if not path.is_file():
        raise UsageError(
            f"{INVENTORY_ENV}={from_env}: no such inventory file"
            f" (fix the path, or unset {INVENTORY_ENV} to use the built-in localhost inventory)"
        )
    return load_inventory(path)


def _configured_inventory() -> Inventory:
    """The config file's `inventory`, else the built-in one."""
    config = load_config()
    if not config.inventory:
        return default_inventory()
    path = Path(os.path.expanduser(config.inventory))
    if not path.is_file():
        raise config.error(config.inventory_line, "inventory", f"no such inventory file {config.inventory}",
                           "fix the path, or remove the key to use the built-in localhost inventory")
    return load_inventory(path)


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as err:
        raise UsageError(f"cannot read inventory {path}: {err.strerror or err}{near_file(str(path))}") from None


def _inventory(root: Node | None, file: str) -> Inventory:
    src = Source(file)
    top = src.mapping(src.document(root, _NEEDS), "", _TOP_KEYS, required=("nodes",))
    readers = _node_readers(src)
    defaults = _defaults(src, top.entries.get("defaults"), readers)
    nodes = _nodes(src, top.entries["nodes"], readers, defaults)
    master = _master(src, top, nodes)
    return Inventory(path=file, nodes=nodes, master=master, lines=collect_lines(top))


def _node_readers(src: Source) -> dict[str, Reader]:
    return {
        "name": src.string,
        "host": src.text,
        "user": src.text,
        "port": lambda node, path: src.integer(node, path, 1, 65535),
        "identity_file": src.text,
        "known_hosts": src.text,
        "host_key_policy": lambda node, path: src.enum(node, path, HostKeyPolicy),
        "python": src.text,
        "iface": src.text,
        "env": lambda node, path: _env_values(src, node, path),
        "gpus": lambda node, path: src.integer(node, path, 0),
        "slots": lambda node, path: src.integer(node, path, 1),
        "labels": src.strings,
        "proxy_jump": src.text,
        "transport": lambda node, path: src.enum(node, path, TransportKind),
    }


def _env_values(src: Source, node: Node, path: str) -> dict[str, str]:
    """Plain variables; a `${env:...}` secret here would reach the hosts unresolved."""
    env = src.plain_env(node, path)
    for name, value in env.items():
        if "${env:" in value:
            line = cast(Map, node).entries[name].line
            hint = "secrets are read from the job file's env, which keeps them out of records"
            raise src.error(line, join_path(path, name), "an inventory cannot hold ${env:...} secrets", hint)
    return env


def _defaults(src: Source, node: Node | None, readers: dict[str, Reader]) -> dict[str, object]:
    if node is None:
        return {}
    if isinstance(node, Map):
        for key in _IDENTITY_KEYS:
            if key in node.entries:
                hint = "set it on each node under 'nodes'"
                raise src.error(node.key_lines[key], f"defaults.{key}", f"'{key}' cannot have a default", hint)
    allowed = {key: read for key, read in readers.items() if key not in _IDENTITY_KEYS}
    return src.fields(node, "defaults", allowed)


def _nodes(src: Source, node: Node, readers: dict[str, Reader], defaults: dict[str, object]) -> tuple[NodeSpec, ...]:
    if not isinstance(node, Seq):
        what = f"must be a list of nodes, got {describe(node)}"
        raise src.error(node.line, "nodes", what, "start each node with '- name: ...'")
    if not node.items:
        raise src.error(node.line, "nodes", "must list at least one node", "add an entry like '- name: node0'")
    specs: list[NodeSpec] = []
    name_lines: dict[str, int] = {}
    for index, item in enumerate(node.items):
        path = f"nodes[{index}]"
        spec, name_line = _node(src, item, path, readers, defaults)
        if spec.name in name_lines:
            first = f"node names must be unique; the first {spec.name!r} is at line {name_lines[spec.name]}"
            raise src.error(name_line, f"{path}.name", f"duplicate node name {spec.name!r}", first)
        name_lines[spec.name] = name_line
        specs.append(spec)
    return tuple(specs)


def _node(
    src: Source, item: Node, path: str, readers: dict[str, Reader], defaults: dict[str, object]
) -> tuple[NodeSpec, int]:
    """One node with the defaults applied, and the line of its `name` key."""
    mapping = src.mapping(item, path, readers, required=("name",))
    values = src.fields(mapping, path, readers)
    name = str(values["name"])
    name_line = mapping.key_lines["name"]
    if not NODE_NAME.fullmatch(name):
        raise src.error(name_line, f"{path}.name", f"invalid node name {name!r}", _NODE_NAME_HINT)
    merged = {**defaults, **values}
    merged["env"] = {**_env(defaults), **_env(values)}
    merged.setdefault("host", name)
    return NodeSpec(**merged, line=mapping.line), name_line


def _env(values: dict[str, object]) -> dict[str, str]:
    return cast("dict[str, str]", values.get("env", {}))


def _master(src: Source, top: Map, nodes: tuple[NodeSpec, ...]) -> str | None:
    node = top.entries.get("master")
    if node is None:
        return None
    name = src.string(node, "master")
    names = [spec.name for spec in nodes]
    if name not in names:
        raise src.error(
            node.line, "master", f"{name!r} is not a node of this inventory", suggestion(name, names, "nodes")
        )
    return name
