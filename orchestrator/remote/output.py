"""Whole lines to a program's stdout (or a stream file) from several threads, never spliced.

Shipped with every remote program that writes from more than one thread (probe, supervisor).
Events are lines that start with the byte 0x1e followed by JSON with "ev": the event's kind.
"""

from __future__ import annotations

import json
import threading
from typing import Any, BinaryIO

EVENT = b"\x1e"


class Output:
    """A stream that several threads write whole lines to; a closed stream is let go quietly
    (the controller went away: nothing is left to tell)."""

    def __init__(self, stream: BinaryIO) -> None:
        self.stream = stream
        self.lock = threading.Lock()

    def raw(self, data: bytes) -> None:
        """Bytes as they are (whole lines, each ending in a newline)."""
        with self.lock:
            try:
                self.stream.write(data)
                self.stream.flush()
            except (BrokenPipeError, OSError, ValueError):
                pass

    def line(self, data: bytes) -> None:
        """One line (the newline is added)."""
        self.raw(data + b"\n")

    def event(self, kind: str, fields: dict[str, Any] | None = None, /, **more: Any) -> None:
        """An event line: `event("exit", rc=1)` or `event("listening", {"port": 29500})`."""
        self.raw(EVENT + json.dumps({"ev": kind, **(fields or {}), **more}).encode() + b"\n")
