"""The controller's side of a job's lines: stored once, kept short for the summary, metrics picked out.

Every batch a host sends (remote/stream.py) is masked (the job's secret values become `***`),
written to the job directory (remote/linestore.py: per-rank files and an index in arrival
order), and only then handed to the screen; the work is per batch, not per line. The index entry
is written with its batch, not buffered: a line the terminal showed is in `distrun logs` even if
the controller is killed the next instant. A failure to
write (a full disk) is counted and said once, never raised into a host's reader thread.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from typing import IO, Any

from orchestrator.logs.screen import Screen
from orchestrator.remote.linestore import NOTE, IndexEntry, LineStore
from orchestrator.remote.redact import Masker
from orchestrator.remote.stream import STDOUT, Batch
from orchestrator.store import JobDir

METRICS_MARK = "DISTRUN_METRICS "
TAIL_LINES = 50
FLUSH_EVERY = 0.2
MetricsCallback = Callable[[str, int | None, dict[str, Any]], None]


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


def job_wide(record: dict[str, Any]) -> bool:
    """Whether a metrics record speaks for the whole job (rank 0's, or one without a rank), not
    only for the rank that printed it (every rank prints its own step time)."""
    return record.get("rank") in (0, None)


def last_lines(data: bytes, count: int) -> list[str]:
    """The last `count` lines of a batch (each ending in a newline), decoded."""
    return [line.decode("utf-8", "replace") for line in data.rsplit(b"\n", count + 1)[-count - 1:-1]]


class LogSink:
    """Writes every line of a job to its directory and its screen, from many threads.

    Args:
        job_dir: The job's directory.
        screen: The terminal side, or None (detached: files only).
        on_metrics: Called with (node, rank, record) for each metrics line.
        secrets: Values masked as `***` before anything is kept or shown.
        attempt: The controller's attempt number, recorded with every line.
    """

    def __init__(self, job_dir: JobDir, screen: Screen | None = None, on_metrics: MetricsCallback | None = None,
                 secrets: Iterable[str] = (), attempt: int = 1) -> None:
        self.dir = job_dir
        self.screen = screen
        self.on_metrics = on_metrics
        self.masker = Masker(secrets)
        self.attempt = attempt
        self.lock = threading.Lock()
        self.store = LineStore(str(job_dir.root))
        self.tails: dict[tuple[str, int | None], deque[str]] = {}
        self.own_tails: dict[str, deque[str]] = {}  # each host's lines less distrun's notes: its ranks' and torchrun's
        self.metrics_file: IO[str] | None = None
        self.unstored = 0
        self.store_error: str | None = None
        self.closed = threading.Event()
        self.flusher = threading.Thread(target=self._flush_loop, name="distrun-log-flush", daemon=True)
        self.flusher.start()

    def batch(self, node: str, batch: Batch) -> None:
        """A batch of lines from a host (its ranks' or its own)."""
        data = self.masker.bytes(batch.data) if self.masker else batch.data
        self._keep(IndexEntry(time.time(), self.attempt, node, batch.rank, batch.stream, batch.nlines, len(data),
                              batch.partial), data)
        if self.screen is not None:
            self.screen.batch(node, batch.rank, batch.stream, data, batch.nlines, batch.partial)
        if batch.rank is not None and METRICS_MARK.encode() in data:
            self._metrics(node, batch.rank, data)

    def line(self, node: str, text: str, stream: str = STDOUT) -> None:
        """One line of a host that reached the controller some other way (Slurm's batch output)."""
        self.batch(node, Batch(None, stream, 1, text.encode("utf-8", "surrogateescape") + b"\n"))

    def note(self, node: str, text: str) -> None:
        """A line of distrun's own about a host, shown and kept with the host's lines."""
        text = self.masker.text(text) if self.masker else text
        data = f"distrun: {text}\n".encode("utf-8", "replace")
        self._keep(IndexEntry(time.time(), self.attempt, node, None, NOTE, 1, len(data)), data)
        if self.screen is not None:
            self.screen.note(node, text)

    def notes(self, nodes: list[str], text: str) -> None:
        """`note` about each of `nodes`, kept with each host's lines and shown in one line."""
        text = self.masker.text(text) if self.masker else text
        data = f"distrun: {text}\n".encode("utf-8", "replace")
        for node in nodes:
            self._keep(IndexEntry(time.time(), self.attempt, node, None, NOTE, 1, len(data)), data)
        if self.screen is not None:
            self.screen.notes(nodes, text)

    def stopping(self, node: str) -> None:
        """distrun began stopping `node` (its shutdown noise is folded on screen)."""
        if self.screen is not None:
            self.screen.stopping(node)

    def failed_rank(self, node: str, rank: int | None) -> None:
        """The root cause is `rank` on `node` (its traceback shows on screen, once)."""
        if self.screen is not None:
            self.screen.failed_rank(node, rank)

    def ended(self, node: str) -> None:
        """`node` reported its exit."""
        if self.screen is not None:
            self.screen.ended(node)

    def last_lines(self, node: str, rank: int | None, count: int) -> tuple[str, ...]:
        """The last `count` lines of a rank (stdout and stderr in arrival order), or of a host."""
        with self.lock:
            return tuple(list(self.tails.get((node, rank), ()))[-count:])

    def showed(self, node: str, rank: int | None, lines: tuple[str, ...]) -> bool:
        """Whether a rank's `lines` were the last the screen showed of it (False when there is no screen)."""
        return self.screen is not None and self.screen.showed(node, rank, lines)

    def own_lines(self, node: str, count: int) -> tuple[str, ...]:
        """The last `count` lines that came from a host itself (its ranks' and torchrun's), not distrun's notes."""
        with self.lock:
            return tuple(list(self.own_tails.get(node, ()))[-count:])

    def shortfalls(self) -> list[str]:
        """Lines for the summary: what the terminal or the files did not get, if anything."""
        lines = []
        missed = self.screen.missed if self.screen is not None else 0
        if missed:
            lines.append(f"  {missed} line(s) were not shown on the terminal (it did not keep up); the job's files "
                         f"have every line: distrun logs {self.dir.root.name}")
        if self.unstored:
            lines.append(f"  {self.unstored} line(s) could not be written to {self.dir.root} ({self.store_error})")
        return lines

    def flush(self) -> None:
        with self.lock:
            self._flush()

    def close_screen(self, timeout: float | None = 10.0) -> None:
        """Show what the screen still holds and stop it (before the summary is printed)."""
        if self.screen is not None:
            self.screen.close(timeout)

    def close(self) -> None:
        self.closed.set()
        self.close_screen()
        with self.lock:
            self._flush()
            self.store.close()
            if self.metrics_file is not None:
                with contextlib.suppress(OSError):
                    self.metrics_file.close()

    def _keep(self, entry: IndexEntry, data: bytes) -> None:
        with self.lock:
            try:
                self.store.append(entry, data)
            except OSError as exc:
                self._unstored(entry.nlines, exc)
            lines = last_lines(data, TAIL_LINES)  # decoded once for the three tails (a cost per batch)
            for key in {(entry.node, entry.rank), (entry.node, None)}:
                tail = self.tails.get(key)
                if tail is None:
                    tail = self.tails[key] = deque(maxlen=TAIL_LINES)
                tail.extend(lines)
            if entry.stream != NOTE:
                self.own_tails.setdefault(entry.node, deque(maxlen=TAIL_LINES)).extend(lines)

    def _unstored(self, nlines: int, exc: OSError) -> None:
        self.unstored += nlines
        if self.store_error is None:
            self.store_error = exc.strerror or str(exc)
            if self.screen is not None:
                self.screen.note("distrun", f"cannot write the job's files in {self.dir.root} ({self.store_error}); "
                                 "lines are still shown here")

    def _metrics(self, node: str, rank: int, data: bytes) -> None:
        for raw in data.split(b"\n"):
            record = parse_metrics(raw.decode("utf-8", "replace")) if METRICS_MARK.encode() in raw else None
            if record is None:
                continue
            record = {"t": time.time(), **record, "node": node, "rank": rank}  # where it came from, never its text
            with self.lock:
                try:
                    if self.metrics_file is None:
                        self.metrics_file = self.dir.open(self.dir.metrics, "a", encoding="utf-8")  # closed in close()
                    self.metrics_file.write(json.dumps(record) + "\n")
                except OSError as exc:
                    self._unstored(0, exc)
            if self.on_metrics is not None:
                self.on_metrics(node, rank, record)

    def _flush(self) -> None:
        try:
            self.store.flush()
            if self.metrics_file is not None:
                self.metrics_file.flush()
        except OSError as exc:
            self._unstored(0, exc)

    def _flush_loop(self) -> None:
        while not self.closed.wait(FLUSH_EVERY):
            self.flush()


def append_note(job_dir: JobDir, node: str, text: str, attempt: int = 1) -> None:
    """One line of distrun's own in a job's lines when no LogSink is open (a scheduler's queue).

    Raises:
        OSError: the job directory could not be written.
    """
    data = f"distrun: {text}\n".encode("utf-8", "replace")
    store = LineStore(str(job_dir.root))
    try:
        store.append(IndexEntry(time.time(), attempt, node, None, NOTE, 1, len(data)), data)
    finally:
        store.close()
