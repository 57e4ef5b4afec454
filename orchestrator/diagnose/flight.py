"""Flight Recorder dumps of a hung job: which ranks have not entered the collective the others wait in.

torch records every collective a rank schedules (TORCH_FR_BUFFER_SIZE from torch 2.7,
TORCH_NCCL_TRACE_BUFFER_SIZE before; distrun sets the host's for every job unless it sets
`flight_recorder: false`), and every rank serves the record on its Unix socket: distrun's worker
entry (remote/distrun_worker.py) runs it inside `torch.distributed.elastic.control_plane.worker_main()`.
The hang watchdog fetches each rank's dump
(`fr_trace_json`) with its stack; `lags` reads them: per process group, the collective most
ranks have entered last and not completed, and the ranks whose last entry is below it. What a rank
serves is its program's, not distrun's: every dump is checked (`entries`) before it is read, and a
rank whose answer is not a record counts as one that gave none, as a rank that did not answer does:
never left out, as it is the likeliest cause (a stopped rank cannot answer).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from orchestrator.console.display import rank_ranges
from orchestrator.remote.flightrec import BadRecord, not_a_record

COMPLETED = "completed"
DEFAULT_GROUP = "default_pg"


@dataclass(frozen=True)
class Entry:
    """One operation of a rank's record, as distrun reads it."""

    seq: int  # collective_seq_id: the same collective has the same number on every rank of the group
    name: str  # profiling_name, e.g. "gloo:all_reduce"
    group: tuple[str, str]  # the process group's (name, desc)
    p2p: bool  # a point-to-point operation (no collective_seq_id shared by the group)
    done: bool  # retired from the record or in state "completed" (gloo leaves state "scheduled")
    created_ns: int  # time_created_ns: when the rank entered it, on its host's clock


def entries(dump: object) -> list[Entry]:
    """The operations of a rank's record (fr_trace_json's JSON), checked before anything reads them.

    Raises:
        BadRecord: the answer is not such a record (another schema, wrong types, not JSON's object).
    """
    why = not_a_record(dump)
    if why is not None:
        raise BadRecord(f"the answer is not a record: {why}")
    found = []
    for raw in dump.get("entries") or ():  # type: ignore[union-attr]
        pg = [str(part) for part in raw.get("process_group") or ("", "")]
        found.append(Entry(raw.get("collective_seq_id") or 0, str(raw.get("profiling_name") or "?"),
                           (pg[0] if pg else "", pg[1] if len(pg) > 1 else ""), bool(raw.get("is_p2p")),
                           bool(raw.get("retired")) or raw.get("state") == COMPLETED, raw.get("time_created_ns") or 0))
    return found


@dataclass(frozen=True)
class LastCollective:
    """A rank's last collective in one process group."""

    seq: int  # collective_seq_id: the same collective has the same number on every rank of the group
    name: str  # profiling_name, e.g. "gloo:all_reduce"
    pending: bool  # not completed: neither retired from the record nor in state "completed"


@dataclass(frozen=True)
class Lag:
    """Ranks of a process group that have not entered the collective the others wait in.

    Attributes:
        group: The process group's name ("0" is the default group).
        desc: Its description ("default_pg").
        seq: The collective's collective_seq_id.
        collective: Its profiling name ("gloo:all_reduce").
        waiting: The ranks whose last entry is that collective, not completed.
        behind: The ranks whose last entry comes before it, completed: they are elsewhere.
        last: Each behind rank's last collective_seq_id (0: it entered none).
        silent: The ranks of the group that gave no record (did not answer, or not a record).
        blocked: The ranks still inside an earlier collective, not completed (held up, not the cause).
        blocked_in: Each blocked rank's collective_seq_id.
    """

    group: str
    desc: str
    seq: int
    collective: str
    waiting: tuple[int, ...]
    behind: tuple[int, ...]
    last: tuple[int, ...]
    silent: tuple[int, ...] = ()
    blocked: tuple[int, ...] = ()
    blocked_in: tuple[int, ...] = ()

    def blamed(self) -> tuple[int, ...]:
        """The likeliest cause: the ranks behind (they answered, and are not in the collective), else
        those that gave no record (a stopped rank cannot answer), else those held in an earlier one."""
        return self.behind or self.silent or self.blocked

    def line(self) -> str:
        """`rank 3 has not entered collective #31 gloo:all_reduce that ranks 0-2,4-5 wait in (last entered: #30)`;
        `rank 3 gave no record (it did not answer): the likeliest cause, as ranks 0-1,5 wait in collective
        #105 gloo:all_reduce (ranks 2,4 are still in #104)`."""
        group = "" if self.desc == DEFAULT_GROUP else f" of process group {self.desc or self.group}"
        what = f"collective #{self.seq} {self.collective}{group}"
        waiting = f"{label(self.waiting)} {'wait' if len(self.waiting) > 1 else 'waits'} in"
        held = (f"{label(self.blocked)} {'are' if len(self.blocked) > 1 else 'is'} still in "
                f"{', '.join(f'#{seq}' for seq in dict.fromkeys(self.blocked_in))}")
        if self.behind:
            verb = "have" if len(self.behind) > 1 else "has"
            lasts = ", ".join(f"#{seq}" for seq in dict.fromkeys(self.last))
            said = f"{label(self.behind)} {verb} not entered {what} that {waiting} (last entered: {lasts})"
            silent = f"; {label(self.silent)} gave no record" * bool(self.silent)
            return said + silent + f"; {held}" * bool(self.blocked)
        if self.silent:
            return (f"{label(self.silent)} gave no record (did not answer): the likeliest cause, as {waiting} {what}"
                    + f" ({held})" * bool(self.blocked))
        if self.blocked:
            return f"{held}, behind {what} that {waiting}"
        return f"{waiting} {what}: no rank is behind"

    def to_dict(self) -> dict[str, Any]:
        return {"group": self.group, "desc": self.desc, "seq": self.seq, "collective": self.collective,
                "waiting": list(self.waiting), "behind": list(self.behind), "last": list(self.last),
                "silent": list(self.silent), "blocked": list(self.blocked), "blocked_in": list(self.blocked_in)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Lag:
        def ranks(key: str) -> tuple[int, ...]:
            return tuple(data.get(key) or ())
        return cls(group=str(data.get("group", "")), desc=str(data.get("desc", "")), seq=int(data.get("seq", 0)),
                   collective=str(data.get("collective", "")), waiting=ranks("waiting"), behind=ranks("behind"),
                   last=ranks("last"), silent=ranks("silent"), blocked=ranks("blocked"),
                   blocked_in=ranks("blocked_in"))


def label(ranks: Sequence[int]) -> str:
    """`rank 3`, `ranks 0-2,4-5`."""
    return f"{'rank' if len(ranks) == 1 else 'ranks'} {rank_ranges(ranks)}"


def by_reason(errors: Mapping[int, str]) -> dict[str, list[int]]:
    """Ranks grouped by why they gave no dump: {"no socket": [4, 5]}."""
    grouped: dict[str, list[int]] = {}
    for rank, why in sorted(errors.items()):
        grouped.setdefault(why, []).append(rank)
    return grouped


def last_entries(dump: Mapping[str, Any]) -> dict[tuple[str, str], LastCollective]:
    """A rank's last collective in each process group ((name, desc) -> entry); point-to-point
    operations are left out (they have no collective_seq_id shared by the group).

    Raises:
        BadRecord: the dump is not a record distrun can read.
    """
    last: dict[tuple[str, str], LastCollective] = {}
    for entry in entries(dump):
        if entry.p2p or entry.seq <= 0:
            continue
        if entry.group not in last or entry.seq >= last[entry.group].seq:
            last[entry.group] = LastCollective(entry.seq, entry.name, not entry.done)
    return last


def blamed(found: Sequence[Lag]) -> list[int]:
    """The ranks the lags find the likeliest cause, in every group."""
    return sorted({rank for lag in found for rank in lag.blamed()})


def lags(dumps: Mapping[int, Mapping[str, Any]], silent: Sequence[int] = ()) -> list[Lag]:
    """Per process group, the collective the most ranks have entered last and not completed
    (ties: the later one), and the ranks whose last entry is below it.

    Args:
        dumps: Each rank's Flight Recorder dump (fr_trace_json's JSON); one that is not a record
            distrun can read counts as no record.
        silent: The job's ranks that gave no record (never left out: a stopped rank cannot answer).

    Returns:
        One Lag per process group where some rank waits in a collective, in group order. A group's
        ranks are those whose dump has entries in it (every rank of the job for the default group,
        the silent ones among them); a rank behind that is still inside an earlier collective is
        `blocked`, not `behind`. A group where no rank waits (all completed) has none.
    """
    by_group: dict[tuple[str, str], dict[int, LastCollective]] = {}
    read: list[int] = []
    for rank, dump in sorted(dumps.items()):
        try:
            lasts = last_entries(dump)
        except BadRecord:
            continue
        read.append(rank)
        for group, entry in lasts.items():
            by_group.setdefault(group, {})[rank] = entry
    unread = tuple(sorted({*silent, *(set(dumps) - set(read))}))
    return [lag for (name, desc), group in sorted(by_group.items())
            if (lag := group_lag(name, desc, group, read if desc == DEFAULT_GROUP else sorted(group),
                                 unread if desc == DEFAULT_GROUP else ())) is not None]


def group_lag(name: str, desc: str, entries: Mapping[int, LastCollective], members: Sequence[int],
              silent: tuple[int, ...]) -> Lag | None:
    """One process group's lag: the collective most of its ranks wait in, and who is not in it."""
    pending = Counter(e.seq for e in entries.values() if e.pending)
    if not pending:
        return None
    seq = max(pending, key=lambda s: (pending[s], s))
    waiting = tuple(r for r, e in entries.items() if e.seq == seq and e.pending)
    below = [r for r in members if entries.get(r, LastCollective(0, "", False)).seq < seq]
    behind = tuple(r for r in below if r not in entries or not entries[r].pending)
    blocked = tuple(r for r in below if r in entries and entries[r].pending)
    return Lag(name, desc, seq, entries[waiting[0]].name, waiting, behind,
               tuple(entries[r].seq if r in entries else 0 for r in behind), silent, blocked,
               tuple(entries[r].seq for r in blocked))
