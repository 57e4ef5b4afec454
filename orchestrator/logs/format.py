"""One line format everywhere (launch, `logs`, `logs -f`): `[node1 r3] text`.

A rank's stderr lines are marked `[node1 r3 err]`, a host's own lines (torchrun's, distrun's
notes) carry no rank (`[node1]`), a line that came without its newline is marked `partial`, and
lines folded from several ranks show their hosts and ranks as ranges (`[node0-2 r0-5]`).
Text from hosts is escaped for the terminal (remote/redact.py); `bare` gives the text alone.
"""

from __future__ import annotations

import time
from collections.abc import Iterable

from orchestrator.console.display import fold_hosts
from orchestrator.remote.redact import shown_text

COLOURS = (36, 33, 35, 32, 34, 91, 96, 93, 95, 92, 94)


def label(node: str, rank: int | None, stream: str, partial: bool = False) -> str:
    """`[node1 r3]`, `[node1 r3 err]`, `[node1]`, `[node1 err]`, with ` partial` when it is."""
    parts = [node] if rank is None else [node, f"r{rank}"]
    if stream == "e":
        parts.append("err")
    if partial:
        parts.append("partial")
    return "[" + " ".join(parts) + "]"


def note(node: str, text: str) -> str:
    """A line of distrun's own about a host as shown: `[node1] distrun: text`."""
    return f"{label(node, None, 'o')} distrun: {text}"


def rank_prefixes(node: str, rank: int) -> tuple[str, str]:
    """What a rank's whole lines begin with as shown: on stdout (`[node1 r3] `) and stderr (`[node1 r3 err] `)."""
    return label(node, rank, "o") + " ", label(node, rank, "e") + " "


def ranges(names: Iterable[str]) -> str:
    """Names folded into one range without brackets where they make one: node0-2, r0-5, r0,3."""
    folded = fold_hosts(names)
    head, bracket, rest = folded.partition("[")
    if bracket and rest.endswith("]") and "[" not in rest and "," not in head:
        return head + rest[:-1]
    return folded


def group_label(nodes: Iterable[str], ranks: Iterable[int | None], stream: str) -> str:
    """The label of a line folded from several ranks: `[node0-2 r0-5]` (`err` for stderr)."""
    parts = [ranges(nodes)]
    numbered = [f"r{r}" for r in dict.fromkeys(ranks) if r is not None]
    if numbered:
        parts.append(ranges(numbered))
    if stream == "e":
        parts.append("err")
    return "[" + " ".join(parts) + "]"


def stamp(t: float) -> str:
    """An arrival time as `--timestamps` shows it: `2026-11-21T14:30:12.345` (local time).

    Counted in whole milliseconds first: `t - int(t)` of a time like 12.345 is 0.34499..., and
    cutting that showed 12.344, a stamp before the time a rank printed in the line it stamps."""
    whole, millis = divmod(round(t * 1000), 1000)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(whole)) + f".{millis:03d}"


def paint(text: str, code: int | None) -> str:
    return text if code is None else f"\x1b[{code}m{text}\x1b[0m"


def prefixed(text: str, prefix: str) -> str:
    """Lines (each ending in a newline) with `prefix` in front of each, in one replace."""
    if not prefix:
        return text
    return prefix + text[:-1].replace("\n", "\n" + prefix) + "\n"


def shown(data: bytes) -> str:
    """A batch's bytes as text for a terminal: decoded (bad bytes as U+FFFD), controls escaped."""
    return shown_text(data)
