"""Many hosts, one screen: host ranges (`node[0-7]`) and identical output gathered, as `clush -b` does.

Nothing here knows how output was produced; callers hand in per-host text and status.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

_NUMBERED = re.compile(r"^(?P<prefix>.*?)(?P<digits>\d+)(?P<suffix>\D*)$")
RULE = "-" * 15


def fold_hosts(names: Iterable[str]) -> str:
    """Fold host names into ClusterShell's range form.

    Names that differ only in their last number are folded into one bracket; zero padding
    is kept (`gpu[08-10]`); names without a number are listed as they are.

    Args:
        names: Host names, in any order; duplicates count once.

    Returns:
        E.g. `node[0-2,5],login` for node0, node1, node2, node5, login; "" for no names.
    """
    groups: dict[tuple[str, str], list[str]] = {}
    plain: list[str] = []
    for name in dict.fromkeys(names):
        match = _NUMBERED.match(name)
        if match is None:
            plain.append(name)
        else:
            groups.setdefault((match["prefix"], match["suffix"]), []).append(match["digits"])
    parts = [((prefix, suffix), f"{prefix}{_bracket(numbers)}{suffix}") for (prefix, suffix), numbers in groups.items()]
    parts += [((name, ""), name) for name in plain]
    return ",".join(text for _, text in sorted(parts))


def _bracket(numbers: list[str]) -> str:
    ordered = sorted(numbers, key=lambda digits: (int(digits), digits))
    if len(ordered) == 1:
        return ordered[0]
    return "[" + ",".join(_ranges(ordered)) + "]"


def _ranges(ordered: list[str]) -> list[str]:
    """`01 02 03 7` -> `01-03`, `7`: a run continues while numbers are consecutive and padded alike."""
    runs: list[list[str]] = []
    for digits in ordered:
        if runs and _continues(runs[-1], digits):
            runs[-1].append(digits)
        else:
            runs.append([digits])
    return [run[0] if len(run) == 1 else f"{run[0]}-{run[-1]}" for run in runs]


def _continues(run: list[str], digits: str) -> bool:
    first, last = run[0], run[-1]
    width = len(first) if first.startswith("0") and len(first) > 1 else 0
    return int(digits) == int(last) + 1 and digits == str(int(digits)).zfill(width)


@dataclass(frozen=True)
class HostOutput:
    """What one host showed: its lines, and a status when it did not succeed ("exit code 2")."""

    lines: tuple[str, ...] = ()
    status: str = ""


@dataclass(frozen=True)
class Block:
    """Hosts whose output and status were identical."""

    hosts: tuple[str, ...]
    output: HostOutput

    def header(self) -> str:
        status = f": {self.output.status}" if self.output.status else ""
        return f"{fold_hosts(self.hosts)} ({len(self.hosts)}){status}"

    def render(self) -> str:
        return "\n".join([RULE, self.header(), RULE, *self.output.lines])


def gather(outputs: Mapping[str, HostOutput]) -> list[Block]:
    """Group hosts with identical lines and status, in the order each group's first host came.

    Args:
        outputs: Host name -> what it showed.

    Returns:
        One block per distinct output.
    """
    by_output: dict[HostOutput, list[str]] = {}
    for host, output in outputs.items():
        by_output.setdefault(output, []).append(host)
    return [Block(tuple(hosts), output) for output, hosts in by_output.items()]


def render_blocks(blocks: Sequence[Block]) -> str:
    """The blocks as text, one after the other; blocks with no lines are left out.

    Returns:
        The text, ending in a newline, or "" when no block has lines.
    """
    shown = [block.render() for block in blocks if block.output.lines]
    return "\n".join(shown) + "\n" if shown else ""


def failure_summary(reasons: Mapping[str, str], total: int) -> str:
    """One line naming the hosts that failed and why, hosts with the same reason folded.

    Args:
        reasons: Failed host -> why ("exit code 1", "unreachable").
        total: How many hosts were asked.

    Returns:
        E.g. `2 of 3 hosts failed: node[1-2] (exit code 1)`; "" when nothing failed.
    """
    if not reasons:
        return ""
    by_reason: dict[str, list[str]] = {}
    for host, reason in reasons.items():
        by_reason.setdefault(reason, []).append(host)
    parts = [f"{fold_hosts(hosts)} ({reason})" for reason, hosts in by_reason.items()]
    noun = "host" if total == 1 else "hosts"
    return f"{len(reasons)} of {total} {noun} failed: {', '.join(parts)}"


def size_text(value: float) -> str:
    """Bytes as people read them: `512 MiB`, `24 GiB`."""
    for unit, scale in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if value >= scale:
            return f"{value / scale:.0f} {unit}" if value / scale >= 10 else f"{value / scale:.1f} {unit}"
    return f"{value:.0f} B"


def rank_ranges(ranks: Sequence[int]) -> str:
    """[0, 1, 2, 4, 5] -> "0-2,4-5"."""
    ordered = sorted(set(ranks))
    parts: list[str] = []
    start = prev = None
    for rank in [*ordered, None]:
        if start is not None and (rank is None or rank != prev + 1):  # type: ignore[operator]
            parts.append(str(start) if start == prev else f"{start}-{prev}")
            start = None
        if rank is not None and start is None:
            start = rank
        prev = rank
    return ",".join(parts)
