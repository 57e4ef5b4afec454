"""The operator's terminal: lines through a queue of their own, noise folded, identical lines collapsed.

Nothing that decides a job's fate waits on the terminal. Lines are formatted where they arrive
(per batch: one decode, one escape check, one replace) and handed to `TerminalWriter` (writer.py),
a queue written by a thread of its own. When stdout does not keep up, a pipe or a file catches
up later from a spill file in the job's directory (late, but every line, in order); an
interactive terminal skips ahead, says where, and the job's summary counts what it missed.

Noise (files keep everything):
- a failure's aftermath (fold.py): the other ranks' tracebacks, torchrun's ChildFailedError
  blocks and exit-barrier errors, and what distrun's stop makes a host say on stderr
  (SignalException, "Sending process ... closing signal") are folded into one counted line per
  host, `[node0] 52 lines of shutdown output (distrun logs ID --node node0)`; the first failed
  rank's traceback stays, whole (or the root cause's, shown when it is known);
- known-harmless warnings that repeat (fold.py's `HARMLESS`) are shown once, then counted, and those
  every launch prints (`SILENT`) not at all;
- a rank's `DISTRUN_METRICS` and `DISTRUN_CHECKSUM` lines are data for the live view, the summary
  and the files, not for reading: kept off the screen unless asked (`launch --metrics-lines`).

`Collapser` folds identical lines printed by several ranks within a moment into one
`[node0-2 r0-5] text` line (`launch --collapse`, `logs --collapse`).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from orchestrator.logs.fold import HarmlessFold, ShutdownFold
from orchestrator.logs.format import COLOURS, group_label, label, paint, prefixed, shown
from orchestrator.logs.writer import QUEUE_BYTES, TerminalWriter

SPILL = "screen.spill"  # in the job directory: what a pipe that fell behind has still to get
COLLAPSE_WINDOW = 0.5  # seconds within which identical lines from several ranks are folded
DATA_LINES = ("DISTRUN_METRICS ", "DISTRUN_CHECKSUM ")  # a rank's lines for distrun, not for a person
SHOWN_BATCHES = 64  # per rank: the last batches shown, enough for a summary's last lines (a batch is a line or more)


@dataclass
class FoldedLines:
    """Identical lines from one or more ranks, as `Collapser` folds them."""

    first: float
    stream: str
    text: str
    members: list[tuple[str, int | None]] = field(default_factory=list)

    def render(self) -> str:
        if len(self.members) == 1:
            node, rank = self.members[0]
            return f"{label(node, rank, self.stream)} {self.text}"
        nodes = [n for n, _ in self.members]
        return f"{group_label(nodes, [r for _, r in self.members], self.stream)} {self.text}"


class Collapser:
    """Folds identical lines that several ranks print within `window` seconds of each other.

    Lines come out in the order their first copy came in, each once its window has passed.
    """

    def __init__(self, window: float = COLLAPSE_WINDOW) -> None:
        self.window = window
        self.open: dict[tuple[str, str], FoldedLines] = {}

    def add(self, t: float, node: str, rank: int | None, stream: str, text: str) -> list[FoldedLines]:
        """Take one line arriving at `t`; returns the groups it made due."""
        ready = self.due(t)
        key = (stream, text)
        group = self.open.get(key)
        if group is not None and (node, rank) in group.members:
            ready += self._until(key)  # the same rank again: a new line, not a copy
            group = None
        if group is None:
            group = self.open[key] = FoldedLines(t, stream, text)
        group.members.append((node, rank))
        return ready

    def due(self, now: float) -> list[FoldedLines]:
        """The groups whose window has passed by `now`, oldest first."""
        ready = []
        while self.open:
            key, group = next(iter(self.open.items()))
            if now - group.first < self.window:
                break
            ready.append(self.open.pop(key))
        return ready

    def drain(self) -> list[FoldedLines]:
        ready = list(self.open.values())
        self.open.clear()
        return ready

    def _until(self, key: tuple[str, str]) -> list[FoldedLines]:
        """Close the groups up to and including `key`'s, keeping their order."""
        ready = []
        for other in list(self.open):
            ready.append(self.open.pop(other))
            if other == key:
                break
        return ready


class Screen:
    """Formats a job's lines for the terminal and hands them to a TerminalWriter.

    Args:
        terminal: Where lines go.
        colour: One colour per host in the labels.
        collapse: Fold identical lines of several ranks (`launch --collapse`).
        data_lines: Show the ranks' DISTRUN_METRICS and DISTRUN_CHECKSUM lines (`launch --metrics-lines`).
        job_id: The job, named in the hints of folded lines.
        clock: Seconds (time.time) for the collapse window.
        limit: Characters held in memory for a terminal that fell behind.
        job_dir: Where a pipe or file that fell behind catches up from (None: skip ahead as a terminal).
    """

    def __init__(self, terminal: TextIO, colour: bool = False, collapse: bool = False, job_id: str = "",
                 clock: Callable[[], float] | None = None, limit: int = QUEUE_BYTES,
                 job_dir: Path | None = None, data_lines: bool = False) -> None:
        self.colour = colour
        self.data_lines = data_lines
        self.job_id = job_id
        self.clock = clock or time.time
        self.colours: dict[str, int] = {}
        self.lock = threading.Lock()
        self.collapser = Collapser() if collapse else None
        self.fold = ShutdownFold()
        self.harmless = HarmlessFold()
        self.shown_tails: dict[tuple[str, int], deque[str]] = {}  # each rank's last batches as shown
        # A pipe or a file gets every line, late when it fell behind; a terminal skips ahead.
        interactive = getattr(terminal, "isatty", lambda: False)()
        spill = None if interactive or job_dir is None else job_dir / SPILL
        self.writer = TerminalWriter(terminal, limit, tick=self._tick if collapse else None, spill=spill,
                                     marker=self._skipped)

    @property
    def missed(self) -> int:
        """Lines the terminal had no room for."""
        return self.writer.missed

    def batch(self, node: str, rank: int | None, stream: str, data: bytes, nlines: int, partial: bool = False) -> None:
        """Show a batch of a host's `nlines` lines (each ending in a newline)."""
        text = shown(data)
        if not self.data_lines and rank is not None and "DISTRUN_" in text:
            text = "".join(line for line in text.splitlines(keepends=True) if not line.startswith(DATA_LINES))
            if not text:
                return
            nlines = text.count("\n")
        with self.lock:
            if stream == "e" or rank is None:
                text = self.fold.take(node, rank, stream, text)
                if not text:
                    return
            kept = self.harmless.take(node, text)
            if kept is not text:
                if not kept:
                    return
                text, nlines = kept, kept.count("\n")
            self._remember(node, rank, text)
            if self.collapser is not None and not partial:
                self._collapse(self.collapser, node, rank, stream, text)
                return
            self.writer.offer(prefixed(text, self._label(node, rank, stream, partial) + " "), nlines)

    def note(self, node: str, text: str) -> None:
        """A line of distrun's own about a host."""
        line = shown(f"distrun: {text}".encode())
        with self.lock:
            if self.fold.note(node):
                return
            self.writer.offer(f"{self._label(node, None, 'o', False)} {line}\n", 1)

    def notes(self, nodes: list[str], text: str) -> None:
        """The same note of distrun's about several hosts, in one line: `[node0,2] distrun: ...`."""
        line = shown(f"distrun: {text}".encode())
        with self.lock:
            shown_nodes = [node for node in nodes if not self.fold.note(node)]
            if shown_nodes:
                self.writer.offer(f"{group_label(shown_nodes, [], 'o')} {line}\n", 1)

    def stopping(self, node: str) -> None:
        """distrun began stopping `node`: fold what the stop makes it print on stderr."""
        with self.lock:
            self.fold.stopping(node)

    def failed_rank(self, node: str, rank: int | None) -> None:
        """The root cause is `rank` on `node`: its traceback shows (once) if it was folded."""
        with self.lock:
            text = self.fold.release(node, rank)
            if text:
                self._remember(node, rank, text)
                self.writer.offer(prefixed(text, self._label(node, rank, "e", False) + " "), text.count("\n"))

    def showed(self, node: str, rank: int | None, lines: Sequence[str]) -> bool:
        """Whether `lines` (a rank's last lines as the files keep them) are the last this screen showed of
        that rank, every one but its data lines, and the terminal missed none: a summary need not repeat them."""
        wanted = "".join(shown(f"{line}\n".encode()) for line in lines if not line.startswith(DATA_LINES))
        with self.lock:
            if rank is None or not wanted or self.writer.missed:
                return False
            return "".join(self.shown_tails.get((node, rank), ())).endswith(wanted)

    def ended(self, node: str) -> None:
        """`node` reported its exit: one line for what was folded of its output, if anything."""
        with self.lock:
            count = self.fold.said(node)
            if count:
                self.writer.offer(f"{self._label(node, None, 'o', False)} {count} line{'s' if count > 1 else ''} "
                                  f"of shutdown output (distrun logs {self.job_id} --node {node})\n", 1)

    def close(self, timeout: float | None = 10.0) -> None:
        """Let held lines go, say what was folded, and write what is queued (at most `timeout` s)."""
        for node in self.fold.pending():
            self.ended(node)  # a host that never reported its exit (lost while stopping), or folded after it
        with self.lock:
            if self.collapser is not None:
                self._show_groups(self.collapser.drain())
            for line in self.harmless.said():
                self.writer.offer(line, 1)
        self.writer.close(timeout)

    def _remember(self, node: str, rank: int | None, text: str) -> None:
        if rank is not None:
            tail = self.shown_tails.get((node, rank))
            if tail is None:
                tail = self.shown_tails[(node, rank)] = deque(maxlen=SHOWN_BATCHES)
            tail.append(text)

    def _skipped(self, count: int) -> str:
        return (f"[distrun] {count} line{'s' if count > 1 else ''} skipped here: the terminal fell behind "
                f"(distrun logs {self.job_id} has every line)\n")

    def _label(self, node: str, rank: int | None, stream: str, partial: bool) -> str:
        text = label(node, rank, stream, partial)
        if not self.colour:
            return text
        code = self.colours.setdefault(node, COLOURS[len(self.colours) % len(COLOURS)])
        return paint(text, code)

    def _collapse(self, collapser: Collapser, node: str, rank: int | None, stream: str, text: str) -> None:
        now = self.clock()
        ready = []
        for line in text[:-1].split("\n"):
            ready += collapser.add(now, node, rank, stream, line)
        self._show_groups(ready)

    def _tick(self) -> None:
        with self.lock:
            if self.collapser is not None:
                self._show_groups(self.collapser.due(self.clock()))

    def _show_groups(self, groups: list[FoldedLines]) -> None:
        if groups:
            self.writer.offer("".join(g.render() + "\n" for g in groups), len(groups))
