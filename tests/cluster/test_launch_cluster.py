"""Multi-host launch over SSH on real sshd hosts: agreement, fail fast, no orphans, operations."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers import REPO, distrun, job_lines, unique_job_id, wait_for

from .ports import in_time_wait, leave_in_time_wait, port_held

WORKER = Path(__file__).parent / "jobs" / "worker.py"
TRAIN = REPO / "jobs" / "train_resnet50.py"


def write_job(
    tmp_path: Path, name: str = "w", args: list[str] | None = None, extra: str = "", script: Path = WORKER,
    heartbeat: float = 8,
) -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_text(
        f"name: {name}\nscript: {script}\nargs: {json.dumps(args or [])}\nnproc_per_node: 2\n"
        f"env: {{OMP_NUM_THREADS: '1'}}\nheartbeat_timeout: {heartbeat:g}\nstop_grace: 3\n" + extra
    )
    return path


def start(job: Path, inv: Path, home: Path, job_id: str, *extra: str) -> subprocess.Popen[str]:
    """`distrun launch` in the background, its output in HOME/<job_id>.out."""
    env = {**os.environ, "DISTRUN_HOME": str(home), "OMP_NUM_THREADS": "1"}
    home.mkdir(parents=True, exist_ok=True)
    with open(home / f"{job_id}.out", "w") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "orchestrator", "launch", str(job), "-i", str(inv), "--job-id", job_id, *extra],
            cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT, text=True,
        )


def output(home: Path, job_id: str) -> str:
    path = home / f"{job_id}.out"
    return path.read_text(errors="replace") if path.exists() else ""


def job_procs(cluster, job_id: str) -> dict[int, list]:
    return {i: cluster.processes_with_env(i, "DISTRUN_JOB_ID", job_id) for i in range(cluster.n)}



def wait_for_line(home: Path, job_id: str, text: str, timeout: float = 120) -> None:
    path = home / "jobs" / job_id
    assert wait_for(lambda: text in job_lines(path), timeout), (
        f"{text!r} never appeared in {path}; distrun said: {output(home, job_id)[-2000:]}"
    )


def record(home: Path, job_id: str) -> dict:
    return next(r for r in json.loads(distrun("ps", "--json", "--all", home=home).stdout) if r["id"] == job_id)


@pytest.fixture
def inv(cluster3, tmp_path) -> Path:
    return cluster3.write_inventory(tmp_path / "inv.yaml")


def test_three_hosts_two_processes_each_agree_on_allreduce_and_trained_weights(cluster3, inv, tmp_path):
    job_id = unique_job_id("ddp-3x2")
    home = tmp_path / "home"
    job = write_job(
        tmp_path,
        "ddp",
        [
            "--model",
            "tiny",
            "--steps",
            "3",
            "--image-size",
            "32",
            "--batch-size",
            "4",
            "--log-every",
            "1",
            "--print-checksum",
        ],
        script=TRAIN,
    )
    result = distrun("launch", str(job), "-i", str(inv), "--job-id", job_id, "--metrics-lines", home=home)
    assert result.returncode == 0, result.stdout[-3000:]
    sums = [
        json.loads(line.split("DISTRUN_CHECKSUM ", 1)[1])
        for line in result.stdout.splitlines()
        if "DISTRUN_CHECKSUM " in line
    ]
    assert sorted(s["rank"] for s in sums) == list(range(6))
    assert {s["allreduce"] for s in sums} == {21.0}
    assert len({s["weights"] for s in sums}) == 1
    rec = record(home, job_id)
    assert rec["state"] == "succeeded" and rec["exit_code"] == 0
    assert rec["hosts"] == ["node0", "node1", "node2"] and rec["master_addr"] == cluster3.addr(0)
    assert all(not procs for procs in job_procs(cluster3, job_id).values())


def test_every_torchrun_worker_variable_is_present_and_correct_in_each_rank(cluster3, inv, tmp_path):
    job_id = unique_job_id("env-1")
    home = tmp_path / "home"
    result = distrun("launch", str(write_job(tmp_path)), "-i", str(inv), "--job-id", job_id, home=home)
    assert result.returncode == 0, result.stdout[-3000:]
    envs = [json.loads(line.split("ENV ", 1)[1]) for line in result.stdout.splitlines() if " ENV {" in line]
    assert len(envs) == 6
    for env in envs:
        rank, local = int(env["RANK"]), int(env["LOCAL_RANK"])
        assert env["hostname"] == f"node{rank // 2}"
        assert local == rank % 2 and int(env["GROUP_RANK"]) == rank // 2
        assert env["WORLD_SIZE"] == "6" and env["LOCAL_WORLD_SIZE"] == "2" and env["GROUP_WORLD_SIZE"] == "3"
        assert env["ROLE_RANK"] == str(rank) and env["ROLE_WORLD_SIZE"] == "6"
        assert env["MASTER_ADDR"] == cluster3.addr(0) and env["MASTER_PORT"].isdigit()
        assert env["TORCHELASTIC_RESTART_COUNT"] == "0" and env["TORCHELASTIC_MAX_RESTARTS"] == "0"
        assert env["TORCHELASTIC_RUN_ID"] and env["DISTRUN_JOB_ID"] == job_id
        assert env["GLOO_SOCKET_IFNAME"] == "eth0"


def test_a_rank_raising_on_one_host_stops_all_hosts_and_names_host_and_rank(cluster3, inv, tmp_path):
    job_id = unique_job_id("fail-1")
    home = tmp_path / "home"
    job = write_job(tmp_path, args=["--fail-rank", "3", "--sleep", "60"])
    result = distrun("launch", str(job), "-i", str(inv), "--job-id", job_id, home=home, timeout=90)
    assert result.returncode == 1, result.stdout[-3000:]
    summary = result.stdout[result.stdout.index("Root Cause") :]
    assert "host: node1" in summary and "rank: 3" in summary
    assert "deliberate failure on rank 3" in summary
    assert "Other hosts: node[0,2]: stopped by distrun" in summary
    rec = record(home, job_id)
    assert rec["state"] == "failed"
    root = rec["failures"][0]
    # torchrun's record of rank 3: exit 1, or SIGABRT when gloo's thread aborts the interpreter's exit
    # after the exception ("terminate called without an active exception"; 2 CI runs in about 8).
    assert (root["host"], root["rank"]) == ("node1", 3)
    assert (root["kind"], root["exit_code"], root["signal"]) in (("exit", 1, None), ("signal", None, "SIGABRT"))
    assert all(not procs for procs in job_procs(cluster3, job_id).values())


def test_a_rank_aborting_after_its_last_step_fails_and_the_summary_says_the_work_was_done(cluster3, inv, tmp_path):
    job_id = unique_job_id("abort-1")
    home = tmp_path / "home"
    job = tmp_path / "abort.yaml"
    job.write_text(f"name: abort\nscript: {WORKER.parent / 'abort_at_exit.py'}\nnproc_per_node: 1\nstop_grace: 3\n")
    result = distrun("launch", str(job), "-i", str(inv), "--job-id", job_id, home=home, timeout=90)
    assert result.returncode == 1, result.stdout[-3000:]
    summary = result.stdout[result.stdout.index("FAILED") :]
    assert "host: node2" in summary and "rank: 2" in summary and "exit: killed by SIGABRT" in summary
    assert "when: at exit, after the job's final metrics line (its work was done)" in summary
    assert ("finished: every rank of node[0-1] had exited; distrun stopped those hosts in torchrun's exit barrier"
            in summary)
    # Its last line is on the screen above the summary, not repeated under it; the job's summary file has it.
    assert "rank 2: step 2/2 done" in result.stdout[:result.stdout.index("FAILED")]
    assert "last 1 lines of rank 2: shown above (not repeated here)" in summary
    assert "rank 2: step 2/2 done" in (home / "jobs" / job_id / "summary.txt").read_text()
    assert "Other hosts: node[0-1]: stopped by distrun" in summary
    root = record(home, job_id)["failures"][0]
    assert (root["host"], root["rank"], root["signal"]) == ("node2", 2, "SIGABRT")
    assert root["after_final"] is True and root["barrier_hosts"] == ["node0", "node1"]
    # Every other rank waited in torchrun's exit barrier, and rank 2 printed no traceback: a crash at exit.
    top = result.stdout[result.stdout.index(f"job {job_id} FAILED"):].splitlines()
    assert top[1] == "the work finished on every rank; rank 2 crashed at interpreter exit (SIGABRT)", top
    assert root["when"] == "at exit"


def test_cutting_one_hosts_link_stops_the_others_within_20_s_and_it_cleans_itself(cluster3, inv, tmp_path):
    job_id = unique_job_id("cut-1")
    home = tmp_path / "home"
    proc = start(write_job(tmp_path, args=["--sleep", "120"]), inv, home, job_id)
    try:
        wait_for_line(home, job_id, "tick 5")
        cluster3.cut(2)
        cut_at = time.monotonic()
        assert wait_for(lambda: not job_procs(cluster3, job_id)[0] and not job_procs(cluster3, job_id)[1], 25)
        gone_after = time.monotonic() - cut_at
        proc.wait(timeout=60)
        out = output(home, job_id)
    finally:
        cluster3.restore(2)
        if proc.poll() is None:
            proc.kill()
    assert gone_after <= 20, f"others still running {gone_after:.1f} s after the cut"
    assert proc.returncode == 1
    assert "host: node2" in out and "host lost" in out
    # node2's own last lines from before the cut (its ranks' ticks), not distrun's note written after it.
    block = out[out.index("last ", out.index("Root Cause")):out.index("Other hosts")]
    assert block.startswith("last ") and " lines of node2:" in block.splitlines()[0], block
    assert "tick" in block and "distrun:" not in block, block
    # The cut host's supervisor ends the job itself once the heartbeat has been silent.
    assert wait_for(lambda: not job_procs(cluster3, job_id)[2], 20)


def test_sigint_to_distrun_stops_every_host_and_exits_130(cluster3, inv, tmp_path):
    job_id = unique_job_id("int-1")
    home = tmp_path / "home"
    proc = start(write_job(tmp_path, args=["--sleep", "120"]), inv, home, job_id)
    wait_for_line(home, job_id, "tick 5")
    began = time.monotonic()
    proc.send_signal(signal.SIGINT)
    proc.wait(timeout=30)
    assert proc.returncode == 130
    assert wait_for(lambda: all(not p for p in job_procs(cluster3, job_id).values()), 10 - (time.monotonic() - began))
    assert record(home, job_id)["state"] == "stopped"


def test_stopping_one_of_two_jobs_on_the_same_hosts_leaves_the_other_to_finish(cluster3, inv, tmp_path):
    job_a = unique_job_id("two-a")
    job_b = unique_job_id("two-b")
    home = tmp_path / "home"
    long_job = start(write_job(tmp_path, "a", ["--sleep", "120"]), inv, home, job_a)
    short_job = start(write_job(tmp_path, "b", ["--sleep", "12"]), inv, home, job_b)
    try:
        wait_for_line(home, job_a, "tick 5")
        wait_for_line(home, job_b, "tick 5")
        assert distrun("stop", job_a, home=home).returncode == 0
        long_job.wait(timeout=30)
        assert all(not p for p in job_procs(cluster3, job_a).values())
        assert any(job_procs(cluster3, job_b).values()), "stopping two-a touched two-b"
        short_job.wait(timeout=120)
    finally:
        for proc in (long_job, short_job):
            if proc.poll() is None:
                proc.kill()
    assert record(home, job_a)["state"] == "stopped"
    assert short_job.returncode == 0 and record(home, job_b)["state"] == "succeeded"


def test_auto_port_skips_29500_when_it_is_taken_on_the_master(cluster3, inv, tmp_path):
    job_id = unique_job_id("port-1")
    with port_held(cluster3, 0, 29500):
        home = tmp_path / "home"
        result = distrun("launch", str(write_job(tmp_path)), "-i", str(inv), "--job-id", job_id, home=home)
        assert result.returncode == 0, result.stdout[-3000:]
        assert record(home, job_id)["master_port"] not in (0, 29500)


def test_an_explicit_busy_port_is_an_infrastructure_error_naming_host_and_port(cluster3, inv, tmp_path):
    leave_in_time_wait(cluster3, 0, 29511)  # as an earlier test's rendezvous on that port may have
    assert in_time_wait(cluster3, 0, 29511)
    with port_held(cluster3, 0, 29511):
        job = write_job(tmp_path, extra="rendezvous: {port: 29511}\n")
        result = distrun("launch", str(job), "-i", str(inv), home=tmp_path / "home")
    assert result.returncode == 3
    assert "node0" in result.stderr and "29511" in result.stderr and "Traceback" not in result.stderr


def test_detach_then_follow_logs_then_stop(cluster3, inv, tmp_path):
    home = tmp_path / "home"
    job = write_job(tmp_path, args=["--sleep", "120"])
    detached = distrun("launch", str(job), "-i", str(inv), "--detach", home=home, timeout=60)
    assert detached.returncode == 0, detached.stderr
    job_id = detached.stdout.strip().splitlines()[-1]
    wait_for_line(home, job_id, "tick 5")
    env = {**os.environ, "DISTRUN_HOME": str(home)}
    follower = subprocess.Popen(
        [sys.executable, "-m", "orchestrator", "logs", job_id, "-f", "--rank", "4"],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        text=True,
    )
    time.sleep(2)
    assert distrun("ps", home=home).stdout.count("running") == 1
    stopped = distrun("stop", job_id, home=home)
    assert stopped.returncode == 0, stopped.stderr
    out, _ = follower.communicate(timeout=30)
    # logs -f exits with the job's exit code: a job `distrun stop` ended is 143, as its controller says.
    assert follower.returncode == 143 and "[node2 r4] tick 4" in out
    assert record(home, job_id)["exit_code"] == 143
    assert record(home, job_id)["state"] == "stopped"
    assert all(not p for p in job_procs(cluster3, job_id).values())


def test_a_killed_controller_leaves_hosts_that_clean_themselves_and_ps_shows_lost(cluster3, inv, tmp_path):
    job_id = unique_job_id("kill-1")
    home = tmp_path / "home"
    proc = start(write_job(tmp_path, args=["--sleep", "120"]), inv, home, job_id)
    wait_for_line(home, job_id, "tick 5")
    proc.kill()
    proc.wait()
    assert wait_for(lambda: all(not p for p in job_procs(cluster3, job_id).values()), 8 + 10)
    assert record(home, job_id)["state"] == "lost"


def test_logs_recover_brings_back_what_a_cut_off_host_printed_after_the_controller_lost_it(cluster3, inv, tmp_path):
    job_id = unique_job_id("rec-1")
    home = tmp_path / "home"
    proc = start(write_job(tmp_path, args=["--sleep", "120"], extra="telemetry: {interval: 0.5}\n"), inv, home,
                 job_id)
    try:
        wait_for_line(home, job_id, "tick 5")
        cluster3.cut(2)
        proc.wait(timeout=60)
        # Cut off, node2's workers tick on until its supervisor's heartbeat timeout ends them.
        assert wait_for(lambda: not job_procs(cluster3, job_id)[2], 30)
    finally:
        cluster3.restore(2)
    seen = (home / "jobs" / job_id / "ranks" / "5.out").read_text().count("tick 5")
    result = distrun("logs", job_id, "--recover", "--rank", "5", "--grep", "tick", home=home)
    assert result.returncode == 0, result.stderr
    assert result.stderr.count("recovered") == 3
    assert len(result.stdout.splitlines()) >= seen + 8, "node2's ticks after the cut should be back"
    combined = job_lines(home / "jobs" / job_id)
    assert all(f"[node{i} r{2 * i}] tick" in combined for i in range(3))
    samples = [json.loads(line) for line in (home / "jobs" / job_id / "telemetry.jsonl").read_text().splitlines()]
    assert {s["node"] for s in samples} == {"node0", "node1", "node2"}

def test_stop_cleans_the_hosts_of_a_lost_job_directly(cluster3, inv, tmp_path):
    job_id = unique_job_id("lost-1")
    home = tmp_path / "home"
    job = write_job(tmp_path, args=["--sleep", "120"], heartbeat=600)
    proc = start(job, inv, home, job_id)
    wait_for_line(home, job_id, "tick 5")
    proc.kill()
    proc.wait()
    assert any(job_procs(cluster3, job_id).values())
    result = distrun("stop", job_id, home=home)
    assert result.returncode == 0, result.stderr
    assert all(not p for p in job_procs(cluster3, job_id).values())
    assert record(home, job_id)["state"] == "stopped"


def test_secrets_reach_ranks_through_stdin_and_never_show_in_host_ps(cluster3, inv, tmp_path):
    job_id = unique_job_id("sec-1")
    home = tmp_path / "home"
    job = write_job(tmp_path, args=["--sleep", "8"], extra="")
    text = job.read_text().replace("env: {OMP_NUM_THREADS: '1'}", "env: {OMP_NUM_THREADS: '1', TOKEN: '${env:T}'}")
    job.write_text(text)
    env = {**os.environ, "DISTRUN_HOME": str(home), "T": "sekrit-271828"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "orchestrator", "launch", str(job), "-i", str(inv), "--job-id", job_id],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        text=True,
    )
    wait_for_line(home, job_id, "tick 5")
    listing = cluster3.host_run(1, ["ps", "-eww", "-o", "args"]).stdout
    proc.communicate(timeout=60)
    assert job_id in listing and "sekrit-271828" not in listing
    assert proc.returncode == 0
    assert "sekrit" not in (home / "jobs" / job_id / "plan.json").read_text()


def test_max_restarts_restarts_the_workers_and_counts_the_restart(cluster3, inv, tmp_path):
    job_id = unique_job_id("restart-1")
    # One host: across hosts, torchrun's agents restart out of step and gloo's re-rendezvous
    # fails inside torch; distrun's part (passing max_restarts, counting restarts) is the same.
    home = tmp_path / "home"
    job = write_job(tmp_path, args=["--fail-rank", "1", "--fail-before-init"], extra="max_restarts: 1\n")
    result = distrun("launch", str(job), "-i", str(inv), "--nodes", "node1", "--job-id", job_id, home=home,
                     timeout=180)
    assert result.returncode == 0, result.stdout[-3000:]
    assert "restarts: 1" in result.stdout
    assert record(home, job_id)["restarts"] == 1


def test_sync_copies_the_workdir_to_private_host_dirs_skipping_ignored_and_unchanged(make_cluster, tmp_path):
    cluster = make_cluster(2, private_dirs=True)
    inv = cluster.write_inventory(tmp_path / "inv.yaml")
    project = tmp_path / "project"
    (project / "pkg").mkdir(parents=True)
    (project / "train.py").write_text("import os\nprint('CWD', os.getcwd(), sorted(os.listdir('.')))\n")
    (project / "pkg" / "data.txt").write_text("payload\n")
    (project / "secret.key").write_text("no\n")
    (project / ".distrunignore").write_text("*.key\n")
    job = project / "job.yaml"
    job.write_text("name: sync\nscript: train.py\nnproc_per_node: 1\nsync: true\nworkdir: /srv/node/project\n")
    home = tmp_path / "home"
    first = distrun("launch", str(job), "-i", str(inv), home=home, cwd=project)
    assert first.returncode == 0, first.stdout + first.stderr
    assert first.stdout.count("file(s) sent") == 2 and "(4 file(s) sent)" in first.stdout
    listing = cluster.host_run(1, ["find", "/srv/node/project", "-type", "f"]).stdout.split()
    assert sorted(listing) == [
        "/srv/node/project/.distrunignore",
        "/srv/node/project/job.yaml",
        "/srv/node/project/pkg/data.txt",
        "/srv/node/project/train.py",
    ]
    assert not Path("/srv/node/project").exists() or not (Path("/srv/node/project") / "train.py").exists()
    second = distrun("launch", str(job), "-i", str(inv), home=home, cwd=project)
    assert second.returncode == 0 and second.stdout.count("(0 file(s) sent)") == 2


def test_unreachable_host_at_launch_is_exit_3_naming_it_and_nothing_starts(cluster3, inv, tmp_path):
    job_id = unique_job_id("down-1")
    cluster3.stop_sshd(1)
    try:
        result = distrun(
            "launch", str(write_job(tmp_path)), "-i", str(inv), "--job-id", job_id, home=tmp_path / "home"
        )
    finally:
        cluster3.start_sshd(1)
    assert result.returncode == 3
    assert "node1" in result.stderr and "Traceback" not in result.stderr
    assert all(not p for p in job_procs(cluster3, job_id).values())


def test_a_misspelt_module_or_a_script_missing_on_a_host_fails_the_preflight_within_10_s_naming_it(
        make_cluster, tmp_path):
    cluster = make_cluster(2, private_dirs=True)
    inv = cluster.write_inventory(tmp_path / "inv.yaml")
    project = tmp_path / "project"
    (project / "pkg").mkdir(parents=True)
    (project / "train.py").write_text("print('trained')\n")
    for i, files in ((0, "pkg/__init__.py pkg/train.py train.py"), (1, "pkg/__init__.py pkg/train.py")):
        cluster.host_run(i, ["sh", "-c", f"mkdir -p /srv/node/project/pkg && cd /srv/node/project && touch {files}"])
    home = tmp_path / "home"
    cases = {"module: pkg.trian": "✗ entry  node[0-1]: module pkg.trian: No module named 'pkg.trian'",
             "script: train.py": "✗ entry  node1: script train.py: no such file"}
    for n, (entry, line) in enumerate(cases.items()):
        job = project / f"job{n}.yaml"
        job.write_text(f"name: entry\n{entry}\nnproc_per_node: 1\nworkdir: /srv/node/project\n")
        began = time.monotonic()
        result = distrun("launch", str(job), "-i", str(inv), "--job-id", f"entry-{n}", home=home, cwd=project)
        seconds = time.monotonic() - began
        assert result.returncode == 2, result.stdout + result.stderr
        assert line in result.stderr and "Traceback" not in result.stderr
        assert seconds < 10
        assert all(not p for p in job_procs(cluster, f"entry-{n}").values())
    doctor = distrun("doctor", "-i", str(inv), "--job", str(job), home=home, cwd=project)
    assert doctor.returncode == 1 and "✗ entry            node1: script train.py: no such file" in doctor.stdout
