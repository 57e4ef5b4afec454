"""What distrun shows on a terminal and nowhere else: the one writer, colour, progress counts, a
yes/no question.

Every write of distrun to a terminal goes through `show` (tests/test_terminal_escape.py holds
every other module to it): text from a host may carry escape sequences that retitle the window,
move the cursor or clear the screen, and `show` writes every control character as `\\xNN`
(remote/redact.py's `escape_controls`) but newline, tab and the SGR colour sequences
(`ESC [ digits m`) of distrun's own styling. `ProgressCounter` and `ask_yes_no` write their own fixed
sequences here.

Colour follows one rule for every command: `--color always|never` wins, then the config file's
`color:`, then `NO_COLOR` (set to anything non-empty: no colour), then whether the stream is a
terminal. ProgressCounter (`connected 41/64`) is written to stderr only when stderr is a terminal, and
erased before anything else is printed.
"""

from __future__ import annotations

import os
import re
import sys
import termios
import threading
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from enum import Enum
from typing import TextIO

_SGR = re.compile("(\x1b\\[[0-9;]*m)")


class ColorMode(str, Enum):
    AUTO = "auto"
    ALWAYS = "always"
    NEVER = "never"


_settings = {"color": ColorMode.AUTO}


def set_color_mode(mode: ColorMode | str) -> None:
    """Set this process's colour mode (from `--color` or the config file)."""
    _settings["color"] = ColorMode(mode)


def color_mode() -> ColorMode:
    return _settings["color"]


def colour(stream: TextIO | None) -> bool:
    """Whether text written to `stream` may be coloured (see the module docstring)."""
    mode = color_mode()
    if mode is not ColorMode.AUTO:
        return mode is ColorMode.ALWAYS
    if os.environ.get("NO_COLOR"):
        return False
    return stream is not None and stream.isatty()


def safe_text(text: str) -> str:
    """`text` as it may reach a terminal: control characters escaped but newline, tab and SGR colours."""
    # Imported here, not when this module loads: cli/main.py imports it before it takes Ctrl-C, and
    # orchestrator.remote's package (the bundle's resources) costs tens of ms there.
    from orchestrator.remote.redact import escape_controls

    if "\x1b" not in text:
        return escape_controls(text)
    bare = _SGR.sub("", text)
    if len(escape_controls(bare)) == len(bare):  # no control but the colours': kept whole (two C passes)
        return text
    parts = _SGR.split(text)
    # split() with a group: the SGR sequences are at the odd places.
    return "".join(part if i % 2 else escape_controls(part) for i, part in enumerate(parts))


def show(text: str = "", *, err: bool = False, stream: TextIO | None = None, end: str = "\n",
         flush: bool = False) -> None:
    """Write `text` (and `end`) to stdout, stderr (`err`) or `stream`, made safe (`safe_text`).

    The one way distrun writes to a terminal, so that no text from a host acts on it.
    """
    out = stream if stream is not None else sys.stderr if err else sys.stdout
    out.write(safe_text(text) + end)
    if flush:
        out.flush()


def is_terminal(stream: TextIO | None) -> bool:
    """Whether `stream` is an interactive terminal (a closed or missing stream is not)."""
    try:
        return stream is not None and stream.isatty()
    except ValueError:
        return False


class ProgressCounter:
    """A count that rewrites one terminal line: `connected 41/64`.

    Args:
        total: How many there are.
        verb: What a tick means ("connected", "probed").
        stream: Where to write; nothing is written unless it is a terminal.
    """

    def __init__(self, total: int, verb: str, stream: TextIO | None = None) -> None:
        self.total = total
        self.verb = verb
        self.stream = sys.stderr if stream is None else stream
        self.shown = is_terminal(self.stream) and total > 1
        self._done: set[str] = set()
        self._visible = False
        self._lock = threading.Lock()

    def tick(self, name: str) -> None:
        """Count `name` and show the new count; a name already counted changes nothing."""
        with self._lock:
            if name in self._done:
                return
            self._done.add(name)
            if self.shown:
                self.stream.write(f"\r\x1b[2K{self.verb} {len(self._done)}/{self.total}")
                self.stream.flush()
                self._visible = True

    @property
    def count(self) -> int:
        return len(self._done)

    def clear(self) -> None:
        """Erase the line, so that what follows starts on a clean one."""
        with self._lock:
            if self._visible:
                self.stream.write("\r\x1b[2K")
                self.stream.flush()
                self._visible = False


def ask_yes_no(question: str, stdin: TextIO | None = None, out: TextIO | None = None) -> bool:
    """Ask on the terminal; only `y` or `yes` is a yes (Enter, EOF and anything else are a no)."""
    stdin = sys.stdin if stdin is None else stdin
    out = sys.stderr if out is None else out
    out.write(f"{safe_text(question)} [y/N] ")
    out.flush()
    answer = stdin.readline()
    return answer.strip().lower() in ("y", "yes")


def can_ask() -> bool:
    """Whether a question can be put to somebody: stdin and stderr are both terminals."""
    return is_terminal(sys.stdin) and is_terminal(sys.stderr)


@contextmanager
def no_control_echo(stream: TextIO | None = None) -> Iterator[None]:
    """Within the block, a Ctrl-C typed on `stream`'s terminal (default stdin) is not echoed as `^C`.

    The live view redraws a block of lines in place; a `^C` echoed at its right edge wraps the
    cursor onto a line the view does not know of, and its title stays on screen after it is
    cleared. Nothing changes where `stream` is not a terminal; the terminal's own setting is
    restored after the block, however it ends.
    """
    stream = sys.stdin if stream is None else stream
    try:
        fd = stream.fileno()
        before = termios.tcgetattr(fd) if os.isatty(fd) else None
    except (OSError, ValueError, termios.error):
        before = None
    if before is None:
        yield
        return
    quiet = [*before[:3], before[3] & ~termios.ECHOCTL, *before[4:]]
    termios.tcsetattr(fd, termios.TCSANOW, quiet)
    try:
        yield
    finally:
        with suppress(termios.error, OSError):
            termios.tcsetattr(fd, termios.TCSANOW, before)


def say_at_once(line: str) -> None:
    """Write `line` to stderr in one system call, past Python's buffers (a signal handler's line: the
    main thread may be inside a write); on a terminal, first erase what a progress line
    (`connected 1/3`) left on the cursor's line."""
    fd = sys.stderr.fileno()
    erase = "\r\x1b[2K" if os.isatty(fd) else ""
    os.write(fd, f"{erase}{line}\n".encode())
