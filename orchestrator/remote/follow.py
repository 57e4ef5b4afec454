"""Follows one file as it is appended to: what it gained since the last read, as bytes or as whole lines.

Every reader of a growing file uses `Follower`: the controller (`top`'s telemetry, `logs -f`'s index,
the lighthouse's quorums, Slurm's stream files) and the hosts (the rank files remote/tail.py reads).
A file that does not exist yet is read once it appears; one cut shorter than what was read (truncated)
is read again from its start, and so is one replaced by another file under its path, once the old
one is read to its end. A line still without its newline is held back (`pending`) until it comes.
The caller polls: `read` never waits; `appended` is the loop that waits. Stdlib-only (runs on the hosts).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator

CHUNK = 1 << 20


class Follower:
    """One file, followed from its start or from a line near its end.

    Args:
        path: The file (it need not exist yet).
        last: Start at the first line that begins in the file's last `last` bytes, as the file is
            when it is first opened; None: at its start.
    """

    def __init__(self, path: str | os.PathLike[str], last: int | None = None) -> None:
        self.path = os.fspath(path)
        self.last = last
        self.fd: int | None = None
        self.offset = 0
        self.skip = False  # the bytes up to the next newline are the end of a line begun before the start
        self.pending = b""  # a partial last line, held back until its newline
        self._open()
        self.last = None  # a file that appears later is read from its start

    def read(self, limit: int | None = None) -> bytes:
        """The bytes appended since the last read: at most `limit`, else all there are (b"" while
        the file does not exist)."""
        if self.fd is None and not self._open():
            return b""
        assert self.fd is not None
        parts = []
        while True:
            try:
                chunk = os.pread(self.fd, limit or CHUNK, self.offset)
            except OSError:
                break
            if not chunk:
                if not parts and self._changed():
                    continue
                break
            self.offset += len(chunk)
            parts.append(self._skipped(chunk))
            if limit is not None:
                break
        return b"".join(parts)

    def lines(self, limit: int | None = None) -> bytes:
        """The whole lines appended since the last read (each ending in a newline), a partial last
        line held back in `pending`."""
        return self.cut(self.read(limit))

    def cut(self, data: bytes) -> bytes:
        """`pending` and `data` up to their last newline; what follows it becomes `pending`."""
        data = self.pending + data if self.pending else data
        end = data.rfind(b"\n") + 1
        self.pending = data[end:]
        return data[:end]

    def take_pending(self) -> bytes:
        """The partial last line held back (the caller will not wait for its newline), and no more."""
        pending, self.pending = self.pending, b""
        return pending

    def mtime(self) -> int:
        """The file's modification time in ns (0 while it is not open)."""
        try:
            return os.fstat(self.fd).st_mtime_ns if self.fd is not None else 0
        except OSError:
            return 0

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None

    def __enter__(self) -> Follower:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def _open(self) -> bool:
        try:
            self.fd = os.open(self.path, os.O_RDONLY)
        except OSError:
            return False
        if self.last is not None:
            size = os.fstat(self.fd).st_size
            if size > self.last:
                self.offset, self.skip = size - self.last - 1, True
        return True

    def _skipped(self, chunk: bytes) -> bytes:
        if not self.skip:
            return chunk
        newline = chunk.find(b"\n")
        if newline < 0:
            return b""
        self.skip = False
        return chunk[newline + 1:]

    def _changed(self) -> bool:
        """At the end of what is open: whether the file was cut short or replaced, and so is now
        read from its start."""
        assert self.fd is not None
        try:
            now = os.fstat(self.fd)
            there = os.stat(self.path)
        except OSError:
            return False
        replaced = (there.st_dev, there.st_ino) != (now.st_dev, now.st_ino)
        if not replaced and now.st_size >= self.offset:
            return False
        self.offset, self.skip, self.pending = 0, False, b""
        if replaced:
            self.close()
            return self._open()
        return True


def appended(follower: Follower, finished: Callable[[], bool], poll: float, limit: int = CHUNK) -> Iterator[bytes]:
    """The bytes appended to a followed file as they come, `poll` seconds between two looks, until
    `finished()` and nothing more is there."""
    while True:
        chunk = follower.read(limit)
        if chunk:
            yield chunk
        elif finished():
            rest = follower.read()
            if rest:
                yield rest
            return
        else:
            time.sleep(poll)
