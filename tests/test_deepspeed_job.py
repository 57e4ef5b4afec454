"""jobs/deepspeed_zero.py run for real on CPU under torchrun: ZeRO-3 trains with the loss going
down and equal weights on every rank, nothing is JIT-compiled, DeepSpeed's checkpoints resume,
and a checkpoint of another model is refused in one line."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import REPO
from tests.test_training_script import TORCHRUN_VARS, free_port, records

SCRIPT = REPO / "jobs" / "deepspeed_zero.py"
SMALL = ["--width", "128", "--layers", "3", "--log-every", "2", "--lr", "1e-2"]
TIMEOUT = 240


def run(tmp: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """Two ranks under torchrun, with an empty torch extensions directory of their own."""
    inherited = {name: value for name, value in os.environ.items() if name not in TORCHRUN_VARS}
    env = {**inherited, "OMP_NUM_THREADS": "1", "TORCH_EXTENSIONS_DIR": str(tmp / "ext")}
    env.pop("DS_ACCELERATOR", None)
    argv = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-addr", "127.0.0.1",
            "--master-port", str(free_port()), str(SCRIPT), *SMALL, *args]
    return subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=TIMEOUT, check=False)


def rank0_lines(result: subprocess.CompletedProcess[str]) -> list[dict[str, Any]]:
    return [r for r in records(result, "DISTRUN_METRICS") if r.get("rank") == 0 and not r.get("final")]


@pytest.fixture(scope="module")
def first_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, subprocess.CompletedProcess[str]]:
    tmp = tmp_path_factory.mktemp("ds")
    return tmp, run(tmp, "--steps", "8", "--checkpoint-dir", str(tmp / "ckpt"), "--checkpoint-every", "4",
                    "--print-checksum")


def test_zero3_trains_in_step_without_compiling(first_run: tuple[Path, subprocess.CompletedProcess[str]]) -> None:
    tmp, result = first_run
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    lines = rank0_lines(result)
    assert [line["step"] for line in lines] == [2, 4, 6, 8]
    assert {line["strategy"] for line in lines} == {"zero3"}
    assert lines[-1]["loss"] < lines[0]["loss"] / 2, [line["loss"] for line in lines]
    sums = records(result, "DISTRUN_CHECKSUM")
    assert len(sums) == 2 and sums[0]["weights"] == sums[1]["weights"] and sums[0]["allreduce"] == 3.0
    assert not (tmp / "ext").exists(), "DeepSpeed built an op at start"
    assert "built successfully" not in result.stdout + result.stderr


def test_resumes_from_deepspeeds_last_checkpoint(first_run: tuple[Path, subprocess.CompletedProcess[str]]) -> None:
    tmp, _ = first_run
    ckpt = tmp / "ckpt"
    assert (ckpt / "latest").read_text().strip() == "step-8"
    assert sorted(p.name for p in ckpt.glob("step-*")) == ["step-8"]
    result = run(tmp, "--steps", "10", "--checkpoint-dir", str(ckpt))
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert result.stdout.count("resumed from step 8") == 2
    owner = json.loads((ckpt / "distrun-deepspeed.json").read_text())
    assert owner["world_size"] == 2 and owner["model"]["width"] == 128
    final = [r for r in records(result, "DISTRUN_METRICS") if r.get("final")]
    assert final and final[0]["steps_run"] == 2 and final[0]["step"] == 10


def test_checkpoint_of_another_model_is_refused(first_run: tuple[Path, subprocess.CompletedProcess[str]]) -> None:
    tmp, _ = first_run
    result = run(tmp, "--steps", "12", "--width", "64", "--checkpoint-dir", str(tmp / "ckpt"))
    assert result.returncode != 0
    refused = [line for line in result.stdout.splitlines() if "holds a DeepSpeed checkpoint of job" in line]
    assert refused and "'width': 128" in refused[0] and "use another --checkpoint-dir" in refused[0]
    assert f'File "{SCRIPT}"' not in result.stdout + result.stderr, "the rank died in a traceback"
    assert "exitcode  : 2" in result.stderr


def test_compare_rows_run_ddps_model_data_and_optimizer_under_each_zero_stage() -> None:
    from orchestrator.spec import load_job

    ddp = load_job(REPO / "jobs" / "compare" / "ddp.yaml").args
    for stage in (1, 2, 3):
        args = load_job(REPO / "jobs" / "compare" / f"zero{stage}.yaml").args
        pairs = dict(zip(args[::2], args[1::2], strict=True))
        assert pairs["--stage"] == str(stage) and pairs["--optimizer"] == "sgd" and pairs["--lr"] == "0.002"
        for flag in ("--model", "--image-size", "--batch-size", "--steps", "--log-every", "--warmup-steps"):
            assert pairs[flag] == ddp[ddp.index(flag) + 1], flag


def test_sgd_is_allowed_by_zero_and_the_batch_size_overrides_the_config() -> None:
    spec = importlib.util.spec_from_file_location("deepspeed_zero", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["deepspeed_zero"] = module
    spec.loader.exec_module(module)
    config = module.ds_config(module.parse_args(["--optimizer", "sgd", "--batch-size", "4", "--stage", "2"]))
    assert config["zero_allow_untested_optimizer"] is True and config["train_micro_batch_size_per_gpu"] == 4
    assert config["zero_optimization"]["stage"] == 2
    assert "zero_allow_untested_optimizer" not in module.ds_config(module.parse_args([]))
