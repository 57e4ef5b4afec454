"""The sbatch script and job files the Slurm backend writes, checked as text (no Slurm needed)."""

from __future__ import annotations

import json
import shlex
import stat
from pathlib import Path

import pytest

from orchestrator.backends.slurm import batch_job, write_files
from orchestrator.backends.slurm_script import SlurmOptions, node_argv, render_script
from orchestrator.run.request import LaunchRequest
from orchestrator.spec import load_job
from orchestrator.store import JobDir
from tests.helpers import REPO, distrun

SCRIPT = REPO / "tests" / "slurm_ddp_job.py"
SECRET = "s3cret-value-never-in-clear"

GPU_INVENTORY = """\
defaults: {python: /opt/venv/bin/python3, iface: ib0, env: {NCCL_DEBUG: WARN}}
nodes:
  - {name: gpu0, host: 10.0.0.10, gpus: 8}
  - {name: gpu1, host: 10.0.0.11, gpus: 8}
"""

CPU_INVENTORY = """\
defaults: {python: /usr/bin/python3}
nodes:
  - {name: cpu0, host: 10.0.0.20}
  - {name: cpu1, host: 10.0.0.21}
  - {name: cpu2, host: 10.0.0.22}
"""


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def job_text(extra: str = "") -> str:
    return (f"name: train\nscript: {SCRIPT}\nargs: [--steps, '5']\nnnodes: 2\n"
            "env: {OMP_NUM_THREADS: '4', WANDB_API_KEY: '${env:WANDB_KEY}'}\n" + extra)


def dry_run(tmp_path: Path, inventory: str, job: str, *extra: str) -> str:
    inv = write(tmp_path, "inventory.yaml", inventory)
    result = distrun("launch", str(write(tmp_path, "job.yaml", job)), "--backend", "slurm", "-i", str(inv),
                     "--dry-run", "--job-id", "train-1", *extra, home=tmp_path / "home",
                     env={"WANDB_KEY": SECRET})
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_a_gpu_job_script_requests_gpus_per_node_and_sets_the_nccl_interface(tmp_path: Path) -> None:
    script = dry_run(tmp_path, GPU_INVENTORY, job_text("slurm: {partition: gpu, time: '01:00:00', "
                                                       "extra: [--exclusive, --constraint=h100]}\n"),
                     "-o", "partition=h100", "-o", "account=proj")

    assert script.startswith("#!/bin/bash\n")
    for directive in ("--nodes=2", "--ntasks-per-node=1", "--gpus-per-node=8", "--partition=h100",
                      "--time=01:00:00", "--account=proj", "--exclusive", "--constraint=h100", "--job-name=train"):
        assert f"#SBATCH {directive}\n" in script
    assert "export NCCL_SOCKET_IFNAME=ib0\n" in script and "export GLOO_SOCKET_IFNAME=ib0\n" in script
    assert "export NCCL_DEBUG=WARN\n" in script
    assert "--nproc-per-node 8 --node-rank '$SLURM_NODEID' --master-addr '$MASTER_ADDR'" in script
    assert "srun --nodes=2 --ntasks-per-node=1 --kill-on-bad-exit=1" in script


def test_the_script_names_secrets_but_never_holds_their_values(tmp_path: Path) -> None:
    script = dry_run(tmp_path, GPU_INVENTORY, job_text())

    assert SECRET not in script
    assert "Secrets (WANDB_API_KEY) are not in this file" in script


def test_the_script_removes_the_secrets_file_before_any_srun_and_feeds_it_to_the_last_one(tmp_path: Path) -> None:
    script = dry_run(tmp_path, CPU_INVENTORY, job_text())
    secrets = shlex.quote(str(tmp_path / "home" / "jobs" / "train-1" / "slurm" / "secrets.json"))
    lines = script.splitlines()

    opened, removed = lines.index(f"exec 3<{secrets}"), lines.index(f"rm -f {secrets}")
    sruns = [i for i, line in enumerate(lines) if line.startswith(("srun", "master=$(srun"))]
    assert opened < removed < sruns[0] and len(sruns) == 2
    assert lines[-1].endswith(" <&3") and all("--export=ALL" in lines[i] for i in sruns)


def test_sbatch_exports_only_the_basic_variables_of_the_controllers_environment(tmp_path: Path) -> None:
    script = dry_run(tmp_path, CPU_INVENTORY, job_text())

    (export,) = [line for line in script.splitlines() if line.startswith("#SBATCH --export=")]
    assert export == "#SBATCH --export=PATH,HOME,USER,LOGNAME,LANG,LC_ALL,LC_CTYPE,TZ"


def test_a_job_without_secrets_has_no_secrets_file_to_take(tmp_path: Path) -> None:
    script = dry_run(tmp_path, CPU_INVENTORY, job_text().replace(", WANDB_API_KEY: '${env:WANDB_KEY}'", ""))

    assert "secrets.json" not in script and "<&3" not in script


def test_a_dry_run_prints_the_script_and_writes_no_job(tmp_path: Path) -> None:
    script = dry_run(tmp_path, CPU_INVENTORY, job_text())

    assert f"#SBATCH --output={tmp_path / 'home' / 'jobs' / 'train-1' / 'slurm-%j.out'}" in script
    assert not (tmp_path / "home" / "jobs" / "train-1").exists()


def test_slurm_gpus_per_node_sets_the_request_and_the_processes_per_node(tmp_path: Path) -> None:
    script = dry_run(tmp_path, CPU_INVENTORY, job_text("slurm: {gpus_per_node: 4}\n"))

    assert "#SBATCH --gpus-per-node=4\n" in script and "--nproc-per-node 4 " in script


def test_a_cpu_job_asks_for_no_gpu_and_runs_two_processes_per_node(tmp_path: Path) -> None:
    script = dry_run(tmp_path, CPU_INVENTORY, job_text())

    assert "--gpus-per-node" not in script and "NCCL_SOCKET_IFNAME" not in script
    assert "--nproc-per-node 2 " in script


def test_without_nnodes_the_job_takes_as_many_nodes_as_the_inventory_selects(tmp_path: Path) -> None:
    script = dry_run(tmp_path, CPU_INVENTORY, job_text().replace("nnodes: 2\n", ""))

    assert "#SBATCH --nodes=3\n" in script and "--nnodes 3 " in script


def test_nodes_option_is_refused_because_slurm_places_the_job(tmp_path: Path) -> None:
    inv = write(tmp_path, "inventory.yaml", CPU_INVENTORY)
    result = distrun("launch", str(write(tmp_path, "job.yaml", job_text())), "--backend", "slurm", "-i", str(inv),
                     "--nodes", "cpu0,cpu1", "--dry-run", home=tmp_path / "home", env={"WANDB_KEY": SECRET})

    assert result.returncode == 2
    assert "Slurm chooses the nodes" in result.stderr and "Traceback" not in result.stderr


def test_only_torchruns_own_options_take_per_node_values() -> None:
    argv = ["python", "-m", "torch.distributed.run", "--node-rank", "0", "--master-addr", "$MASTER_ADDR",
            "--master-port", "0", "train.py", "--master-port", "1234"]

    assert node_argv(argv, 9) == ["python", "-m", "torch.distributed.run", "--node-rank", "$SLURM_NODEID",
                                  "--master-addr", "$MASTER_ADDR", "--master-port", "$MASTER_PORT",
                                  "train.py", "--master-port", "1234"]


def test_a_c10d_job_reaches_the_rendezvous_at_the_master_of_the_allocation(tmp_path: Path) -> None:
    script = dry_run(tmp_path, CPU_INVENTORY, job_text("rendezvous: {backend: c10d}\n"))

    assert "--rdzv-endpoint '$MASTER_ADDR:$MASTER_PORT'" in script


def test_a_fixed_rendezvous_port_is_checked_free_rather_than_searched(tmp_path: Path) -> None:
    script = dry_run(tmp_path, CPU_INVENTORY, job_text("rendezvous: {port: 29611}\n"))

    assert 'port 29611 exact)' in script


@pytest.fixture
def written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> JobDir:
    monkeypatch.setenv("WANDB_KEY", SECRET)
    inv = write(tmp_path, "inventory.yaml", CPU_INVENTORY)
    job = load_job(write(tmp_path, "job.yaml", job_text()))
    request = LaunchRequest(job_file=job.path, inventory=str(inv), backend="slurm")
    job_dir = JobDir(tmp_path / "home" / "jobs" / "train-1")
    batch, bundle = batch_job(job, request.asked(), job_dir, "train-1", SlurmOptions())
    write_files(job_dir, batch, bundle, render_script(batch))
    return job_dir


def test_secrets_go_to_a_file_only_its_owner_can_read(written: JobDir) -> None:
    secrets = written.root / "slurm" / "secrets.json"

    assert stat.S_IMODE(secrets.stat().st_mode) == 0o600
    assert json.loads(secrets.read_text()) == {"WANDB_API_KEY": SECRET}


def test_no_other_job_file_holds_a_secret_value(written: JobDir) -> None:
    others = [p for p in written.root.rglob("*") if p.is_file() and p.name != "secrets.json"]

    assert {p.name for p in others} >= {"job.sbatch", "node.json", "bundle.json", "bootstrap.py", "plan.json"}
    assert all(SECRET not in p.read_text() for p in others)


ONE_LINE_HINT = "(it is written into one line of the backend's script: remove the line break)"


@pytest.mark.parametrize(("pair", "value"), [
    ("partition=gpu\ntouch /tmp/owned", "'gpu\\ntouch /tmp/owned'"),
    ("time=01:00:00\rx", "'01:00:00\\rx'"),
    ("account=proj\x1b]0;title\x07", "'proj\\x1b]0;title\\x07'"),
    ("extra=--exclusive '--constraint=h100\nrm -rf ~'", "'--constraint=h100\\nrm -rf ~'"),
])
def test_a_slurm_option_with_a_line_break_on_the_command_line_is_refused_in_one_line(
        tmp_path: Path, pair: str, value: str) -> None:
    inv = write(tmp_path, "inventory.yaml", CPU_INVENTORY)
    result = distrun("launch", str(write(tmp_path, "job.yaml", job_text())), "--backend", "slurm", "-i", str(inv),
                     "-o", pair, "--dry-run", home=tmp_path / "home", env={"WANDB_KEY": SECRET})

    key = pair.partition("=")[0]
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr == (f"distrun: error: -o {pair!r}: {key}: must be one line of text, got {value} "
                             f"{ONE_LINE_HINT}\n")
    assert not (tmp_path / "home" / "jobs").exists()


@pytest.mark.parametrize(
    ("section", "where", "line"),
    [
        ('slurm: {partition: "gpu\\necho injected"}', "slurm.partition", 6),
        ('slurm: {time: "01:00:00\\rx"}', "slurm.time", 6),
        ("slurm:\n  account: |\n    proj\n    touch /tmp/owned", "slurm.account", 7),
        ('slurm: {extra: [--exclusive, "--constraint=h100\\nrm -rf ~"]}', "slurm.extra[1]", 6),
    ],
)
def test_a_slurm_option_with_a_line_break_in_the_job_file_is_refused_at_its_line(
        tmp_path: Path, section: str, where: str, line: int) -> None:
    inv = write(tmp_path, "inventory.yaml", CPU_INVENTORY)
    job = write(tmp_path, "job.yaml", job_text(section + "\n"))
    result = distrun("launch", str(job), "--backend", "slurm", "-i", str(inv), "--dry-run",
                     home=tmp_path / "home", env={"WANDB_KEY": SECRET})

    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr.startswith(f"distrun: error: {job}:{line}: {where}: must be one line of text, got '")
    assert result.stderr.endswith(f" {ONE_LINE_HINT}\n") and result.stderr.count("\n") == 1


def test_arguments_that_name_node_variables_stay_literal_in_the_script_and_the_node_config(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WANDB_KEY", SECRET)
    args = ["$SLURM_NODEID", "--master-addr", "$MASTER_ADDR", "`hostname`", "$(id)"]
    job = load_job(write(tmp_path, "job.yaml", job_text().replace("args: [--steps, '5']", f"args: {json.dumps(args)}")))
    request = LaunchRequest(job_file=job.path, inventory=str(write(tmp_path, "inventory.yaml", CPU_INVENTORY)),
                            backend="slurm")
    job_dir = JobDir(tmp_path / "home" / "jobs" / "train-1")
    batch, bundle = batch_job(job, request.asked(), job_dir, "train-1", SlurmOptions())
    script = render_script(batch)
    write_files(job_dir, batch, bundle, script)

    argv = batch.plan.hosts[0].argv
    assert argv[-len(args):] == args
    assert shlex.join(args) in script
    filled = json.loads(batch.files.node_json.read_text())["expand_at"]
    assert [argv[i - 1] for i in filled] == ["--node-rank", "--master-addr", "--master-port"]
    assert all(i < len(argv) - len(args) - 1 for i in filled)


def test_a_later_attempt_excludes_the_quarantined_nodes_and_has_files_of_its_own(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WANDB_KEY", SECRET)
    inv = write(tmp_path, "inventory.yaml", CPU_INVENTORY)
    job = load_job(write(tmp_path, "job.yaml", job_text("restarts: {max: 1}\ncheckpoint_dir: /shared/ckpt\n")))
    asked = LaunchRequest(job_file=job.path, inventory=str(inv), backend="slurm").asked()
    job_dir = JobDir(tmp_path / "home" / "jobs" / "train-1")
    batch, _ = batch_job(job, asked, job_dir, "train-1", SlurmOptions(), attempt=2, nnodes=1, exclude=("cpu1",))
    script = render_script(batch)

    assert "#SBATCH --exclude=cpu1\n" in script and "#SBATCH --nodes=1\n" in script
    assert "export DISTRUN_ATTEMPT=2\n" in script and "export DISTRUN_CHECKPOINT_DIR=/shared/ckpt\n" in script
    assert batch.files.dir == job_dir.root / "slurm" / "attempt2"
    assert str(batch.files.stream("cpu0")).startswith(str(job_dir.root / "slurm" / "attempt2"))
