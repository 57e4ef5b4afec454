"""The layout a job's lines are kept in, on the controller and in every host's own copy.

Stdlib-only: the supervisor writes a host's copy with it, the controller its job directory, and
`distrun logs` and `--recover` read both. In a directory:

    ranks/<rank>.out   ranks/<rank>.err     each rank's stdout and stderr, bytes as they came
    nodes/<node>.out   nodes/<node>.err     a host's own lines (torchrun's, distrun's notes)
    lines.idx                               one line per batch, in arrival order

Each line of lines.idx is tab-separated: time (seconds since the epoch, when the batch
arrived), attempt, node, rank (`-` for a host's own lines), stream (`o` stdout, `e` stderr,
`d` a note from distrun, kept in the node's .out file), number of lines, number of bytes, and
`p` for a partial line (else `-`). A batch's lines lie in its file right after those of the
entries before it, so the index gives every line's place without a per-line cost, and `logs`
merges all files in arrival order from it. Data is written before its index entry.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from orchestrator.remote.private import FILE_MODE, make_private_dirs

INDEX = "lines.idx"
NOTE = "d"
STREAMS = ("o", "e", NOTE)


@dataclass(frozen=True)
class IndexEntry:
    """One batch of lines as the index records it."""

    time: float
    attempt: int
    node: str
    rank: int | None
    stream: str
    nlines: int
    nbytes: int
    partial: bool = False

    def line(self) -> str:
        """The entry as a line of lines.idx."""
        rank = "-" if self.rank is None else str(self.rank)
        return (f"{self.time:.6f}\t{self.attempt}\t{self.node}\t{rank}\t{self.stream}\t{self.nlines}\t"
                f"{self.nbytes}\t{'p' if self.partial else '-'}\n")

    @property
    def path(self) -> str:
        """The data file holding this entry's lines, relative to the directory."""
        return data_path(self.node, self.rank, self.stream)


def data_path(node: str, rank: int | None, stream: str) -> str:
    """`ranks/3.out`, `ranks/3.err`, `nodes/node0.out` (notes too) or `nodes/node0.err`."""
    ext = "err" if stream == "e" else "out"
    return f"nodes/{node}.{ext}" if rank is None else f"ranks/{rank}.{ext}"


def parse_entry(line: str) -> IndexEntry:
    """An index line back into an IndexEntry.

    Raises:
        ValueError: the line is not an index entry.
    """
    fields = line.rstrip("\n").split("\t")
    if len(fields) != 8 or fields[4] not in STREAMS:
        raise ValueError(f"not a line of {INDEX}: {line[:80]!r}")
    rank = None if fields[3] == "-" else int(fields[3])
    return IndexEntry(float(fields[0]), int(fields[1]), fields[2], rank, fields[4], int(fields[5]), int(fields[6]),
                      fields[7] == "p")


def read_index(root: str) -> list[IndexEntry]:
    """Every entry of a directory's index (an unfinished last line, being written, is left out)."""
    try:
        with open(os.path.join(root, INDEX), encoding="utf-8") as fh:
            text = fh.read()
    except FileNotFoundError:
        return []
    return list(parse_entries(text[:text.rfind("\n") + 1]))


def parse_entries(text: str) -> Iterator[IndexEntry]:
    """Entries of index text made of whole lines; a line that cannot be read is skipped."""
    for line in text.splitlines():
        try:
            yield parse_entry(line)
        except ValueError:
            continue


@dataclass(frozen=True)
class Located:
    """An entry and where its bytes are: `offset` in its file."""

    entry: IndexEntry
    offset: int


class Locator:
    """Gives each entry its offset in its file, entry after entry (the index lists them in the
    order they were written to each file)."""

    def __init__(self) -> None:
        self.ends: dict[str, int] = {}

    def place(self, entry: IndexEntry) -> Located:
        path = entry.path
        offset = self.ends.get(path, 0)
        self.ends[path] = offset + entry.nbytes
        return Located(entry, offset)

    def place_all(self, entries: Iterable[IndexEntry]) -> list[Located]:
        return [self.place(e) for e in entries]


class LineStore:
    """Appends batches to a directory in this layout; several threads may call `append`.

    Args:
        root: The directory (created 0700; files are created 0600).
        buffered: Buffer index lines until `flush` (the controller, which flushes a few times a
            second); unbuffered, each entry is written as it comes (the host's copy).
    """

    def __init__(self, root: str, buffered: bool = False) -> None:
        self.root = root
        self.buffered = buffered
        self.lock = threading.Lock()
        self.fds: dict[str, int] = {}
        self.pending: list[str] = []
        for sub in ("", "ranks", "nodes"):
            make_private_dirs(os.path.join(root, sub))
        self.index = self._open(INDEX)

    def _open(self, relative: str) -> int:
        fd = os.open(os.path.join(self.root, relative), os.O_WRONLY | os.O_APPEND | os.O_CREAT, FILE_MODE)
        os.fchmod(fd, FILE_MODE)  # a file made before (by an older distrun, or another umask) too
        return fd

    def append(self, entry: IndexEntry, data: bytes) -> None:
        """Write a batch's bytes to its file, then its entry to the index.

        Raises:
            OSError: a write failed (the disk is full); what was written stays.
        """
        with self.lock:
            path = entry.path
            fd = self.fds.get(path)
            if fd is None:
                fd = self.fds[path] = self._open(path)
            _write_all(fd, data)
            if self.buffered:
                self.pending.append(entry.line())
            else:
                _write_all(self.index, entry.line().encode())

    def flush(self) -> None:
        """Write the buffered index lines.

        Raises:
            OSError: the write failed; the lines stay buffered for the next try.
        """
        with self.lock:
            if self.pending:
                _write_all(self.index, "".join(self.pending).encode())
                self.pending.clear()

    def close(self) -> None:
        """Flush and close every file (a failed flush is given up: the disk is full)."""
        with contextlib.suppress(OSError):
            self.flush()
        with self.lock:
            for fd in [self.index, *self.fds.values()]:
                os.close(fd)
            self.fds.clear()


def _write_all(fd: int, data: bytes) -> None:
    """Write all of `data`, or none of it: a write cut short (a full disk) is taken back, so that
    the offsets the index implies stay true for the batches that follow.

    Raises:
        OSError: the write failed.
    """
    view = memoryview(data)
    try:
        while view:
            view = view[os.write(fd, view):]
    except OSError:
        written = len(data) - len(view)
        if written:
            os.ftruncate(fd, os.fstat(fd).st_size - written)
        raise
