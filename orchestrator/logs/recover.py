"""`distrun logs --recover`: a finished job's files rebuilt from the copies its hosts kept.

Each host's copy has the layout of the job directory (remote/linestore.py), with the host's own
arrival times. The rebuilt index merges every host's batches with distrun's own notes from the
controller's index by time, so lines keep their order across hosts and the notes (and hosts
with no copy) are not lost. The job's summary (summary.txt) is left as it is. The new files are
written aside and then moved in place, each file replaced whole.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from orchestrator.logs.query import JobLog
from orchestrator.logs.sink import METRICS_MARK, parse_metrics
from orchestrator.remote.linestore import INDEX, NOTE, IndexEntry, LineStore, Locator, parse_entries
from orchestrator.store import JobDir

STAGING = ".recovering"
LAYOUT_DIRS = ("ranks", "nodes")


@dataclass(frozen=True)
class FetchedCopy:
    """One host's copy as fetched: its files by path (`lines.idx`, `ranks/3.out`, ...) and the
    telemetry samples it kept (JSON lines)."""

    files: Mapping[str, bytes]
    telemetry: str = ""


@dataclass(frozen=True)
class Piece:
    """A batch to write into the rebuilt directory, with its place in the merged order."""

    entry: IndexEntry
    data: bytes
    order: int


def rebuild(job_dir: JobDir, copies: Mapping[str, FetchedCopy]) -> dict[str, int]:
    """Replace a job's lines, metrics and telemetry with what its hosts kept.

    Args:
        job_dir: The job's directory.
        copies: Each host's copy; a host whose copy has no index keeps the lines the controller had.

    Returns:
        {node: lines recovered from its copy}.

    Raises:
        OSError: the job directory could not be written (it is left as it was).
    """
    staging = job_dir.root / STAGING
    shutil.rmtree(staging, ignore_errors=True)
    with_copy = {node for node, copy in copies.items() if INDEX in copy.files}
    pieces = list(controller_pieces(job_dir.root, replaced=with_copy))
    for node in sorted(with_copy):
        pieces += host_pieces(copies[node], len(pieces))
    pieces.sort(key=lambda p: (p.entry.time, p.order))
    try:
        write_staging(staging, pieces, copies)
    except OSError:
        shutil.rmtree(staging, ignore_errors=True)  # a full disk: the job's files stay as they were
        raise
    swap_in(staging, job_dir.root)
    return {node: sum(p.entry.nlines for p in pieces if p.entry.node == node and p.entry.stream != NOTE)
            for node in sorted(with_copy)}


def write_staging(staging: Path, pieces: list[Piece], copies: Mapping[str, FetchedCopy]) -> None:
    """The rebuilt lines, metrics and telemetry, written aside in `staging`.

    Raises:
        OSError: a write failed.
    """
    store = LineStore(str(staging), buffered=True)
    try:
        for piece in pieces:
            store.append(piece.entry, piece.data)
        store.flush()
    finally:
        store.close()
    write_metrics(staging / "metrics.jsonl", pieces)
    write_telemetry(staging / "telemetry.jsonl", copies)


def controller_pieces(root: Path, replaced: set[str]) -> Iterator[Piece]:
    """What the controller keeps of its own: distrun's notes, and the lines of every node whose
    lines are not `replaced` by a host's copy."""
    log = JobLog(root)
    try:
        for order, located in enumerate(log.new_entries()):
            entry = located.entry
            if entry.stream == NOTE or entry.node not in replaced:
                yield Piece(entry, log.read(located), order)
    finally:
        log.close()


def host_pieces(copy: FetchedCopy, first_order: int) -> list[Piece]:
    """A host copy's batches, from its index; a batch cut short keeps its whole lines."""
    locator = Locator()
    pieces = []
    for entry in parse_entries(copy.files[INDEX].decode("utf-8", "replace")):
        located = locator.place(entry)
        data = copy.files.get(entry.path, b"")[located.offset:located.offset + entry.nbytes]
        if len(data) < entry.nbytes:
            data = data[:data.rfind(b"\n") + 1]
            entry = IndexEntry(entry.time, entry.attempt, entry.node, entry.rank, entry.stream, data.count(b"\n"),
                               len(data), entry.partial)
        if data:
            pieces.append(Piece(entry, data, first_order + len(pieces)))
    return pieces


def write_metrics(path: Path, pieces: list[Piece]) -> None:
    """metrics.jsonl from the ranks' metrics lines, as the launch wrote it."""
    mark = METRICS_MARK.encode()
    with open(path, "w", encoding="utf-8") as out:
        for piece in pieces:
            if piece.entry.rank is None or mark not in piece.data:
                continue
            for raw in piece.data.split(b"\n"):
                record = parse_metrics(raw.decode("utf-8", "replace")) if mark in raw else None
                if record is not None:
                    out.write(json.dumps({"t": piece.entry.time, "node": piece.entry.node, "rank": piece.entry.rank,
                                          **record}) + "\n")


def write_telemetry(path: Path, copies: Mapping[str, FetchedCopy]) -> None:
    with open(path, "w", encoding="utf-8") as out:
        for node, copy in copies.items():
            for line in copy.telemetry.splitlines():
                try:
                    sample = json.loads(line)
                except ValueError:
                    continue  # a sample cut short when its host went down
                out.write(json.dumps({**sample, "node": node}) + "\n")


def swap_in(staging: Path, root: Path) -> None:
    """Move the rebuilt files in place of the old ones (each replaced whole), then drop the old."""
    for name in LAYOUT_DIRS:
        old = root / name
        if old.exists():
            os.rename(old, staging / f"old-{name}")
        os.rename(staging / name, old)
    for name in (INDEX, "metrics.jsonl", "telemetry.jsonl"):
        os.replace(staging / name, root / name)
    shutil.rmtree(staging)
