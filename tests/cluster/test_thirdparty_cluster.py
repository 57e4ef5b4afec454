"""A program written the way third-party examples are (tests/cluster/jobs/snapshot_trainer.py: its own
Trainer class and snapshot file, one line per epoch from rank 0, nothing for distrun), run unmodified
on 3 namespace hosts x 2 ranks: distrun names a host slowed from outside, with one of its ranks, and
explains a rank stopped from outside as a stall, from the ranks' Flight Recorders (served by its
worker entry) and stacks, killing nothing."""

from __future__ import annotations

import json
import re
import signal
import threading
from pathlib import Path

from tests.cluster.test_flight_straggler_cluster import signal_all, slow_until_named
from tests.cluster.test_hang_cluster import stored_state
from tests.cluster.test_launch_cluster import job_procs, output, record, start, write_job
from tests.helpers import distrun, unique_job_id, wait_for

TRAINER = Path(__file__).parent / "jobs" / "snapshot_trainer.py"
STALL_AFTER = 20


def launch(tmp_path: Path, cluster, home: Path, job_id: str, epochs: int, extra: str = ""):
    inv = cluster.write_inventory(tmp_path / "inv.yaml")
    args = [str(epochs), "5", "--snapshot_path", str(tmp_path / "snapshot.pt")]
    job = write_job(tmp_path, job_id.split("-")[0], args, script=TRAINER, heartbeat=20, extra=extra)
    return start(job, inv, home, job_id, "--no-live")


def test_a_slowed_host_of_an_unmodified_program_is_named_with_a_rank_from_its_flight_recorders(cluster3, tmp_path):
    home, job_id = tmp_path / "home", unique_job_id("trainerslow")
    proc = launch(tmp_path, cluster3, home, job_id, epochs=100000)
    stop = threading.Event()
    try:
        assert wait_for(lambda: "Epoch 2 |" in output(home, job_id), 180), output(home, job_id)
        named, took, live, progress = slow_until_named(cluster3, home, job_id, stop)
    finally:
        stop.set()
        distrun("stop", job_id, home=home, timeout=120)
        proc.wait(timeout=120)
    out = output(home, job_id)
    assert named, out[-3000:]
    print(f"MEASURED named {took:.0f} s after the slowdown:",
          next(line for line in out.splitlines() if "ALERT straggler" in line))
    assert re.search(r"\[node2\] distrun: ALERT straggler: rank [45] on node2 (enters \w+ \d+ ms after the others|"
                     r"is held off its CPU \d+% of the time)", out)
    assert [a for a in live["alerts"] if (a["rule"], a["node"], a["rank"] in (4, 5)) == ("straggler", "node2", True)], \
        live["alerts"]
    assert "straggler: rank" in (home / "jobs" / job_id / "summary.txt").read_text()
    assert set(progress["ranks"]) == {str(r) for r in range(6)} and progress["collectives"] > 0, progress


def test_a_rank_of_an_unmodified_program_stopped_from_outside_is_a_stall_explained_then_running_again(
        cluster3, tmp_path):
    home, job_id = tmp_path / "home", unique_job_id("trainerstall")
    proc = launch(tmp_path, cluster3, home, job_id, epochs=100000, extra=f"stall_after: {STALL_AFTER}\n")
    stuck: list[int] = []
    try:
        assert wait_for(lambda: "Epoch 2 |" in output(home, job_id), 180), output(home, job_id)
        node1 = cluster3.processes_with_env(1, "DISTRUN_JOB_ID", job_id)
        stuck = [p.pid for p in node1 if p.environ().get("RANK") == "3"]
        assert len(stuck) == 1, stuck
        signal_all(stuck, signal.SIGSTOP)  # rank 3 on node1 stops, outside any collective or in one
        assert wait_for(lambda: stored_state(home, job_id) == "stalled", 150, every=0.5), output(home, job_id)
        rec = record(home, job_id)
        assert any("rank 3 on node1" in a["message"] for a in rec["alerts"] if a["rule"] == "stall"), rec["alerts"]
        kept = home / "jobs" / job_id
        assert sorted(p.name for p in (kept / "stacks").glob("rank*.txt")) == [f"rank{r}.txt" for r in range(6)]
        # A stopped rank cannot answer for its Flight Recorder (its server thread is stopped too): the
        # others' records are kept, and why rank 3's is not.
        records = sorted(p.name for p in (kept / "flight").glob("rank*.json"))
        assert records == [f"rank{r}.json" for r in (0, 1, 2, 4, 5)], records
        assert list(json.loads((kept / "flight" / "flight.json").read_text())["errors"]) == ["3"]
        alive = job_procs(cluster3, job_id)
        assert all(alive.values()), alive  # nothing killed
        signal_all(stuck, signal.SIGCONT)
        assert wait_for(lambda: stored_state(home, job_id) == "running", 120, every=0.5), output(home, job_id)
    finally:
        signal_all(stuck, signal.SIGCONT)
        distrun("stop", job_id, home=home, timeout=120)
        proc.wait(timeout=120)
    out = output(home, job_id)
    assert "job progressing again" in out, out[-3000:]
    summary = out[out.rindex(f"job {job_id} "):]
    assert "  stalled at " in summary and "rank 3 on node1" in summary, summary
