"""The controller's restarts end to end on this machine (the local backend, real torchrun, 2 gloo ranks)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from tests.helpers import REPO, distrun, wait_for

WORKER = REPO / "tests" / "cluster" / "jobs" / "restart_worker.py"


def write_job(tmp_path: Path, args: list[str], restarts: str) -> Path:
    path = tmp_path / "job.yaml"
    path.write_text(f"name: again\nscript: {WORKER}\nargs: {json.dumps(args)}\nnproc_per_node: 2\n"
                    f"env: {{OMP_NUM_THREADS: '1'}}\nstop_grace: 2\nrestarts: {restarts}\n"
                    f"checkpoint_dir: {tmp_path / 'not' / 'yet' / 'there'}\n")
    return path


def record(home: Path) -> dict:
    return json.loads(distrun("ps", "--json", home=home).stdout)[0]


def interrupted_launch(tmp_path: Path, job: Path, home: Path, when: str, sig: signal.Signals) -> tuple[int, str]:
    """`distrun launch JOB` on this machine, sent `sig` once its output shows `when`; its exit code and output."""
    env = {**os.environ, "DISTRUN_HOME": str(home), "OMP_NUM_THREADS": "1"}
    out = tmp_path / "out.txt"
    with open(out, "w") as sink:
        proc = subprocess.Popen([sys.executable, "-m", "orchestrator", "launch", str(job), "--backend", "local",
                                 "--no-live"], cwd=REPO, env=env, stdout=sink, stderr=subprocess.STDOUT)
    try:
        assert wait_for(lambda: when in out.read_text(), 120), out.read_text()[-3000:]
        proc.send_signal(sig)
        return proc.wait(timeout=30), out.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()


def test_a_rank_that_fails_once_restarts_on_the_same_host_from_the_checkpoint(tmp_path: Path) -> None:
    home = tmp_path / "home"
    job = write_job(tmp_path, ["--steps", "8", "--step-time", "0.05", "--fail-rank", "1", "--fail-at", "3",
                               "--fail-once"], "{max: 1, backoff: 0}")
    result = distrun("launch", str(job), "--backend", "local", "--no-live", home=home)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert (tmp_path / "not" / "yet" / "there" / "step").read_text() == "8"
    rec = record(home)
    assert [(a["number"], a["hosts"], (a["failure"] or {}).get("kind")) for a in rec["attempts"]] == [
        (1, ["localhost"], "exit"), (2, ["localhost"], None)]
    assert rec["quarantined"] == []
    second = distrun("logs", "last", "--attempt", "2", "--bare", home=home).stdout.splitlines()
    assert sorted(line for line in second if line.startswith(("resumed", "step"))) == sorted(
        ["resumed from step 3"] * 2 + [f"step {s} attempt 2 world 2" for s in range(3, 8) for _ in range(2)])
    first = distrun("logs", "last", "--attempt", "1", "--bare", home=home).stdout
    assert "step 2 attempt 1 world 2" in first and "attempt 2 world" not in first
    assert "restarting: attempt 2 on the same hosts, localhost" in result.stderr + result.stdout
    assert "Attempts (2 of at most 2):" in result.stderr + result.stdout


def test_sigterm_during_the_backoff_stops_the_job_before_its_next_attempt(tmp_path: Path) -> None:
    home = tmp_path / "home"
    job = write_job(tmp_path, ["--steps", "8", "--step-time", "0.05", "--fail-rank", "0", "--fail-at", "1"],
                    "{max: 3, backoff: 120}")
    code, text = interrupted_launch(tmp_path, job, home, "restarting: attempt 2", signal.SIGTERM)
    assert code == 143, text[-3000:]
    rec = record(home)
    assert rec["state"] == "stopped" and len(rec["attempts"]) == 1
    assert rec["detail"].startswith(f"job {rec['id']} stopped (SIGTERM) before attempt 2\nAttempts (1 of at most 4):")


def test_sigint_during_a_restartable_attempt_shows_the_attempt_as_stopped(tmp_path: Path) -> None:
    home = tmp_path / "home"
    job = write_job(tmp_path, ["--steps", "100000", "--step-time", "0.2"], "{max: 3, backoff: 0}")
    code, text = interrupted_launch(tmp_path, job, home, "step 2 attempt 1", signal.SIGINT)
    assert code == 130, text[-3000:]
    rec = record(home)
    assert rec["state"] == "stopped"
    assert [(a["number"], a["state"], a["failure"]) for a in rec["attempts"]] == [(1, "stopped", None)]
    assert f"job {rec['id']} stopped (SIGINT)" in text
    attempt = next(line for line in text.splitlines() if line.strip().startswith("attempt 1 on localhost"))
    assert attempt.endswith(": stopped"), attempt


def test_logs_follow_of_a_detached_job_goes_through_its_restart_and_exits_with_its_code(tmp_path: Path) -> None:
    home = tmp_path / "home"
    job = write_job(tmp_path, ["--steps", "8", "--step-time", "0.2", "--fail-rank", "1", "--fail-at", "3",
                               "--fail-once"], "{max: 1, backoff: 1}")
    launched = distrun("launch", str(job), "--backend", "local", "--detach", home=home)
    assert launched.returncode == 0, launched.stderr

    followed = distrun("logs", "last", "-f", home=home)

    assert followed.returncode == 0, followed.stdout[-3000:] + followed.stderr[-3000:]
    lines = followed.stdout.splitlines()
    assert "--- attempt 2 ---" in lines
    second = lines[lines.index("--- attempt 2 ---"):]
    assert sorted(line for line in second if line.endswith("step 7 attempt 2 world 2")) == [
        "[localhost r0] step 7 attempt 2 world 2", "[localhost r1] step 7 attempt 2 world 2"]
    assert any(line.endswith("step 2 attempt 1 world 2") for line in lines[:lines.index("--- attempt 2 ---")])
    assert record(home)["state"] == "succeeded"
