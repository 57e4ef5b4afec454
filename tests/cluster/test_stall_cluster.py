"""A stall on real hosts (3 namespace hosts x 2 ranks, gloo, CPU), no hang_timeout: distrun explains it
and kills nothing. The script prints nothing for distrun (rank 0's "epoch N loss" lines only)."""

from __future__ import annotations

import json
import time
from pathlib import Path

from tests.cluster.test_hang_cluster import HANG_WORKER, stored_state
from tests.cluster.test_launch_cluster import job_procs, output, record, start, wait_for, write_job
from tests.helpers import distrun

SPIN_WORKER = Path(__file__).parent / "jobs" / "spin_worker.py"
STALL_AFTER = 20


def test_rank_3_spinning_outside_any_collective_is_a_stall_explained_without_killing_anything(cluster3, tmp_path):
    inv = cluster3.write_inventory(tmp_path / "inv.yaml")
    home = tmp_path / "home"
    job = write_job(tmp_path, "stall", ["--stuck-rank", "3", "--stuck-epoch", "3"],
                    extra=f"stall_after: {STALL_AFTER}\n", script=SPIN_WORKER)
    proc = start(job, inv, home, "stall-1", "--no-live")
    try:
        assert wait_for(lambda: stored_state(home, "stall-1") == "stalled", 150, every=0.5), output(home, "stall-1")
        rec = record(home, "stall-1")
        assert rec["state"] == "stalled" and proc.poll() is None
        said = [alert["message"] for alert in rec["alerts"]]
        assert any("rank 3 on node1 is not where the others wait" in line for line in said), said
        stacks = home / "jobs" / "stall-1" / "stacks"
        assert sorted(p.name for p in stacks.glob("rank*.txt")) == [f"rank{r}.txt" for r in range(6)]
        assert "spin (spin_worker.py:" in (stacks / "rank3.txt").read_text()
        time.sleep(2)
        alive = job_procs(cluster3, "stall-1")
        assert all(alive.values()), alive  # nothing killed: every host still runs the job's processes
        assert stored_state(home, "stall-1") == "stalled"
        distrun("stop", "stall-1", home=home, timeout=120)
        proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    out = output(home, "stall-1")
    assert "job stalled (no progress from any rank for" in out
    summary = out[out.rindex("job stall-1 "):]
    assert "  stalled at " in summary and "still stalled at the end" in summary, summary
    assert "rank 3 on node1 is not where the others wait" in summary
    assert f"kept in: {stacks}" in summary


def test_a_stall_of_ranks_that_serve_the_flight_recorder_keeps_every_ranks_record_and_names_the_collective(
        cluster3, tmp_path):
    inv = cluster3.write_inventory(tmp_path / "inv.yaml")
    home = tmp_path / "home"
    job = write_job(tmp_path, "stallfr", ["--hang-rank", "3", "--hang-step", "30", "--steps", "100000"],
                    extra=f"stall_after: {STALL_AFTER}\n", script=HANG_WORKER)
    proc = start(job, inv, home, "stall-2", "--no-live")
    try:
        assert wait_for(lambda: any(a["rule"] == "stall" for a in record(home, "stall-2")["alerts"])
                        if stored_state(home, "stall-2") == "stalled" else False, 150, every=1), output(home, "stall-2")
        flight = home / "jobs" / "stall-2" / "flight"
        assert sorted(p.name for p in flight.glob("rank*.json")) == [f"rank{r}.json" for r in range(6)]
        lags = json.loads((flight / "flight.json").read_text())["lags"]
        assert [(lag["seq"], lag["behind"]) for lag in lags] == [(31, [3])]
        assert proc.poll() is None
        distrun("stop", "stall-2", home=home, timeout=120)
        proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    out = output(home, "stall-2")
    assert ("flight recorder: rank 3 has not entered collective #31 gloo:all_reduce that ranks 0-2,4-5 wait in"
            in out), out[-3000:]
