"""What a stall or hang look makes of the ranks' answers (diagnose/ranks.py, flight.py, watchdog.py):
a Flight Recorder answer of the wrong shape is a per-rank note, never an exception; the ranks'
positions in their collectives decide which rank is odd and the stacks say where it is; a rank that
does not answer (stopped) is the likeliest cause, not its neighbours held up in the collective it
left; the reason line says what the Flight Recorder found.

The hosts' answers are remote/stack.py's JSON lines, built from the real fr_trace_json records in
tests/data/flight (tests/test_flight.py's `dump_upto`) and py-spy's thread format, given to the real
`look` (stack.gather, ranks.look, watchdog.diagnose) by a backend that answers for the hosts. The fetch
tests serve a real Unix socket. tests/faults/test_ranks_faults.py runs the same on the lab.
"""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from orchestrator.diagnose import ranks
from orchestrator.diagnose.failures import Failure
from orchestrator.diagnose.flight import BadRecord, Lag, lags
from orchestrator.diagnose.watchdog import diagnose
from orchestrator.fanout.group import GroupResult
from orchestrator.remote.flightrec import fetch
from orchestrator.store import JobRecord, JobState, Store
from tests.test_flight import dump_upto, entry, own_tmp  # noqa: F401  (own_tmp: the fixture)

NODES = ["node0", "node1", "node2"]
ADDRESSES = {node: f"10.0.0.1{i}" for i, node in enumerate(NODES)}
COLLECTIVE = [("all_reduce", "/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py", 2806),
              ("steps", "/w/train.py", 41)]
STUCK = [("load_batch", "/w/train.py", 21), ("steps", "/w/train.py", 40)]
STORE_WAIT = [("get", "/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py", 4120),
              ("load_batch", "/w/train.py", 23), ("steps", "/w/train.py", 40)]
LOGGER = [("wait", "/usr/lib/python3.11/threading.py", 331), ("log_forever", "/w/train.py", 12)]
STOPPED = ("stopped: state T in /proc/4242/stat (stopped by a signal (SIGSTOP, SIGTSTP)), kernel wait channel "
           "do_signal_stop; py-spy cannot read a stopped process")


def thread(name: str, frames: Sequence[tuple[str, str, int]]) -> dict[str, Any]:
    """One thread as py-spy's --json prints it (short_filename: from site-packages, or the file's name)."""
    return {"thread_name": name, "frames": [{"name": f, "filename": path, "line": line,
                                             "short_filename": path.split("site-packages/")[-1].rsplit("/w/")[-1]}
                                            for f, path, line in frames]}


class Hosts:
    """The job's backend as `look` reaches it: each host answers remote/stack.py's JSON line."""

    def __init__(self, answers: dict[str, dict[str, Any]]) -> None:
        self.answers = answers

    def run_remote_near(self, record: JobRecord, nodes: Sequence[str], main: str, modules: list[str],
                        args: Sequence[str] = (), timeout: float | None = None) -> GroupResult[str]:
        assert main == "stack" and "--flight" in args
        return GroupResult({node: json.dumps(self.answers[node]) for node in nodes})


def answers(stacks: dict[int, list[dict[str, Any]] | str], flights: dict[int, Any], pyspy: bool = True
            ) -> dict[str, dict[str, Any]]:
    """Six ranks, two a host: each rank's threads (or its stack's error) and its record (or why none)."""
    by_node: dict[str, dict[str, Any]] = {node: {"pyspy": "/v/bin/py-spy" if pyspy else None, "ranks": []}
                                          for node in NODES}
    for rank in range(6):
        got: dict[str, Any] = {"rank": rank, "local_rank": rank % 2, "pid": 4000 + rank, "flight_seconds": 0.004}
        stack = stacks[rank]
        got.update({"error": stack} if isinstance(stack, str) else {"threads": stack} if pyspy else {})
        flight = flights[rank]
        got.update({"flight_error": flight.removeprefix("ERROR ")} if isinstance(flight, str) else {"flight": flight})
        by_node[NODES[rank // 2]]["ranks"].append(got)
    return by_node


def hang(tmp_path: Path, by_node: dict[str, dict[str, Any]]) -> Failure:
    store = Store(tmp_path / "home")
    rec = JobRecord(id="fr-9", name="fr", spec_path="x.yaml", inventory="inv.yaml", hosts=NODES, backend="ssh",
                    state=JobState.RUNNING)
    return diagnose(Hosts(by_node), rec, store.job_dir(rec.id), 15, ADDRESSES)


def main_in(frames: Sequence[tuple[str, str, int]], *more: dict[str, Any]) -> list[dict[str, Any]]:
    return [thread("MainThread", frames), *more]


BAD_RECORDS = {
    "entries of numbers": ({"entries": [1, 2, 3]}, "entry 0 is 1, not an object"),
    "a string collective_seq_id": ({"entries": [{**entry(31, False), "collective_seq_id": "31"}]},
                                   'entry 0 has collective_seq_id "31", not a JSON number'),
    "another schema": ({"version": "9.0", "entries": [{"seq": 31, "op": "all_reduce"}]},
                       "entry 0 has no collective_seq_id (a record of another schema)"),
    "entries as an object": ({"entries": {"0": entry(31, False)}}, "its entries are a JSON object, not a list"),
    "a list": ([entry(31, False)], "a JSON list, not an object"),
}


@pytest.mark.parametrize("bad", BAD_RECORDS, ids=list(BAD_RECORDS))
def test_a_record_of_the_wrong_shape_is_a_note_on_its_rank_and_the_others_still_name_the_rank_behind(tmp_path, bad):
    record, why = BAD_RECORDS[bad]
    flights: dict[int, Any] = {r: dump_upto(30, False) if r == 3 else dump_upto(31, True) for r in range(6)}
    flights[2] = record
    stacks = {r: main_in(STUCK if r == 3 else COLLECTIVE) for r in range(6)}
    failure = hang(tmp_path, answers(stacks, flights))
    assert (failure.host, failure.rank) == ("node1", 3)
    assert f"rank 2: no Flight Recorder dump (the answer is not a record: {why})" in failure.stack
    (lag,) = failure.flight
    assert (lag.behind, lag.silent, lag.waiting) == ((3,), (2,), (0, 1, 4, 5))
    kept = json.loads((tmp_path / "home" / "jobs" / "fr-9" / "flight" / "flight.json").read_text())
    assert kept["errors"] == {"2": f"the answer is not a record: {why}"}
    with pytest.raises(BadRecord, match="the answer is not a record"):
        ranks.Position.of(record)
    assert lags({0: record, 1: dump_upto(4, True)}) == [Lag("0", "default_pg", 4, "gloo:all_reduce", (1,), (), (),
                                                            silent=(0,))]


def test_a_look_at_ranks_one_of_which_serves_no_record_gives_its_position_as_a_note(tmp_path):
    flights: dict[int, Any] = {r: dump_upto(31, True) for r in range(6)}
    flights[2] = {"entries": [1, 2, 3]}
    stacks = {r: main_in(COLLECTIVE) for r in range(6)}
    rec = JobRecord(id="fr-8", name="fr", spec_path="x.yaml", inventory="inv.yaml", hosts=NODES, backend="ssh",
                    state=JobState.RUNNING)
    seen = ranks.look(Hosts(answers(stacks, flights)), rec)
    assert seen.ranks[2].position is None
    assert seen.ranks[2].no_position == "the answer is not a record: entry 0 is 1, not an object"
    assert seen.ranks[1].position is not None and seen.ranks[1].position.completed == 30


def test_a_rank_with_one_more_thread_is_not_odd_and_the_rank_behind_is_named_with_its_stack(tmp_path):
    # rank 0 runs a logger thread; rank 3 waits for a store key inside torch.distributed, never entering #31
    stacks = {r: main_in(STORE_WAIT if r == 3 else COLLECTIVE) for r in range(6)}
    stacks[0] = main_in(COLLECTIVE, thread("logger", LOGGER))
    flights: dict[int, Any] = {r: dump_upto(30, False) if r == 3 else dump_upto(31, True) for r in range(6)}
    failure = hang(tmp_path, answers(stacks, flights))
    assert (failure.host, failure.rank, failure.address) == ("node1", 3, "10.0.0.11")
    assert failure.reason == ("hang: no progress from any rank for 15 s; rank 3 on node1 is not where the others "
                              "wait: it has not entered collective #31 gloo:all_reduce (Flight Recorder)")
    assert failure.stack[:2] == ("stack of rank 3 (get ← load_batch (train.py:23)):", "  thread MainThread:")
    assert "ranks 0-2,4-5 wait in: all_reduce ← steps (train.py:41)" in failure.stack
    # The stacks alone (no Flight Recorder) say the same: threads other than the one in the collective don't count.
    no_flight = {r: "ERROR no socket served" for r in range(6)}
    by_stacks = hang(tmp_path, answers(stacks, no_flight))
    assert (by_stacks.rank, by_stacks.reason.split("; ")[1]) == (3, "rank 3 on node1 is not where the others wait")


def test_the_flight_recorder_decides_the_odd_rank_over_the_stacks_which_say_where_it_is(tmp_path):
    # rank 1 is alone in its stack (a different line of the loop), yet every rank but 3 waits in #31
    stacks = {r: main_in(COLLECTIVE) for r in range(6)}
    stacks[1] = main_in([COLLECTIVE[0], ("steps", "/w/train.py", 44)])
    stacks[3] = main_in([COLLECTIVE[0], ("steps", "/w/train.py", 47)])
    flights: dict[int, Any] = {r: dump_upto(30, False) if r == 3 else dump_upto(31, True) for r in range(6)}
    failure = hang(tmp_path, answers(stacks, flights))
    assert failure.rank == 3 and failure.stack[0] == "stack of rank 3 (all_reduce ← steps (train.py:47)):"
    assert failure.stack[1:] == ("  thread MainThread:", "    all_reduce (torch/distributed/distributed_c10d.py:2806)",
                                 "    steps (train.py:47)", "rank 1 waits in: all_reduce ← steps (train.py:44)",
                                 "ranks 0,2,4-5 (the majority) wait in: all_reduce ← steps (train.py:41)")


def test_two_ranks_alone_in_their_stacks_are_not_told_apart_by_rank_order(tmp_path):
    stacks = {r: main_in(COLLECTIVE) for r in range(6)}
    stacks[0] = main_in([COLLECTIVE[0], ("steps", "/w/train.py", 44)])
    stacks[3] = main_in([COLLECTIVE[0], ("steps", "/w/train.py", 47)])
    failure = hang(tmp_path, answers(stacks, {r: "ERROR no socket served" for r in range(6)}))
    assert (failure.host, failure.rank) == ("", None)
    assert failure.reason.endswith("; the ranks wait in 3 places, none of them the odd one out")


def test_a_stopped_rank_that_gave_no_record_is_named_and_its_neighbours_held_in_the_collective_are_not(tmp_path):
    # rank 3 SIGSTOPped inside all_reduce #104: ranks 2 and 4 (its ring neighbours) are still in #104,
    # ranks 0-1,5 completed it and wait in #105; rank 3 cannot answer, nor can py-spy read it.
    flights: dict[int, Any] = {r: dump_upto(104 if r in (2, 4) else 105, True) for r in range(6)}
    flights[3] = "ERROR it cannot answer: stopped: state T in /proc/4242/stat (stopped by a signal (SIGSTOP, SIGTSTP))"
    stacks: dict[int, list[dict[str, Any]] | str] = {r: main_in(COLLECTIVE) for r in range(6)}
    stacks[3] = STOPPED
    failure = hang(tmp_path, answers(stacks, flights))
    assert (failure.host, failure.rank) == ("node1", 3)
    assert failure.reason.endswith("rank 3 on node1 is not where the others wait: it gave no Flight Recorder "
                                   "record while the others wait in collective #105 gloo:all_reduce")
    (lag,) = failure.flight
    assert (lag.behind, lag.silent, lag.blocked, lag.blocked_in) == ((), (3,), (2, 4), (104, 104))
    assert lag.line() == ("rank 3 gave no record (did not answer): the likeliest cause, as ranks 0-1,5 wait in "
                          "collective #105 gloo:all_reduce (ranks 2,4 are still in #104)")
    assert failure.stack[:2] == (f"stack of rank 3 ({STOPPED}):", f"  {STOPPED}")
    assert Lag.from_dict(json.loads(json.dumps(lag.to_dict()))) == lag


def test_a_hang_without_py_spy_says_in_its_reason_the_rank_the_flight_recorder_names(tmp_path):
    flights: dict[int, Any] = {r: dump_upto(29, False) if r == 3 else dump_upto(30, True) for r in range(6)}
    failure = hang(tmp_path, answers({r: [] for r in range(6)}, flights, pyspy=False))
    assert (failure.host, failure.rank) == ("node1", 3)
    assert failure.reason == ("hang: no progress from any rank for 15 s; rank 3 on node1 is not where the others "
                              "wait: it has not entered collective #30 gloo:all_reduce (Flight Recorder)")
    assert "unknown" not in failure.reason
    assert failure.stack[0].startswith("node0: no stacks: node0: py-spy is not installed")


def test_a_lag_recorded_before_silent_and_blocked_ranks_reads_back_with_none():
    old = {"group": "0", "desc": "default_pg", "seq": 31, "collective": "gloo:all_reduce", "waiting": [0, 1],
           "behind": [3], "last": [30]}
    assert Lag.from_dict(old) == Lag("0", "default_pg", 31, "gloo:all_reduce", (0, 1), (3,), (30,))


def serve_once(path: str, reply: bytes) -> threading.Thread:
    """A Unix socket at `path` that answers one request with `reply`, as a rank's program might."""
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(1)

    def answer() -> None:
        with server:
            conn, _ = server.accept()
            with conn:
                conn.recv(65536)
                conn.sendall(reply)
    serving = threading.Thread(target=answer, daemon=True)
    serving.start()
    return serving


@pytest.fixture
def sock(own_tmp: Path) -> Iterator[str]:  # noqa: F811
    yield str(own_tmp / "rank2.sock")


def test_a_rank_that_answers_garbage_gets_one_line_of_error(sock):
    serve_once(sock, b"HELLO\r\nWORLD\n\x1b[31m\n")
    got = fetch(sock)
    assert set(got) == {"flight_error"} and "\n" not in got["flight_error"] and "\x1b" not in got["flight_error"]
    assert got["flight_error"].startswith("BadStatusLine: ")


def test_a_rank_that_serves_json_of_the_wrong_shape_gets_why_it_is_not_a_record(sock):
    body = json.dumps({"entries": [1, 2, 3]}).encode()
    serve_once(sock, b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
    assert fetch(sock) == {"flight_error": "the answer is not a record: entry 0 is 1, not an object"}
