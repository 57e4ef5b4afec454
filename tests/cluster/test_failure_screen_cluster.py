"""What a failed job's screen shows, on real sshd hosts with real torchrun: one rank's failure fits
one screen, the failed rank's traceback once, the root cause once; the rest folded into a counted
line per host that says where it is kept."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.helpers import REPO, distrun, unique_job_id

TRAIN = REPO / "jobs" / "train_resnet50.py"
SCREEN_AFTER_FAILURE = 40  # the goal: lines on screen from the failed rank's traceback to the end


@pytest.fixture
def inv(cluster3, tmp_path) -> Path:
    return cluster3.write_inventory(tmp_path / "inv.yaml")


def training_job(tmp_path: Path, *args: str) -> Path:
    path = tmp_path / "fail.yaml"
    path.write_text(f"name: fail\nscript: {TRAIN}\nnproc_per_node: 2\nenv: {{OMP_NUM_THREADS: '1'}}\n"
                    "stop_grace: 3\nargs: [--model, tiny, --image-size, '32', --batch-size, '4', --steps, '200', "
                    f"--log-every, '2', {', '.join(args)}]\n")
    return path


def test_one_rank_failure_on_three_hosts_fits_one_screen_naming_the_rank_once(cluster3, inv, tmp_path):
    job_id = unique_job_id("screen-1")
    home = tmp_path / "home"
    job = training_job(tmp_path, "--fail-at-step", "6", "--fail-rank", "3")

    result = distrun("launch", str(job), "-i", str(inv), "--no-live", "--job-id", job_id, home=home, timeout=180)

    lines = result.stdout.splitlines()
    assert result.returncode == 1, result.stdout[-3000:]
    first = next(i for i, line in enumerate(lines) if "Traceback" in line and "r3" in line.split("]")[0])
    shown = lines[first:]
    assert len(shown) <= SCREEN_AFTER_FAILURE, "\n".join(shown)
    assert sum(line.startswith("[node1 r3 err]") and "Traceback" in line for line in shown) == 1
    assert not any(re.match(r"\[node[02] r\d err\]", line) for line in shown), "the other ranks' errors are folded"
    assert result.stdout.count("Root Cause") == 1 and re.findall(r"rank\s*: (\d+)", result.stdout) == ["3"]
    for node in ("node0", "node2"):
        assert re.search(rf"^\[{node}\] \d+ lines of shutdown output \(distrun logs {job_id} --node {node}\)$",
                         result.stdout, re.M), result.stdout
    everything = distrun("logs", job_id, home=home).stdout
    assert len(everything.splitlines()) > len(lines), "the job's files keep what the screen folded"


def test_a_rank_raising_at_step_20_leaves_the_other_hosts_failed_as_a_consequence_never_in_an_exit_barrier(
        cluster3, inv, tmp_path):
    # Issue 41: the others fail on their own (gloo's Connection closed by peer) while distrun's stop goes
    # out; how each ended is decided from torchrun's records and the ranks' error files, not from timing.
    job_id = unique_job_id("planted-1")
    home = tmp_path / "home"
    job = training_job(tmp_path, "--fail-at-step", "20", "--fail-rank", "3")

    result = distrun("launch", str(job), "-i", str(inv), "--no-live", "--job-id", job_id, home=home, timeout=180)

    assert result.returncode == 1, result.stdout[-3000:]
    other = next(line for line in result.stdout.splitlines() if line.startswith("Other hosts: "))
    for node in ("node0", "node2"):
        assert re.search(rf"{node}: failed as a consequence \(rank \d: RuntimeError: .*Connection closed by peer",
                         other), other
    assert "exit barrier" not in result.stdout and "finished:" not in result.stdout
    records = [r for r in json.loads(distrun("ps", "--json", "--all", home=home).stdout) if r["id"] == job_id]
    root = records[0]["failures"][0]
    assert (root["host"], root["rank"], root["barrier_hosts"]) == ("node1", 3, [])
