"""What each rank of a running job is doing now: the one look that `distrun stack`, the hang
watchdog and the stall detector (watchdog.py) all take.

`look` has the job's backend take every rank's stack (py-spy, stack.py) and, where the rank serves
one, its Flight Recorder record (flight.py), on every host at once, and returns per rank: where its
main thread is, its Flight Recorder position (the last collective it entered and the last it
completed, and when it entered its last), and when its last line reached the controller. `Look.keep`
writes what it found into the job directory (stacks/, flight/). A host without py-spy, ptrace
refused, a rank that serves no Flight Recorder or serves something that is not a record (the socket
is the rank's program's: its answer is checked before it is read): each is said in one line, and
the rest still counts.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orchestrator.diagnose import flight as flights
from orchestrator.diagnose import stack as stacks
from orchestrator.remote.private import make_private_dirs, write_private
from orchestrator.remote.redact import Masker

if TYPE_CHECKING:
    from orchestrator.store import JobDir, JobRecord

NS = 1e9


@dataclass(frozen=True)
class Position:
    """Where a rank is in its collectives, as its Flight Recorder says (every process group together).

    Attributes:
        entered: The collective_seq_id of the last collective it entered (0: none).
        completed: That of the last it completed (0: none).
        collective: The last one's profiling name ("gloo:all_reduce").
        entered_at: When it entered its last one, in seconds since the epoch (the host's clock).
    """

    entered: int
    completed: int
    collective: str
    entered_at: float

    @classmethod
    def of(cls, dump: Mapping[str, Any]) -> Position | None:
        """The position in a dump (fr_trace_json's JSON); None when it recorded no collective.

        Raises:
            flights.BadRecord: the dump is not a record distrun can read.
        """
        entries = [e for e in flights.entries(dump) if not e.p2p and e.seq > 0]
        if not entries:
            return None
        newest = max(entries, key=lambda e: e.created_ns)
        return cls(newest.seq, max((e.seq for e in entries if e.done), default=0), newest.name,
                   newest.created_ns / NS)

    def text(self) -> str:
        """`in #31 gloo:all_reduce (completed #30)`."""
        state = "done with" if self.completed >= self.entered else "in"
        return f"{state} #{self.entered} {self.collective} (completed #{self.completed})"


@dataclass(frozen=True)
class RankNow:
    """One rank now: its stack, its Flight Recorder position (or why none), its last line's time."""

    rank: int
    node: str
    stack: stacks.RankStack | None = None
    position: Position | None = None
    no_position: str = ""  # why there is no position ("no socket served"), when there is none
    last_line: float | None = None  # seconds since the epoch; None: no line yet (or not known here)

    def where(self) -> str:
        """Where its main thread is, or why that is not known."""
        return self.stack.where() if self.stack is not None else "no stack"

    def to_dict(self) -> dict[str, Any]:
        position = self.position
        return {"rank": self.rank, "node": self.node, "where": self.where(),
                "flight": None if position is None else {
                    "entered": position.entered, "completed": position.completed,
                    "collective": position.collective, "entered_at": round(position.entered_at, 3)},
                "no_flight": self.no_position or None,
                "last_line": None if self.last_line is None else round(self.last_line, 3)}


@dataclass
class Look:
    """Every rank of a job now (`ranks`, by rank), and all that was gathered (the stacks by host,
    the hosts that gave none, the Flight Recorder dumps)."""

    gathered: stacks.Gathered
    ranks: dict[int, RankNow] = field(default_factory=dict)

    def last_collective(self) -> float | None:
        """When any rank last entered a collective (seconds since the epoch); None: no record says."""
        return max((r.position.entered_at for r in self.ranks.values() if r.position is not None), default=None)

    def to_json(self) -> list[dict[str, Any]]:
        return [self.ranks[rank].to_dict() for rank in sorted(self.ranks)]

    def keep(self, job_dir: JobDir, lags: Sequence[flights.Lag]) -> tuple[list[str], list[str]]:
        """Write every rank's stack into stacks/ and every Flight Recorder dump into flight/.

        Returns:
            What could not be written, for the stacks and for the dumps (a full disk must not
            hide which rank is stuck).
        """
        notes: tuple[list[str], list[str]] = ([], [])
        try:
            keep_stacks(self.gathered, job_dir.stacks)
        except OSError as exc:
            notes[0].append(f"stacks not kept in {job_dir.stacks}: {exc}")
        if self.gathered.flight.dumps:
            try:
                keep_flight(self.gathered.flight, lags, job_dir.flight)
            except OSError as exc:
                notes[1].append(f"Flight Recorder dumps not kept in {job_dir.flight}: {exc}")
        return notes


def look(backend: stacks.ReachesRanks, record: JobRecord, nodes: Sequence[str] | None = None, *,
         native: bool = False, flight: bool = True, masker: Masker | None = None,
         last_lines: Mapping[int, float] | None = None, timeout: float = stacks.GATHER_TIMEOUT) -> Look:
    """What every rank of a running job (or of its `nodes`) is doing now.

    Args:
        backend: The job's backend (it reaches the ranks' hosts).
        record: The job.
        nodes: Only these of its hosts; None: all.
        native: Include native (C/C++) frames in the stacks.
        flight: Also fetch each rank's Flight Recorder record, where it serves one.
        masker: The job's secrets, masked in everything the hosts answered.
        last_lines: When each rank's last line arrived (seconds since the epoch), where known.
        timeout: Seconds a host may take.

    Raises:
        UsageError: a node is not the job's.
        DistrunError: the backend could not reach the ranks at all.
    """
    gathered = stacks.gather(backend, record, nodes, native, timeout, flight=flight, masker=masker)
    lines = last_lines or {}
    dumps = gathered.flight
    found = {r.rank: RankNow(r.rank, r.node, r) for r in gathered.ranks}
    for rank, node in dumps.nodes.items():
        found.setdefault(rank, RankNow(rank, node))
    ranks = {}
    for rank, now in found.items():
        position, why = position_of(dumps, rank)
        ranks[rank] = RankNow(rank, now.node, now.stack, position, why, lines.get(rank))
    return Look(gathered, ranks)


def position_of(dumps: stacks.Flight, rank: int) -> tuple[Position | None, str]:
    """A rank's position, or None and why there is none. A dump that is not a record becomes its
    why, and leaves the dumps (so nothing else reads it)."""
    try:
        position = Position.of(dumps.dumps[rank]) if rank in dumps.dumps else None
    except flights.BadRecord as exc:
        del dumps.dumps[rank]
        dumps.errors[rank] = str(exc)
        return None, str(exc)
    return position, "" if position else dumps.errors.get(rank, "no collective recorded")


def keep_stacks(gathered: stacks.Gathered, folder: Path) -> None:
    """Write every rank's stack (rank<R>.txt), the folded view (folded.txt) and the JSON (stacks.json),
    private (0700/0600) as every file of the job."""
    make_private_dirs(folder)
    for rank in gathered.ranks:
        text = "\n".join([f"rank {rank.rank} on {rank.node} (pid {rank.pid})", *stacks.stack_lines(rank)])
        write_private(folder / f"rank{rank.rank}.txt", text + "\n")
    write_private(folder / "folded.txt", stacks.render(gathered) + "\n")
    write_private(folder / "stacks.json", json.dumps(stacks.to_json(gathered), indent=2) + "\n")


def keep_flight(flight: stacks.Flight, lags: Sequence[flights.Lag], folder: Path) -> None:
    """Write every rank's dump (rank<R>.json) and what they say (flight.json: lags, errors, seconds),
    private (0700/0600) as every file of the job."""
    make_private_dirs(folder)
    for rank, dump in flight.dumps.items():
        write_private(folder / f"rank{rank}.json", json.dumps(dump) + "\n")
    summary = {"lags": [lag.to_dict() for lag in lags], "errors": {str(r): why for r, why in flight.errors.items()},
               "seconds": round(flight.seconds, 3)}
    write_private(folder / "flight.json", json.dumps(summary, indent=2) + "\n")
