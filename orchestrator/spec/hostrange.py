"""Host ranges as clush and pdsh write them: `node[0-7,12]`, `gpu[08-10]-ib`, `node[0-3],login`.

`expand_hosts` is the inverse of `display.fold_hosts`: for any set of host names,
`expand_hosts(fold_hosts(names))` gives the same names back. Each bracket holds numbers and
ranges of numbers; a range whose first number is zero-padded keeps that width (`[08-10]` is
08, 09, 10). Several brackets in one name give every combination (`r[1-2]n[1-2]` is r1n1,
r1n2, r2n1, r2n2). Commas outside brackets separate names.
"""

from __future__ import annotations

import itertools
import re

MAX_HOSTS = 65536  # a range wider than this is a typo (`node[0-1000000]`), not a fleet
_NUMBER = re.compile(r"\d+")


class HostRangeError(ValueError):
    """A host range that cannot be read; `str()` says what is wrong with it."""


def expand_hosts(text: str) -> list[str]:
    """Every host name a range stands for, in the order written, each once.

    Args:
        text: E.g. `node[0-2,5],login`.

    Returns:
        E.g. ["node0", "node1", "node2", "node5", "login"].

    Raises:
        HostRangeError: unbalanced brackets, an empty name or bracket, a part of a bracket that is
            not a number or a range, a range that runs backwards, or more than MAX_HOSTS names.
    """
    names: dict[str, None] = {}
    for item in split_top_level(text):
        for name in _expand_item(item):
            names[name] = None
            if len(names) > MAX_HOSTS:
                raise HostRangeError(f"more than {MAX_HOSTS} host names")
    return list(names)


def split_top_level(text: str) -> list[str]:
    """Split at the commas outside brackets: `node[0,2],gpu1` -> [`node[0,2]`, `gpu1`].

    Raises:
        HostRangeError: the brackets do not balance, or a name is empty (`a,,b`).
    """
    items: list[str] = []
    depth = 0
    start = 0
    for index, char in enumerate(text):
        if char == "[":
            depth += 1
            if depth > 1:
                raise HostRangeError(f"'[' inside a bracket at character {index + 1}")
        elif char == "]":
            depth -= 1
            if depth < 0:
                raise HostRangeError(f"']' without '[' at character {index + 1}")
        elif char == "," and depth == 0:
            items.append(text[start:index])
            start = index + 1
    if depth:
        raise HostRangeError("'[' without ']'")
    items.append(text[start:])
    stripped = [item.strip() for item in items]
    if not all(stripped):
        raise HostRangeError("an empty name (two commas in a row, or one at an end)")
    return stripped


def _expand_item(item: str) -> list[str]:
    """One name with zero or more brackets: every combination of their numbers, in order."""
    parts = re.split(r"\[([^\]]*)\]", item)
    texts, brackets = parts[0::2], parts[1::2]
    choices = [_bracket(body) for body in brackets]
    names = []
    for combination in itertools.product(*choices):
        pieces = [texts[0]]
        for number, text in zip(combination, texts[1:], strict=True):
            pieces += [number, text]
        names.append("".join(pieces))
    return names


def _bracket(body: str) -> list[str]:
    """The numbers of one bracket's body (`0-2,5` -> 0 1 2 5); padding kept from each range's start."""
    if not body.strip():
        raise HostRangeError("an empty bracket '[]'")
    numbers: list[str] = []
    for part in body.split(","):
        numbers += _range(part.strip())
        if len(numbers) > MAX_HOSTS:
            raise HostRangeError(f"more than {MAX_HOSTS} host names")
    return numbers


def _range(part: str) -> list[str]:
    first, dash, last = part.partition("-")
    if not _NUMBER.fullmatch(first) or (dash and not _NUMBER.fullmatch(last)):
        raise HostRangeError(f"'{part}' in a bracket is not a number or a range like 0-7")
    if not dash:
        return [first]
    low, high = int(first), int(last)
    if high < low:
        raise HostRangeError(f"the range '{part}' runs backwards (write {last}-{first})")
    if high - low >= MAX_HOSTS:
        raise HostRangeError(f"more than {MAX_HOSTS} host names")
    width = len(first) if first.startswith("0") and len(first) > 1 else 0
    return [str(number).zfill(width) for number in range(low, high + 1)]
