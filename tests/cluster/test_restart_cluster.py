"""The controller's restarts on real hosts (namespace hosts, real sshd and torchrun, gloo on CPU).

Every job runs tests/cluster/jobs/restart_worker.py: numbered all_reduce steps, the next step
checkpointed in DISTRUN_CHECKPOINT_DIR after each one and resumed from at start, each step
printed as `step S attempt A world W` by every rank.
"""

from __future__ import annotations

import os
import re
import signal
import time
import uuid
from pathlib import Path

import pytest

from tests.cluster.test_launch_cluster import job_procs, output, record, start, wait_for_line, write_job
from tests.faults.invariants import CUT_HOST_BOUND
from tests.helpers import distrun, wait_for

RESTART_WORKER = Path(__file__).parent / "jobs" / "restart_worker.py"
STEP = re.compile(r"^\[(node\d) r(\d+)\] step (\d+) attempt (\d+) world (\d+)$", re.M)
RESUMED = re.compile(r"^\[node\d r\d+\] resumed from step (\d+)$", re.M)
HEARTBEAT = 4


@pytest.fixture
def inv(cluster3, tmp_path) -> Path:
    return cluster3.write_inventory(tmp_path / "inv.yaml")


def unique(name: str) -> str:
    """A job id of this run: the namespace hosts share one ~/.distrun, where an earlier run's copy
    under the same id (a run that was interrupted) would be added to."""
    return f"{name}-{uuid.uuid4().hex[:6]}"


def kill_a_worker(cluster, job_id: str, host: int) -> None:
    """SIGKILL one rank of the job on node<host>."""
    workers = [p for p in job_procs(cluster, job_id)[host] if str(RESTART_WORKER) in p.cmdline]
    assert workers, job_procs(cluster, job_id)
    os.kill(workers[0].pid, signal.SIGKILL)


def restart_job(tmp_path: Path, name: str, args: list[str], extra: str) -> Path:
    return write_job(tmp_path, name, args, script=RESTART_WORKER, heartbeat=HEARTBEAT,
                     extra=f"checkpoint_dir: {tmp_path / 'ckpt'}\n{extra}")


def finish(proc, timeout: float = 180) -> None:
    try:
        proc.wait(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def attempt_lines(home: Path, job_id: str, attempt: int) -> str:
    done = distrun("logs", job_id, "--attempt", str(attempt), home=home)
    assert done.returncode == 0, done.stderr
    return done.stdout


def steps(text: str) -> list[tuple[str, int, int, int, int]]:
    """(node, rank, step, attempt, world) of every step line."""
    return [(m[0], int(m[1]), int(m[2]), int(m[3]), int(m[4])) for m in STEP.findall(text)]


def resumed_from(text: str) -> int:
    points = {int(k) for k in RESUMED.findall(text)}
    assert len(points) == 1, f"every rank resumes from one step: {points}"
    return points.pop()


def assert_each_step_once_from(lines: list[tuple[str, int, int, int, int]], first: int, target: int,
                               ranks: int) -> None:
    """Every step from `first` to `target` - 1 ran exactly once on each of `ranks` ranks."""
    for rank in range(ranks):
        done = sorted(step for _, r, step, _, _ in lines if r == rank)
        assert done == list(range(first, target)), f"rank {rank} ran steps {done}, expected {first}..{target - 1}"


def test_a_cut_training_host_is_replaced_by_the_spare_and_training_goes_on_from_the_checkpoint(
        cluster3, inv, tmp_path):
    job_id = unique("spare")
    home, target = tmp_path / "home", 40
    job = restart_job(tmp_path, "spare", ["--steps", str(target), "--step-time", "0.4"],
                      "nnodes: 2\nrestarts: {max: 2, backoff: 1}\n")
    proc = start(job, inv, home, job_id, "--no-live", "--nodes", "node0,node1,node2")
    try:
        wait_for_line(home, job_id, "step 8 attempt 1")
        assert record(home, job_id)["hosts"] == ["node0", "node1"]
        cluster3.cut(1)
        cut_at = time.monotonic()
        finish(proc)
    finally:
        cluster3.restore(1)
    restored = time.monotonic()
    out = output(home, job_id)
    assert proc.returncode == 0, out[-4000:]
    # The cut host ends the job itself (its controller's heartbeat stopped), within the fault matrix's bound.
    assert wait_for(lambda: not job_procs(cluster3, job_id)[1], CUT_HOST_BOUND), job_procs(cluster3, job_id)
    print(f"MEASURED cut to the job's end: {restored - cut_at:.1f} s")
    rec = record(home, job_id)
    assert rec["state"] == "succeeded" and rec["quarantined"] == ["node1"]
    first, second = rec["attempts"]
    assert first["hosts"] == ["node0", "node1"] and second["hosts"] == ["node0", "node2"]
    assert (first["failure"]["host"], first["failure"]["kind"]) == ("node1", "lost")
    assert second["failure"] is None and second["ended"] is not None
    assert second["port"] not in (0, first["port"]), "attempt 2 rendezvous on a fresh port"
    assert rec["hosts"] == ["node0", "node2"]
    # The recorded command starts the job again where it now runs: the spare, not the quarantined host.
    assert rec["command"][rec["command"].index("--nodes") + 1] == "node[0,2]"
    assert distrun("logs", job_id, "--node", "node1", home=home).returncode == 0
    assert "attempt 1 on node[0-1]" in out and "attempt 2 on node[0,2]" in out and "node1 quarantined" in out
    # Attempt 2 resumes where attempt 1's last checkpoint was, and runs every later step once on its 4 ranks.
    again = attempt_lines(home, job_id, 2)
    resume = resumed_from(again)
    later = steps(again)
    assert {(node, world, attempt) for node, _, _, attempt, world in later} == {("node0", 4, 2), ("node2", 4, 2)}
    assert_each_step_once_from(later, resume, target, ranks=4)
    before = {step for _, _, step, _, _ in steps(attempt_lines(home, job_id, 1))}
    assert set(range(resume)) <= before, f"attempt 1 ran {sorted(before)}, the checkpoint says {resume}"
    assert "DISTRUN_ATTEMPT" not in out
    ps = distrun("ps", home=home).stdout
    assert re.search(rf"^{re.escape(job_id)} +succeeded .* node\[0,2\] +attempts=2 +quarantined=node1$", ps, re.M), ps


def test_a_rank_that_raises_every_time_fails_the_job_after_max_attempts_each_listed(cluster3, inv, tmp_path):
    job_id = unique("raises")
    home = tmp_path / "home"
    job = restart_job(tmp_path, "raises", ["--steps", "20", "--fail-rank", "1", "--fail-at", "3"],
                      "restarts: {max: 2, backoff: 0}\n")
    proc = start(job, inv, home, job_id, "--no-live", "--nodes", "node0,node1")
    finish(proc)
    out = output(home, job_id)
    assert proc.returncode == 1, out[-4000:]
    rec = record(home, job_id)
    assert rec["state"] == "failed" and rec["quarantined"] == []
    assert [a["number"] for a in rec["attempts"]] == [1, 2, 3]
    assert all(a["hosts"] == ["node0", "node1"] and a["failure"]["kind"] == "exit" and a["failure"]["rank"] == 1
               for a in rec["attempts"])
    summary = out[out.rindex(f"job {job_id} FAILED"):]
    assert "no restart left: restarts.max is 2" in summary
    assert "Attempts (3 of at most 3):" in summary
    for number in (1, 2, 3):
        line = rf"attempt {number} on node\[0-1\], \S+: node0 \([\d.]+\) rank 1: exit code 1"
        assert re.search(line, summary), summary
    assert resumed_from(attempt_lines(home, job_id, 3)) == 3
    assert all(not procs for procs in job_procs(cluster3, job_id).values())


def test_nnodes_min_max_without_a_spare_goes_on_with_one_host_after_a_worker_is_killed(cluster3, inv, tmp_path):
    job_id = unique("fewer")
    home, target = tmp_path / "home", 30
    job = restart_job(tmp_path, "fewer", ["--steps", str(target), "--step-time", "0.3"],
                      "nnodes: '1:2'\nrestarts: {max: 1, backoff: 0}\n")
    proc = start(job, inv, home, job_id, "--no-live", "--nodes", "node0,node1")
    try:
        wait_for_line(home, job_id, "step 5 attempt 1")
        kill_a_worker(cluster3, job_id, 1)
        finish(proc)
    finally:
        if proc.poll() is None:
            proc.kill()
    out = output(home, job_id)
    assert proc.returncode == 0, out[-4000:]
    rec = record(home, job_id)
    assert rec["quarantined"] == ["node1"]
    first, second = rec["attempts"]
    assert (first["failure"]["kind"], first["failure"]["signal"], first["failure"]["host"]) == (
        "signal", "SIGKILL", "node1")
    assert second["hosts"] == ["node0"]
    again = attempt_lines(home, job_id, 2)
    later = steps(again)
    assert {(node, world) for node, _, _, _, world in later} == {("node0", 2)}
    assert_each_step_once_from(later, resumed_from(again), target, ranks=2)
    assert "without node1 (no spare left; fewer hosts allowed)" in out


def test_a_hang_restarts_on_the_same_hosts_when_restarts_on_lists_hang(cluster3, inv, tmp_path):
    job_id = unique("hangs")
    home, target = tmp_path / "home", 16
    job = restart_job(tmp_path, "hangs", ["--steps", str(target), "--hang-rank", "3", "--hang-at", "6"],
                      "hang_timeout: 8\nrestarts: {max: 1, backoff: 0, on: [hang]}\n")
    proc = start(job, inv, home, job_id, "--no-live", "--nodes", "node0,node1")
    finish(proc)
    out = output(home, job_id)
    assert proc.returncode == 0, out[-4000:]
    rec = record(home, job_id)
    first, second = rec["attempts"]
    assert first["failure"]["kind"] == "hang" and rec["quarantined"] == []
    assert first["hosts"] == second["hosts"] == ["node0", "node1"]
    again = attempt_lines(home, job_id, 2)
    assert resumed_from(again) == 6
    assert_each_step_once_from(steps(again), 6, target, ranks=4)


def test_a_spare_that_cannot_be_reached_is_set_aside_and_the_next_spare_takes_the_place(cluster3, inv, tmp_path):
    job_id = unique("unreached")
    home, target = tmp_path / "home", 24
    job = restart_job(tmp_path, "unreached", ["--steps", str(target), "--step-time", "0.3"],
                      "nnodes: 1\nrestarts: {max: 1, backoff: 0}\n")
    cluster3.stop_sshd(1)
    try:
        proc = start(job, inv, home, job_id, "--no-live", "--nodes", "node0,node1,node2")
        wait_for_line(home, job_id, "step 4 attempt 1")
        kill_a_worker(cluster3, job_id, 0)
        finish(proc)
    finally:
        cluster3.start_sshd(1)
    out = output(home, job_id)
    assert proc.returncode == 0, out[-4000:]
    rec = record(home, job_id)
    assert rec["quarantined"] == ["node0", "node1"]
    assert [a["hosts"] for a in rec["attempts"]] == [["node0"], ["node2"]]
    assert re.search(r"\[distrun\] node1 set aside \(node1.*\); attempt 2 on node2", out), out[-3000:]
    again = attempt_lines(home, job_id, 2)
    assert_each_step_once_from(steps(again), resumed_from(again), target, ranks=2)
