"""The operator's day on real namespace hosts: errors folded under host ranges with doctor's fix,
doctor's skipped checks, internal runs, "Launched as" that starts the job again on the same hosts,
prune on the hosts, launch --detach --json, top --json and stop by host."""

from __future__ import annotations

import json
import shlex
import subprocess
import time
from pathlib import Path

import pytest

from orchestrator.transport.base import REACH_HINT
from tests.cluster.harness import Cluster
from tests.cluster.test_launch_cluster import WORKER, job_procs, wait_for, wait_for_line, write_job
from tests.helpers import distrun


@pytest.fixture
def inv(cluster3: Cluster, tmp_path: Path) -> Path:
    return cluster3.write_inventory(tmp_path / "inv.yaml")


def run(*args: str, home: Path, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return distrun(*args, home=home, env={"DISTRUN_SSH_CONFIG": "/nonexistent", "DISTRUN_SSH_TIMEOUT": "5"},
                   timeout=timeout)


def test_a_wrong_identity_file_is_one_line_for_every_host_with_the_fix(cluster3: Cluster, tmp_path: Path) -> None:
    wrong = tmp_path / "wrong_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(wrong)], check=True)
    inventory = cluster3.write_inventory(tmp_path / "wrong.yaml", identity_file=str(wrong))
    home = tmp_path / "home"

    launch = run("launch", "jobs/tiny.yaml", "-i", str(inventory), home=home)
    doctor = run("doctor", "-i", str(inventory), home=home)

    assert launch.returncode == 3
    errors = [line for line in launch.stderr.splitlines() if line.startswith("distrun: error:")]
    assert errors == [f"distrun: error: node[0-2]: authentication failed as root with {wrong} "
                      f"(check identity_file / user) (fix: {REACH_HINT})"]
    assert doctor.returncode == 3
    rows = doctor.stdout.splitlines()
    assert doctor.stdout.count("authentication failed") == 1
    assert not any(row.startswith("✓") for row in rows), doctor.stdout
    assert rows[-1].startswith("0 ok, 0 warning(s), 1 error(s), 22 skipped")


def test_doctors_all_reduce_is_an_internal_run_never_last(cluster3: Cluster, inv: Path, tmp_path: Path) -> None:
    home = tmp_path / "home"

    doctor = run("doctor", "-i", str(inv), "--nodes", "node[0-1]", "--bandwidth", home=home)
    listed = json.loads(run("ps", "--json", home=home).stdout)
    every = json.loads(run("ps", "--all", "--json", home=home).stdout)
    last = run("logs", "last", home=home)

    assert doctor.returncode == 0, doctor.stdout + doctor.stderr
    assert listed == []
    assert [(job["name"], job["internal"], job["hosts"]) for job in every] == [
        ("doctor-bandwidth", True, ["node0", "node1"])]
    assert last.returncode == 2 and "no job matches 'last' (no jobs recorded yet)" in last.stderr


def test_launched_as_starts_the_job_again_on_the_same_hosts_with_its_arguments(cluster3: Cluster, inv: Path,
                                                                              tmp_path: Path) -> None:
    home = tmp_path / "home"
    first = run("launch", "jobs/tiny.yaml", "-i", str(inv), "--nodes", "node[0,2]", "--", "--steps", "4", home=home)
    assert first.returncode == 0, first.stdout[-2000:] + first.stderr
    job = json.loads(run("ps", "--json", home=home).stdout)[0]

    page = run("report", "last", "-o", str(tmp_path / "r.html"), home=home)
    launched = (tmp_path / "r.html").read_text().split("<p>Launched as:</p><pre>")[1].split("</pre>")[0]
    command = shlex.split(launched.replace("&#x27;", "'"))
    split = command.index("--")
    again = run(*command[1:split], "--dry-run", *command[split:], home=home)

    assert page.returncode == 0
    assert command[:2] == ["distrun", "launch"] and "--nodes" in command and command[-2:] == ["--steps", "4"]
    assert again.returncode == 0, again.stderr
    assert [line.split("]")[0].strip("[") for line in again.stdout.splitlines() if line.startswith("[node")] == \
        job["hosts"] == ["node0", "node2"]
    assert "--steps 4" in again.stdout

    copy = f"/root/.distrun/jobs/{job['id']}"
    assert cluster3.host_run(0, ["test", "-d", copy]).returncode == 0
    pruned = run("prune", "--keep", "0", "--json", home=home)
    assert json.loads(pruned.stdout) == {"removed": [job["id"]], "kept": {}, "dry_run": False}
    assert all(cluster3.host_run(i, ["test", "-e", copy]).returncode != 0 for i in range(3))
    assert json.loads(run("ps", "--json", home=home).stdout) == []


def test_detach_json_then_top_json_then_stop_by_host(cluster3: Cluster, inv: Path, tmp_path: Path) -> None:
    home = tmp_path / "home"
    job_file = write_job(tmp_path, args=["--sleep", "120"], script=WORKER)

    detached = run("launch", str(job_file), "-i", str(inv), "--nodes", "node[1-2]", "--detach", "--json",
                   home=home, timeout=120)
    assert detached.returncode == 0, detached.stderr
    record = json.loads(detached.stdout)
    job_id = record["id"]
    assert record["hosts"] == ["node1", "node2"] and record["state"] in ("pending", "running")
    wait_for_line(home, job_id, "tick 3")

    def sampled() -> dict:
        return json.loads(run("top", "last", "--json", home=home).stdout)

    assert wait_for(lambda: all(h["host"] for h in sampled()["hosts"]), 60, every=1.0)
    sample = sampled()
    assert sample["job"] == job_id and sample["state"] == "running"
    assert [h["node"] for h in sample["hosts"]] == ["node1", "node2"]
    assert all(h["host"]["kind"] == "host" and "cpu_pct" in h["host"] for h in sample["hosts"])

    began = time.monotonic()
    stopped = run("stop", "--nodes", "node2", "--json", home=home)
    assert stopped.returncode == 0, stopped.stderr
    answer = json.loads(stopped.stdout)
    listed = json.loads(run("ps", "--json", home=home).stdout)[0]
    assert (answer["id"], answer["state"], answer["exit_code"]) == (job_id, "stopped", listed["exit_code"])
    assert time.monotonic() - began < 60
    assert all(not procs for procs in job_procs(cluster3, job_id).values())
