"""Backend options: each backend declares its own (as torchx's run options do), and they are read the
same way from the job file's section named after the backend and from `-o KEY=VALUE` on the command line.

    slurm: {partition: gpu, time: "01:00:00"}          # in the job file
    distrun launch job.yaml -o partition=debug         # on the command line, over the file

A wrong value in the file is a SpecError at its FILE:LINE; one on the command line names the
`-o` it came from. An unknown key names the closest option the backend has. An option that a
backend writes into a line of a script (Slurm's `#SBATCH` lines) is declared `one_line`: a line
break there would end the line and start a shell command, so it is refused in both places.
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
from orchestrator.spec.yamlsrc import Node, Seq, shown

TRUE = ("true", "yes", "1", "on")
FALSE = ("false", "no", "0", "off")
ONE_LINE = "must be one line of text"
ONE_LINE_HINT = "it is written into one line of the backend's script: remove the line break"


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
        one_line: TEXT, or each item of STRINGS, must be one line of printable text (no line
            break or other control character): the backend writes it into a line of a script.
    """

    name: str
    type: OptionType
    help: str
    minimum: float | None = None
    one_line: bool = False

    def reader(self, src: Source) -> Reader:
        """How the job file's value is read (and checked, at its line)."""
        read = self._plain_reader(src)
        if not self.one_line or self.type not in (OptionType.TEXT, OptionType.STRINGS):
            return read

        def one_line(node: Node, path: str) -> object:
            value = read(node, path)
            for index, text in enumerate(value if isinstance(value, tuple) else (value,)):
                if not text.isprintable():
                    item, where = (node.items[index], f"{path}[{index}]") if isinstance(node, Seq) else (node, path)
                    raise src.error(item.line, where, f"{ONE_LINE}, got {shown(text)}", ONE_LINE_HINT)
            return value

        return one_line

    def _plain_reader(self, src: Source) -> Reader:
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
            items = tuple(shlex.split(text))
            self._check_lines(items)
            return items
        if self.type is OptionType.BOOLEAN:
            if text.lower() not in TRUE + FALSE:
                raise ValueError("expected true or false")
            return text.lower() in TRUE
        if self.type is OptionType.TEXT:
            if not text.strip():
                raise ValueError("must not be empty")
            self._check_lines((text,))
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

    def _check_lines(self, texts: Sequence[str]) -> None:
        """Raises ValueError when the option is `one_line` and a text is not one line."""
        bad = next((text for text in texts if not text.isprintable()), None) if self.one_line else None
        if bad is not None:
            raise ValueError(f"{ONE_LINE}, got {bad!r} ({ONE_LINE_HINT})")


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
        given = shown(pair)  # one line, whatever the pair holds
        if not sep:
            raise UsageError(f"-o {given}: expected KEY=VALUE")
        option = by_name.get(key)
        if option is None:
            raise UsageError(f"-o {given}: {_unknown(backend, shown(key), list(by_name))}")
        try:
            values[key] = option.parse(text)
        except ValueError as exc:
            raise UsageError(f"-o {given}: {key}: {exc}") from None
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
