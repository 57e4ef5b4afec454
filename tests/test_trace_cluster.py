"""`distrun trace` of a real 3 hosts x 2 run (namespace hosts, SSH, gloo on CPU) of a program written
as third-party examples are (tests/data/trace/quiet_ddp.py: prints nothing for distrun), with node2's
ranks slowed from outside: read back, the trace is valid, every rank's collectives are slices in
order on one clock, node2's ranks enter late while the others wait, and a trace taken while the job
runs is the run so far."""

from __future__ import annotations

import json
import statistics
import threading
import time
from pathlib import Path

import pytest

from tests.cluster.test_flight_straggler_cluster import duty_cycle, rank_pids
from tests.cluster.test_launch_cluster import output, start, write_job
from tests.helpers import distrun, unique_job_id, wait_for
from tests.test_trace import check_in_order, check_valid, names, slices

pytestmark = pytest.mark.cluster

PROGRAM = Path(__file__).parent / "data" / "trace" / "quiet_ddp.py"
SLOW_HOST = 2
HEALTHY_S, SLOWED_S = 20, 35
VERY_LATE_MS = 20.0


def trace(home: Path, job_id: str, path: Path) -> tuple[dict, str]:
    done = distrun("trace", job_id, "-o", str(path), home=home)
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads(path.read_text()), done.stdout


def last_us(trace: dict) -> int:
    """The time of a trace's last event, µs since the epoch."""
    return trace["otherData"]["epoch_us"] + max(e["ts"] for e in trace["traceEvents"] if e["ph"] != "M")


def standing(by_rank: dict, since_us: int) -> tuple[dict[int, float], dict[int, float]]:
    """Over the collectives every rank recorded after `since_us`: each rank's mean lateness at entry
    (ms), and the share of them it entered more than VERY_LATE_MS after the first rank."""
    by_seq: dict[int, dict[int, dict]] = {}
    for (_, tid), events in by_rank.items():
        for event in events:
            if event["ts"] >= since_us:
                by_seq.setdefault(event["args"]["seq"], {})[tid] = event
    whole = [ranks for ranks in by_seq.values() if len(ranks) == len(by_rank)]
    late = {r: statistics.fmean(ranks[r]["args"]["late_ms"] for ranks in whole) for r in by_rank_tids(by_rank)}
    return late, {r: sum(ranks[r]["args"]["late_ms"] > VERY_LATE_MS for ranks in whole) / len(whole) for r in late}


def by_rank_tids(by_rank: dict) -> list[int]:
    return sorted(tid for _, tid in by_rank)


def test_a_three_host_run_is_one_valid_timeline_where_the_slowed_hosts_ranks_stand_out(cluster3, tmp_path):
    home, job_id = tmp_path / "home", unique_job_id("trace3x2")
    inv = cluster3.write_inventory(tmp_path / "inv.yaml")
    job = write_job(tmp_path, "trace3x2", ["--seconds", str(HEALTHY_S + SLOWED_S)], script=PROGRAM, heartbeat=20)
    proc = start(job, inv, home, job_id, "--no-live")
    stop = threading.Event()
    try:
        assert wait_for(lambda: len(rank_pids(cluster3, SLOW_HOST, job_id)) == 2, 120), output(home, job_id)
        assert wait_for(lambda: "epoch 3 loss" in output(home, job_id), 120), output(home, job_id)
        time.sleep(HEALTHY_S / 2)
        slowed = time.time()
        threading.Thread(target=duty_cycle, args=(rank_pids(cluster3, SLOW_HOST, job_id), stop), daemon=True).start()
        time.sleep(10)
        so_far, said = trace(home, job_id, tmp_path / "running.json")
    finally:
        stop.set()
    assert proc.wait(timeout=300) == 0, output(home, job_id)[-3000:]
    check_valid(so_far)
    assert "trace: the job is running: what it recorded so far" in said
    whole, _ = trace(home, job_id, tmp_path / "trace.json")

    check_valid(whole)
    processes, threads = names(whole)
    assert processes[0] == f"job {job_id}" and len(processes) == 4, processes
    assert sorted(threads.values()) == [f"rank {r}" for r in range(6)]
    by_rank = slices(whole)
    assert len(by_rank) == 6 and all(len(events) > 100 for events in by_rank.values()), {
        k: len(v) for k, v in by_rank.items()}
    check_in_order(by_rank)
    assert len(slices(so_far)) == 6 and last_us(so_far) < last_us(whole)
    # One clock: the ranks of three hosts enter the same collective within a few ms of each other, typically
    # (the first ones, while ranks still start, and those a slowed rank enters late, are further apart).
    entered: dict[int, list[int]] = {}
    for events in by_rank.values():
        for event in events:
            entered.setdefault(event["args"]["seq"], []).append(event["ts"])
    spread = [max(ts) - min(ts) for ts in entered.values() if len(ts) == 6]
    assert spread and statistics.median(spread) < 50_000, statistics.median(spread)
    late, very = standing(by_rank, int(slowed * 1e6) - whole["otherData"]["epoch_us"] + 1_000_000)
    print(f"MEASURED while node2 was slowed: mean lateness at entry (ms) {late}; "
          f"share entered over {VERY_LATE_MS:g} ms late {very}")
    assert sorted(late, key=late.get)[-2:] in ([4, 5], [5, 4]), late
    assert min(late[4], late[5]) > 2 * max(late[r] for r in range(4)), late
    assert min(very[4], very[5]) > 3 * max(very[r] for r in range(4)), very
