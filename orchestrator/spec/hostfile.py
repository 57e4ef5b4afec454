"""A DeepSpeed hostfile read as an inventory: `HOST slots=N` per line.

As DeepSpeed's launcher reads it: `#` starts a comment, blank lines are skipped, each host once.
Each host becomes a node named after it, reached over SSH as ~/.ssh/config says (user, port, key),
running the interpreter that runs distrun (DeepSpeed's launcher also runs its own interpreter's
path on every host); `slots` is the node's process count for `nproc_per_node: auto`.
A bad line is a SpecError at FILE:LINE.
"""

from __future__ import annotations

import re
import sys

from orchestrator.errors import SpecError
from orchestrator.spec.model import Inventory, NodeSpec

_COMMENT = re.compile(r"#.*")
_SLOTS = re.compile(r"slots=(\S*)")
_HOST = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
_FORMAT = "each line is 'HOST slots=N', e.g. 'worker-1 slots=2'"


def looks_like_hostfile(text: str) -> bool:
    """Whether the first line that is not blank or a comment is a hostfile line, not YAML.

    Args:
        text: The file's text.

    Returns:
        True when that line holds `slots=` and no `:`.
    """
    for raw in text.splitlines():
        line = _COMMENT.sub("", raw).strip()
        if line:
            return ":" not in line and "slots=" in line
    return False


def hostfile_inventory(text: str, path: str) -> Inventory:
    """Read a DeepSpeed hostfile.

    Args:
        text: The file's text.
        path: The file name shown in errors.

    Returns:
        One node per host, `slots` as its process count.

    Raises:
        SpecError: a line is not `HOST slots=N`, a host is named twice, or no host is named.
    """
    nodes: list[NodeSpec] = []
    seen: dict[str, int] = {}
    for number, raw in enumerate(text.splitlines(), start=1):
        line = _COMMENT.sub("", raw).strip()
        if not line:
            continue
        host, slots = _entry(line, path, number)
        if host in seen:
            raise SpecError(path, number, "", f"host {host!r} is listed twice",
                            f"the first is at line {seen[host]}; keep one line per host")
        seen[host] = number
        nodes.append(NodeSpec(name=host, host=host, python=sys.executable, slots=slots, line=number))
    if not nodes:
        raise SpecError(path, 1, "", "the hostfile names no host", _FORMAT)
    return Inventory(path=path, nodes=tuple(nodes))


def _entry(line: str, path: str, number: int) -> tuple[str, int]:
    """The host and slots of one hostfile line."""
    words = line.split()
    if _SLOTS.fullmatch(words[0]):
        raise SpecError(path, number, "", f"no host before {words[0]!r}", _FORMAT)
    host = words[0]
    if not _HOST.fullmatch(host):
        raise SpecError(path, number, "", f"invalid host {host!r}", "use a host name or an IPv4 address")
    found = [_SLOTS.fullmatch(word) for word in words[1:]]
    if len(words) != 2 or found[0] is None:
        raise SpecError(path, number, "", f"{line!r} is not a hostfile line", _FORMAT)
    value = found[0].group(1)
    if not value.isdigit() or int(value) < 1:
        raise SpecError(path, number, "", f"slots={value} for host {host!r} is not a positive integer",
                        "slots is the number of processes on that host, e.g. slots=2")
    return host, int(value)
