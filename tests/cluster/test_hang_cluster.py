"""Hangs on real hosts (3 namespace hosts x 2 ranks, gloo, CPU): the watchdog's root cause, and `distrun stack`."""

from __future__ import annotations

import json
import re
import sys
import time
from pathlib import Path

import pytest

from orchestrator.errors import UsageError
from orchestrator.store import Store
from tests.cluster.test_launch_cluster import job_procs, output, record, start, wait_for, wait_for_line, write_job
from tests.helpers import distrun

HANG_WORKER = Path(__file__).parent / "jobs" / "hang_worker.py"
HANG_TIMEOUT = 15


def stored_state(home: Path, job_id: str) -> str | None:
    """The job's state as its record says now (None before it is recorded)."""
    path = home / "distrun.db"
    if not path.exists():
        return None
    try:
        return Store(home).get(job_id).state.value
    except UsageError:
        return None


@pytest.fixture
def inv(cluster3, tmp_path) -> Path:
    return cluster3.write_inventory(tmp_path / "inv.yaml")


def test_rank_3_stuck_outside_the_collective_is_named_with_its_function_within_the_bound(cluster3, inv, tmp_path):
    home = tmp_path / "home"
    job = write_job(tmp_path, "hang", ["--hang-rank", "3", "--hang-step", "30", "--steps", "100000"],
                    extra=f"hang_timeout: {HANG_TIMEOUT}\n", script=HANG_WORKER)
    proc = start(job, inv, home, "hang-1", "--no-live")
    try:
        # Stalled from a third of hang_timeout without progress on: in the record, and so in `distrun ps`.
        assert wait_for(lambda: stored_state(home, "hang-1") == "stalled", 90, every=0.5), output(home, "hang-1")
        ps = distrun("ps", home=home).stdout
        proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    ended = time.time()
    out = output(home, "hang-1")
    assert proc.returncode == 1, out[-3000:]
    assert re.search(r"^hang-1 +stalled ", ps, re.M), ps
    began = float(re.search(r"HANG START (\d+\.\d+)", out).group(1))
    assert ended - began <= HANG_TIMEOUT + 30, f"root cause {ended - began:.1f} s after the hang began"
    summary = out[out.index("Root Cause"):]
    assert "host: node1" in summary and "rank: 3" in summary
    assert "rank 3 on node1 is not where the others wait" in summary
    assert "load_batch (hang_worker.py:21)" in summary
    assert re.search(r"ranks 0-2,4-5 wait in: all_reduce .*← steps \(hang_worker\.py:41\)", summary), summary
    # The Flight Recorder (hang_worker serves it): every rank entered collective #30 (steps 0-29) and
    # ranks 0-2,4-5 wait in #31, which rank 3 has not entered.
    assert ("flight recorder: rank 3 has not entered collective #31 gloo:all_reduce that ranks 0-2,4-5 wait in "
            "(last entered: #30)") in summary, summary
    root = record(home, "hang-1")["failures"][0]
    assert (root["kind"], root["host"], root["rank"]) == ("hang", "node1", 3)
    assert [(lag["seq"], lag["behind"], lag["waiting"]) for lag in root["flight"]] == [(31, [3], [0, 1, 2, 4, 5])]
    flight = home / "jobs" / "hang-1" / "flight"
    assert sorted(p.name for p in flight.glob("rank*.json")) == [f"rank{r}.json" for r in range(6)]
    fetched = json.loads((flight / "flight.json").read_text())
    stacks = home / "jobs" / "hang-1" / "stacks"
    assert sorted(p.name for p in stacks.glob("rank*.txt")) == [f"rank{r}.txt" for r in range(6)]
    assert "load_batch" in (stacks / "rank3.txt").read_text()
    assert all(not procs for procs in job_procs(cluster3, "hang-1").values())
    print(f"MEASURED hang start to root cause: {ended - began:.1f} s (hang_timeout {HANG_TIMEOUT} s); "
          f"stack dump of 6 ranks on 3 hosts: {json.loads((stacks / 'stacks.json').read_text())['seconds']} s; "
          f"Flight Recorder fetch, slowest rank: {fetched['seconds']} s")


def python_without_pyspy(root: Path) -> Path:
    """This venv's python seen from a directory without py-spy beside it (nor is it on the hosts' PATH)."""
    venv = Path(sys.prefix)
    (root / "bin").mkdir(parents=True)
    (root / "pyvenv.cfg").write_text((venv / "pyvenv.cfg").read_text())
    (root / "lib").symlink_to(venv / "lib")
    (root / "bin" / "python").symlink_to(Path(sys.executable).resolve())
    return root / "bin" / "python"


def test_a_hang_on_hosts_without_py_spy_names_no_host_and_says_how_to_find_the_stuck_rank(cluster3, tmp_path):
    inv = cluster3.write_inventory(tmp_path / "inv.yaml", python=str(python_without_pyspy(tmp_path / "nopyspy")))
    home = tmp_path / "home"
    job = write_job(tmp_path, "hang", ["--hang-rank", "3", "--hang-step", "30", "--steps", "100000"],
                    extra=f"hang_timeout: {HANG_TIMEOUT}\nflight_recorder: false\n",
                    script=HANG_WORKER)
    proc = start(job, inv, home, "hang-2", "--no-live")
    try:
        proc.wait(timeout=150)
    finally:
        if proc.poll() is None:
            proc.kill()
    out = output(home, "hang-2")
    assert proc.returncode == 1, out[-3000:]
    summary = out[out.index("Root Cause"):]
    assert "host: unknown (distrun cannot tell which host is at fault)" in summary, summary
    assert "unknown: every rank silent, no stacks" in summary
    assert "node0: no stacks: node0: py-spy is not installed beside the host's python nor on its PATH" in summary
    assert "to find the stuck rank: install py-spy on the hosts" in summary
    assert "or turn the Flight Recorder back on (flight_recorder: true" in summary
    root_block = summary.split("Other hosts")[0]
    assert not re.search(r"^  (host: node|rank: )", root_block, re.M), root_block
    root = record(home, "hang-2")["failures"][0]
    assert (root["kind"], root["host"], root["rank"], root["address"]) == ("hang", "", None, "")
    assert "Other hosts: node[0-2]: stopped by distrun" in summary
    assert all(not procs for procs in job_procs(cluster3, "hang-2").values())


def test_stack_folds_the_six_ranks_of_a_healthy_job_into_one_group_and_ps_shows_it_running(cluster3, inv, tmp_path):
    home = tmp_path / "home"
    # Each step: a tiny all_reduce, then 4 s of sleep, where every rank is when it is dumped, unless
    # a dump straddles a step's end (py-spy pauses each rank in turn): then another dump is taken.
    job = write_job(tmp_path, "healthy", ["--steps", "100000", "--step-time", "4"], script=HANG_WORKER)
    proc = start(job, inv, home, "ok-1", "--no-live")
    try:
        wait_for_line(home, "ok-1", "step 2")
        for _ in range(3):
            began = time.monotonic()
            done = distrun("stack", "ok-1", "--json", home=home, timeout=60)
            took = time.monotonic() - began
            assert done.returncode == 0, done.stderr
            groups = json.loads(done.stdout)["groups"]
            if len(groups) == 1:
                break
        assert [(g["ranks"], g["hosts"]) for g in groups] == [(list(range(6)), ["node0", "node1", "node2"])]
        assert groups[0]["where"] == "steps (hang_worker.py:46)"
        text = distrun("stack", "ok-1", "--node", "node1", home=home, timeout=60).stdout.splitlines()
        titles = [line for line in text if re.match(r"ranks? [0-9,-]+ \(on ", line)]
        assert titles in (["ranks 2-3 (on node1)"], ["rank 2 (on node1)", "rank 3 (on node1)"],
                          ["rank 3 (on node1)", "rank 2 (on node1)"]), text
        assert record(home, "ok-1")["state"] == "running"
    finally:
        distrun("stop", "ok-1", home=home, timeout=60)
        proc.wait(timeout=60)
    assert all(not procs for procs in job_procs(cluster3, "ok-1").values())
    print(f"MEASURED distrun stack --json, 6 ranks on 3 hosts: {took:.2f} s (the whole command)")


def test_a_job_that_prints_only_metrics_lines_is_not_called_hung(cluster3, inv, tmp_path):
    home = tmp_path / "home"
    # 25 steps of 1 s: 2.5 times hang_timeout, with rank 0's DISTRUN_METRICS lines as the only output
    # (after gloo's warnings at init, which arm the watchdog before the first step).
    job = write_job(tmp_path, "quiet", ["--steps", "25", "--step-time", "1", "--metrics-only"],
                    extra="hang_timeout: 10\n", script=HANG_WORKER)
    proc = start(job, inv, home, "quiet-1", "--no-live")
    try:
        proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    out = output(home, "quiet-1")
    assert proc.returncode == 0, out[-3000:]
    # It may show stalled for a moment (gloo's first all_reduce connects every pair of ranks), never hung.
    assert "job hung" not in out and "hang:" not in out
    rec = record(home, "quiet-1")
    assert (rec["state"], rec["failures"]) == ("succeeded", [])
    assert len((home / "jobs" / "quiet-1" / "metrics.jsonl").read_text().splitlines()) == 25
