"""Line routing: rank prefixes, the job directory's log files, metrics lines, and following.

A host's lines arrive as torchrun prints them with `[r<rank>]` in front (set through
TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE). Each line goes to combined.log and the terminal as
`[node r<rank>] text`, to nodes/<node>.log and ranks/<rank>.log, as it arrives.
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, TextIO

from orchestrator.store import JobDir

RANK_PREFIX = re.compile(r"^\[r(\d+)\]")
METRICS_MARK = "DISTRUN_METRICS "
TAIL_LINES = 200
FLUSH_EVERY = 0.2
COLOURS = (36, 33, 35, 32, 34, 91, 96, 93, 95, 92, 94)


@dataclass(frozen=True)
class LogLine:
    node: str
    rank: int | None
    text: str

    def label(self) -> str:
        return f"[{self.node} r{self.rank}]" if self.rank is not None else f"[{self.node}]"


def parse_line(node: str, raw: str) -> LogLine:
    """Split torchrun's `[r3]` prefix off a host's line."""
    match = RANK_PREFIX.match(raw)
    if match is None:
        return LogLine(node, None, raw)
    return LogLine(node, int(match.group(1)), raw[match.end():])


def parse_metrics(text: str) -> dict[str, Any] | None:
    """The JSON of a metrics line (`DISTRUN_METRICS {...}`), or None for any other line."""
    at = text.find(METRICS_MARK)
    if at < 0:
        return None
    try:
        data = json.loads(text[at + len(METRICS_MARK):])
    except ValueError:
        return None
    return data if isinstance(data, dict) else None


class LogSink:
    """Writes every line of a job to its files and to the terminal, from many threads.

    Files are appended with buffered writes flushed every FLUSH_EVERY seconds and at close,
    so a job printing hundreds of thousands of lines is not slowed by a write per line.
    """

    def __init__(self, job_dir: JobDir, terminal: TextIO | None = None, colour: bool = False,
                 on_metrics: Callable[[LogLine, dict[str, Any]], None] | None = None) -> None:
        self.dir = job_dir
        self.terminal = terminal
        self.colour = colour
        self.on_metrics = on_metrics
        self.lock = threading.Lock()
        self.files: dict[tuple[str, str | int | None], IO[str]] = {}
        self.node_tail: dict[str, deque[str]] = {}
        self.rank_tail: dict[int, deque[str]] = {}
        self.node_colour: dict[str, int] = {}
        self.closed = threading.Event()
        self.flusher = threading.Thread(target=self._flush_loop, daemon=True)
        self.flusher.start()

    def _file(self, kind: str, name: str | int | None = None) -> IO[str]:
        """The open file for ("combined"|"metrics") or ("node", name) or ("rank", rank).

        Keyed by plain values, not paths: building and hashing paths per line was most of
        the cost of relaying a log flood.
        """
        handle = self.files.get((kind, name))
        if handle is None:
            handle = self.dir.open(self._path(kind, name), "a", encoding="utf-8", buffering=1 << 16)
            self.files[(kind, name)] = handle
        return handle

    def _path(self, kind: str, name: str | int | None) -> Path:
        if kind == "node":
            return self.dir.node_log(str(name))
        if kind == "rank":
            return self.dir.rank_log(int(name or 0))
        return self.dir.metrics if kind == "metrics" else self.dir.combined

    def line(self, node: str, raw: str) -> LogLine:
        """Route one line from a host; returns it parsed."""
        line = parse_line(node, raw)
        label = line.label()
        with self.lock:
            self._file("combined").write(f"{label} {line.text}\n")
            self._file("node", node).write(raw + "\n")
            self.node_tail.setdefault(node, deque(maxlen=TAIL_LINES)).append(raw)
            if line.rank is not None:
                self._file("rank", line.rank).write(line.text + "\n")
                self.rank_tail.setdefault(line.rank, deque(maxlen=TAIL_LINES)).append(line.text)
            if self.terminal is not None:
                self.terminal.write(f"{self._paint(node, label)} {line.text}\n")
        metrics = parse_metrics(line.text)
        if metrics is not None:
            self._metrics(line, metrics)
        return line

    def note(self, node: str, text: str) -> None:
        """A message from distrun itself about a host, shown and kept like a host's line."""
        self.line(node, f"distrun: {text}")

    def summary(self, text: str) -> None:
        """The job's closing summary, appended to combined.log so `logs` and `logs -f` show it."""
        with self.lock:
            self._file("combined").write(text.rstrip("\n") + "\n")
        self.flush()

    def _metrics(self, line: LogLine, data: dict[str, Any]) -> None:
        record = {"t": time.time(), "node": line.node, "rank": line.rank, **data}
        with self.lock:
            self._file("metrics").write(json.dumps(record) + "\n")
        if self.on_metrics is not None:
            self.on_metrics(line, record)

    def _paint(self, node: str, label: str) -> str:
        if not self.colour:
            return label
        code = self.node_colour.setdefault(node, COLOURS[len(self.node_colour) % len(COLOURS)])
        return f"\x1b[{code}m{label}\x1b[0m"

    def _flush_loop(self) -> None:
        while not self.closed.wait(FLUSH_EVERY):
            self.flush()

    def flush(self) -> None:
        with self.lock:
            for handle in self.files.values():
                handle.flush()
            if self.terminal is not None:
                self.terminal.flush()

    def close(self) -> None:
        self.closed.set()
        self.flush()
        with self.lock:
            for handle in self.files.values():
                handle.close()
            self.files.clear()


def select_file(job_dir: JobDir, node: str | None, rank: int | None) -> Path:
    """The file that holds what `distrun logs` was asked for."""
    if rank is not None:
        return job_dir.rank_log(rank)
    if node is not None:
        return job_dir.node_log(node)
    return job_dir.combined


def read_lines(path: Path, pattern: re.Pattern[str] | None, tail: int | None) -> list[str]:
    if not path.exists():
        return []
    with open(path, encoding="utf-8", errors="replace") as fh:
        lines = [ln.rstrip("\n") for ln in fh if pattern is None or pattern.search(ln)]
    return lines[-tail:] if tail else lines


def follow(path: Path, finished: Callable[[], bool], pattern: re.Pattern[str] | None,
           poll: float = 0.2) -> Iterator[str]:
    """Yield lines appended to `path` until `finished()` and nothing more is left to read."""
    while not path.exists():
        if finished():
            return
        time.sleep(poll)
    with open(path, encoding="utf-8", errors="replace") as fh:
        partial = ""
        while True:
            chunk = fh.readline()
            if chunk:
                partial += chunk
                if partial.endswith("\n"):
                    if pattern is None or pattern.search(partial):
                        yield partial.rstrip("\n")
                    partial = ""
                continue
            if finished():
                rest = (partial + fh.read()).rstrip("\n")
                # split("\n"), not splitlines(): a log line may hold \x1e, \x0c and the like.
                for ln in rest.split("\n") if rest else []:
                    if pattern is None or pattern.search(ln):
                        yield ln
                return
            time.sleep(poll)
