"""The terminal's side of a job's lines: a queue written by a thread of its own; `offer` never waits.

When the terminal falls behind (a pipe nobody reads for a while, a slow log shipper), what does
not fit the in-memory queue goes on to a spill file in the job's directory, and the writer
catches up from it, in order: late, but every line. An interactive terminal instead skips ahead
(a person reads the latest lines): it says where, with how many lines, and the job's summary
counts them (`distrun logs` has them all).
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO, TextIO

from orchestrator.console.terminal import show

QUEUE_BYTES = 16 << 20  # text waiting in memory before it spills (or, on a terminal, is skipped)
SPILL_READ = 1 << 20  # bytes read back from the spill file at a time
TICK = 0.1


class TerminalWriter:
    """Writes text to a terminal from a thread of its own; `offer` never waits on the terminal.

    Args:
        terminal: Where lines go.
        limit: Characters queued in memory before the spill file (or skipping) takes over.
        tick: Called about every TICK seconds from the writer's thread (to let held lines go).
        spill: The file to catch up from when the terminal is behind; None: skip ahead instead.
        marker: The line said where lines were skipped, given how many.
    """

    def __init__(self, terminal: TextIO, limit: int = QUEUE_BYTES, tick: Callable[[], None] | None = None,
                 spill: Path | None = None, marker: Callable[[int], str] | None = None) -> None:
        self.terminal = terminal
        self.limit = limit
        self.tick = tick
        self.spill = spill
        self.marker = marker or (lambda count: f"distrun: {count} line(s) skipped here\n")
        self.items: deque[tuple[str, int]] = deque()
        self.size = 0
        self.missed = 0
        self.skipped = 0  # lines left out since the last marker
        self.spilled = 0  # bytes in the spill file not read back yet
        self.spill_out: BinaryIO | None = None
        self.spill_in: BinaryIO | None = None
        self.cond = threading.Condition()
        self.closing = False
        self.broken = False
        self.thread = threading.Thread(target=self._run, name="distrun-terminal", daemon=True)
        self.thread.start()

    def offer(self, text: str, nlines: int) -> bool:
        """Queue `text` (`nlines` whole lines) for the terminal; False when it was left out (counted)."""
        with self.cond:
            if self.broken:
                self.missed += nlines
                return False
            full = bool(self.items) and self.size + len(text) > self.limit
            if self.spill is not None and (self.spilled or full):
                return self._spill(self.spill, text, nlines)
            if full:
                self.missed += nlines
                self.skipped += nlines
                return False
            if self.skipped:
                self._queue(self.marker(self.skipped), 1)
                self.skipped = 0
            self._queue(text, nlines)
            return True

    def close(self, timeout: float | None = 10.0) -> None:
        """Write what is queued, then stop; what could not be written counts as missed. A writer
        with a spill file waits for all of it (a pipe gets every line); else at most `timeout` s."""
        with self.cond:
            self.closing = True
            self.cond.notify()
        self.thread.join(None if self.spill is not None else timeout)
        with self.cond:
            self.missed += sum(n for _, n in self.items)
            self.items.clear()
            self.broken = True
            self._drop_spill()

    def _queue(self, text: str, nlines: int) -> None:
        """Queue text; the writer takes it within TICK (a wake per batch cost as much CPU as the batch)."""
        self.items.append((text, nlines))
        self.size += len(text)

    def _spill(self, path: Path, text: str, nlines: int) -> bool:
        """Append to the spill file (the terminal reads it back in order); False when it cannot be written."""
        try:
            if self.spill_out is None:
                self.spill_out = open(path, "wb")  # noqa: SIM115 - closed in _drop_spill
                self.spill_in = open(path, "rb")  # noqa: SIM115
            data = text.encode("utf-8", "surrogateescape")
            self.spill_out.write(data)
            self.spill_out.flush()
        except OSError:
            self.missed += nlines
            return False
        self.spilled += len(data)
        self.cond.notify()
        return True

    def _unspill(self) -> tuple[str, int] | None:
        """The next whole lines of the spill file (the file starts over once all is read)."""
        if not self.spilled or self.spill_in is None or self.spill_out is None:
            return None
        data = b"".join(self.spill_in.readlines(SPILL_READ))
        self.spilled -= len(data)
        if not self.spilled:
            self.spill_out.seek(0)
            self.spill_out.truncate()
            self.spill_in.seek(0)
        return data.decode("utf-8", "surrogateescape"), data.count(b"\n")

    def _drop_spill(self) -> None:
        for handle in (self.spill_out, self.spill_in):
            if handle is not None:
                handle.close()
        self.spill_out = self.spill_in = None
        self.spilled = 0
        if self.spill is not None:
            self.spill.unlink(missing_ok=True)

    def _take(self) -> tuple[str, int] | None:
        with self.cond:
            if not self.items and not self.spilled and not self.closing:
                self.cond.wait(TICK)
            if not self.items:
                return self._unspill()
            text = "".join(t for t, _ in self.items)
            count = sum(n for _, n in self.items)
            self.items.clear()
            self.size = 0
            return text, count

    def _run(self) -> None:
        while True:
            if self.tick is not None:
                self.tick()
            taken = self._take()
            if taken is None:
                if self.closing:
                    return
                continue
            try:
                show(taken[0], stream=self.terminal, end="")
                if not self.items and not self.spilled:
                    self.terminal.flush()
            except (OSError, ValueError):
                with self.cond:
                    self.broken = True
                    self.missed += taken[1] + sum(n for _, n in self.items) + self._spilled_lines()
                    self.items.clear()
                return

    def _spilled_lines(self) -> int:
        """Lines in the spill file not read back yet (once the terminal broke: counted as missed)."""
        if not self.spilled or self.spill_in is None:
            return 0
        count = sum(line.count(b"\n") for line in self.spill_in)
        self.spilled = 0
        return count
