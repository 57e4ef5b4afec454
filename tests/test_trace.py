"""`distrun trace` over recorded and synthetic job directories: a valid Chrome Trace Event file,
every rank's collectives as slices in order on one clock, alerts of both forms, the failed rank's
lines, what is missing said in a line, and the size and time of a 64-rank trace."""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

import pytest

from orchestrator.report.events import alert_event
from orchestrator.report.timeline import place, read_rounds, step_period
from orchestrator.report.trace import write_trace
from orchestrator.store import JobRecord, JobState, Store
from tests.helpers import distrun

RECORDED = Path(__file__).parent / "data" / "trace" / "quiet-2x1"  # a real 2-rank run of quiet_ddp.py
T0 = 1_795_000_000.0
PHASES = {"X", "i", "C", "M"}


# ---------------------------------------------------------------- jobs


@pytest.fixture
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Store:
    monkeypatch.setenv("DISTRUN_HOME", str(tmp_path / "home"))
    return Store()


def recorded_job(store: Store, job_id: str = "quiet-20261128-053528-0e3a2c", **fields: Any) -> JobRecord:
    """The recorded 2-rank run, as its record and job directory (a copy)."""
    end = json.loads((RECORDED / "end.json").read_text())
    attempt = end["attempts"][0]
    record = JobRecord(id=job_id, name="quiet", spec_path="quiet.yaml", inventory="<built-in>", hosts=["localhost"],
                       backend="local", state=JobState.SUCCEEDED, started=attempt["started"], ended=end["ended"],
                       exit_code=0, attempts=end["attempts"], **fields)
    store.save(record)
    shutil.copytree(RECORDED, store.job_dir(job_id).root)
    return record


def synthetic_rows(hosts: int, nproc: int, count: int, late: dict[int, float], every: int = 400,
                   step_s: float = 0.05) -> list[dict[str, Any]]:
    """collectives.jsonl as `hosts` hosts write it: a round every `every` collectives, each rank's
    collectives since the last; rank r enters collective n at n * step_s + late[r] seconds."""
    rows = []
    ops = ["all_reduce"] * 3 + ["broadcast"]
    for upto in range(every, count + every, every):
        upto = min(upto, count)
        for host in range(hosts):
            ranks = {}
            for rank in range(host * nproc, (host + 1) * nproc):
                entered = [[seq, ops[seq % 4], int((T0 + seq * step_s + late.get(rank, 0.0)) * 1e6)]
                           for seq in range(upto - every + 1, upto + 1)]
                ranks[str(rank)] = {"done": upto, "entered": upto, "c": entered}
            rows.append({"t": T0 + upto * step_s + 1.0, "node": f"node{host}", "ranks": ranks, "skipped": {}})
    return rows


def synthetic_job(store: Store, job_id: str, rows: list[dict[str, Any]] | None, hosts: int, nproc: int,
                  worker: bool = True, **fields: Any) -> JobRecord:
    """A recorded job of `hosts` x `nproc` with these collectives rows (None: no collectives.jsonl)."""
    record = JobRecord(id=job_id, name=job_id, spec_path="j.yaml", inventory="inv.yaml",
                       hosts=[f"node{h}" for h in range(hosts)], state=fields.pop("state", JobState.SUCCEEDED),
                       started=T0 - 5, ended=T0 + 200, **fields)
    store.save(record)
    job_dir = store.job_dir(job_id)
    job_dir.create()
    entry = ["~/.distrun/jobs/x/bin/distrun_worker.py"] if worker else []
    plan = {"hosts": [{"node": f"node{h}", "host": f"10.0.0.{10 + h}", "node_rank": h, "nproc": nproc,
                       "argv": ["python", "-P", "distrun_torchrun.py", *entry, "train.py"]} for h in range(hosts)]}
    job_dir.plan.write_text(json.dumps(plan))
    if rows is not None:
        job_dir.collectives.write_text("".join(json.dumps(r) + "\n" for r in rows))
    samples = [{"kind": "host", "t": T0 + i, "node": f"node{h}", "cpu_pct": 50.0 + h, "load1": 1.0,
                "mem_used_mb": 900.0} for i in range(5) for h in range(hosts)]
    job_dir.telemetry.write_text("".join(json.dumps(s) + "\n" for s in samples))
    return record


def trace_of(store: Store, record: JobRecord, tmp_path: Path) -> tuple[dict[str, Any], list[str]]:
    path, _, missing = write_trace(record, store.job_dir(record.id), tmp_path / f"{record.id}.json")
    return json.loads(path.read_text()), missing


# ---------------------------------------------------------------- reading a trace back


def check_valid(trace: dict[str, Any]) -> None:
    """What Perfetto's and chrome://tracing's JSON importers need of every event."""
    assert isinstance(trace["traceEvents"], list) and trace["displayTimeUnit"] == "ms"
    for event in trace["traceEvents"]:
        assert event["ph"] in PHASES, event
        assert isinstance(event["pid"], int) and isinstance(event["tid"], int), event
        if event["ph"] != "M":
            assert isinstance(event["ts"], int) and event["ts"] >= 0, event
        if event["ph"] == "X":
            assert isinstance(event["dur"], int) and event["dur"] >= 1, event
        if event["ph"] == "i":
            assert event["s"] in ("t", "p", "g"), event


def names(trace: dict[str, Any]) -> tuple[dict[int, str], dict[tuple[int, int], str]]:
    """The processes' and threads' names."""
    meta = [e for e in trace["traceEvents"] if e["ph"] == "M"]
    processes = {e["pid"]: e["args"]["name"] for e in meta if e["name"] == "process_name"}
    threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in meta if e["name"] == "thread_name"}
    return processes, threads


def slices(trace: dict[str, Any]) -> dict[tuple[int, int], list[dict[str, Any]]]:
    """Each rank's collective slices by (pid, tid), in file order."""
    by_rank: dict[tuple[int, int], list[dict[str, Any]]] = {}
    for event in trace["traceEvents"]:
        if event["ph"] == "X":
            by_rank.setdefault((event["pid"], event["tid"]), []).append(event)
    return by_rank


def check_in_order(by_rank: dict[tuple[int, int], list[dict[str, Any]]]) -> None:
    """Every rank's collectives in sequence order, each entered no earlier than the one before."""
    for key, events in by_rank.items():
        seqs = [e["args"]["seq"] for e in events]
        assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs), key
        starts = [e["ts"] for e in events]
        assert starts == sorted(starts), key


# ---------------------------------------------------------------- tests


def test_a_real_two_rank_run_is_a_valid_trace_with_each_ranks_collectives_in_order(store, tmp_path):
    trace, missing = trace_of(store, recorded_job(store), tmp_path)

    check_valid(trace)
    assert missing == []
    processes, threads = names(trace)
    assert processes == {0: "job quiet-20261128-053528-0e3a2c", 1: "localhost"}
    assert threads == {(1, 0): "rank 0", (1, 1): "rank 1"}
    by_rank = slices(trace)
    check_in_order(by_rank)
    rows = [json.loads(line) for line in (RECORDED / "collectives.jsonl").read_text().splitlines()]
    recorded = {r: {c[0] for row in rows for c in row["ranks"].get(str(r), {}).get("c", [])} for r in (0, 1)}
    assert {r: {e["args"]["seq"] for e in by_rank[(1, r)]} for r in (0, 1)} == recorded
    # One clock: the same collective's two entries lie within a few ms of each other.
    entered = {r: {e["args"]["seq"]: e["ts"] for e in by_rank[(1, r)]} for r in (0, 1)}
    gaps = sorted(abs(entered[0][s] - entered[1][s]) for s in recorded[0] & recorded[1])
    assert gaps[len(gaps) // 2] < 5000, gaps[-10:]
    counters = {e["name"] for e in trace["traceEvents"] if e["ph"] == "C"}
    assert counters == {"cpu %", "load", "memory used MB"}
    instants = [e["name"] for e in trace["traceEvents"] if e["ph"] == "i"]
    assert instants == ["attempt 1 started on localhost", "attempt 1 ended: succeeded"]


def test_a_slice_ends_when_the_last_rank_entered_and_a_late_host_stands_out():
    rows = synthetic_rows(3, 2, 400, late={4: 0.030, 5: 0.035}, every=100)
    timeline = place(read_rounds(rows))

    first = {r: timeline.ranks[r][0] for r in range(6)}
    assert all(c.seq == 1 and c.ranks_seen == 6 for c in first.values())
    assert {r: c.end_us - c.entered_us for r, c in first.items()} == {
        0: 35000, 1: 35000, 2: 35000, 3: 35000, 4: 5000, 5: 0}
    assert {r: c.late_us for r, c in first.items()} == {0: 0, 1: 0, 2: 0, 3: 0, 4: 30000, 5: 35000}
    assert step_period([c.op for c in timeline.ranks[0]]) == 4


def test_a_collective_not_completed_when_last_read_runs_to_that_read():
    rows = synthetic_rows(1, 2, 100, late={}, every=100)
    rows[-1]["ranks"]["1"]["done"] = 99  # rank 1 is still in collective 100
    timeline = place(read_rounds(rows))

    last = timeline.ranks[1][-1]
    assert (last.seq, last.completed) == (100, False)
    assert last.end_us == int(rows[-1]["t"] * 1e6)
    assert timeline.ranks[0][-1].completed


def test_rows_written_by_a_later_distrun_or_damaged_are_read_for_what_they_hold():
    rows: list[Any] = [
        {"t": T0, "node": "n0", "ranks": {"0": {"done": 2, "entered": 2,
                                                "c": [[1, "all_reduce", 10, 250, "x"], [2, "barrier", 20]]}}},
        {"t": "soon", "node": "n0", "ranks": {}},
        {"t": T0 + 1, "node": "n0", "ranks": {"1": {"c": [[1], "junk", [0, "all_reduce", 5]]}, "x": {}},
         "skipped": {"2": "no answer within 1 s"}},
    ]
    rounds = read_rounds(rows)

    assert [c.extra for c in rounds.collectives[0].values()] == [(250, "x"), ()]
    assert rounds.collectives[1] == {}
    assert rounds.skipped == {2: "no answer within 1 s"}


def test_alerts_kept_as_data_or_as_an_older_distrun_wrote_them_are_on_their_rank_or_host():
    started = time.mktime((2026, 11, 28, 23, 59, 0, 0, 0, -1))
    old = alert_event("23:59:30 node2: straggler: rank 5 on node2 enters all_reduce 156 ms after the others", started)
    after_midnight = alert_event("00:00:10 node1: stall: no rank progressed for 300 s", started)
    new = alert_event({"t": started + 5, "node": "node1", "rule": "idle", "rank": None, "message": "gpu0 idle",
                       "figures": {"util": 0}}, started)

    assert old is not None and (old.t, old.kind, old.node, old.rank) == (started + 30, "straggler", "node2", 5)
    assert after_midnight is not None and (after_midnight.t, after_midnight.kind) == (started + 70, "stall")
    assert new is not None and (new.kind, new.rank, new.args) == ("idle", None, {"figures": {"util": 0}})
    assert alert_event("not an alert", started) is None and alert_event(42, started) is None


def test_alerts_failures_and_the_failed_ranks_lines_are_instants_where_they_belong(store, tmp_path):
    failure = {"host": "localhost", "kind": "exit", "rank": 1, "exit_code": 1, "time": 1795843340.0,
               "last_lines": ["epoch 3 loss 0.1"]}
    alerts = ["05:22:10 localhost: straggler: rank 1 on localhost enters all_reduce 80 ms after the others",
              {"t": 1795843335.0, "node": "localhost", "rule": "stall", "rank": None, "message": "stall: 300 s",
               "figures": {}}]
    record = recorded_job(store, failures=[failure], alerts=alerts)
    trace, _ = trace_of(store, record, tmp_path)

    instants = [e for e in trace["traceEvents"] if e["ph"] == "i"]
    by_cat: dict[str, list[dict[str, Any]]] = {}
    for event in instants:
        by_cat.setdefault(event["cat"], []).append(event)
    assert [(e["pid"], e["tid"], e["s"]) for e in by_cat["failure"]] == [(1, 1, "t")]
    assert [(e["pid"], e["s"]) for e in by_cat["stall"]] == [(0, "g")]
    straggler = by_cat["straggler"][0]
    assert (straggler["pid"], straggler["tid"]) == (1, 1)
    assert "line" not in by_cat  # rank 1 printed nothing (rank 0 prints the epochs)


def test_the_failed_ranks_lines_come_with_the_time_they_arrived(store, tmp_path):
    failure = {"host": "localhost", "kind": "exit", "rank": 0, "exit_code": 1, "time": 1795843340.0}
    trace, _ = trace_of(store, recorded_job(store, failures=[failure]), tmp_path)

    lines = [e for e in trace["traceEvents"] if e["ph"] == "i" and e["cat"] == "line"]
    expected = (RECORDED / "ranks" / "0.out").read_text().splitlines()[-300:]
    assert [e["args"]["line"] for e in lines] == expected
    assert lines[0]["name"] == expected[0] and all((e["pid"], e["tid"]) == (1, 0) for e in lines)
    assert [e["ts"] for e in lines] == sorted(e["ts"] for e in lines)


def test_a_job_with_flight_recorder_false_still_traces_its_telemetry_and_says_why_no_collectives(store, tmp_path):
    record = synthetic_job(store, "nofr", None, 2, 2, worker=False)
    trace, missing = trace_of(store, record, tmp_path)

    check_valid(trace)
    assert missing == ["no collectives: the job ran with `flight_recorder: false`, so no rank's Flight Recorder "
                       "was read"]
    assert trace["otherData"]["missing"] == missing
    assert not slices(trace) and sum(e["ph"] == "C" for e in trace["traceEvents"]) == 30


def test_an_older_job_directory_without_collectives_and_with_text_alerts_still_reads(store, tmp_path):
    record = synthetic_job(store, "older", None, 1, 2, alerts=["04:00:00 node0: gpu0 idle for 60 s"])
    trace, missing = trace_of(store, record, tmp_path)

    check_valid(trace)
    assert missing[0].startswith("no collectives: this job directory has no collectives.jsonl (written by an "
                                 "older distrun")


def test_ranks_that_never_answer_and_a_torch_without_the_control_plane_are_each_one_line(store, tmp_path):
    rows = synthetic_rows(3, 2, 100, late={}, every=100)
    rows[2] = {"t": rows[2]["t"], "node": "node2", "ranks": {}, "skipped": {"4": "no answer within 1 s", "5": "x"}}
    silent = synthetic_job(store, "silent", rows, 3, 2, state=JobState.RUNNING)
    empty = synthetic_job(store, "noserver", [], 1, 2)

    trace, missing = trace_of(store, silent, tmp_path)
    assert missing == ["the job is running: what it recorded so far",
                       "rank 4-5 (node2): no collectives recorded (its last Flight Recorder read: no answer "
                       "within 1 s)"]
    assert len(slices(trace)) == 4
    assert trace_of(store, empty, tmp_path)[1] == [
        "no collectives: no rank served its Flight Recorder: a torch without the control plane "
        "(torch.distributed.elastic.control_plane, torch 2.7 on) serves none; `distrun doctor` names such hosts"]


def test_a_trace_of_64_ranks_and_2000_collectives_is_written_in_a_few_seconds(store, tmp_path):
    record = synthetic_job(store, "big", synthetic_rows(8, 8, 2000, late={}), 8, 8)

    began, cpu = time.perf_counter(), time.process_time()
    path, events, _ = write_trace(record, store.job_dir(record.id), tmp_path / "big.json")
    took, cpu = time.perf_counter() - began, time.process_time() - cpu

    size = path.stat().st_size
    print(f"MEASURED 64 ranks x 2000 collectives: {events} events, {size / 1e6:.1f} MB, written in {cpu:.2f} s "
          f"of CPU ({took:.2f} s wall, load {os.getloadavg()[0]:.0f})")
    assert events > 64 * 2000 and cpu < 4.0  # CPU time: the wall clock of a shared 2-core machine is its load's
    check_in_order(slices(json.loads(path.read_text())))


def test_distrun_trace_writes_the_file_and_says_how_to_open_it(store, tmp_path):
    record = recorded_job(store)
    home = tmp_path / "home"

    done = distrun("trace", "last", "-o", str(tmp_path / "t.json"), home=home)
    wrong = distrun("trace", "nosuchjob", home=home)

    assert done.returncode == 0, done.stderr
    assert f"trace written to {tmp_path / 't.json'}" in done.stdout and "ui.perfetto.dev" in done.stdout
    assert json.loads((tmp_path / "t.json").read_text())["otherData"]["job"] == record.id
    assert wrong.returncode == 2 and "nosuchjob" in wrong.stderr and "Traceback" not in wrong.stderr


def test_gpu_samples_are_counters_named_by_gpu_and_a_skewed_hosts_clock_is_shifted(store, tmp_path):
    record = synthetic_job(store, "gpus", synthetic_rows(2, 1, 100, late={}, every=100), 2, 1)
    job_dir = store.job_dir(record.id)
    with job_dir.telemetry.open("a") as out:
        out.write(json.dumps({"kind": "gpu", "t": T0 + 1, "node": "node1", "gpu": 3, "util": 97.0,
                              "mem_used_mb": 70000.0}) + "\n")
    job_dir.facts.write_text(json.dumps({"node0": {"clock_skew": 0.2}, "node1": {"clock_skew": 3.0}}))
    trace, _ = trace_of(store, record, tmp_path)

    counters = {(e["pid"], e["name"]) for e in trace["traceEvents"] if e["ph"] == "C"}
    assert {(2, "gpu3 util %"), (2, "gpu3 memory used MB")} <= counters
    first = {e["tid"]: e["ts"] for e in trace["traceEvents"] if e["ph"] == "X" and e["args"]["seq"] == 1}
    assert first[0] - first[1] == 3_000_000  # node1 (rank 1) 3 s ahead: put back on the controller's clock
    late = {e["tid"]: e["args"]["late_ms"] for e in trace["traceEvents"] if e["ph"] == "X" and e["args"]["seq"] == 1}
    assert late == {0: 3000.0, 1: 0.0}  # lateness on the same clock


def test_a_job_whose_directory_was_pruned_still_traces_its_record(store, tmp_path):
    failure = {"host": "node0", "kind": "exit", "rank": 0, "exit_code": 1, "time": T0 + 3}
    record = synthetic_job(store, "pruned", None, 1, 2, state=JobState.FAILED, failures=[failure])
    shutil.rmtree(store.job_dir(record.id).root)
    trace, missing = trace_of(store, record, tmp_path)

    check_valid(trace)
    assert missing == [f"no job directory ({store.job_dir(record.id).root} is gone: `distrun prune` removes it): "
                       "only the record's alerts, failures and attempts"]
    assert [e["cat"] for e in trace["traceEvents"] if e["ph"] == "i"] == ["failure"]
