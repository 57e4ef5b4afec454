"""Stragglers and progress from the ranks' Flight Recorders: the host's reduction of a dump
(orchestrator/remote/frpoll.py), the straggler rule over the hosts' events
(orchestrator/diagnose/stragglers.py's FlightDetector), the progress (diagnose/flight.py's
FlightProgress) and the live monitor's alert (telemetry/view.py).

tests/data/flight/entries/*.json.gz are real fr_trace_json answers (torch 2.13, gloo, CPU) of 3
ranks that ran 90 steps of two all_reduces each, fetched after the last step: `late2_*` each rank
sleeping 50 ms before a step's first all_reduce, rank 2 200 ms more; `even_*` every rank 250 ms.
"""

from __future__ import annotations

import copy
import gzip
import json
import os
import socket
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from orchestrator.diagnose.progress import FlightProgress, progress_line
from orchestrator.diagnose.stragglers import FlightDetector, LateRank
from orchestrator.remote.frpoll import MAX_COLLECTIVES, Poller, reduce
from orchestrator.remote.provenance import own_roots
from orchestrator.telemetry.view import Monitor

DATA = Path(__file__).parent / "data" / "flight" / "entries"


def dumps(kind: str) -> dict[int, dict[str, Any]]:
    return {rank: json.loads(gzip.decompress((DATA / f"{kind}_rank{rank}.json.gz").read_bytes())) for rank in range(3)}


def events(kind: str, polls: int = 1) -> list[tuple[str, dict[str, Any]]]:
    """Each rank's dump as its host's `fr` events (rank r on node<r>), cut into `polls` rounds as a
    host that polled it `polls` times while it ran would have sent it."""
    found = []
    for rank, dump in dumps(kind).items():
        entries = dump["entries"]
        sent = 0
        for cut in range(1, polls + 1):
            seen = {**dump, "entries": entries[:len(entries) * cut // polls]}
            summary = reduce(seen, sent)
            sent = summary["c"][-1][0] if summary["c"] else sent
            found.append((f"node{rank}", {"ranks": {str(rank): summary}, "skipped": {}}))
    return found


def named(kind: str, polls: int = 1, data: list[tuple[str, dict[str, Any]]] | None = None) -> list[LateRank]:
    detector = FlightDetector(world_size=3)
    return [late for node, event in (data or events(kind, polls)) for late in detector.observe(node, event)]


def test_a_dump_is_reduced_to_each_collectives_sequence_op_and_entry_time_past_the_last_sent():
    dump = dumps("late2")[2]
    summary = reduce(dump, after=170)
    assert (summary["done"], summary["entered"]) == (180, 180)
    assert [c[0] for c in summary["c"]] == list(range(171, 181))
    first = next(e for e in dump["entries"] if e["collective_seq_id"] == 171)
    assert summary["c"][0] == [171, "all_reduce", first["time_created_ns"] // 1000]
    assert len(json.dumps(reduce(dump, 0))) < len(json.dumps(dump)) / 4  # the event is small


def test_a_reduced_dump_keeps_only_the_latest_collectives():
    dump = copy.deepcopy(dumps("even")[0])
    dump["entries"] = dump["entries"] * 2  # more entries than an event carries
    assert len(reduce(dump, 0)["c"]) == MAX_COLLECTIVES


def test_the_rank_that_enters_the_all_reduces_200_ms_late_is_named_with_its_host_and_by_how_much():
    (late,) = named("late2")
    assert (late.node, late.rank, late.op, late.intervals) == ("node2", 2, "all_reduce", 3)
    assert 0.19 < late.late_s < 0.25
    assert late.late * 2 == late.collectives  # the step's first all_reduce of two
    assert late.message().startswith(
        "straggler: rank 2 on node2 enters all_reduce 200 ms after the others "
        f"(median over the {late.late} of {late.collectives} collectives it entered late, 3 intervals in a row)")


def test_the_same_rank_is_named_when_the_hosts_sent_the_dumps_in_rounds():
    assert [(late.node, late.rank) for late in named("late2", polls=5)] == [("node2", 2)]


def test_ranks_that_enter_together_name_no_straggler():
    assert named("even") == []
    assert named("even", polls=5) == []


def test_a_rank_late_for_fewer_intervals_than_the_rule_asks_is_not_named():
    data = events("even")
    _, event = data[2]
    collectives = event["ranks"]["2"]["c"]
    start = collectives[0][2]
    # Rank 2 late by 200 ms for the first 9 s of the run only: under 3 intervals of 5 s.
    event["ranks"]["2"]["c"] = [[seq, op, t + 200_000 if t - start < 9_000_000 else t] for seq, op, t in collectives]
    assert named("even", data=data) == []
    event["ranks"]["2"]["c"] = [[seq, op, t + 200_000] for seq, op, t in collectives]
    assert [late.rank for late in named("even", data=data)] == [2]


def test_a_rank_late_by_much_in_few_collectives_is_named_when_the_others_wait_for_it_a_tenth_of_the_time():
    # A host whose CPU comes in slices (a quota, a throttled VM) is late only where a slice ended between
    # two collectives: here every 8th (collectives 127 ms apart), by 150 ms: 1 in 8 by count, 15 % by time.
    data = events("even")
    _, event = data[2]
    collectives = event["ranks"]["2"]["c"]
    def late_every(nth: int) -> list[list[Any]]:
        return [[seq, op, t + 150_000 if i % nth == 0 else t] for i, (seq, op, t) in enumerate(collectives)]

    event["ranks"]["2"]["c"] = late_every(8)
    assert [late.rank for late in named("even", data=data)] == [2]
    event["ranks"]["2"]["c"] = late_every(20)
    assert named("even", data=data) == []  # 6 % of the time: a hiccup, not a straggler


def test_a_collective_is_judged_only_once_every_rank_reported_it():
    data = events("late2")
    detector = FlightDetector(world_size=3)
    assert [detector.observe(node, event) for node, event in data[:2]] == [[], []]
    assert detector.judged == 0
    assert [late.rank for late in detector.observe(*data[2])] == [2]


def test_progress_is_each_ranks_last_completed_collective_and_the_slowest_ranks_rate():
    progress = FlightProgress()
    progress.observe({"ranks": {"0": {"done": 100}, "1": {"done": 98}}}, now=10.0)
    progress.observe({"ranks": {"0": {"done": 150}, "1": {"done": 148}}}, now=15.0)
    assert progress.to_dict() == {"collectives_per_s": 10.0, "collectives": 148, "ranks": {"0": 150, "1": 148},
                                  "at": 15.0}
    assert progress_line(progress.to_dict()) == "10.0 collectives/s, ranks at #148 (1), #150 (0)"


def test_the_monitor_alerts_with_the_hosts_telemetry_as_evidence_and_keeps_the_progress():
    fired: list[Any] = []
    monitor = Monitor(["node0", "node1", "node2"], 1.0, fired.extend, lambda node: True, "job", world_size=3)
    monitor.sample("node2", {"kind": "host", "load1": 5.12, "cpu_pct": 97.6, "job_cpu_pct": 40.0,
                             "mem_used_mb": 410.0, "mem_total_mb": 1000.0})
    for node, event in events("late2"):
        progress = monitor.flight(node, event)
    (alert,) = fired
    assert (alert.node, alert.rule) == ("node2", "straggler")
    assert alert.message.endswith("; node2 now: load 5.1, cpu 98%, job cpu 40%, memory 41%")
    assert (alert.rank, alert.figures["op"], alert.evidence) == (2, "all_reduce", alert.message.split("; ")[-1])
    assert progress["ranks"] == {"0": 180, "1": 180, "2": 180}
    assert "progress " in str(monitor.frame().caption)


@pytest.fixture
def sock_dir():
    with tempfile.TemporaryDirectory(dir="/tmp") as directory:  # a short path: a Unix socket's limit
        yield directory


def test_a_rank_that_does_not_answer_within_the_bound_is_skipped_not_waited_for(sock_dir):
    silent = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    silent.bind(os.path.join(sock_dir, "rank3.sock"))
    silent.listen()  # accepts, never answers
    accepted = threading.Thread(target=silent.accept, daemon=True)
    accepted.start()
    started = time.monotonic()
    fields = Poller(sock_dir, own_roots(), bound=0.5).round()
    assert time.monotonic() - started < 2.0
    assert fields is not None and fields["ranks"] == {}
    assert "3" in fields["skipped"]
    silent.close()


def test_a_host_where_no_rank_serves_sends_no_event(sock_dir):
    assert Poller(sock_dir, own_roots()).round() is None


def test_a_rank_the_metrics_lines_named_is_not_named_again_from_the_flight_recorders():
    fired: list[Any] = []
    monitor = Monitor(["node0", "node1", "node2"], 1.0, fired.extend, lambda node: True, "job", world_size=3)
    for step in range(1, 6):
        for rank in range(3):
            monitor.metrics(f"node{rank}", {"step": step, "rank": rank, "busy_s": 1.0 if rank == 2 else 0.1})
    for node, event in events("late2"):
        monitor.flight(node, event)
    assert [(a.node, a.message.split(" takes ")[0]) for a in fired] == [("node2", "straggler: rank 2")]


def test_on_a_loaded_host_where_every_rank_is_late_now_and_then_nobody_is_named():
    # make demo's false alarm (one host, 2 ranks, load 12): each rank 150 ms late in a third of the collectives,
    # turn about: by the old rule each was late in over a quarter of them, and one was named.
    data = [(node, copy.deepcopy(fr)) for node, fr in events("even")][:2]
    for rank, (_, fr) in enumerate(data):
        collectives = fr["ranks"][str(rank)]["c"]
        fr["ranks"][str(rank)]["c"] = [[seq, op, t + 150_000 if i % 3 == rank else t]
                                       for i, (seq, op, t) in enumerate(collectives)]
    detector = FlightDetector(world_size=2)
    assert [late for node, fr in data for late in detector.observe(node, fr)] == []
    _, fr = data[1]
    fr["ranks"]["1"]["c"] = [[seq, op, t + 150_000] for seq, op, t in fr["ranks"]["1"]["c"]]  # now rank 1 always
    detector = FlightDetector(world_size=2)
    assert [late.rank for node, fr in data for late in detector.observe(node, fr)] == [1]


def test_a_collective_one_rank_never_reports_is_passed_over_not_waited_for_forever():
    data = events("late2")
    _, fr = data[0]
    fr["ranks"]["0"]["c"] = [c for c in fr["ranks"]["0"]["c"] if c[0] != 5]  # fell out of rank 0's event
    detector = FlightDetector(world_size=3)
    assert [late.rank for node, fr in data for late in detector.observe(node, fr)] == [2]
    assert detector.entered == {}
