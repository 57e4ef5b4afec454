"""What `srun` runs on each node of a Slurm job, run here as srun would (no Slurm needed)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import fields
from pathlib import Path

import pytest

from orchestrator.backends.slurm import batch_job, follow_lines, write_files
from orchestrator.backends.slurm_script import BatchJob, SlurmFiles, SlurmOptions, node_config, render_script
from orchestrator.backends.ssh import plan_supervisor_config
from orchestrator.remote.config import SupervisorConfig
from orchestrator.remote.slurm_node import exit_status, expand, fill_supervisor_config
from orchestrator.run.request import LaunchRequest
from orchestrator.spec import load_job
from orchestrator.store import JobDir

SECRET = "node-secret"


@pytest.fixture
def batch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> BatchJob:
    monkeypatch.setenv("TOKEN_SOURCE", SECRET)
    monkeypatch.setenv("HOME", str(tmp_path))
    script = tmp_path / "train.py"
    script.write_text("")
    job_file = tmp_path / "job.yaml"
    job_file.write_text(f"name: n\nscript: {script}\nnnodes: 2\nenv: {{TOKEN: '${{env:TOKEN_SOURCE}}'}}\n"
                        "stop_grace: 1\ntelemetry: {enabled: false}\n")
    job = load_job(job_file)
    job_dir = JobDir(tmp_path / "job")
    made, bundle = batch_job(job, LaunchRequest(job_file=str(job_file), backend="slurm").asked(), job_dir, "n-1",
                             SlurmOptions())
    write_files(job_dir, made, bundle, render_script(made))
    return made


def node_task(files: SlurmFiles, size: int, *argv: str, node: str = "n1", env: dict[str, str] | None = None,
              stdin: str = "") -> subprocess.CompletedProcess[str]:
    """Run the node's task as the batch script's srun line does, with a command instead of torchrun;
    `stdin` is what srun gives it (the secrets file, for the job's last srun)."""
    return subprocess.run(
        [sys.executable, str(files.bootstrap), str(files.bundle), str(size), *argv],
        env={**os.environ, "SLURMD_NODENAME": node, "SLURM_NODEID": "1", **(env or {})},
        input=stdin, capture_output=True, text=True, timeout=60, check=False,
    )


def stream_lines(files: SlurmFiles, node: str = "n1") -> list[str]:
    return files.stream(node).read_text().split("\n")


def events(lines: list[str]) -> list[dict]:
    return [json.loads(line[1:]) for line in lines if line.startswith("\x1e")]


def test_a_node_runs_the_command_with_its_secrets_and_exits_with_its_status(batch: BatchJob) -> None:
    command = ("import os, sys, time; time.sleep(1.5); t = os.environ['TOKEN']; "
               "print('args', *sys.argv[1:], t[::-1], t, os.environ['DISTRUN_JOB_ID']); sys.exit(3)")
    result = node_task(batch.files, batch.bundle_size, str(batch.files.node_json), "--",
                       sys.executable, "-c", command, "$SLURM_NODEID", "$MASTER_ADDR",
                       stdin=batch.files.secrets.read_text())

    assert result.returncode == 3, result.stderr
    lines = stream_lines(batch.files)
    # The job's own arguments stay as written: only torchrun's per-node options are filled in.
    # The secret reached the command (reversed, it is not masked); printed as it is, it is masked.
    assert f"args $SLURM_NODEID $MASTER_ADDR {SECRET[::-1]} *** n-1" in lines
    assert SECRET not in batch.files.stream("n1").read_text()
    kinds = [e["ev"] for e in events(lines)]
    assert kinds[0] == "started" and kinds[-1] == "exit"
    # stdin is closed under srun: that must not read as a controller gone away.
    assert events(lines)[-1]["rc"] == 3 and events(lines)[-1]["reason"] is None


def test_a_node_fills_its_rank_and_the_master_into_the_positions_the_config_names(batch: BatchJob) -> None:
    argv = [sys.executable, "-c", "import sys; print('args', *sys.argv[1:])", "$SLURM_NODEID", "$MASTER_ADDR"]
    config = json.loads(batch.files.node_json.read_text())
    config["expand_at"] = [3]
    batch.files.node_json.write_text(json.dumps(config))
    result = node_task(batch.files, batch.bundle_size, str(batch.files.node_json), "--", *argv,
                       env={"MASTER_ADDR": "n0"}, stdin=batch.files.secrets.read_text())

    assert result.returncode == 0, result.stderr
    assert "args 1 $MASTER_ADDR" in stream_lines(batch.files)


def test_a_node_killed_by_a_signal_exits_as_a_shell_reports_it(batch: BatchJob) -> None:
    result = node_task(batch.files, batch.bundle_size, str(batch.files.node_json), "--",
                       sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)",
                       stdin=batch.files.secrets.read_text())

    assert result.returncode == 128 + 9


def test_the_master_reports_its_node_name_and_a_free_port(batch: BatchJob) -> None:
    result = node_task(batch.files, batch.bundle_size, "port", "29500", node="n0")

    node, port = result.stdout.split()
    assert result.returncode == 0 and node == "n0" and int(port) >= 29500


def test_a_busy_fixed_port_fails_the_master_with_a_message_naming_it(batch: BatchJob) -> None:
    import socket

    with socket.socket() as held:
        held.bind(("0.0.0.0", 0))
        held.listen()
        port = held.getsockname()[1]
        result = node_task(batch.files, batch.bundle_size, "port", str(port), "exact", node="n0")

    assert result.returncode == 3
    assert f"rendezvous port {port} is in use on n0" in result.stderr


def test_only_the_named_variables_are_filled_and_only_at_the_given_positions() -> None:
    env = {"SLURM_NODEID": "2", "MASTER_ADDR": "node0", "HOME": "/root"}
    argv = ["--node-rank", "$SLURM_NODEID", "$MASTER_ADDR:$MASTER_PORT", "$HOME", "cost$5", "$SLURM_NODEID"]

    assert expand(argv, ["SLURM_NODEID", "MASTER_ADDR"], env, [1, 2, 3, 4]) == [
        "--node-rank", "2", "node0:$MASTER_PORT", "$HOME", "cost$5", "$SLURM_NODEID"]


def test_exit_status_of_a_signal_is_128_plus_it() -> None:
    assert (exit_status(0), exit_status(1), exit_status(-15), exit_status(None)) == (0, 1, 143, 127)


def test_the_controller_reads_event_lines_whole_and_drains_a_last_partial_line(tmp_path: Path) -> None:
    stream = tmp_path / "n0.stream"
    stream.write_bytes(b'[r0]step 1\n\x1e{"ev": "exit", "rc": 0}\nno newline yet')

    assert list(follow_lines(stream, lambda: True)) == ['[r0]step 1', '\x1e{"ev": "exit", "rc": 0}', "no newline yet"]


def test_the_controller_waits_for_a_stream_that_does_not_exist_yet(tmp_path: Path) -> None:
    stream = tmp_path / "n0.stream"
    calls = []

    def finished() -> bool:
        calls.append(1)
        if len(calls) == 3:
            stream.write_text("late\n")
        return len(calls) > 4

    assert list(follow_lines(stream, finished)) == ["late"]


def test_a_node_fills_its_own_values_into_the_one_supervisor_configuration_the_controller_wrote(
        batch: BatchJob) -> None:
    template = node_config(batch)["supervisor"]
    assert set(template) == {f.name for f in fields(SupervisorConfig)}
    argv = ["torchrun", "--node-rank", "1", "--nproc-per-node", "2", "x.py"]
    filled = fill_supervisor_config(node_config(batch), "c1", argv, dict(os.environ), {"TOKEN": "s"})
    assert (filled.node, filled.first_rank, filled.secret_names, filled.env) == ("c1", 2, ["TOKEN"], {"TOKEN": "s"})
    assert filled.heartbeat_timeout is None  # Slurm owns the job's lifetime: no controller heartbeat
    assert filled.stop_grace == batch.plan.stop_grace == 1
    over_ssh = plan_supervisor_config(batch.plan, batch.plan.hosts[0])
    assert (over_ssh.heartbeat_timeout, over_ssh.stop_grace) == (batch.plan.heartbeat_timeout, 1)
