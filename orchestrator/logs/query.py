"""Reading a job's lines back: filters that intersect, one format, in arrival order, and following.

A job directory (or a host's copy) keeps each rank's and host's lines in files of their own and
an index of batches in arrival order (remote/linestore.py). `JobLog` reads the index (all of it,
or what was added since) and each batch's bytes; `Query` says which batches and lines are
wanted; `Renderer` turns them into text in the one line format (logs/format.py).
"""

from __future__ import annotations

import os
import re
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from orchestrator.errors import UsageError
from orchestrator.logs.fold import HarmlessFold
from orchestrator.logs.format import label, prefixed, shown, stamp
from orchestrator.logs.screen import Collapser, FoldedLines
from orchestrator.remote.follow import Follower
from orchestrator.remote.linestore import INDEX, IndexEntry, Located, Locator, parse_entries


def parse_ranks(values: Iterable[str]) -> frozenset[int] | None:
    """`--rank 3 --rank 0,2` -> {0, 2, 3}; None when no --rank was given.

    Raises:
        UsageError: a value is not a rank number.
    """
    ranks: set[int] = set()
    for value in values:
        for part in value.split(","):
            if not part.strip().isdigit():
                raise UsageError(f"--rank {value}: {part.strip() or 'nothing'!r} is not a rank number "
                                 "(give --rank 3 or --rank 0,2)")
            ranks.add(int(part))
    return frozenset(ranks) if ranks else None


@dataclass(frozen=True)
class Query:
    """Which lines `distrun logs` shows; every filter given must hold (they intersect).

    Attributes:
        nodes: Only these hosts' lines.
        ranks: Only these global ranks' lines (a host's own lines have no rank: left out).
        stderr: Only stderr lines.
        attempt: Only this attempt's lines.
        since: Only lines that arrived at or after this time.
        grep: Only lines whose text matches.
        tail: Only the last N lines, after every other filter.
    """

    nodes: frozenset[str] | None = None
    ranks: frozenset[int] | None = None
    stderr: bool = False
    attempt: int | None = None
    since: float | None = None
    grep: re.Pattern[str] | None = None
    tail: int | None = None

    @property
    def narrowed(self) -> bool:
        """Whether a filter leaves lines out (then the job's summary is not shown after them)."""
        return any(v is not None for v in (self.nodes, self.ranks, self.attempt, self.since, self.grep)) or self.stderr

    def takes(self, entry: IndexEntry) -> bool:
        """Whether a batch's lines may be wanted (grep and tail apply to its lines)."""
        return ((self.nodes is None or entry.node in self.nodes)
                and (self.ranks is None or entry.rank in self.ranks)
                and (not self.stderr or entry.stream == "e")
                and (self.attempt is None or entry.attempt == self.attempt)
                and (self.since is None or entry.time >= self.since))


@dataclass(frozen=True)
class Style:
    """How lines are shown: `[node1 r3] text`, with the arrival time first, or the text alone."""

    timestamps: bool = False
    bare: bool = False

    def prefix(self, entry: IndexEntry) -> str:
        parts = [stamp(entry.time)] if self.timestamps else []
        if not self.bare:
            parts.append(label(entry.node, entry.rank, entry.stream, entry.partial))
        return " ".join(parts) + " " if parts else ""


class JobLog:
    """A job directory's lines: its index read as it grows, and each batch's bytes."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.index = Follower(root / INDEX)
        self.locator = Locator()
        self.files: dict[str, int] = {}

    def new_entries(self) -> list[Located]:
        """The entries added to the index since the last call (whole lines only)."""
        return self.locator.place_all(parse_entries(self.index.lines().decode("utf-8", "replace")))

    def read(self, located: Located) -> bytes:
        """A batch's bytes (fewer when its file was cut short)."""
        path = located.entry.path
        fd = self.files.get(path)
        if fd is None:
            try:
                fd = self.files[path] = os.open(self.root / path, os.O_RDONLY)
            except OSError:
                return b""
        return os.pread(fd, located.entry.nbytes, located.offset)

    def attempts(self, entries: Iterable[Located]) -> list[int]:
        return sorted({located.entry.attempt for located in entries})

    def close(self) -> None:
        self.index.close()
        for fd in self.files.values():
            os.close(fd)
        self.files.clear()


class Renderer:
    """Turns batches into shown text: filtered, escaped, prefixed, collapsed if asked.

    Args:
        query: Which lines.
        style: How they look.
        collapse: Fold identical lines of several ranks that arrived within a moment.
        harmless: Keep known-harmless warnings that repeat to their first, as the launch's screen
            does (`logs -f`); `folded` then says how many more there were.
    """

    def __init__(self, query: Query, style: Style, collapse: bool = False, harmless: bool = False) -> None:
        self.query = query
        self.style = style
        self.collapser = Collapser() if collapse else None
        self.harmless = HarmlessFold() if harmless else None
        self.attempt: int | None = None

    def render(self, log: JobLog, entries: Iterable[Located]) -> Iterator[str]:
        """Text for each wanted batch (whole lines, each ending in a newline), in index order."""
        for located in entries:
            entry = located.entry
            if not self.query.takes(entry):
                continue
            data = log.read(located)
            if not data.endswith(b"\n"):
                data = data[:data.rfind(b"\n") + 1]  # a file cut short: its whole lines only
            if not data:
                continue
            text = shown(data)
            if self.query.grep is not None:
                text = "".join(line for line in split_lines(text) if self.query.grep.search(line[:-1]))
                if not text:
                    continue
            if self.harmless is not None:
                text = self.harmless.take(entry.node, text)
                if not text:
                    continue
            yield from self._attempt_mark(entry)
            if self.collapser is not None and not entry.partial:
                yield from self._collapse(self.collapser, entry, text)
                continue
            yield prefixed(text, self.style.prefix(entry))

    def finish(self) -> Iterator[str]:
        """What collapse still holds."""
        if self.collapser is not None:
            yield from self._groups(self.collapser.drain())

    def folded(self) -> list[str]:
        """A line for each known-harmless warning whose repeats were kept off (with `harmless`)."""
        return [] if self.harmless is None else self.harmless.said()

    def due(self, now: float) -> Iterator[str]:
        """Collapsed lines whose window passed (while following)."""
        if self.collapser is not None:
            yield from self._groups(self.collapser.due(now))

    def _attempt_mark(self, entry: IndexEntry) -> Iterator[str]:
        """A line where the attempt changes (what collapse holds of the last attempt goes first)."""
        if self.attempt is not None and entry.attempt != self.attempt:
            yield from self.finish()
            if not self.style.bare:
                yield f"--- attempt {entry.attempt} ---\n"
        self.attempt = entry.attempt

    def _collapse(self, collapser: Collapser, entry: IndexEntry, text: str) -> Iterator[str]:
        for line in text[:-1].split("\n"):
            yield from self._groups(collapser.add(entry.time, entry.node, entry.rank, entry.stream, line))

    def _groups(self, groups: list[FoldedLines]) -> Iterator[str]:
        for group in groups:
            when = stamp(group.first) + " " if self.style.timestamps else ""
            yield when + (group.text if self.style.bare else group.render()) + "\n"


def read_lines(root: Path, query: Query, style: Style, collapse: bool = False) -> Iterator[str]:
    """Every wanted line of a job directory as shown text, in arrival order; `query.tail` keeps the
    last N lines after the other filters."""
    log = JobLog(root)
    try:
        renderer = Renderer(query, style, collapse)
        chunks = _chain(renderer.render(log, log.new_entries()), renderer.finish())
        if query.tail is None:
            yield from chunks
            return
        kept: deque[str] = deque(maxlen=query.tail)
        for chunk in chunks:
            kept.extend(split_lines(chunk))
        yield "".join(kept)
    finally:
        log.close()


def split_lines(text: str) -> list[str]:
    """Lines of text that ends in a newline, each with its newline; split on newlines only (a
    line may hold U+2028 and the like, which str.splitlines would split on)."""
    return [line + "\n" for line in text[:-1].split("\n")] if text else []


def _chain(*parts: Iterable[str]) -> Iterator[str]:
    for part in parts:
        yield from part
