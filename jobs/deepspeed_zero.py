"""A DeepSpeed ZeRO job: a stack of linear layers trained on synthetic data, started by torchrun.

Run by `distrun launch jobs/deepspeed.yaml` (or `torchrun --nproc-per-node 2 jobs/deepspeed_zero.py`).
The ZeRO stage and the batch come from the DeepSpeed config beside this file
(`deepspeed_config.json`), `--stage` overrides the stage. On CPU (no CUDA) it sets
`DS_ACCELERATOR=cpu` and the gloo backend; on GPUs NCCL, each rank on `cuda:LOCAL_RANK`.

No surprise compile: under torchrun DeepSpeed's CPU shared-memory all-reduce op
(`deepspeed_shm_comm`, a C++ extension JIT-built on first use, minutes on a small host) is
never used (it needs LOCAL_SIZE, which torchrun does not set), so the script marks it
incompatible before `init_distributed` and nothing is compiled. With LOCAL_SIZE set it is
left alone, and the script says first that DeepSpeed may build it and where.

Checkpoints are DeepSpeed's own (`save_checkpoint`/`load_checkpoint`) in `--checkpoint-dir`
(default $DISTRUN_CHECKPOINT_DIR), on storage every host sees: every rank writes its ZeRO
shards, DeepSpeed's `latest` file names the last whole one. Beside them `distrun-deepspeed.json`
says which job wrote them and for which model: a checkpoint for another model or world size is
refused (exit 2), one of another job is resumed with a line naming that job.

Prints the DISTRUN_METRICS protocol of jobs/README.md (strategy `zero0`..`zero3`) and
`resumed from step K` on every rank that resumes.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

if not os.environ.get("DS_ACCELERATOR"):
    import torch as _torch

    os.environ["DS_ACCELERATOR"] = "cuda" if _torch.cuda.is_available() else "cpu"

import deepspeed
import torch
import torch.distributed as dist
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
from quick_exit import quick_exit

METRICS_PREFIX = "DISTRUN_METRICS"
CHECKSUM_PREFIX = "DISTRUN_CHECKSUM"
CHECKPOINT_DIR_ENV = "DISTRUN_CHECKPOINT_DIR"
OWNER_FILE = "distrun-deepspeed.json"
SHM_OP = "deepspeed_shm_comm"
DEFAULT_CONFIG = Path(__file__).resolve().parent / "deepspeed_config.json"
# torch 2.13 deprecates the collectives ZeRO calls on every step; one warning per call floods the log.
warnings.filterwarnings("ignore", message=r"`torch\.distributed\.\w+` is deprecated", category=FutureWarning)


@dataclass(frozen=True)
class ModelShape:
    """What a checkpoint must match to be loaded."""

    width: int
    layers: int
    classes: int
    model: str = "mlp"
    image_size: int = 32


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    env_dir = os.environ.get(CHECKPOINT_DIR_ENV)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, default=DEFAULT_CONFIG, help="DeepSpeed config (JSON)")
    parser.add_argument("--stage", type=int, choices=(0, 1, 2, 3), help="ZeRO stage (default: the config's)")
    parser.add_argument("--model", choices=("mlp", "resnet50", "tiny"), default="mlp",
                        help="mlp: residual linear layers; resnet50, tiny: jobs/resnet_model.py on images")
    parser.add_argument("--width", type=int, default=1024, help="mlp: features of every hidden layer")
    parser.add_argument("--layers", type=int, default=8, help="mlp: hidden linear layers")
    parser.add_argument("--classes", type=int, help="default: 16 for mlp, 1000 for the image models")
    parser.add_argument("--image-size", type=int, default=32, help="resnet50, tiny: images are 3xSxS")
    parser.add_argument("--batch-size", type=int, help="samples per rank per step (default: the config's)")
    parser.add_argument("--optimizer", choices=("adamw", "sgd"), default="adamw",
                        help="torch's AdamW, or SGD with momentum 0.9 and weight decay 1e-4 (train_resnet50.py's)")
    parser.add_argument("--steps", type=int, default=40, help="optimizer steps in the whole run")
    parser.add_argument("--lr", type=float, default=3e-4, help="AdamW learning rate")
    parser.add_argument("--log-every", type=int, default=5)
    parser.add_argument("--warmup-steps", type=int, default=2)
    parser.add_argument("--checkpoint-dir", type=Path, default=Path(env_dir) if env_dir else None)
    parser.add_argument("--checkpoint-every", type=int, default=0, help="also checkpoint every N steps")
    parser.add_argument("--step-sleep", type=float, default=0.0, help="seconds each rank sleeps per step (tests)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--print-checksum", action="store_true")
    args = parser.parse_args(argv)
    if args.classes is None:
        args.classes = 16 if args.model == "mlp" else 1000
    if args.checkpoint_every and args.checkpoint_dir is None:
        parser.error(f"--checkpoint-every needs --checkpoint-dir or ${CHECKPOINT_DIR_ENV}")
    if min(args.steps, args.log_every, args.width, args.layers, args.classes) < 1:
        parser.error("--steps, --log-every, --width, --layers and --classes must be positive")
    return args


def say(message: str) -> None:
    """One human-readable line, flushed at once."""
    sys.stdout.write(f"train_deepspeed: {message}\n")
    sys.stdout.flush()


def emit(prefix: str, payload: dict[str, Any]) -> None:
    sys.stdout.write(f"{prefix} {json.dumps(payload)}\n")
    sys.stdout.flush()


def ds_config(args: argparse.Namespace) -> dict[str, Any]:
    """The DeepSpeed config file, with `--stage` applied."""
    try:
        config = json.loads(args.config.read_text())
    except (OSError, ValueError) as err:
        say(f"cannot read DeepSpeed config {args.config}: {err}")
        quick_exit(2)
    if args.stage is not None:
        config.setdefault("zero_optimization", {})["stage"] = args.stage
    if args.optimizer == "sgd":  # ZeRO-1 and 2 refuse an optimizer outside DeepSpeed's tested list unless told
        config.setdefault("zero_allow_untested_optimizer", True)
    if args.batch_size is not None:
        config["train_micro_batch_size_per_gpu"] = args.batch_size
        config.pop("train_batch_size", None)
    return config


def skip_unused_shm_build() -> None:
    """Keep DeepSpeed from JIT-compiling its CPU shared-memory op when it would not use it."""
    if os.environ.get("DS_ACCELERATOR") != "cpu":
        return
    if os.environ.get("LOCAL_SIZE"):
        cache = os.environ.get("TORCH_EXTENSIONS_DIR", "~/.cache/torch_extensions")
        say(f"LOCAL_SIZE is set: DeepSpeed may build its C++ op {SHM_OP} under {cache} (minutes, once per host)")
        return
    deepspeed.ops.__compatible_ops__[SHM_OP] = False


class Block(nn.Module):
    """x + relu(linear(norm(x))): deep stacks of it still learn."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.linear = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.relu(self.linear(self.norm(x)))


def build_model(shape: ModelShape, seed: int) -> nn.Module:
    torch.manual_seed(seed)
    if shape.model != "mlp":
        import resnet_model

        return resnet_model.build_model(shape.model, shape.classes)
    blocks = [Block(shape.width) for _ in range(shape.layers)]
    return nn.Sequential(*blocks, nn.LayerNorm(shape.width), nn.Linear(shape.width, shape.classes))


class Teacher:
    """Deterministic data: a bank of random inputs, each labelled by a fixed random linear map.

    Sample i is bank item i mod the bank's size: the same on every rank and every run.
    """

    def __init__(self, shape: ModelShape, seed: int, bank: int = 64) -> None:
        generator = torch.Generator().manual_seed(seed + 1)
        if shape.model != "mlp":  # images and labels drawn as train_resnet50.py's SyntheticImages draws them
            self.inputs = torch.randn(bank, 3, shape.image_size, shape.image_size, generator=generator)
            self.labels = torch.randint(shape.classes, (bank,), generator=generator)
            return
        self.inputs = torch.randn(bank, shape.width, generator=generator)
        projection = torch.randn(shape.width, shape.classes, generator=generator)
        self.labels = (self.inputs @ projection).argmax(dim=1)

    def batch(self, first: int, size: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Samples first..first+size-1."""
        index = torch.arange(first, first + size) % len(self.inputs)
        return self.inputs[index], self.labels[index]


def checkpoint_owner(directory: Path) -> dict[str, Any] | None:
    try:
        return json.loads((directory / OWNER_FILE).read_text())
    except (OSError, ValueError):
        return None


def check_owner(directory: Path, shape: ModelShape, world: int) -> None:
    """Refuse a checkpoint for another model or world size; name the job that wrote it."""
    owner = checkpoint_owner(directory)
    if owner is None or not (directory / "latest").is_file():
        return
    if owner.get("model") != asdict(shape) or owner.get("world_size") != world:
        say(f"rank {dist.get_rank()}: "
            f"{directory} holds a DeepSpeed checkpoint of job {owner.get('job')} for model {owner.get('model')} "
            f"on {owner.get('world_size')} ranks, not {asdict(shape)} on {world}: "
            "use another --checkpoint-dir or remove that one")
        quick_exit(2)
    job = os.environ.get("DISTRUN_JOB_ID")
    if owner.get("job") != job and dist.get_rank() == 0:
        say(f"{directory}: resuming the checkpoint of job {owner.get('job')}, not this job ({job}); "
            "remove the directory to start from step 0")


def load(engine: Any, directory: Path | None, shape: ModelShape) -> int:
    """Resume from DeepSpeed's last checkpoint in directory; the step to go on from (0 without one)."""
    if directory is None:
        return 0
    check_owner(directory, shape, dist.get_world_size())
    if not (directory / "latest").is_file():
        if dist.get_rank() == 0:
            say(f"no checkpoint in {directory}; starting from step 0")
        return 0
    path, client = engine.load_checkpoint(str(directory))
    step = int(client["step"])
    say(f"rank {dist.get_rank()}: resumed from step {step} ({path})")
    return step


def save(engine: Any, directory: Path, step: int, shape: ModelShape) -> None:
    """Every rank writes its shards under tag step-K; `latest` names it once all are written."""
    engine.save_checkpoint(str(directory), tag=f"step-{step}", client_state={"step": step})
    if dist.get_rank() != 0:
        return
    owner = {"job": os.environ.get("DISTRUN_JOB_ID"), "model": asdict(shape), "world_size": dist.get_world_size()}
    partial = directory / f"{OWNER_FILE}.partial"
    partial.write_text(json.dumps(owner))
    partial.replace(directory / OWNER_FILE)
    for older in directory.glob("step-*"):
        if older.name != f"step-{step}" and older.is_dir():
            remove_tree(older)
    say(f"saved {directory}/step-{step} at step {step}")


def remove_tree(path: Path) -> None:
    for item in sorted(path.rglob("*"), reverse=True):
        item.rmdir() if item.is_dir() else item.unlink()
    path.rmdir()


def peak_mem_mb(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def all_reduce(value: float, op: dist.ReduceOp.RedOpType, device: torch.device) -> float:
    tensor = torch.tensor([value], dtype=torch.float64, device=device)
    dist.all_reduce(tensor, op=op)
    return float(tensor.item())


@dataclass
class Meter:
    """Step timings and losses turned into DISTRUN_METRICS lines."""

    common: dict[str, Any]
    device: torch.device
    warmup_until: int
    since: float
    steps: int = 0
    loss_sum: float = 0.0
    timed_steps: int = 0
    timed_s: float = 0.0

    def record(self, step: int, loss: float, started: float) -> None:
        now = time.perf_counter()
        self.steps += 1
        self.loss_sum += loss
        if step > self.warmup_until:
            self.timed_steps += 1
            self.timed_s += now - started

    def log(self, step: int) -> None:
        now = time.perf_counter()
        step_time = (now - self.since) / max(self.steps, 1)
        line: dict[str, Any] = {"step": step, "rank": dist.get_rank(), "step_time_s": round(step_time, 4),
                                "wait_s": 0.0, "busy_s": round(step_time, 4)}
        loss = all_reduce(self.loss_sum / max(self.steps, 1), dist.ReduceOp.SUM, self.device) / dist.get_world_size()
        if dist.get_rank() == 0:
            line.update(samples_per_s=round(self.common["global_batch"] / step_time, 2), loss=round(loss, 5),
                        peak_mem_mb=round(peak_mem_mb(self.device), 1), warmup=step <= self.warmup_until,
                        **self.common)
        emit(METRICS_PREFIX, line)
        self.steps, self.loss_sum, self.since = 0, 0.0, time.perf_counter()

    def finish(self, step: int, steps_run: int, wall_s: float) -> None:
        peak = all_reduce(peak_mem_mb(self.device), dist.ReduceOp.MAX, self.device)
        if dist.get_rank() != 0:
            return
        mean = self.common["global_batch"] * self.timed_steps / self.timed_s if self.timed_s else None
        emit(METRICS_PREFIX, {"final": True, "step": step, "steps_run": steps_run, "rank": 0,
                              "mean_samples_per_s": None if mean is None else round(mean, 2),
                              "peak_mem_mb": round(peak, 1), "wall_s": round(wall_s, 3), **self.common})


def init(args: argparse.Namespace) -> tuple[dict[str, Any], torch.device]:
    """The process group (gloo on CPU, NCCL on GPUs) and the rank's device."""
    config = ds_config(args)
    skip_unused_shm_build()
    cuda = os.environ["DS_ACCELERATOR"] == "cuda"
    deepspeed.init_distributed(dist_backend="nccl" if cuda else "gloo")
    if not cuda:
        return config, torch.device("cpu")
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    torch.cuda.set_device(device)
    return config, device


def make_optimizer(model: nn.Module, args: argparse.Namespace) -> torch.optim.Optimizer:
    if args.optimizer == "sgd":
        return torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9, weight_decay=1e-4)
    return torch.optim.AdamW(model.parameters(), lr=args.lr)


def save_due(args: argparse.Namespace, step: int) -> bool:
    return step == args.steps or bool(args.checkpoint_every and step % args.checkpoint_every == 0)


def train(args: argparse.Namespace) -> None:
    config, device = init(args)
    shape = ModelShape(args.width, args.layers, args.classes, args.model, args.image_size)
    model = build_model(shape, args.seed)
    count = sum(p.numel() for p in model.parameters())
    optimizer = make_optimizer(model, args)
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, config=config)
    rank, world = dist.get_rank(), dist.get_world_size()
    stage = engine.zero_optimization_stage()
    if rank == 0:
        attempt = os.environ.get("DISTRUN_ATTEMPT")
        say(f"{'attempt ' + attempt + ': ' if attempt else ''}deepspeed {deepspeed.__version__}, ZeRO stage {stage}, "
            f"{count:,} parameters ({world} ranks, {device.type})")
    start = load(engine, args.checkpoint_dir, shape)
    batch = engine.train_micro_batch_size_per_gpu()
    common = {"world_size": world, "global_batch": batch * world, "strategy": f"zero{stage}",
              "device": device.type, "amp": None}
    meter = Meter(common, device, start + args.warmup_steps, time.perf_counter())
    teacher, began = Teacher(shape, args.seed), time.perf_counter()
    for step in range(start + 1, args.steps + 1):
        started = time.perf_counter()
        inputs, labels = teacher.batch(((step - 1) * world + rank) * batch, batch)
        loss = nn.functional.cross_entropy(engine(inputs.to(device)), labels.to(device))
        engine.backward(loss)
        engine.step()
        time.sleep(args.step_sleep)
        meter.record(step, loss.item(), started)
        if step % args.log_every == 0 or step == args.steps:
            meter.log(step)
        if args.checkpoint_dir and save_due(args, step):
            save(engine, args.checkpoint_dir, step, shape)
    meter.finish(args.steps, max(args.steps - start, 0), time.perf_counter() - began)
    if args.print_checksum:
        print_checksum(engine, device)


def print_checksum(engine: Any, device: torch.device) -> None:
    """Every rank's sum of the full parameters (gathered under ZeRO-3): equal when in sync."""
    params = list(engine.module.parameters())
    with deepspeed.zero.GatheredParameters(params, enabled=engine.zero_optimization_stage() == 3):
        weights = round(sum(p.detach().double().sum().item() for p in params), 6)
    reduced = all_reduce(float(dist.get_rank() + 1), dist.ReduceOp.SUM, device)
    emit(CHECKSUM_PREFIX, {"rank": dist.get_rank(), "weights": weights, "allreduce": reduced})


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.checkpoint_dir is not None:
        args.checkpoint_dir.mkdir(parents=True, exist_ok=True)
    train(args)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    # Not sys.exit: interpreter teardown can abort a rank whose work is done (see quick_exit).
    quick_exit(main())
