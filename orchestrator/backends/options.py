"""Backend options: each backend declares its own (as torchx's run options do), and they are read the
same way from the job file's section named after the backend and from `-o KEY=VALUE` on the command line.

    slurm: {partition: gpu, time: "01:00:00"}          # in the job file
    distrun launch job.yaml -o partition=debug         # on the command line, over the file

A wrong value in the file is a SpecError at its FILE:LINE; one on the command line names the
`-o` it came from. An unknown key names the closest option the backend has.
"""

from __future__ import annotations

import math
import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum

from orchestrator.errors import UsageError
from orchestrator.spec.fields import Reader, Source, suggestion
from orchestrator.spec.model import JobSpec
from orchestrator.spec.yamlsrc import Node

TRUE = ("true", "yes", "1", "on")
FALSE = ("false", "no", "0", "off")


class OptionType(str, Enum):
    TEXT = "text"  # non-empty text, as written
    INTEGER = "integer"  # at least `minimum`
    NUMBER = "number"  # at least `minimum`
    BOOLEAN = "boolean"
    STRINGS = "strings"  # a list in the file; shell words on the command line


@dataclass(frozen=True)
class Option:
    """One option a backend takes.

    Attributes:
        name: The key, in the job file's section and after `-o`.
        type: What values it takes.
        help: One line for `distrun backends`.
        minimum: The smallest value (INTEGER: default 0; NUMBER: default none).
    """

    name: str
    type: OptionType
    help: str
    minimum: float | None = None

    def reader(self, src: Source) -> Reader:
        """How the job file's value is read (and checked, at its line)."""
        low = self.minimum
        if self.type is OptionType.INTEGER:
            return lambda node, path: src.integer(node, path, int(low if low is not None else 0))
        if self.type is OptionType.NUMBER:
            return lambda node, path: src.number(node, path, low if low is not None else -math.inf)
        if self.type is OptionType.BOOLEAN:
            return src.boolean
        if self.type is OptionType.STRINGS:
            return src.strings
        return src.text

    def parse(self, text: str) -> object:
        """The value of `-o NAME=TEXT`.

        Raises:
            ValueError: TEXT is not a value of this option (the message says what is expected).
        """
        if self.type is OptionType.STRINGS:
            return tuple(shlex.split(text))
        if self.type is OptionType.BOOLEAN:
            if text.lower() not in TRUE + FALSE:
                raise ValueError("expected true or false")
            return text.lower() in TRUE
        if self.type is OptionType.TEXT:
            if not text.strip():
                raise ValueError("must not be empty")
            return text
        kind = int if self.type is OptionType.INTEGER else float
        try:
            value = kind(text)
        except ValueError:
            raise ValueError(f"expected {'an integer' if kind is int else 'a number'}") from None
        low = self.minimum if self.minimum is not None else (0 if kind is int else -math.inf)
        if value < low:
            raise ValueError(f"must be at least {low:g}")
        return value


def from_job(job: JobSpec, backend: str, options: Sequence[Option]) -> dict[str, object]:
    """The values of the job file's section named `backend` (absent: none).

    Raises:
        SpecError: an unknown key or a wrong value, at its line of the job file.
    """
    section: Node | None = job.backend_sections.get(backend)
    if section is None:
        return {}
    src = Source(job.path)
    return src.fields(section, backend, {o.name: o.reader(src) for o in options})


def from_command_line(pairs: Sequence[str], backend: str, options: Sequence[Option]) -> dict[str, object]:
    """The values of `-o KEY=VALUE` pairs, in order (a key given twice: the last wins).

    Raises:
        UsageError: a pair without `=`, an unknown key, or a wrong value; the message names the pair.
    """
    by_name = {o.name: o for o in options}
    values: dict[str, object] = {}
    for pair in pairs:
        key, sep, text = pair.partition("=")
        if not sep:
            raise UsageError(f"-o {pair}: expected KEY=VALUE")
        option = by_name.get(key)
        if option is None:
            raise UsageError(f"-o {pair}: {_unknown(backend, key, list(by_name))}")
        try:
            values[key] = option.parse(text)
        except ValueError as exc:
            raise UsageError(f"-o {pair}: {key}: {exc}") from None
    return values


def _unknown(backend: str, key: str, names: list[str]) -> str:
    if not names:
        return f"the {backend} backend takes no options"
    return f"the {backend} backend has no option {key!r} ({suggestion(key, names, 'options')})"


def resolve(job: JobSpec, pairs: Sequence[str], backend: str, options: Sequence[Option]) -> dict[str, object]:
    """The backend's options: the job file's section, with `-o` pairs over it."""
    return {**from_job(job, backend, options), **from_command_line(pairs, backend, options)}


def describe(options: Sequence[Option]) -> list[str]:
    """One line per option: `partition (text): the Slurm partition`."""
    return [f"{o.name} ({o.type.value}): {o.help}" for o in options]
