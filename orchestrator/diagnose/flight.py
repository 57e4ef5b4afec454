"""Flight Recorder dumps of a hung job: which ranks have not entered the collective the others wait in.

torch records every collective a rank schedules (TORCH_FR_BUFFER_SIZE from torch 2.7,
TORCH_NCCL_TRACE_BUFFER_SIZE before; distrun sets the host's for every job unless it sets
`flight_recorder: false`), and every rank serves the record on its Unix socket: distrun's worker
entry (remote/distrun_worker.py) runs it inside `torch.distributed.elastic.control_plane.worker_main()`.
The hang watchdog fetches each rank's dump
(`fr_trace_json`) with its stack; `lags` reads them: per process group, the collective most
ranks have entered last and not completed, and the ranks whose last entry is below it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from orchestrator.console.display import rank_ranges

COMPLETED = "completed"
DEFAULT_GROUP = "default_pg"
RATE_S = 30.0  # the progress rate is over this many seconds of events


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
        behind: The ranks whose last entry comes before it (none: every rank waits in it).
        last: Each behind rank's last collective_seq_id (0: it entered none).
    """

    group: str
    desc: str
    seq: int
    collective: str
    waiting: tuple[int, ...]
    behind: tuple[int, ...]
    last: tuple[int, ...]

    def line(self) -> str:
        """`rank 3 has not entered collective #31 gloo:all_reduce that ranks 0-2,4-5 wait in (its last: #30)`."""
        group = "" if self.desc == DEFAULT_GROUP else f" of process group {self.desc or self.group}"
        what = f"collective #{self.seq} {self.collective}{group}"
        waiting = f"{label(self.waiting)} {'wait' if len(self.waiting) > 1 else 'waits'} in"
        if not self.behind:
            return f"{waiting} {what}: no rank is behind"
        verb = "have" if len(self.behind) > 1 else "has"
        lasts = ", ".join(f"#{seq}" for seq in dict.fromkeys(self.last))
        return f"{label(self.behind)} {verb} not entered {what} that {waiting} (last entered: {lasts})"

    def to_dict(self) -> dict[str, Any]:
        return {"group": self.group, "desc": self.desc, "seq": self.seq, "collective": self.collective,
                "waiting": list(self.waiting), "behind": list(self.behind), "last": list(self.last)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Lag:
        return cls(group=str(data.get("group", "")), desc=str(data.get("desc", "")), seq=int(data.get("seq", 0)),
                   collective=str(data.get("collective", "")), waiting=tuple(data.get("waiting") or ()),
                   behind=tuple(data.get("behind") or ()), last=tuple(data.get("last") or ()))


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
    operations are left out (they have no collective_seq_id shared by the group)."""
    last: dict[tuple[str, str], LastCollective] = {}
    for raw in dump.get("entries") or ():
        seq = int(raw.get("collective_seq_id") or 0)
        if raw.get("is_p2p") or seq <= 0:
            continue
        pg = list(raw.get("process_group") or ("", ""))
        group = (str(pg[0]), str(pg[1]) if len(pg) > 1 else "")
        if group not in last or seq >= last[group].seq:
            done = bool(raw.get("retired")) or raw.get("state") == COMPLETED  # gloo leaves state "scheduled"
            last[group] = LastCollective(seq, str(raw.get("profiling_name") or "?"), not done)
    return last


def lags(dumps: Mapping[int, Mapping[str, Any]]) -> list[Lag]:
    """Per process group, the collective the most ranks have entered last and not completed
    (ties: the later one), and the ranks whose last entry is below it.

    Args:
        dumps: Each rank's Flight Recorder dump (fr_trace_json's JSON).

    Returns:
        One Lag per process group where some rank waits in a collective, in group order. A group's
        ranks are those whose dump has entries in it (every rank with a dump for the default group);
        ranks without a dump are in none. A group where no rank waits (all completed) has none.
    """
    by_group: dict[tuple[str, str], dict[int, LastCollective]] = {}
    for rank, dump in sorted(dumps.items()):
        for group, entry in last_entries(dump).items():
            by_group.setdefault(group, {})[rank] = entry
    found = []
    for (name, desc), entries in sorted(by_group.items()):
        pending = Counter(e.seq for e in entries.values() if e.pending)
        if not pending:
            continue
        seq = max(pending, key=lambda s: (pending[s], s))
        waiting = tuple(r for r, e in entries.items() if e.seq == seq and e.pending)
        members = sorted(dumps) if desc == DEFAULT_GROUP else sorted(entries)
        behind = tuple(r for r in members if entries.get(r, LastCollective(0, "", False)).seq < seq)
        found.append(Lag(name, desc, seq, entries[waiting[0]].name, waiting, behind,
                         tuple(entries[r].seq if r in entries else 0 for r in behind)))
    return found



@dataclass
class FlightProgress:
    """A job's progress from the hosts' `fr` events (remote/frpoll.py), for a program that prints no
    metrics lines: each rank's last completed collective, and the rate at which the slowest rank
    completes them (a collective completes on every rank or on none, so the slowest is the job's)."""

    ranks: dict[int, int] = field(default_factory=dict)  # rank -> last completed collective_seq_id
    seen: list[tuple[float, int]] = field(default_factory=list)  # (when, the slowest rank's position), RATE_S

    def observe(self, event: Mapping[str, Any], now: float) -> None:
        """Take one host's `fr` event, seen at `now` (seconds)."""
        for rank, summary in (event.get("ranks") or {}).items():
            done = summary.get("done") if isinstance(summary, dict) else None
            if str(rank).isdigit() and isinstance(done, int):
                self.ranks[int(rank)] = max(done, self.ranks.get(int(rank), 0))
        if self.ranks:
            self.seen = [s for s in self.seen if s[0] >= now - RATE_S] + [(now, min(self.ranks.values()))]

    def rate(self) -> float | None:
        """Collectives completed per second over the last RATE_S seconds (None: not yet two events apart)."""
        if len(self.seen) < 2 or self.seen[-1][0] <= self.seen[0][0]:
            return None
        return (self.seen[-1][1] - self.seen[0][1]) / (self.seen[-1][0] - self.seen[0][0])

    def to_dict(self) -> dict[str, Any]:
        """`{"collectives_per_s", "collectives", "ranks": {rank: last completed}}` for `ps`, `top` and the record."""
        rate = self.rate()
        return {"collectives_per_s": None if rate is None else round(rate, 2),
                "collectives": self.seen[-1][1] if self.seen else 0,
                "ranks": {str(rank): seq for rank, seq in sorted(self.ranks.items())}}


def progress_line(progress: Mapping[str, Any]) -> str:
    """`12.5 collectives/s, ranks at #4501 (0-3), #4502 (4-5)`: a job's progress as its Flight Recorders tell."""
    at: dict[int, list[int]] = {}
    for rank, seq in (progress.get("ranks") or {}).items():
        at.setdefault(int(seq), []).append(int(rank))
    rate = progress.get("collectives_per_s")
    positions = ", ".join(f"#{seq} ({rank_ranges(sorted(ranks))})" for seq, ranks in sorted(at.items()))
    said = f"{rate:.1f} collectives/s" if isinstance(rate, int | float) else "collectives"
    return f"{said}, ranks at {positions}" if positions else said
