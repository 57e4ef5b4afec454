"""The project's exceptions; `cli/main.py` maps each to an exit code and one line on stderr."""

from __future__ import annotations

from enum import IntEnum


class ExitCode(IntEnum):
    OK = 0
    FAILED = 1
    USAGE = 2
    INFRA = 3
    INTERRUPTED = 130
    TERMINATED = 143


class DistrunError(Exception):
    """Base of every error meant for a person: `str(err)` is the whole message."""

    exit_code: ExitCode = ExitCode.FAILED


class UsageError(DistrunError):
    """Bad input from the command line or a file: exit 2."""

    exit_code = ExitCode.USAGE


class SpecError(UsageError):
    """A YAML file is wrong: rendered as `FILE:LINE: key.path: what is wrong (hint)`."""

    def __init__(self, file: str, line: int, key_path: str, what: str, hint: str = "") -> None:
        self.file = file
        self.line = line
        self.key_path = key_path
        self.what = what
        self.hint = hint
        super().__init__(self.render())

    def render(self) -> str:
        where = f"{self.file}:{self.line}: "
        key = f"{self.key_path}: " if self.key_path else ""
        hint = f" ({self.hint})" if self.hint else ""
        return f"{where}{key}{self.what}{hint}"


class InfraError(DistrunError):
    """A host is unreachable, authentication failed, a port is busy: exit 3."""

    exit_code = ExitCode.INFRA


def one_line(exc: BaseException) -> str:
    """The first line of an exception's message (its type's name when the message is empty),
    for summaries that give each host one line."""
    text = str(exc)
    return text.splitlines()[0] if text else type(exc).__name__
