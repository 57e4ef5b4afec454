"""The supervisor's output stream: line batches framed by rank and stream, and events.

Stdlib-only: the supervisor writes it (`StreamWriter`), the controller reads it (`FrameReader`),
over an SSH channel or, on Slurm, through a file in the shared job directory.

A stream is a sequence of records:

- a batch: the header line `\\x1f<rank> <stream> <nlines> <nbytes> <flags>\\n`, then exactly
  `nbytes` bytes holding `nlines` whole lines, each ending in `\\n`. `rank` is the global rank,
  or `-` for the host's own lines (torchrun's); `stream` is `o` (stdout) or `e` (stderr); `flags`
  is `p` when the batch is one partial line that waited too long for its newline, else `-`;
- an event: `\\x1e` then one JSON object with "ev" (its kind) and `\\n` (remote/output.py);
- anything else up to a newline: a line that came unframed (kept as a host line).

The controller's work is per batch, not per line: a batch is written to its file in one call,
and prefixed for the terminal with one `bytes.replace`.
"""

from __future__ import annotations

import json
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, BinaryIO

EVENT = b"\x1e"
BATCH = b"\x1f"
STDOUT = "o"
STDERR = "e"
HOST = "-"  # the rank field of the host's own lines
PARTIAL = "p"
QUEUE_LIMIT = 64 << 20  # bytes of batches waiting for the controller before producers wait
WRITE_MAX = 1 << 20  # batches joined into one write, at most this many bytes


@dataclass(frozen=True)
class Batch:
    """Whole lines of one stream of one rank (rank None: the host's own lines)."""

    rank: int | None
    stream: str
    nlines: int
    data: bytes
    partial: bool = False


def header(rank: int | None, stream: str, nlines: int, nbytes: int, partial: bool = False) -> bytes:
    """The header line of a batch of `nlines` lines, `nbytes` bytes."""
    who = HOST if rank is None else str(rank)
    return f"\x1f{who} {stream} {nlines} {nbytes} {PARTIAL if partial else '-'}\n".encode()


def encode(batch: Batch) -> bytes:
    """A batch as it goes on the stream: header, then its bytes."""
    return header(batch.rank, batch.stream, batch.nlines, len(batch.data), batch.partial) + batch.data


class FrameError(ValueError):
    """A batch header that cannot be read."""


def parse_header(line: bytes) -> tuple[int | None, str, int, int, bool]:
    """(rank, stream, nlines, nbytes, partial) of a header line (without its 0x1f and newline).

    Raises:
        FrameError: the line is not a batch header.
    """
    try:
        who, stream, nlines, nbytes, flags = line.decode("ascii").split(" ")
        rank = None if who == HOST else int(who)
        count, size = int(nlines), int(nbytes)
    except (UnicodeDecodeError, ValueError) as exc:
        raise FrameError(f"bad batch header {line[:80]!r}") from exc
    if stream not in (STDOUT, STDERR) or count < 0 or size < 0:
        raise FrameError(f"bad batch header {line[:80]!r}")
    return rank, stream, count, size, flags == PARTIAL


class FrameReader:
    """Cuts a byte stream, fed in chunks of any size, into batches, events and unframed lines.

    Args:
        on_batch: Called with each complete batch.
        on_event: Called with the JSON bytes of each event (after its 0x1e).
        on_line: Called with each unframed line (no newline); also with a header it cannot read,
            after which the bytes that follow are read as lines.
    """

    def __init__(self, on_batch: Callable[[Batch], None], on_event: Callable[[bytes], None],
                 on_line: Callable[[bytes], None]) -> None:
        self.on_batch = on_batch
        self.on_event = on_event
        self.on_line = on_line
        self.rest = b""
        self.need = 0
        self.parts: list[bytes] = []
        self.pending: tuple[int | None, str, int, int, bool] | None = None

    def feed(self, data: bytes) -> None:
        """Take the next bytes of the stream; calls back for every record they complete."""
        buf = self.rest + data if self.rest else data
        pos, end = 0, len(buf)
        while pos < end:
            if self.need:
                piece = buf[pos:pos + self.need]
                self.parts.append(piece)
                self.need -= len(piece)
                pos += len(piece)
                if not self.need:
                    self._complete()
                continue
            cut = buf.find(b"\n", pos)
            if cut < 0:
                break
            self._record(buf[pos:cut])
            pos = cut + 1
        self.rest = buf[pos:]

    def close(self) -> None:
        """The stream ended: what is left of an unfinished line is delivered as a line; an
        unfinished batch (the host went away mid-write) as the lines it holds."""
        if self.need and self.pending is not None:
            data = b"".join(self.parts)
            for line in data.split(b"\n"):
                if line:
                    self.on_line(line)
            self.need, self.parts, self.pending = 0, [], None
        if self.rest:
            self.on_line(self.rest)
            self.rest = b""

    def _record(self, line: bytes) -> None:
        first = line[:1]
        if first == BATCH:
            try:
                self.pending = parse_header(line[1:])
            except FrameError:
                self.on_line(line)
                return
            self.need = self.pending[3]
            self.parts = []
            if not self.need:
                self._complete()
        elif first == EVENT:
            self.on_event(line[1:])
        else:
            self.on_line(line)

    def _complete(self) -> None:
        rank, stream, nlines, _, partial = self.pending  # type: ignore[misc]  # set with need
        data = self.parts[0] if len(self.parts) == 1 else b"".join(self.parts)
        self.parts, self.pending = [], None
        self.on_batch(Batch(rank, stream, nlines, data, partial))


class StreamWriter:
    """What the supervisor writes to its output, from one thread of its own.

    Events (heartbeats, telemetry, notes) go out before waiting batches, so that neither a log
    flood nor a controller that stopped reading delays them behind lines; nothing that calls
    `event` ever waits on the output. Batches keep their order; `batch` waits only while more
    than `limit` bytes of them are queued. `end` queues a last event behind every batch (the
    exit, which the controller must see after the lines). A closed or broken output is let go
    quietly: the controller went away, nothing is left to tell.

    Args:
        stream: The output (stdout's buffer, or a file).
        limit: Bytes of batches queued before `batch` waits.
    """

    def __init__(self, stream: BinaryIO, limit: int = QUEUE_LIMIT) -> None:
        self.stream = stream
        self.limit = limit
        self.events: deque[bytes] = deque()
        self.bulk: deque[bytes] = deque()
        self.queued = 0
        self.cond = threading.Condition()
        self.ending = False
        self.broken = False
        self.thread = threading.Thread(target=self._run, name="distrun-output", daemon=True)
        self.thread.start()

    def event(self, kind: str, fields: dict[str, Any] | None = None, /, **more: Any) -> None:
        """An event, sent ahead of queued batches: `event("hb")`, `event("tel", {...})`."""
        data = EVENT + json.dumps({"ev": kind, **(fields or {}), **more}).encode() + b"\n"
        with self.cond:
            if kind == "hb" and data in self.events:
                return  # one waiting heartbeat says as much as several
            self.events.append(data)
            self.cond.notify()

    def batch(self, batch: Batch) -> None:
        """Queue a batch, behind the others; waits while the queue is over its limit."""
        data = encode(batch)
        with self.cond:
            while self.queued > self.limit and not self.broken and not self.ending:
                self.cond.wait(0.5)
            if self.broken:
                return
            self.bulk.append(data)
            self.queued += len(data)
            self.cond.notify_all()

    def end(self, kind: str, timeout: float | None, /, **fields: Any) -> bool:
        """Queue a last event behind every batch, then wait until all of it was written.

        Args:
            kind: The last event's kind ("exit").
            timeout: Seconds to wait for the output to take it all; None waits as long as it takes.
            fields: The event's fields.

        Returns:
            True when everything was written (False: timed out, or the output is gone).
        """
        data = EVENT + json.dumps({"ev": kind, **fields}).encode() + b"\n"
        with self.cond:
            self.bulk.append(data)
            self.queued += len(data)
            self.ending = True
            self.cond.notify_all()
        self.thread.join(timeout)
        return not self.thread.is_alive() and not self.broken

    def _take(self) -> bytes | None:
        """The next bytes to write (events first, batches joined up to WRITE_MAX); None: done."""
        with self.cond:
            while not self.events and not self.bulk:
                if self.ending:
                    return None
                self.cond.wait()
            if self.events:
                data = b"".join(self.events)
                self.events.clear()
                return data
            parts, size = [], 0
            while self.bulk and (not parts or size + len(self.bulk[0]) <= WRITE_MAX):
                part = self.bulk.popleft()
                parts.append(part)
                size += len(part)
            self.queued -= size
            self.cond.notify_all()
            return b"".join(parts)

    def _run(self) -> None:
        while True:
            data = self._take()
            if data is None:
                return
            try:
                self.stream.write(data)
                self.stream.flush()
            except (OSError, ValueError):
                with self.cond:
                    self.broken = True
                    self.events.clear()
                    self.bulk.clear()
                    self.queued = 0
                    self.cond.notify_all()
                return
