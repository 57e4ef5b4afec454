"""jobs/train_resnet50.py run for real on CPU: the metrics protocol, rank agreement under
torchrun, injected failures, checkpoint/resume, and every strategy; plus the bundled ResNet-50."""

from __future__ import annotations

import importlib.util
import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch

from tests.helpers import REPO

SCRIPT = REPO / "jobs" / "train_resnet50.py"
TINY = ["--model", "tiny", "--image-size", "32", "--batch-size", "4", "--num-classes", "10"]
RANK_KEYS = {"step", "rank", "step_time_s", "wait_s", "busy_s"}
METRIC_KEYS = RANK_KEYS | {"step", "samples_per_s", "step_time_s", "loss", "peak_mem_mb", "world_size", "global_batch",
               "strategy", "device", "amp", "warmup"}
FINAL_KEYS = {"final", "step", "steps_run", "mean_samples_per_s", "peak_mem_mb", "wall_s", "world_size",
              "global_batch", "strategy", "device", "amp"}
TIMEOUT = 180
SLOW_S = 0.3
TORCHRUN_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def load_resnet_model() -> ModuleType:
    spec = importlib.util.spec_from_file_location("resnet_model", REPO / "jobs" / "resnet_model.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def train(*args: str, nproc: int | None = None, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """The script under torchrun with `nproc` processes, or as plain python when nproc is None."""
    launcher = [] if nproc is None else ["-m", "torch.distributed.run", "--nproc-per-node", str(nproc),
                                         "--master-addr", "127.0.0.1", "--master-port", str(free_port())]
    inherited = {name: value for name, value in os.environ.items() if name not in TORCHRUN_VARS}
    full_env = {**inherited, "OMP_NUM_THREADS": "1", **(env or {})}
    return subprocess.run([sys.executable, *launcher, str(SCRIPT), *args], cwd=REPO, env=full_env,
                          capture_output=True, text=True, timeout=TIMEOUT, check=False)


def records(result: subprocess.CompletedProcess[str], prefix: str) -> list[dict[str, Any]]:
    return [json.loads(line.removeprefix(prefix + " ")) for line in result.stdout.splitlines()
            if line.startswith(prefix + " ")]


def metrics(result: subprocess.CompletedProcess[str]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """(rank 0's interval records, the final record) of a successful run."""
    assert result.returncode == 0, result.stderr[-3000:]
    lines = records(result, "DISTRUN_METRICS")
    assert lines and lines[-1].get("final") is True, result.stdout
    return [r for r in lines[:-1] if r["rank"] == 0], lines[-1]


def weights(result: subprocess.CompletedProcess[str]) -> list[float]:
    return [record["weights"] for record in sorted(records(result, "DISTRUN_CHECKSUM"), key=lambda r: r["rank"])]


# Loaded by every worker through PYTHONPATH: says it is armed, and what would run at teardown.
EXIT_PROBE = """import atexit, os, sys
if "LOCAL_RANK" in os.environ:
    rank = os.environ["RANK"]
    print(f"exit probe armed on rank {rank}", file=sys.stderr, flush=True)
    atexit.register(print, f"exit probe: interpreter teardown ran on rank {rank}", file=sys.stderr, flush=True)
"""


@pytest.fixture(scope="module")
def ddp_run(tmp_path_factory: pytest.TempPathFactory) -> subprocess.CompletedProcess[str]:
    """A finished 2-rank run, rank 1 made slow by SLOW_S a step; its workers carry the exit probe
    (a sitecustomize module)."""
    probe = tmp_path_factory.mktemp("exit-probe")
    (probe / "sitecustomize.py").write_text(EXIT_PROBE)
    return train(*TINY, "--steps", "4", "--log-every", "2", "--print-checksum", "--slow-rank", "1",
                 "--slow-s", str(SLOW_S), nproc=2, env={"PYTHONPATH": str(probe)})


@pytest.fixture(scope="module")
def fsdp_run() -> subprocess.CompletedProcess[str]:
    return train(*TINY, "--steps", "4", "--log-every", "2", "--print-checksum", "--strategy", "fsdp", nproc=2)


def test_bundled_resnet50_matches_torchvision_parameter_count_and_blocks() -> None:
    resnet_model = load_resnet_model()
    model = resnet_model.build_resnet50()
    assert sum(p.numel() for p in model.parameters()) == 25_557_032
    assert len(resnet_model.shard_units(model)) == 3 + 4 + 6 + 3
    assert model(torch.randn(2, 3, 32, 32)).shape == (2, 1000)


def test_a_missing_torchvision_is_no_news_and_a_broken_one_is_said(caplog: pytest.LogCaptureFixture,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    resnet_model = load_resnet_model()
    caplog.set_level("INFO")
    monkeypatch.setitem(sys.modules, "torchvision", None)  # import raises ModuleNotFoundError, as when not installed
    resnet_model.torchvision_models.cache_clear()
    resnet_model.build_model("resnet50")
    assert [r.getMessage() for r in caplog.records] == ["model resnet50: bundled implementation (jobs/resnet_model.py)"]

    caplog.clear()
    resnet_model.torchvision_models.cache_clear()
    monkeypatch.setattr(resnet_model.importlib, "import_module", lambda name: (_ for _ in ()).throw(
        OSError("libc10_cuda.so: cannot open shared object file")))
    assert resnet_model.torchvision_models() is None
    assert "torchvision is installed but does not import here (OSError: libc10_cuda.so" in caplog.text
    resnet_model.torchvision_models.cache_clear()


def test_every_rank_prints_its_own_step_time_and_a_slowed_rank_is_the_busy_one(ddp_run) -> None:
    lines = [r for r in records(ddp_run, "DISTRUN_METRICS") if not r.get("final")]
    assert sorted((r["step"], r["rank"]) for r in lines) == [(2, 0), (2, 1), (4, 0), (4, 1)]
    for record in lines:
        assert record.keys() >= RANK_KEYS
        assert record["busy_s"] + record["wait_s"] == pytest.approx(record["step_time_s"], abs=1e-5)
    steady = {r["rank"]: r for r in lines if r["step"] == 4}
    # Under DDP both ranks take the slow rank's wall time; only busy_s tells them apart.
    assert steady[1]["busy_s"] >= SLOW_S
    assert steady[0]["busy_s"] < steady[1]["busy_s"] - SLOW_S / 2
    assert steady[0]["wait_s"] > SLOW_S / 2


def test_two_rank_run_defaults_to_ddp_and_rank0_prints_the_job_figures(ddp_run) -> None:
    intervals, final = metrics(ddp_run)
    assert [r["step"] for r in intervals] == [2, 4]
    for record in intervals:
        assert record.keys() >= METRIC_KEYS
        assert (record["world_size"], record["global_batch"], record["strategy"]) == (2, 8, "ddp")
        assert (record["device"], record["amp"]) == ("cpu", None)
        assert record["samples_per_s"] > 0 and record["step_time_s"] > 0 and record["peak_mem_mb"] > 0
    assert [r["warmup"] for r in intervals] == [True, False]
    assert final.keys() >= FINAL_KEYS
    assert final["step"] == 4 and final["mean_samples_per_s"] > 0
    assert final["peak_mem_mb"] >= max(r["peak_mem_mb"] for r in intervals)


def test_two_ddp_ranks_end_with_the_same_weights_and_a_working_all_reduce(ddp_run) -> None:
    checksums = records(ddp_run, "DISTRUN_CHECKSUM")
    assert sorted(r["rank"] for r in checksums) == [0, 1]
    assert {r["allreduce"] for r in checksums} == {3.0}
    assert len(set(weights(ddp_run))) == 1


def test_finished_ranks_skip_interpreter_teardown_after_flushing_their_last_lines(ddp_run) -> None:
    # gloo's threads outlive destroy_process_group(); one that releases a tensor while the
    # interpreter finalizes aborts the rank (SIGABRT) after its work is done. The job leaves
    # with quick_exit instead, which must still deliver the lines printed just before it.
    assert ddp_run.returncode == 0, ddp_run.stderr[-3000:]
    assert ddp_run.stderr.count("exit probe armed on rank") == 2
    assert "interpreter teardown ran" not in ddp_run.stderr
    assert sorted(r["rank"] for r in records(ddp_run, "DISTRUN_CHECKSUM")) == [0, 1]


def test_fsdp_on_two_ranks_trains_the_same_weights_as_ddp(ddp_run, fsdp_run) -> None:
    intervals, _ = metrics(fsdp_run)
    assert {r["strategy"] for r in intervals} == {"fsdp"}
    fsdp_weights = weights(fsdp_run)
    assert len(fsdp_weights) == 2 and len(set(fsdp_weights)) == 1
    assert fsdp_weights[0] == pytest.approx(weights(ddp_run)[0], abs=1e-3)


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_bf16_amp_trains_batchnorm_models_on_two_ranks(strategy: str) -> None:
    """The GPU's AMP path on CPU: FSDP2's bf16 param policy once crashed on BatchNorm's fp32 running stats."""
    result = train(*TINY, "--steps", "2", "--log-every", "1", "--print-checksum", "--strategy", strategy,
                   "--amp-on-cpu", nproc=2)
    intervals, final = metrics(result)
    assert {(r["strategy"], r["amp"]) for r in intervals} == {(strategy, "bfloat16")}
    assert final["steps_run"] == 2 and all(r["loss"] == r["loss"] for r in intervals)
    assert len(set(weights(result))) == 1


def test_injected_failure_on_rank_1_fails_the_whole_job() -> None:
    result = train(*TINY, "--steps", "4", "--fail-at-step", "2", "--fail-rank", "1", nproc=2)
    assert result.returncode != 0
    assert "injected failure at step 2 on rank 1" in result.stdout + result.stderr


@pytest.mark.parametrize("strategy", ["single", "dp"])
def test_one_process_strategy_runs_without_torchrun(strategy: str) -> None:
    result = train(*TINY, "--steps", "2", "--log-every", "1", "--strategy", strategy)
    intervals, final = metrics(result)
    assert [(r["step"], r["strategy"], r["world_size"]) for r in intervals] == [(1, strategy, 1), (2, strategy, 1)]
    assert final["steps_run"] == 2
    assert ("dp without GPUs is a plain single process" in result.stdout) == (strategy == "dp")


def test_one_process_strategy_refuses_a_multi_process_launch() -> None:
    result = train(*TINY, "--strategy", "dp", env={"WORLD_SIZE": "2"})
    assert result.returncode == 2
    assert "launch it with nproc_per_node 1" in result.stderr


def test_ft_ddp_outside_a_fault_tolerant_job_is_refused_naming_the_missing_variables() -> None:
    result = train(*TINY, "--strategy", "ft-ddp", env={"REPLICA_GROUP_ID": "0"})
    assert result.returncode == 2
    assert ("--strategy ft-ddp needs NUM_REPLICA_GROUPS, TORCHFT_LIGHTHOUSE: launch it as a job with "
            "fault_tolerance: (jobs/resnet50-ft.yaml)") in result.stderr


def test_ft_ddp_refuses_a_checkpoint_dir_since_it_heals_from_a_peer(tmp_path: Path) -> None:
    ft_env = {"REPLICA_GROUP_ID": "0", "NUM_REPLICA_GROUPS": "1", "TORCHFT_LIGHTHOUSE": "http://127.0.0.1:1"}
    result = train(*TINY, "--strategy", "ft-ddp", "--checkpoint-dir", str(tmp_path), env=ft_env)
    assert result.returncode == 2
    assert "--strategy ft-ddp heals from a peer, not a checkpoint" in result.stderr


def resumed_ranks(result: subprocess.CompletedProcess[str], step: int) -> list[int]:
    """The ranks that printed `resumed from step <step>`."""
    return sorted(int(line.split("rank ")[1].split(":")[0]) for line in result.stdout.splitlines()
                  if f"resumed from step {step} " in line)


def test_resume_after_a_failure_continues_from_the_checkpoint_to_the_same_weights(tmp_path: Path) -> None:
    run = [*TINY, "--steps", "4", "--log-every", "1", "--print-checksum", "--checkpoint-dir", str(tmp_path)]
    uninterrupted = train(*TINY, "--steps", "4", "--log-every", "1", "--print-checksum")
    crashed = train(*run, "--checkpoint-every", "2", "--fail-at-step", "3")
    assert crashed.returncode != 0
    assert torch.load(tmp_path / "last.pt", weights_only=True)["step"] == 2
    resumed = train(*run)
    intervals, final = metrics(resumed)
    assert resumed_ranks(resumed, 2) == [0]
    assert [r["step"] for r in intervals] == [3, 4]
    assert (final["step"], final["steps_run"]) == (4, 2)
    assert weights(resumed) == weights(uninterrupted)


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_longer_run_resumes_on_every_rank_and_trains_only_the_remaining_steps(
        strategy: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    first = train(*TINY, "--steps", "2", "--checkpoint-every", "1", "--strategy", strategy, nproc=2,
                  env={"DISTRUN_CHECKPOINT_DIR": str(tmp_path)})
    assert [r["step"] for r in metrics(first)[0]] == [2]
    assert resumed_ranks(first, 0) == [] and "no checkpoint in" in first.stdout
    second = train(*TINY, "--steps", "4", "--log-every", "1", "--print-checksum", "--strategy", strategy, nproc=2,
                   env={"DISTRUN_CHECKPOINT_DIR": str(tmp_path), "DISTRUN_ATTEMPT": "2"})
    intervals, final = metrics(second)
    assert "train_resnet50: attempt 2" in second.stdout
    assert resumed_ranks(second, 2) == [0, 1]
    assert [r["step"] for r in intervals] == [3, 4]
    assert (final["step"], final["steps_run"]) == (4, 2)
    # The same data, in the same order, as a run that went to step 4 in one go.
    uninterrupted = request.getfixturevalue(f"{strategy}_run")
    assert weights(second) == weights(uninterrupted)


@pytest.mark.parametrize(("strategy", "partial", "saved"), [
    ("ddp", "last.pt.partial", "last.pt"),
    ("fsdp", "step.dcp.partial", "step-4.dcp"),
])
def test_checkpoint_left_half_written_by_a_crash_is_ignored_and_replaced(
        strategy: str, partial: str, saved: str, tmp_path: Path) -> None:
    run = [*TINY, "--strategy", strategy, "--checkpoint-dir", str(tmp_path)]
    metrics(train(*run, "--steps", "2"))
    if strategy == "fsdp":
        (tmp_path / partial).mkdir()
        (tmp_path / partial / "__0_0.distcp").write_bytes(b"cut short")
    else:
        (tmp_path / partial).write_bytes(b"cut short")
    resumed = train(*run, "--steps", "4")
    metrics(resumed)
    assert resumed_ranks(resumed, 2) == [0]
    assert not (tmp_path / partial).exists()
    assert sorted(path.name for path in tmp_path.iterdir()) == [saved]


def test_checkpoint_every_without_a_checkpoint_dir_is_refused() -> None:
    result = train(*TINY, "--checkpoint-every", "2", env={"DISTRUN_CHECKPOINT_DIR": ""})
    assert result.returncode == 2
    assert "--checkpoint-every needs --checkpoint-dir or $DISTRUN_CHECKPOINT_DIR" in result.stderr


def test_run_whose_checkpoint_already_reached_its_steps_trains_nothing_and_succeeds(tmp_path: Path) -> None:
    # A restarted attempt whose predecessor saved the last step and then died.
    run = [*TINY, "--steps", "2", "--checkpoint-dir", str(tmp_path)]
    metrics(train(*run))
    saved = (tmp_path / "last.pt").stat().st_mtime_ns
    again = train(*run)
    intervals, final = metrics(again)
    assert resumed_ranks(again, 2) == [0]
    assert intervals == []
    assert (final["step"], final["steps_run"], final["mean_samples_per_s"]) == (2, 0, None)
    assert (tmp_path / "last.pt").stat().st_mtime_ns == saved
