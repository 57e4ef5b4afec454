"""`distrun launch` end to end on the built-in local inventory: real torchrun, real ranks."""

from __future__ import annotations

import json

import pytest

from tests.helpers import REPO, distrun, job_lines

TINY = ["--", "--model", "tiny", "--steps", "4", "--log-every", "2", "--image-size", "32", "--batch-size", "4",
        "--print-checksum"]


def write_job(tmp_path, extra: str = "") -> str:
    path = tmp_path / "tiny.yaml"
    path.write_text(
        "name: tiny\n"
        f"script: {REPO / 'jobs' / 'train_resnet50.py'}\n"
        "env: {OMP_NUM_THREADS: '1', API_TOKEN: '${env:DISTRUN_TEST_TOKEN}'}\n"
        "telemetry: {interval: 0.5}\n" + extra
    )
    return str(path)


@pytest.fixture(scope="module")
def finished_job(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("local")
    home = tmp / "home"
    result = distrun("launch", write_job(tmp), *TINY, home=home, env={"DISTRUN_TEST_TOKEN": "tok-3141592"})
    return home, result


def job_dir(home):
    (path,) = (home / "jobs").iterdir()
    return path


def test_local_launch_succeeds_with_two_ranks_and_a_throughput_summary(finished_job):
    home, result = finished_job
    assert result.returncode == 0, result.stdout + result.stderr
    assert "[localhost r0]" in result.stdout and "succeeded" in result.stdout and "samples/s" in result.stdout
    assert "DISTRUN_METRICS" not in result.stdout, "metrics lines are data for the summary, not for the screen"
    logged = distrun("logs", "last", home=home).stdout
    assert "[localhost r0] DISTRUN_METRICS" in logged and "[localhost r1] DISTRUN_METRICS" in logged


def test_the_first_line_on_a_pipe_is_the_job_id_and_where_its_files_are(finished_job):
    home, result = finished_job
    root = job_dir(home)
    assert result.stdout.splitlines()[0] == f"Submitted job {root.name} (its files: {root})"


def test_local_launch_keeps_each_ranks_lines_once_with_an_index_in_arrival_order_and_metrics(finished_job):
    home, _ = finished_job
    root = job_dir(home)
    assert (root / "ranks" / "0.out").read_text().strip()
    assert (root / "ranks" / "1.out").read_text().strip()
    assert (root / "lines.idx").read_text().strip()
    assert "[localhost r1]" in job_lines(root)
    metrics = [json.loads(line) for line in (root / "metrics.jsonl").read_text().splitlines()]
    assert sorted((m["step"], m["rank"]) for m in metrics if not m.get("final")) == [(2, 0), (2, 1), (4, 0), (4, 1)]
    assert all(m["node"] == "localhost" and m["busy_s"] > 0 for m in metrics if not m.get("final"))
    assert [m["rank"] for m in metrics if m.get("final")] == [0]


def test_local_launch_records_the_job_as_succeeded(finished_job):
    home, _ = finished_job
    result = distrun("ps", "--json", home=home)
    (rec,) = json.loads(result.stdout)
    assert rec["state"] == "succeeded" and rec["exit_code"] == 0
    assert rec["hosts"] == ["localhost"] and rec["master_addr"] == "127.0.0.1"
    assert rec["ended"] >= rec["started"]


def test_secret_values_never_reach_plan_logs_or_database(finished_job):
    home, result = finished_job
    for path in [*home.rglob("*")]:
        if path.is_file():
            assert b"tok-3141592" not in path.read_bytes(), path
    assert "tok-3141592" not in result.stdout + result.stderr
    plan = json.loads((job_dir(home) / "plan.json").read_text())
    assert plan["hosts"][0]["env"]["API_TOKEN"] == "***"


def test_logs_command_filters_by_rank_grep_and_tail(finished_job):
    home, _ = finished_job
    rank1 = distrun("logs", "last", "--rank", "1", home=home).stdout.splitlines()
    assert rank1 and not any(line.startswith("[localhost r0]") for line in rank1)
    metrics = distrun("logs", "last", "--grep", "DISTRUN_METRICS", home=home).stdout.splitlines()
    assert metrics and all("DISTRUN_METRICS" in line for line in metrics)
    assert len(distrun("logs", "last", "--tail", "3", home=home).stdout.splitlines()) == 3


def test_job_ids_are_accepted_by_unique_prefix(finished_job):
    home, _ = finished_job
    (rec,) = json.loads(distrun("ps", "--json", home=home).stdout)
    prefix = rec["id"][: len("tiny-") + 4]
    result = distrun("logs", prefix, "--tail", "1", home=home)
    assert result.returncode == 0, result.stderr


def test_unknown_job_id_is_a_one_line_usage_error(tmp_path):
    result = distrun("logs", "nope", home=tmp_path)
    assert result.returncode == 2
    assert result.stderr.strip().count("\n") == 0 and "no job matches 'nope'" in result.stderr


def test_a_rank_that_raises_fails_the_job_with_exit_1_and_names_the_rank(tmp_path):
    home = tmp_path / "home"
    result = distrun("launch", write_job(tmp_path), *TINY, "--fail-at-step", "2", "--fail-rank", "1",
                     home=home, env={"DISTRUN_TEST_TOKEN": "x"})
    assert result.returncode == 1, result.stdout + result.stderr
    assert "Root Cause (first observed failure)" in result.stdout
    assert "rank: 1" in result.stdout
    # Its traceback shows once on the screen: the summary refers to it; the record and summary.txt keep it.
    raised = [line for line in result.stdout.splitlines() if "[localhost r1 err]" in line and "Error" in line][-1]
    error = raised.split("]: ", 1)[-1]
    assert result.stdout.count("Traceback (most recent call last)") == 1, result.stdout
    assert f"  error: {error}" in result.stdout and "lines of rank 1: shown above (not repeated here)" in result.stdout
    rec = json.loads(distrun("ps", "--json", home=home).stdout)[0]
    assert rec["state"] == "failed" and rec["exit_code"] == 1
    root = rec["failures"][0]
    assert (root["host"], root["rank"], root["kind"], root["exit_code"]) == ("localhost", 1, "exit", 1)
    assert any("fail" in line.lower() for line in root["last_lines"])
    assert any(error in line for line in root["last_lines"])


def test_dry_run_prints_argv_and_masked_env_and_starts_nothing(tmp_path):
    home = tmp_path / "home"
    # --probe: the values only a probe can fill (processes per node, the port) filled in.
    result = distrun("launch", write_job(tmp_path), "--dry-run", "--probe", home=home,
                     env={"DISTRUN_TEST_TOKEN": "zz-secret"})
    assert result.returncode == 0, result.stderr
    assert "bin/distrun_torchrun.py --log-dir" in result.stdout and "--nproc-per-node 2" in result.stdout
    assert "API_TOKEN=***" in result.stdout and "zz-secret" not in result.stdout
    assert not (home / "jobs").exists() or not any((home / "jobs").iterdir())


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("name: x\nscript: jobs/train_resnet50.py\nnproc_per_nod: 2\n", "unknown key (did you mean 'nproc_per_node'?)"),
        ("name: x\nscript: jobs/train_resnet50.py\nnnodes: -1\n", "nnodes"),
        ("name: x\nscript: jobs/does_not_exist.py\n", "script"),
    ],
)
def test_bad_job_files_give_one_line_file_line_errors_and_exit_2(tmp_path, text, message):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    result = distrun("launch", str(path), home=tmp_path / "home")
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    line = result.stderr.strip()
    assert "\n" not in line and f"{path}:" in line and message in line


def test_nnodes_larger_than_the_inventory_is_an_error_at_the_nnodes_line(tmp_path):
    path = tmp_path / "big.yaml"
    path.write_text("name: x\nscript: jobs/train_resnet50.py\nnnodes: 3\n")
    result = distrun("launch", str(path), home=tmp_path / "home")
    assert result.returncode == 2
    assert f"{path}:3: nnodes" in result.stderr


def restarting_job(tmp_path, max_restarts: int, succeed_after: int | None) -> str:
    """A one-rank job whose worker fails in each of torchrun's attempts before `succeed_after`
    (TORCHELASTIC_RESTART_COUNT), and in every one when it is None."""
    script = tmp_path / "flaky.py"
    limit = "10**9" if succeed_after is None else str(succeed_after)
    script.write_text("import os, sys\n"
                      "restart = int(os.environ['TORCHELASTIC_RESTART_COUNT'])\n"
                      "print(f'attempt {restart}', flush=True)\n"
                      f"sys.exit(3 if restart < {limit} else 0)\n")
    path = tmp_path / "flaky.yaml"
    path.write_text(f"name: flaky\nscript: {script}\nnproc_per_node: 1\nmax_restarts: {max_restarts}\n")
    return str(path)


@pytest.mark.parametrize(("succeed_after", "state", "restarts"), [(1, "succeeded", 1), (None, "failed", 2)])
def test_torchrun_restarts_of_its_workers_are_counted_and_recorded(tmp_path, succeed_after, state, restarts):
    home = tmp_path / "home"
    result = distrun("launch", restarting_job(tmp_path, 2, succeed_after), home=home)
    assert result.stdout.count(" r0] attempt ") == restarts + 1, result.stdout + result.stderr
    rec = json.loads(distrun("ps", "--json", home=home).stdout)[0]
    assert (rec["state"], rec["restarts"]) == (state, restarts)
    if state == "succeeded":
        assert f"restarts: {restarts}" in result.stdout
