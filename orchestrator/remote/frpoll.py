"""Each rank's Flight Recorder, read every few seconds on its host and sent on as a small event.

The supervisor runs `run` in a thread of its own when the job has a socket directory
(DISTRUN_WORKER_SOCKETS, remote/sockdir.py). Every POLL_EVERY seconds it fetches the
`fr_trace_json` of each rank that serves one there (remote/flightrec.py), all at once, each within
FETCH_BOUND seconds: a rank that does not answer in time is skipped this round, never waited for.
A dump is reduced to what the controller needs (`reduce`): the default process group's
collectives the rank entered since the last round (sequence id, op, time entered), and its last
completed and last entered sequence ids. Only a socket served by a process of the job is believed.

Event `fr` (remote/stream.py): {"ranks": {"<rank>": {"done": last completed collective_seq_id,
"entered": last entered, "c": [[seq, op, entered_us], ...]}}, "skipped": {"<rank>": why}}.
`entered_us` is the rank's time_created_ns (the host's wall clock when the rank called the
collective) in microseconds. Stdlib only: shipped to the hosts.
"""

from __future__ import annotations

import os
import re
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from orchestrator.remote.flightrec import fetch
from orchestrator.remote.provenance import Root, proven

POLL_EVERY = 5.0  # seconds between two rounds
FETCH_BOUND = 1.0  # seconds a rank may take to answer before it is skipped this round
MAX_COLLECTIVES = 200  # the most collectives of one rank in one event: the latest
DEFAULT_GROUP = "0"
SOCKET = re.compile(r"rank(\d+)\.sock")


def _seq(raw: Mapping[str, Any]) -> int:
    try:
        return int(raw.get("collective_seq_id") or 0)
    except (TypeError, ValueError):
        return 0


def _op(name: str) -> str:
    """`gloo:all_reduce` -> `all_reduce`."""
    return name.rsplit(":", 1)[-1] or "?"


def reduce(dump: Mapping[str, Any], after: int) -> dict[str, Any]:
    """A rank's dump as {"done", "entered", "c"}: the default group's collectives past `after`
    (point-to-point operations left out), the latest MAX_COLLECTIVES of them."""
    status = (dump.get("pg_status") or {}).get(DEFAULT_GROUP) or {}
    collectives = []
    done = entered = 0
    for raw in dump.get("entries") or ():
        group = raw.get("process_group") or ("",)
        seq = _seq(raw)
        if raw.get("is_p2p") or seq <= 0 or str(group[0]) != DEFAULT_GROUP:
            continue
        entered = max(entered, seq)
        if raw.get("retired") or raw.get("state") == "completed":
            done = max(done, seq)
        if seq > after:
            entered_us = int(raw.get("time_created_ns") or 0) // 1000
            collectives.append([seq, _op(str(raw.get("profiling_name") or "")), entered_us])
    with_status = [_int(status.get("last_completed_collective")), _int(status.get("last_enqueued_collective"))]
    return {"done": max(done, with_status[0]), "entered": max(entered, with_status[1]),
            "c": sorted(collectives)[-MAX_COLLECTIVES:]}


def _int(value: object) -> int:
    try:
        return int(str(value))
    except ValueError:
        return 0


def rank_sockets(directory: str) -> dict[int, str]:
    """The ranks that serve a socket in `directory`, and its path."""
    try:
        names = os.listdir(directory)
    except OSError:
        return {}
    return {int(m.group(1)): os.path.join(directory, name) for name in names if (m := SOCKET.fullmatch(name))}


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

    def round(self) -> dict[str, Any] | None:
        """Fetch every rank's dump at once, within the bound; the event's fields, or None when no rank serves."""
        sockets = rank_sockets(self.directory)
        if not sockets:
            return None
        got: dict[int, dict[str, object]] = {}
        threads = [threading.Thread(target=self._fetch, args=(rank, path, got), daemon=True)
                   for rank, path in sockets.items()]
        for thread in threads:
            thread.start()
        deadline = time.monotonic() + self.bound
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        ranks, skipped = {}, {}
        for rank in sorted(sockets):
            answer = got.get(rank, {"flight_error": f"no answer within {self.bound:g} s"})
            dump = answer.get("flight")
            if not isinstance(dump, dict):
                skipped[str(rank)] = str(answer.get("flight_error"))
                continue
            summary = reduce(dump, self.sent.get(rank, 0))
            if summary["c"]:
                self.sent[rank] = summary["c"][-1][0]
            ranks[str(rank)] = summary
        return {"ranks": ranks, "skipped": skipped}

    def _fetch(self, rank: int, path: str, got: dict[int, dict[str, object]]) -> None:
        got[rank] = fetch(path, timeout=self.bound, peer=lambda pid: proven(pid, self.roots))


def run(directory: str, roots: list[Root], emit: Callable[..., None], done: threading.Event,
        every: float = POLL_EVERY) -> None:
    """Send an `fr` event every `every` seconds until `done`; rounds where no rank serves send none."""
    poller = Poller(directory, roots)
    while not done.wait(every):
        fields = poller.round()
        if fields is not None:
            emit("fr", **fields)
