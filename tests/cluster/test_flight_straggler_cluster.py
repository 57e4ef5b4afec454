"""Stragglers and progress for a script that prints nothing for distrun (3 namespace hosts x 2 ranks,
DDP on gloo, CPU): each host reads its ranks' Flight Recorders every 5 s, and distrun names the host
whose ranks' CPU time is limited from outside, with one of its ranks, live, in `ps --json`'s alerts
and in the summary; the same job on healthy hosts names none; both show the ranks' progress."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import threading
import time
from pathlib import Path

import pytest

from tests.cluster.test_launch_cluster import output, record, start, write_job
from tests.helpers import distrun, unique_job_id, wait_for

WORKER = Path(__file__).parent / "jobs" / "epoch_worker.py"
SLOW_HOST = 2  # node2: ranks 4 and 5
STOPPED_S, RUNNING_S = 0.15, 0.05  # its ranks get a quarter of the CPU time they ask for
NAMED_WITHIN = 90.0


@pytest.fixture
def inv(cluster3, tmp_path) -> Path:
    return cluster3.write_inventory(tmp_path / "inv.yaml")


def rank_pids(cluster, host: int, job_id: str) -> list[int]:
    """The job's ranks on a host (the processes torchrun gave a RANK)."""
    return [p.pid for p in cluster.processes_with_env(host, "DISTRUN_JOB_ID", job_id) if "RANK" in p.environ()]


def signal_all(pids: list[int], sig: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


def duty_cycle(pids: list[int], stop: threading.Event) -> None:
    """Limit the processes' CPU time from outside: stopped STOPPED_S of every STOPPED_S + RUNNING_S."""
    while not stop.is_set():
        signal_all(pids, signal.SIGSTOP)
        time.sleep(STOPPED_S)
        signal_all(pids, signal.SIGCONT)
        time.sleep(RUNNING_S)
    signal_all(pids, signal.SIGCONT)


def slow_until_named(cluster, home: Path, job_id: str, stop: threading.Event) -> tuple[bool, float, dict, dict]:
    """Slow SLOW_HOST's ranks from outside (until `stop`) and wait up to NAMED_WITHIN for a straggler
    alert: whether it came, after how long, and the job's record and `top --json` progress then."""
    slowed = time.monotonic()
    threading.Thread(target=duty_cycle, args=(rank_pids(cluster, SLOW_HOST, job_id), stop), daemon=True).start()
    named = wait_for(lambda: "ALERT straggler" in output(home, job_id), NAMED_WITHIN)
    took = time.monotonic() - slowed
    return named, took, record(home, job_id), json.loads(distrun("top", job_id, "--json", home=home).stdout)["progress"]


def launch(tmp_path: Path, inv: Path, home: Path, job_id: str, seconds: int):
    job = write_job(tmp_path, job_id.split("-")[0], ["--seconds", str(seconds)], script=WORKER, heartbeat=20)
    return start(job, inv, home, job_id, "--no-live")


def summary(home: Path, job_id: str) -> str:
    return (home / "jobs" / job_id / "summary.txt").read_text()


def test_a_host_whose_ranks_get_a_quarter_of_the_cpu_is_named_with_a_rank_within_90_s(cluster3, inv, tmp_path):
    home, job_id = tmp_path / "home", unique_job_id("slowhost")
    proc = launch(tmp_path, inv, home, job_id, seconds=100)
    stop = threading.Event()
    try:
        assert wait_for(lambda: len(rank_pids(cluster3, SLOW_HOST, job_id)) == 2, 120), output(home, job_id)
        assert wait_for(lambda: "epoch 0 loss" in output(home, job_id), 120), output(home, job_id)
        named, took, live, progress = slow_until_named(cluster3, home, job_id, stop)
    finally:
        stop.set()
    assert proc.wait(timeout=240) == 0, output(home, job_id)[-3000:]
    out = output(home, job_id)
    assert named, out[-3000:]
    print(f"MEASURED named {took:.0f} s after the slowdown:",
          next(line for line in out.splitlines() if "ALERT straggler" in line))
    assert re.search(r"\[node2\] distrun: ALERT straggler: rank [45] on node2 (enters \w+ \d+ ms after the others|"
                     r"is held off its CPU \d+% of the time)", out)
    alerts = [a for a in live["alerts"] if a["rule"] == "straggler"]
    assert alerts and all((a["node"], a["rank"] in (4, 5)) == ("node2", True) for a in alerts), live["alerts"]
    assert alerts[0]["evidence"].startswith("node2 now: load")  # the host's telemetry as evidence
    assert "straggler: rank" in summary(home, job_id)
    assert set(progress["ranks"]) == {str(r) for r in range(6)} and progress["collectives"] > 0, progress


def test_the_same_job_on_healthy_hosts_names_no_straggler_and_shows_the_ranks_progress(cluster3, inv, tmp_path):
    home, job_id = tmp_path / "home", unique_job_id("evenhosts")
    proc = launch(tmp_path, inv, home, job_id, seconds=60)
    assert proc.wait(timeout=240) == 0, output(home, job_id)[-3000:]
    out = output(home, job_id)
    assert "straggler" not in out
    done = record(home, job_id)
    assert not [a for a in done["alerts"] if a["rule"] == "straggler"]
    assert set(done["progress"]["ranks"]) == {str(r) for r in range(6)}, done["progress"]
    # Every rank's last position is what it left as it ended: lock-step ranks end at one collective.
    assert len(set(done["progress"]["ranks"].values())) == 1 and done["progress"]["collectives_per_s"] > 0
    assert "  progress: " in summary(home, job_id) and "collectives completed" in summary(home, job_id)
    print("MEASURED progress:", done["progress"])
