"""The Slurm backend on a real Slurm (slurmctld here, a slurmd on each of two namespace hosts)."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers import REPO, distrun, job_lines, unique_job_id, wait_for

from .fixtures import requires_cluster
from .slurm import SlurmCluster

pytestmark = requires_cluster

DDP_JOB = REPO / "tests" / "slurm_ddp_job.py"
HANG_WORKER = Path(__file__).parent / "jobs" / "hang_worker.py"


def write_job(tmp_path: Path, name: str, args: list[str], extra: str = "") -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_text(
        f"name: {name}\nscript: {DDP_JOB}\nargs: {json.dumps(args)}\nnproc_per_node: 2\n"
        "env: {OMP_NUM_THREADS: '1'}\nstop_grace: 3\n" + extra
    )
    return path


def launch(slurm: SlurmCluster, tmp_path: Path, job: Path, job_id: str, *extra: str,
           timeout: float = 180) -> subprocess.CompletedProcess[str]:
    inventory = slurm.cluster.write_inventory(tmp_path / "inventory.yaml")
    return distrun("launch", str(job), "--backend", "slurm", "-i", str(inventory), "--job-id", job_id, *extra,
                   home=tmp_path / "home", env=slurm.env, timeout=timeout)


def record(slurm: SlurmCluster, tmp_path: Path, job_id: str) -> dict:
    listed = distrun("ps", "--json", "--all", home=tmp_path / "home", env=slurm.env).stdout
    return next(r for r in json.loads(listed) if r["id"] == job_id)


def job_processes(slurm: SlurmCluster, job_id: str) -> list:
    return [p for i in range(slurm.cluster.n) for p in slurm.cluster.processes_with_env(i, "DISTRUN_JOB_ID", job_id)]



def slurm_state(slurm: SlurmCluster, slurm_id: str) -> str:
    out = slurm.run("scontrol", "show", "job", "-o", slurm_id).stdout
    return out.split("JobState=", 1)[1].split()[0]


def combined(tmp_path: Path, job_id: str) -> str:
    """The job's lines as `distrun logs` shows them."""
    return job_lines(tmp_path / "home" / "jobs" / job_id)


def test_two_nodes_of_two_processes_train_with_ddp_and_agree(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    result = launch(slurm_cluster, tmp_path, write_job(tmp_path, "ddp", ["--steps", "3"]), "ddp-1")

    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    sums = {int(line.split(" r", 1)[1].split("]")[0]): json.loads(line.split("CHECKSUM ", 1)[1])
            for line in result.stdout.splitlines() if " CHECKSUM " in line}
    assert sorted(sums) == [0, 1, 2, 3]
    assert {s["world"] for s in sums.values()} == {4} and {s["allreduce"] for s in sums.values()} == {10.0}
    assert len({s["weights"] for s in sums.values()}) == 1
    assert [sums[r]["host"] for r in range(4)] == ["node0", "node0", "node1", "node1"]
    rec = record(slurm_cluster, tmp_path, "ddp-1")
    assert rec["state"] == "succeeded" and rec["exit_code"] == 0 and rec["backend"] == "slurm"
    assert rec["hosts"] == ["node0", "node1"] and rec["master_addr"] == "node0" and rec["master_port"] > 0
    assert slurm_state(slurm_cluster, rec["backend_ref"]) == "COMPLETED"
    job_dir = tmp_path / "home" / "jobs" / "ddp-1"
    assert "[node1 r3] CHECKSUM" in combined(tmp_path, "ddp-1")
    assert "CHECKSUM" in (job_dir / "ranks" / "2.out").read_text()
    assert (job_dir / "telemetry.jsonl").exists()
    ps = distrun("ps", home=tmp_path / "home", env=slurm_cluster.env).stdout
    assert f"slurm={rec['backend_ref']}" in ps
    assert slurm_cluster.queue() == [] and job_processes(slurm_cluster, "ddp-1") == []


def test_a_failing_rank_fails_the_job_names_its_node_and_rank_and_releases_the_nodes(
        slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    job_id = unique_job_id("fail-1")
    job = write_job(tmp_path, "fail", ["--fail-rank", "3", "--sleep", "120"])
    began = time.monotonic()
    result = launch(slurm_cluster, tmp_path, job, job_id)
    took = time.monotonic() - began

    assert result.returncode == 1, result.stdout[-3000:]
    summary = result.stdout[result.stdout.index("Root Cause"):]
    assert "host: node1" in summary and "rank: 3" in summary
    assert "rank 3 fails on purpose" in summary
    assert took < 90, f"the job took {took:.0f} s to end after rank 3 failed"
    rec = record(slurm_cluster, tmp_path, job_id)
    assert rec["state"] == "failed" and rec["exit_code"] == 1
    assert slurm_cluster.queue() == [] and job_processes(slurm_cluster, job_id) == []


def test_stop_cancels_a_detached_running_job_in_slurm_and_leaves_no_process(
        slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    home = tmp_path / "home"
    submitted = launch(slurm_cluster, tmp_path, write_job(tmp_path, "long", ["--sleep", "300"]), "stop-1",
                       "--detach", timeout=60)
    assert submitted.returncode == 0, submitted.stderr
    assert submitted.stdout.strip() == "stop-1"
    assert wait_for(lambda: "[node1 r3] step 3" in combined(tmp_path, "stop-1"), 120)
    follower = subprocess.Popen([sys.executable, "-m", "orchestrator", "logs", "-f", "stop-1"], cwd=REPO,
                                env={**os.environ, "DISTRUN_HOME": str(home), **slurm_cluster.env},
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        assert record(slurm_cluster, tmp_path, "stop-1")["state"] == "running"
        stopped = distrun("stop", "stop-1", home=home, env=slurm_cluster.env, timeout=60)
        followed, _ = follower.communicate(timeout=30)
    finally:
        if follower.poll() is None:
            follower.kill()

    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    rec = record(slurm_cluster, tmp_path, "stop-1")
    assert rec["state"] == "stopped"
    assert slurm_state(slurm_cluster, rec["backend_ref"]) == "CANCELLED"
    assert "[node0 r0] step 0" in followed and "CANCELLED" in followed
    assert slurm_cluster.queue() == [] and job_processes(slurm_cluster, "stop-1") == []


def test_a_job_whose_controller_died_shows_slurms_own_state_running_then_succeeded(
        slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    submitted = launch(slurm_cluster, tmp_path, write_job(tmp_path, "orphan", ["--sleep", "10"]), "orphan-1",
                       "--detach", timeout=60)
    assert submitted.returncode == 0, submitted.stderr
    assert wait_for(lambda: "[node1 r3] step 3" in combined(tmp_path, "orphan-1"), 120)
    os.kill(record(slurm_cluster, tmp_path, "orphan-1")["controller_pid"], 9)
    time.sleep(0.5)
    assert record(slurm_cluster, tmp_path, "orphan-1")["state"] == "running"  # Slurm still runs it
    assert wait_for(lambda: slurm_cluster.queue() == [], 120)
    rec = record(slurm_cluster, tmp_path, "orphan-1")
    assert (rec["state"], rec["exit_code"]) == ("succeeded", 0)
    assert "ended COMPLETED after its controller died" in rec["detail"]


def test_a_job_waiting_for_busy_nodes_shows_why_and_can_be_stopped_while_pending(
        slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    busy_id = unique_job_id("busy-1")
    waiting_id = unique_job_id("wait-1")
    busy = write_job(tmp_path, "busy", ["--sleep", "300"])
    waiting = write_job(tmp_path, "waiting", ["--steps", "1"], extra="slurm: {extra: [--exclusive]}\n")
    assert launch(slurm_cluster, tmp_path, busy, busy_id, "--detach", timeout=60).returncode == 0
    try:
        assert wait_for(lambda: record(slurm_cluster, tmp_path, busy_id)["state"] == "running", 60)
        assert launch(slurm_cluster, tmp_path, waiting, waiting_id, "--detach", timeout=60).returncode == 0
        assert wait_for(lambda: "pending (Resources)" in combined(tmp_path, waiting_id), 30)
        assert record(slurm_cluster, tmp_path, waiting_id)["state"] == "pending"
        assert distrun("stop", waiting_id, home=tmp_path / "home", env=slurm_cluster.env).returncode == 0
        assert wait_for(lambda: record(slurm_cluster, tmp_path, waiting_id)["state"] == "stopped", 30)
    finally:
        distrun("stop", busy_id, home=tmp_path / "home", env=slurm_cluster.env, timeout=60)
    assert wait_for(lambda: slurm_cluster.queue() == [], 30)
    assert job_processes(slurm_cluster, busy_id) == []


def test_a_job_asking_for_more_nodes_than_slurm_has_is_refused_at_once(
        slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    began = time.monotonic()
    result = launch(slurm_cluster, tmp_path, write_job(tmp_path, "big", []), "big-1", "--nnodes", "3", timeout=60)

    assert result.returncode == 2
    assert "asks for 3 nodes but Slurm partition debug has 2 (node0, node1)" in result.stderr
    assert "Traceback" not in result.stderr and time.monotonic() - began < 20
    assert slurm_cluster.queue() == []


@pytest.mark.skipif(not (REPO / "jobs" / "resnet50.yaml").exists(), reason="jobs/resnet50.yaml not written yet")
def test_the_resnet50_job_spec_runs_unchanged_on_slurm(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    result = launch(slurm_cluster, tmp_path, REPO / "jobs" / "resnet50.yaml", "resnet-1",
                    "--", "--model", "tiny", "--steps", "3", "--image-size", "32", "--batch-size", "4",
                    timeout=300)

    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    assert record(slurm_cluster, tmp_path, "resnet-1")["state"] == "succeeded"


def test_a_batch_script_that_fails_before_torchrun_shows_slurms_error_in_the_summary(
        slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    job_id = unique_job_id("nopy-1")
    inventory = slurm_cluster.cluster.write_inventory(tmp_path / "inventory.yaml", python="/nonexistent/python3")
    result = distrun("launch", str(write_job(tmp_path, "nopy", [])), "--backend", "slurm", "-i", str(inventory),
                     "--job-id", job_id, home=tmp_path / "home", env=slurm_cluster.env, timeout=120)

    assert result.returncode == 1, result.stdout[-3000:]
    summary = result.stdout[result.stdout.index("Root Cause"):]
    assert "host: node0" in summary and "/nonexistent/python3" in summary
    assert record(slurm_cluster, tmp_path, job_id)["state"] == "failed"
    assert slurm_cluster.queue() == []


ENV_REPORT = """\
import hashlib, json, os, sys
token = os.environ.get("TOKEN", "")
sys.stdout.write("ENV " + json.dumps({
    "token_sha": hashlib.sha256(token.encode()).hexdigest(),
    "copies": sorted(k for k, v in os.environ.items() if v == token and k != "TOKEN"),
    "unrelated": "DISTRUN_TEST_UNRELATED" in os.environ,
    "secrets_file": os.path.exists(sys.argv[1]),
}) + "\\n")
"""


def test_the_job_gets_its_secret_but_not_the_controllers_environment_and_no_secrets_file_while_it_runs(
        slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    job_id = unique_job_id("env-1")
    secret = "slurm-sekrit-8128"
    script = tmp_path / "env_report.py"
    script.write_text(ENV_REPORT)
    secrets_file = tmp_path / "home" / "jobs" / job_id / "slurm" / "secrets.json"
    job = tmp_path / "env.yaml"
    job.write_text(f"name: env\nscript: {script}\nargs: [{json.dumps(str(secrets_file))}]\nnnodes: 2\n"
                   "nproc_per_node: 1\nenv: {TOKEN: '${env:DISTRUN_TEST_SOURCE}'}\ntelemetry: {enabled: false}\n")
    inventory = slurm_cluster.cluster.write_inventory(tmp_path / "inventory.yaml")
    result = distrun("launch", str(job), "--backend", "slurm", "-i", str(inventory), "--job-id", job_id,
                     home=tmp_path / "home", timeout=180,
                     env={**slurm_cluster.env, "DISTRUN_TEST_SOURCE": secret, "DISTRUN_TEST_UNRELATED": "1"})

    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    reports = [json.loads(line.split("ENV ", 1)[1]) for line in result.stdout.splitlines() if " ENV " in line]
    assert len(reports) == 2
    expected = {"token_sha": hashlib.sha256(secret.encode()).hexdigest(), "copies": [], "unrelated": False,
                "secrets_file": False}
    assert reports == [expected, expected]
    assert not secrets_file.exists()


LITERAL_ARGS = ["$SLURM_NODEID", "--master-addr", "$MASTER_ADDR", "${MASTER_PORT}", "`hostname`", "$(id -u)", "a b"]


def test_arguments_naming_node_variables_reach_the_script_literally_on_slurm_as_over_ssh(
        slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    script = tmp_path / "show_args.py"
    script.write_text("import json, sys\nsys.stdout.write('ARGS ' + json.dumps(sys.argv[1:]) + '\\n')\n")
    job = tmp_path / "args.yaml"
    job.write_text(f"name: args\nscript: {script}\nargs: {json.dumps(LITERAL_ARGS)}\nnproc_per_node: 1\n")
    inventory = slurm_cluster.cluster.write_inventory(tmp_path / "inventory.yaml")
    for backend in ("slurm", "ssh"):
        result = distrun("launch", str(job), "--backend", backend, "-i", str(inventory), "--job-id", f"args-{backend}",
                         home=tmp_path / "home", env=slurm_cluster.env, timeout=120)

        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
        shown = [json.loads(line.split("ARGS ", 1)[1]) for line in result.stdout.splitlines() if "ARGS " in line]
        assert shown == [LITERAL_ARGS, LITERAL_ARGS], backend


def test_a_restart_excludes_the_node_whose_worker_was_killed_and_resumes_on_the_other(
        slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    job_id = unique_job_id("again-1")
    worker = REPO / "tests" / "cluster" / "jobs" / "restart_worker.py"
    job = tmp_path / "again.yaml"
    job.write_text(f"name: again\nscript: {worker}\nargs: [--steps, '24', --step-time, '0.3']\nnproc_per_node: 2\n"
                   f"env: {{OMP_NUM_THREADS: '1'}}\nstop_grace: 3\nnnodes: 1\nrestarts: {{max: 1, backoff: 0}}\n"
                   f"checkpoint_dir: {tmp_path / 'ckpt'}\n")
    inventory = slurm_cluster.cluster.write_inventory(tmp_path / "inventory.yaml")
    with open(tmp_path / "out.txt", "w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "orchestrator", "launch", str(job), "--backend", "slurm", "-i",
                                 str(inventory), "--job-id", job_id, "--no-live"], cwd=REPO, stdout=out,
                                stderr=subprocess.STDOUT,
                                env={**os.environ, "DISTRUN_HOME": str(tmp_path / "home"), **slurm_cluster.env})
    try:
        assert wait_for(lambda: "step 4 attempt 1" in combined(tmp_path, job_id), 120), \
            (tmp_path / "out.txt").read_text()[-3000:]
        first = record(slurm_cluster, tmp_path, job_id)["hosts"][0]
        index = int(first.removeprefix("node"))
        workers = [p for p in slurm_cluster.cluster.processes_with_env(index, "DISTRUN_JOB_ID", job_id)
                   if str(worker) in p.cmdline]
        assert workers
        os.kill(workers[0].pid, 9)
        proc.wait(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
    text = (tmp_path / "out.txt").read_text()
    assert proc.returncode == 0, text[-4000:]
    rec = record(slurm_cluster, tmp_path, job_id)
    other = "node1" if first == "node0" else "node0"
    assert rec["quarantined"] == [first] and [a["hosts"] for a in rec["attempts"]] == [[first], [other]]
    script = (tmp_path / "home" / "jobs" / job_id / "slurm" / "attempt2" / "job.sbatch").read_text()
    assert f"#SBATCH --exclude={first}\n" in script
    assert f"attempt 2 submitted as Slurm job {rec['backend_ref']}, excluding {first}" in text
    again = distrun("logs", job_id, "--attempt", "2", "--bare", home=tmp_path / "home").stdout.splitlines()
    resumed = {line for line in again if line.startswith("resumed from step")}
    assert len(resumed) == 1, again
    start = int(resumed.pop().split()[-1])
    assert sorted(line for line in again if line.startswith("step ")) == sorted(
        f"step {s} attempt 2 world 2" for s in range(start, 24) for _ in range(2))
    assert slurm_cluster.queue() == [] and job_processes(slurm_cluster, job_id) == []


def test_stack_of_a_running_slurm_job_folds_its_four_ranks_on_two_nodes_into_one_group(
        slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    job_id = unique_job_id("stack-1")
    home = tmp_path / "home"
    # Each step: a tiny all_reduce, then 2 s of sleep, where every rank is when it is dumped.
    job = tmp_path / "healthy.yaml"
    job.write_text(f"name: healthy\nscript: {HANG_WORKER}\nargs: [--steps, '1000', --step-time, '2']\n"
                   "nproc_per_node: 2\nenv: {OMP_NUM_THREADS: '1'}\nstop_grace: 3\n")
    submitted = launch(slurm_cluster, tmp_path, job, job_id, "--detach", timeout=60)
    assert submitted.returncode == 0, submitted.stderr
    try:
        assert wait_for(lambda: "[node1 r3] step 1" in combined(tmp_path, job_id), 120)
        began = time.monotonic()
        done = distrun("stack", job_id, "--json", home=home, env=slurm_cluster.env, timeout=90)
        took = time.monotonic() - began
        assert done.returncode == 0, done.stdout + done.stderr
        groups = json.loads(done.stdout)["groups"]
        assert [(g["ranks"], g["hosts"]) for g in groups] == [([0, 1, 2, 3], ["node0", "node1"])]
        assert groups[0]["where"] == "steps (hang_worker.py:46)"
        assert list((home / "jobs" / job_id / "slurm").glob("*.bundle")) == []
    finally:
        distrun("stop", job_id, home=home, env=slurm_cluster.env, timeout=60)
    assert job_processes(slurm_cluster, job_id) == []
    print(f"MEASURED distrun stack --json on Slurm, 4 ranks on 2 nodes: {took:.2f} s (the whole command)")


def test_a_rank_stuck_outside_the_collective_on_slurm_is_the_hangs_root_cause_with_its_stack(
        slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    job_id = unique_job_id("hang-1")
    job = tmp_path / "hang.yaml"
    job.write_text(f"name: hang\nscript: {HANG_WORKER}\nargs: [--steps, '100000', --hang-rank, '3', --hang-step, '5']\n"
                   "nproc_per_node: 2\nenv: {OMP_NUM_THREADS: '1'}\nstop_grace: 3\nhang_timeout: 10\n")
    result = launch(slurm_cluster, tmp_path, job, job_id)
    ended = time.time()

    assert result.returncode == 1, result.stdout[-3000:] + result.stderr[-2000:]
    summary = result.stdout[result.stdout.index("Root Cause"):]
    assert "host: node1" in summary and "rank: 3" in summary
    assert "load_batch (hang_worker.py:21)" in summary and "ranks 0-2 wait in: all_reduce" in summary
    # The Flight Recorder through the allocation too: steps 0-4 are collectives #1-#5.
    assert ("flight recorder: rank 3 has not entered collective #6 gloo:all_reduce that ranks 0-2 wait in "
            "(last entered: #5)") in summary, summary
    stacks = tmp_path / "home" / "jobs" / job_id / "stacks"
    assert sorted(p.name for p in stacks.glob("rank*.txt")) == [f"rank{r}.txt" for r in range(4)]
    flight = tmp_path / "home" / "jobs" / job_id / "flight"
    assert sorted(p.name for p in flight.glob("rank*.json")) == [f"rank{r}.json" for r in range(4)]
    began = float(result.stdout.split("HANG START ", 1)[1].split()[0])
    assert slurm_cluster.queue() == [] and job_processes(slurm_cluster, job_id) == []
    print(f"MEASURED on Slurm, hang start to root cause: {ended - began:.1f} s (hang_timeout 10 s, "
          "the controller's exit included)")
