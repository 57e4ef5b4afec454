"""Each rank's Flight Recorder, read every few seconds on its host and sent on as a small event.

The supervisor runs `run` in a thread of its own when the job has a socket directory
(DISTRUN_WORKER_SOCKETS, remote/sockdir.py). Every POLL_EVERY seconds, on the wall clock's multiples
of it (so that every host reads its ranks at the same moment, as NTP keeps their clocks), it fetches
the `fr_trace_json` of each rank that serves one there (remote/flightrec.py), all at once, each
within FETCH_BOUND seconds: a rank that does not answer in time is skipped this round, never waited
for. A dump is reduced to what the controller needs (`reduce`): the default process group's
collectives the rank entered since the last round (sequence id, op, time entered, and how long it
took where the record times it), and its last completed and last entered sequence ids. A record of
another shape is skipped with the reason, never an exception. Only a socket served by a process of
the job is believed; that process's scheduler figures (`sched`) go with its record.

Event `fr` (remote/stream.py): {"at": the round's wall time (s), "ranks": {"<rank>": {"done": last
completed collective_seq_id, "entered": last entered, "c": [[seq, op, entered_us(, duration_us)],
...], "sched": {...} where /proc has them}}, "skipped": {"<rank>": why}, "sched": {"<rank>": {...}} of
the skipped ranks whose process is known (a rank too held to answer in time is still seen)}. `entered_us` is the rank's
time_created_ns (the host's wall clock when the rank called the collective) in microseconds;
`duration_us` is there only when the record has the collective's start and completion (NCCL with
timing; gloo leaves them 0). `sched` (counters since the process started, `ProcWatch`): `cpu_ms`
(user + system), `wait_ms` (waiting for a CPU, /proc/PID/schedstat), `throttled_ms` and
`nr_throttled` (its cgroup's CFS quota, cgroup v1 `cpu` or v2), `stopped` and `looks` (how many of
the looks since the process was first seen found it stopped: SIGSTOP, a debugger). Stdlib only:
shipped to the hosts.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from orchestrator.remote.flightrec import BadRecord, fetch
from orchestrator.remote.provenance import Root, proven

POLL_EVERY = 5.0  # seconds between two rounds
FETCH_BOUND = 1.0  # seconds a rank may take to answer before it is skipped this round
MAX_COLLECTIVES = 200  # the most collectives of one rank in one event: the latest
LOOK_EVERY = 0.1  # seconds between two looks at whether a rank's process is stopped
DEFAULT_GROUP = "0"
SOCKET = re.compile(r"rank(\d+)\.sock")
LAST = re.compile(r"rank(\d+)\.last\.json")  # what a rank left as it ended (remote/distrun_worker.py)
LAST_EVERY = 0.5  # seconds between two looks for what ranks left as they ended
MAX_LAST = 64 << 20  # the largest such record read


def _int(value: object, where: str, text: bool = False) -> int:
    """An integer of the record (`text`: or a string of one, as pg_status has them); BadRecord for anything else."""
    if isinstance(value, bool) or not isinstance(value, (int, str)) or (isinstance(value, str) and not text):
        raise BadRecord(f"{where} is {type(value).__name__}, not an integer")
    try:
        return int(value)
    except ValueError:
        raise BadRecord(f"{where} is {str(value)[:40]!r}, not an integer") from None


def _op(name: object) -> str:
    """`gloo:all_reduce` -> `all_reduce`."""
    return str(name or "").rsplit(":", 1)[-1] or "?"


def _duration_us(raw: Mapping[str, Any], where: str) -> int | None:
    """How long the collective took, where the record has its start and completion (NCCL with timing)."""
    started = raw.get("time_discovered_started_ns") or 0
    completed = raw.get("time_discovered_completed_ns") or 0
    if not started or not completed:
        return None
    return max(0, _int(completed, f"{where} time_discovered_completed_ns")
               - _int(started, f"{where} time_discovered_started_ns")) // 1000


def _entry(raw: object, index: int) -> tuple[int, bool, list[Any]] | None:
    """One entry of the record as (seq, completed, [seq, op, entered_us(, duration_us)]); None for
    what the progress leaves out (point-to-point, another process group, no sequence id)."""
    where = f"entry {index}"
    if not isinstance(raw, dict):
        raise BadRecord(f"{where} is {type(raw).__name__}, not an object")
    group = raw.get("process_group") or ("",)
    if not isinstance(group, (list, tuple)) or not group:
        raise BadRecord(f"{where} process_group is {type(group).__name__}, not a list")
    seq = _int(raw.get("collective_seq_id") or 0, f"{where} collective_seq_id")
    if raw.get("is_p2p") or seq <= 0 or str(group[0]) != DEFAULT_GROUP:
        return None
    kept = [seq, _op(raw.get("profiling_name")), _int(raw.get("time_created_ns") or 0, f"{where} time_created_ns")
            // 1000]
    duration = _duration_us(raw, where)
    return seq, bool(raw.get("retired")) or raw.get("state") == "completed", kept + ([duration] if duration else [])


def _status(dump: Mapping[str, Any]) -> tuple[int, int]:
    """The default group's (last completed, last enqueued) from the record's pg_status ((0, 0) when absent)."""
    every = dump.get("pg_status") or {}
    status = every.get(DEFAULT_GROUP) if isinstance(every, dict) else None
    if status is None:
        return 0, 0
    if not isinstance(status, dict):
        raise BadRecord(f"pg_status is {type(status).__name__}, not an object")
    return (_int(status.get("last_completed_collective") or 0, "pg_status last_completed_collective", True),
            _int(status.get("last_enqueued_collective") or 0, "pg_status last_enqueued_collective", True))


def reduce(dump: Mapping[str, Any], after: int) -> dict[str, Any]:
    """A rank's dump as {"done", "entered", "c"}: the default group's collectives past `after`
    (point-to-point operations left out), the latest MAX_COLLECTIVES of them.

    Raises:
        BadRecord: the dump is not of the shape torch's fr_trace_json writes (its one-line reason).
    """
    entries = dump.get("entries") or []
    if not isinstance(entries, list):
        raise BadRecord(f"entries is {type(entries).__name__}, not a list")
    collectives = []
    done = entered = 0
    for index, raw in enumerate(entries):
        found = _entry(raw, index)
        if found is None:
            continue
        seq, completed, kept = found
        entered = max(entered, seq)
        if completed:
            done = max(done, seq)
        if seq > after:
            collectives.append(kept)
    last_done, last_entered = _status(dump)
    return {"done": max(done, last_done), "entered": max(entered, last_entered),
            "c": sorted(collectives)[-MAX_COLLECTIVES:]}


def rank_sockets(directory: str, pattern: re.Pattern[str] = SOCKET) -> dict[int, str]:
    """The ranks that serve a socket in `directory` (or have a file of `pattern` there), and its path."""
    try:
        names = os.listdir(directory)
    except OSError:
        return {}
    return {int(m.group(1)): os.path.join(directory, name) for name in names if (m := pattern.fullmatch(name))}


def read_last(path: str) -> tuple[dict[str, Any] | None, str]:
    """The record a rank left as it ended (a file of this user's, not a link, read once and removed),
    or (None, why not)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError as exc:
        return None, f"its last record cannot be read: {exc.strerror or exc}"
    try:
        info = os.fstat(fd)
        if info.st_uid != os.getuid() or info.st_size > MAX_LAST:
            return None, "its last record is not of this user's or too large"
        with os.fdopen(os.dup(fd), "rb") as file:
            data = json.loads(file.read())
    except (OSError, ValueError) as exc:
        return None, f"its last record is not JSON: {exc}"[:200]
    finally:
        os.close(fd)
        with contextlib.suppress(OSError):
            os.remove(path)
    return (data, "") if isinstance(data, dict) else (None, "its last record is not a JSON object")


def _read(path: str) -> str:
    try:
        with open(path, encoding="ascii", errors="replace") as file:
            return file.read()
    except OSError:
        return ""


def _state(pid: int) -> str:
    """The process's state letter from /proc/PID/stat ("" when it is gone)."""
    stat = _read(f"/proc/{pid}/stat")
    return stat[stat.rfind(")") + 2:][:1]


def _cgroup_cpu_stat(pid: int) -> dict[str, int]:
    """The CFS quota figures of the process's cgroup: {"throttled_ms", "nr_throttled"} ({} where none are kept)."""
    for line in _read(f"/proc/{pid}/cgroup").splitlines():
        _, controllers, path = [*line.split(":", 2), "", ""][:3]
        if controllers == "":  # cgroup v2: one tree
            where, scale = f"/sys/fs/cgroup{path}", 1_000  # throttled_usec
        elif "cpu" in controllers.split(","):
            where, scale = f"/sys/fs/cgroup/{controllers}{path}", 1_000_000  # throttled_time, ns
        else:
            continue
        figures = dict(pair.split()[:2] for pair in _read(f"{where.rstrip('/')}/cpu.stat").splitlines()
                       if len(pair.split()) >= 2)
        throttled = figures.get("throttled_time", figures.get("throttled_usec"))
        if throttled is not None and throttled.isdigit():
            return {"throttled_ms": int(throttled) // scale, "nr_throttled": int(figures.get("nr_throttled", "0"))}
    return {}


def sched_figures(pid: int) -> dict[str, int]:
    """A process's scheduler counters since it started: `cpu_ms`, `wait_ms` (for a CPU), and its cgroup's
    `throttled_ms`, `nr_throttled` ({} for a process that is gone)."""
    stat = _read(f"/proc/{pid}/stat")
    fields = stat[stat.rfind(")") + 2:].split()
    if len(fields) < 13:
        return {}
    tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    figures = {"cpu_ms": (int(fields[11]) + int(fields[12])) * 1000 // tick}
    schedstat = _read(f"/proc/{pid}/schedstat").split()
    if len(schedstat) >= 2 and schedstat[1].isdigit():
        figures["wait_ms"] = int(schedstat[1]) // 1_000_000
    return {**figures, **_cgroup_cpu_stat(pid)}


class ProcWatch:
    """How often each rank's process was found stopped (SIGSTOP, a debugger), looked at every
    LOOK_EVERY seconds: there is no kernel counter of the time a process spent stopped."""

    def __init__(self) -> None:
        self.pids: dict[int, int] = {}  # rank -> its process
        self.looks: dict[int, list[int]] = {}  # pid -> [stopped, looks]
        self.lock = threading.Lock()

    def watch(self, rank: int, pid: int) -> None:
        with self.lock:
            if self.pids.get(rank) != pid:
                self.looks.pop(self.pids.get(rank, -1), None)
                self.pids[rank] = pid
                self.looks[pid] = [0, 0]

    def look(self) -> None:
        """One look at every watched process."""
        with self.lock:
            for pid, counts in self.looks.items():
                state = _state(pid)
                if state:
                    counts[0] += state in "Tt"
                    counts[1] += 1

    def figures(self, rank: int) -> dict[str, int]:
        """The rank's process's scheduler counters and looks ({} before its process is known)."""
        with self.lock:
            pid = self.pids.get(rank)
            counts = list(self.looks.get(pid, (0, 0))) if pid is not None else None
        if pid is None or counts is None:
            return {}
        figures = sched_figures(pid)
        return {**figures, "stopped": counts[0], "looks": counts[1]} if figures else {}

    def run(self, done: threading.Event) -> None:
        while not done.wait(LOOK_EVERY):
            self.look()


class Poller:
    """One host's rounds: what each rank sent so far, and the next event.

    Args:
        directory: The ranks' socket directory.
        roots: What the job's processes descend from (a socket's server must be one of them).
        bound: Seconds a rank may take to answer.
    """

    def __init__(self, directory: str, roots: list[Root], bound: float = FETCH_BOUND) -> None:
        self.directory = directory
        self.roots = roots
        self.bound = bound
        self.sent: dict[int, int] = {}  # rank -> the last collective_seq_id sent
        self.procs = ProcWatch()

    def round(self) -> dict[str, Any] | None:
        """Fetch every rank's dump at once, within the bound; the event's fields, or None when no rank serves."""
        sockets = rank_sockets(self.directory)
        if not sockets:
            return None
        at = time.time()
        got: dict[int, dict[str, object]] = {}
        threads = [threading.Thread(target=self._fetch, args=(rank, path, got), daemon=True)
                   for rank, path in sockets.items()]
        for thread in threads:
            thread.start()
        deadline = time.monotonic() + self.bound
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        ranks, skipped, held = {}, {}, {}
        for rank in sorted(sockets):
            answer = got.get(rank, {"flight_error": f"no answer within {self.bound:g} s"})
            summary, why = self._summary(rank, answer)
            if summary is None:
                skipped[str(rank)] = why
                held[str(rank)] = self.procs.figures(rank)  # a rank too held to answer is still seen
                continue
            ranks[str(rank)] = summary
        held = {rank: figures for rank, figures in held.items() if figures}
        return {"at": round(at, 3), "ranks": ranks, "skipped": skipped, **({"sched": held} if held else {})}

    def finals(self) -> dict[str, Any] | None:
        """The event of the records ranks left as they ended (`final`: those ranks), None when none did."""
        ranks, skipped, at = {}, {}, time.time()
        for rank, path in sorted(rank_sockets(self.directory, LAST).items()):
            with contextlib.suppress(OSError):
                at = min(at, os.lstat(path).st_mtime)
            dump, why = read_last(path)
            summary, why = self._summary(rank, {"flight": dump, "flight_error": why})
            if summary is None:
                skipped[str(rank)] = why
            else:
                ranks[str(rank)] = summary
        if not ranks and not skipped:
            return None
        return {"at": round(at, 3), "ranks": ranks, "skipped": skipped, "final": sorted(int(r) for r in ranks)}

    def _summary(self, rank: int, answer: Mapping[str, object]) -> tuple[dict[str, Any] | None, str]:
        """The rank's reduced record with its process's scheduler figures, or (None, why there is none)."""
        dump = answer.get("flight")
        if not isinstance(dump, dict):
            return None, str(answer.get("flight_error"))
        try:
            summary = reduce(dump, self.sent.get(rank, 0))
        except BadRecord as exc:
            return None, f"a Flight Recorder record of another shape: {exc}"
        if summary["c"]:
            self.sent[rank] = summary["c"][-1][0]
        sched = self.procs.figures(rank)
        return ({**summary, "sched": sched} if sched else summary), ""

    def _fetch(self, rank: int, path: str, got: dict[int, dict[str, object]]) -> None:
        got[rank] = fetch(path, timeout=self.bound, peer=lambda pid: self._believed(rank, pid))

    def _believed(self, rank: int, pid: int) -> bool:
        """Whether the socket's server is the job's; its process is then the rank's, watched."""
        if not proven(pid, self.roots):
            return False
        if self.procs.pids.get(rank, pid) != pid:
            self.sent.pop(rank, None)  # a restarted rank numbers its collectives from 1 again
        self.procs.watch(rank, pid)
        return True


def _next_round(every: float) -> float:
    """Seconds until the wall clock's next multiple of `every` (every host's rounds at one moment)."""
    return every - time.time() % every


def run(directory: str, roots: list[Root], emit: Callable[..., None], done: threading.Event,
        every: float = POLL_EVERY) -> None:
    """Send an `fr` event every `every` seconds until `done`, and one as soon as ranks leave their last
    records (within LAST_EVERY); rounds where no rank serves send none, and a round that fails is said
    in the event's `skipped` (the thread goes on)."""
    poller = Poller(directory, roots)
    threading.Thread(target=poller.procs.run, args=(done,), daemon=True).start()
    due = time.time() + _next_round(every)
    while True:
        ended = done.wait(max(0.0, min(LAST_EVERY, due - time.time())))
        for look in (poller.finals, poller.round) if time.time() >= due and not ended else (poller.finals,):
            try:
                fields = look()
            except Exception as exc:  # a round that fails is one round lost, not the thread
                fields = {"at": round(time.time(), 3), "ranks": {},
                          "skipped": {"*": f"the round failed: {exc!r}"[:200]}}
            if fields is not None:
                emit("fr", **fields)
        if ended:
            return
        if time.time() >= due:
            due = time.time() + _next_round(every)
