"""Typed readers for the values of a YAML tree. Each check that fails raises a SpecError
naming the file, the value's line and its key path, with a hint on how to fix it.

A field that wants text takes any scalar but null, exactly as written in the file: `python:
3.10` is "3.10", not "3.1", and `iface: no` is "no", not False.
"""

from __future__ import annotations

import difflib
import math
import os
import re
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from datetime import date
from enum import Enum
from typing import TypeVar

from orchestrator.errors import SpecError
from orchestrator.spec.yamlsrc import Map, Node, Scalar, Seq, join_path, shown

E = TypeVar("E", bound=Enum)
Reader = Callable[[Node, str], object]

ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
ENV_NAME_HINT = "use letters, digits and '_', not starting with a digit"
_TRUE_FALSE = {"true", "false", "True", "False", "TRUE", "FALSE"}
_SHOWN_CHARS = 40


def describe(node: Node) -> str:
    """Say what a node is, for 'got ...' in messages: "string 'two'", "integer 3", "a list".

    Args:
        node: Any node.

    Returns:
        A short phrase naming the node's type and, for a scalar, its text.
    """
    if isinstance(node, Map):
        return "a mapping"
    if isinstance(node, Seq):
        return "a list"
    value = node.value
    if value is None:
        return "null"
    if isinstance(value, str):
        return f"string {_clip(value)!r}"
    kinds: list[tuple[type, str]] = [(bool, "boolean"), (int, "integer"), (float, "number"), (date, "date")]
    kind = next((name for cls, name in kinds if isinstance(value, cls)), "value")
    return f"{kind} {shown(_clip(node.text))}"


def closest(word: str, choices: Collection[str]) -> str | None:
    """The choice closest to a misspelled word, if one is close enough.

    Args:
        word: What was written.
        choices: The valid words.

    Returns:
        The closest valid word, or None.
    """
    matches = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return matches[0] if matches else None


def near_file(path: str) -> str:
    """For a file that is not there: " (did you mean DIR/NAME?)" naming the closest file of the same
    folder as `path` would write it, else ""."""
    folder, name = os.path.split(path)
    try:
        with os.scandir(os.path.expanduser(folder or ".")) as entries:
            names = [e.name for e in entries if e.is_file()]
    except OSError:
        return ""
    match = closest(name, names)
    return f" (did you mean {os.path.join(folder, match)}?)" if match else ""


def suggestion(word: str, choices: Collection[str], what: str = "keys") -> str:
    """A hint for a misspelled word: "did you mean 'x'?", else the list of valid choices.

    Args:
        word: What was written.
        choices: The valid words.
        what: The plural noun naming the choices, for the fallback list.

    Returns:
        The hint text.
    """
    match = closest(word, choices)
    if match is not None:
        return f"did you mean {match!r}?"
    return f"valid {what}: {', '.join(choices)}" if choices else f"there are no {what}"


@dataclass(frozen=True)
class Source:
    """The file being read; its readers raise SpecError naming this file."""

    file: str

    def error(self, line: int, path: str, what: str, hint: str = "") -> SpecError:
        """Build (not raise) the error for a value of this file.

        Args:
            line: 1-based line of the value.
            path: Key path of the value.
            what: What is wrong.
            hint: How to fix it.

        Returns:
            The SpecError, ready to raise.
        """
        return SpecError(self.file, line, path, what, hint)

    def document(self, root: Node | None, needs: str) -> Map:
        """Check that a loaded document is a non-empty mapping.

        Args:
            root: What `load_yaml` returned.
            needs: What the file must contain, for the hint.

        Returns:
            The top-level mapping.

        Raises:
            SpecError: The file is empty or its top level is not a mapping.
        """
        if root is None:
            raise self.error(1, "", "the file is empty", needs)
        if not isinstance(root, Map):
            raise self.error(root.line, "", f"the top level must be a mapping of keys, got {describe(root)}", needs)
        return root

    def mapping(self, node: Node, path: str, allowed: Collection[str], required: Sequence[str] = ()) -> Map:
        """Check that a node is a mapping with only allowed keys and every required one.

        Args:
            node: The node to check.
            path: Its key path.
            allowed: The valid keys.
            required: Keys that must be present.

        Returns:
            The mapping.

        Raises:
            SpecError: Not a mapping, an unknown key (naming the closest valid one), or a
                missing required key (at the mapping's first line).
        """
        if not isinstance(node, Map):
            raise self.error(node.line, path, f"must be a mapping, got {describe(node)}")
        for key in node.entries:
            if key not in allowed:
                raise self.error(node.key_lines[key], join_path(path, key), "unknown key", suggestion(key, allowed))
        for key in required:
            if key not in node.entries:
                raise self.error(node.line, path, f"missing required key {key!r}")
        return node

    def fields(self, node: Node, path: str, readers: Mapping[str, Reader]) -> dict[str, object]:
        """Read a mapping whose keys are exactly the keys of `readers`, all optional.

        Args:
            node: The mapping node.
            path: Its key path.
            readers: For each valid key, the reader of its value.

        Returns:
            The value of each key present, read by its reader.

        Raises:
            SpecError: As `mapping` does, or as a reader does.
        """
        mapping = self.mapping(node, path, readers)
        return {key: readers[key](value, join_path(path, key)) for key, value in mapping.entries.items()}

    def string(self, node: Node, path: str) -> str:
        """Read text: any scalar but null, as written.

        Args:
            node: The value.
            path: Its key path.

        Returns:
            The text.

        Raises:
            SpecError: Null, a list or a mapping.
        """
        if isinstance(node, Scalar) and node.value is not None:
            return node.text
        raise self.error(node.line, path, f"must be a string, got {describe(node)}")

    def text(self, node: Node, path: str) -> str:
        """Read non-empty text: any scalar but null or '', as written.

        Args:
            node: The value.
            path: Its key path.

        Returns:
            The text.

        Raises:
            SpecError: Null, empty, a list or a mapping.
        """
        text = self.string(node, path)
        if not text.strip():
            raise self.error(node.line, path, "must not be empty", "remove the key to use the default")
        return text

    def integer(self, node: Node, path: str, low: int, high: int | None = None, kind: str = "an integer") -> int:
        """Read an integer in [low, high]; booleans are not integers.

        Args:
            node: The value.
            path: Its key path.
            low: The smallest valid value.
            high: The largest valid value; None for no limit.
            kind: What the value must be, for messages.

        Returns:
            The integer.

        Raises:
            SpecError: Not an integer, or out of range.
        """
        value = _int_value(node)
        if value is None:
            raise self.error(node.line, path, f"must be {kind}, got {describe(node)}")
        if value < low or (high is not None and value > high):
            expected = f"from {low} to {high}" if high is not None else f">= {low}"
            raise self.error(node.line, path, f"must be {kind} {expected}, got {value}")
        return value

    def auto_or_integer(self, node: Node, path: str, low: int, high: int | None = None) -> int | None:
        """Read `auto` or an integer in [low, high].

        Args:
            node: The value.
            path: Its key path.
            low: The smallest valid integer.
            high: The largest valid integer; None for no limit.

        Returns:
            None for `auto`, else the integer.

        Raises:
            SpecError: Neither `auto` nor an integer in range.
        """
        if isinstance(node, Scalar) and node.value == "auto":
            return None
        return self.integer(node, path, low, high, kind="'auto' or an integer")

    def number(self, node: Node, path: str, low: float, high: float | None = None, *, inclusive: bool = True,
               hint: str = "") -> float:
        """Read a finite number, at least `low` (above it when not `inclusive`) and at most `high`.

        Args:
            node: The value.
            path: Its key path.
            low: The lower bound.
            high: The upper bound; None for no limit.
            inclusive: Whether `low` itself is valid.
            hint: How to fix a value out of bounds.

        Returns:
            The number as a float.

        Raises:
            SpecError: Not a number (booleans are not), not finite, or out of bounds.
        """
        value = node.value if isinstance(node, Scalar) else None
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            raise self.error(node.line, path, f"must be a number, got {describe(node)}")
        if not math.isfinite(value):
            raise self.error(node.line, path, f"must be a finite number, got {shown(node.text)}")
        too_low = value < low or (value == low and not inclusive)
        if too_low or (high is not None and value > high):
            bound = f">= {low:g}" if inclusive else f"> {low:g}"
            if high is not None:
                bound = f"from {low:g} to {high:g}" if inclusive else f"{bound} and <= {high:g}"
            raise self.error(node.line, path, f"must be a number {bound}, got {shown(node.text)}", hint)
        return float(value)

    def boolean(self, node: Node, path: str) -> bool:
        """Read `true` or `false`; YAML 1.1's yes/no/on/off are refused as easy to misread.

        Args:
            node: The value.
            path: Its key path.

        Returns:
            The boolean.

        Raises:
            SpecError: Anything but true or false.
        """
        if isinstance(node, Scalar) and isinstance(node.value, bool):
            if node.text in _TRUE_FALSE:
                return node.value
            raise self.error(node.line, path, f"must be true or false, got {node.text!r}", "write true or false")
        raise self.error(node.line, path, f"must be true or false, got {describe(node)}")

    def choice(self, node: Node, path: str, choices: Sequence[str]) -> str:
        """Read one of a fixed set of words.

        Args:
            node: The value.
            path: Its key path.
            choices: The valid words.

        Returns:
            The word.

        Raises:
            SpecError: Not one of `choices` (naming the closest one when there is one).
        """
        if isinstance(node, Scalar) and node.value is not None and node.text in choices:
            return node.text
        close = closest(node.text, choices) if isinstance(node, Scalar) else None
        hint = f"did you mean {close!r}?" if close else ""
        raise self.error(node.line, path, f"must be one of {', '.join(choices)}, got {describe(node)}", hint)

    def enum(self, node: Node, path: str, kind: type[E]) -> E:
        """Read the value of a `str` Enum.

        Args:
            node: The value.
            path: Its key path.
            kind: The Enum class.

        Returns:
            The member.

        Raises:
            SpecError: Not one of the enum's values.
        """
        return kind(self.choice(node, path, [member.value for member in kind]))

    def strings(self, node: Node, path: str) -> tuple[str, ...]:
        """Read a list of text items (numbers and booleans kept as written).

        Args:
            node: The value.
            path: Its key path.

        Returns:
            The items.

        Raises:
            SpecError: Not a list, or an item that is null, a list or a mapping.
        """
        if not isinstance(node, Seq):
            hint = "write [a, b] or one '- item' a line"
            raise self.error(node.line, path, f"must be a list, got {describe(node)}", hint)
        return tuple(self.string(item, f"{path}[{index}]") for index, item in enumerate(node.items))

    def env(self, node: Node, path: str) -> dict[str, Node]:
        """Check an environment mapping's variable names.

        Args:
            node: The value.
            path: Its key path.

        Returns:
            Each variable name and its (unchecked) value node.

        Raises:
            SpecError: Not a mapping, or a name that is not a valid variable name.
        """
        if not isinstance(node, Map):
            raise self.error(node.line, path, f"must be a mapping of variable names to values, got {describe(node)}")
        for name in node.entries:
            if not ENV_NAME.fullmatch(name):
                raise self.error(
                    node.key_lines[name], join_path(path, name), "not a valid environment variable name", ENV_NAME_HINT
                )
        return node.entries

    def plain_env(self, node: Node, path: str) -> dict[str, str]:
        """Read an environment mapping whose values are plain text.

        Args:
            node: The value.
            path: Its key path.

        Returns:
            Variable name to value, numbers and booleans kept as written.

        Raises:
            SpecError: As `env` does, or a value that is null, a list or a mapping.
        """
        return {name: self.string(value, join_path(path, name)) for name, value in self.env(node, path).items()}


def _clip(text: str) -> str:
    return text if len(text) <= _SHOWN_CHARS else text[: _SHOWN_CHARS - 3] + "..."


def _int_value(node: Node) -> int | None:
    value = node.value if isinstance(node, Scalar) else None
    return value if isinstance(value, int) and not isinstance(value, bool) else None
