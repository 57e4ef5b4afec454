"""What a failure makes every other process print, kept off the screen (the job's files keep it).

One rank raising takes the job down: its peers raise in their next collective, each torchrun
prints a ChildFailedError block with a "Root Cause" of its own, and the processes distrun stops
print SignalException tracebacks. On screen that is hundreds of lines and several contradicting
root causes, before distrun's own. `ShutdownFold` decides, line by line, what stays on screen:

- stdout always shows;
- the first rank whose stderr shows a traceback is the one on screen: all of its lines show,
  so its traceback is there once and whole;
- any other rank's stderr, from its own traceback on, is folded (and its latest lines held, so
  that when the root cause turns out to be that rank, `release` shows them after all);
- a host's torchrun (no rank), from its first traceback, ChildFailedError or exit-barrier error
  on, is folded; so is everything torchrun and the ranks print on stderr once distrun is
  stopping the host (`stopping`).

Folded lines are counted per host, for one line each: `[node0] 52 lines of shutdown output
(distrun logs ID --node node0)`.
"""

from __future__ import annotations

import re
from collections import deque

TRACEBACK = re.compile(r"^(?:\[rank\d+\]:\s*)?Traceback \(most recent call last\):", re.M)
# What torchrun prints once a worker failed or while it is stopped: the start of a block to fold.
TORCHRUN_FAILING = ("ChildFailedError", "Error waiting on exit barrier", "SignalException",
                    "failed (exitcode:", "Sending process")
HELD_LINES = 200  # per folded rank: enough for a whole traceback should it be the root cause's


class ShutdownFold:
    """Which stderr lines a failure's aftermath keeps off the screen, counted per host."""

    def __init__(self, held_lines: int = HELD_LINES) -> None:
        self.held_lines = held_lines
        self.shown: tuple[str, int] | None = None  # the rank whose traceback is on screen
        self.folding: set[tuple[str, int | None]] = set()  # (host, rank or None for torchrun) folded from now on
        self.stopping_hosts: set[str] = set()
        self.counts: dict[str, int] = {}  # host -> lines folded not yet said
        self.held: dict[tuple[str, int], deque[str]] = {}

    def take(self, node: str, rank: int | None, stream: str, text: str) -> str:
        """The part of `text` (whole lines) to show; the rest is folded."""
        if (stream != "e" and rank is not None) or not self._folds(node, rank, text):
            return text
        lines = text.count("\n")
        self.counts[node] = self.counts.get(node, 0) + lines
        if rank is not None:
            held = self.held.setdefault((node, rank), deque(maxlen=self.held_lines))
            held.extend(line + "\n" for line in text[:-1].split("\n"))
        return ""

    def stopping(self, node: str) -> None:
        """distrun began stopping `node`: fold all of its stderr from now on."""
        self.stopping_hosts.add(node)

    def release(self, node: str, rank: int | None) -> str:
        """The held lines of the root cause's rank, when they were folded (its traceback, whole)."""
        if rank is None or self.shown == (node, rank):
            return ""
        held = self.held.pop((node, rank), None)
        if not held:
            return ""
        self.counts[node] = max(self.counts.get(node, 0) - len(held), 0)
        return "".join(held)

    def said(self, node: str) -> int:
        """The lines folded for `node` since last said (then counted from zero)."""
        return self.counts.pop(node, 0)

    def pending(self) -> list[str]:
        """Hosts with folded lines not yet said."""
        return [node for node, count in self.counts.items() if count]

    def _folds(self, node: str, rank: int | None, text: str) -> bool:
        if node in self.stopping_hosts or (node, rank) in self.folding:
            return True
        if rank is None:
            if TRACEBACK.search(text) or any(marker in text for marker in TORCHRUN_FAILING):
                self.folding.add((node, None))
                return True
            return False
        if self.shown == (node, rank) or not TRACEBACK.search(text):
            return False
        if self.shown is None:
            self.shown = (node, rank)
            return False
        self.folding.add((node, rank))
        return True
