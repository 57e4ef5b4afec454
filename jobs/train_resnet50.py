"""Train ResNet-50 (or a tiny CNN) on synthetic ImageNet-shaped data; launched by torchrun.

    torchrun --nproc-per-node 2 jobs/train_resnet50.py --model resnet50 --steps 20
    python jobs/train_resnet50.py --model tiny --steps 4      # one process, no process group

Strategies: ``single`` (one process), ``dp`` (torch.nn.DataParallel over every visible
GPU in one process; a plain single process without GPUs), ``ddp``
(DistributedDataParallel, one process per GPU or CPU slot) and ``fsdp`` (FSDP2
``fully_shard`` per residual block, then the root). ``ddp`` and ``fsdp`` started
without torchrun run as a one-rank process group. ``ft-ddp``: torchft's Manager,
DistributedDataParallel (its comm hook made safe for a peer that dies: ``ft_comm_hook``) and
Optimizer wrapper (gloo on CPU, NCCL on GPUs), one process per replica group of a
job with ``fault_tolerance:`` (jobs/README.md); each group reads its own share of the data,
gradients are averaged over the groups in the quorum, and a group that comes back heals
from a peer. It prints ``ft step S group G participants P`` every ``--log-every`` steps.

Checkpoints (jobs/README.md, "Checkpoints and restarts"): with a checkpoint dir
(``--checkpoint-dir``, default $DISTRUN_CHECKPOINT_DIR) every rank resumes from the
latest checkpoint there at start and prints ``resumed from step K``; the run saves every
``--checkpoint-every`` steps and at the end, atomically: rank 0 renames last.pt.partial
to last.pt, or under fsdp the ranks write DCP shards that rank 0 renames to step-K.dcp.

Metrics line protocol (what distrun parses from every rank's stdout):

    DISTRUN_METRICS {"step": 5, "rank": 0, "busy_s": 0.41, "samples_per_s": 41.2, ...}

One line, the prefix, one space, one JSON object. Every rank prints one every
``--log-every`` steps and at the last step, with its own timing:

    step           int    1-based optimizer step just finished
    rank           int    the printing rank
    step_time_s    float  mean seconds per step over the interval since the last line
                          (wall time: under DDP every rank waits for the slowest, so it is
                          about the same on every rank)
    wait_s         float  of that, mean seconds per step this rank waited for the others inside
                          DDP: its buffer broadcast at forward, its gradient all-reduce once this
                          rank's backward was done (see SyncWait; ddp only, 0 otherwise)
    busy_s         float  step_time_s - wait_s: this rank's own work per step (data, forward,
                          backward, optimizer); a straggler's is the largest

Rank 0's line also carries the job's figures:

    samples_per_s  float  whole-job throughput over the interval since the last line:
                          global_batch * steps in the interval / elapsed seconds
    loss           float  mean training loss over the interval, averaged across ranks
    peak_mem_mb    float  CUDA max_memory_allocated of rank 0's process on GPUs; on
                          CPU the process's max RSS (getrusage); MiB
    world_size     int    number of processes
    global_batch   int    batch_size * grad_accum * world_size (samples per step)
    strategy       str    single | dp | ddp | fsdp | ft-ddp
    device         str    cuda | cpu
    amp            str|null  "bfloat16" / "float16", or null when AMP is off
    warmup         bool   true while step <= the warmup steps of this run

After the last step rank 0 prints one more line with ``"final": true``, ``step``,
``steps_run``, ``mean_samples_per_s`` (global_batch * non-warmup steps / their
elapsed seconds; null when every step was warmup), ``peak_mem_mb`` (max over all
ranks), ``wall_s`` and the run-constant keys above. Every print is flushed.

With ``--print-checksum`` every rank then prints

    DISTRUN_CHECKSUM {"rank": 0, "weights": 1234.567891, "allreduce": 3.0}

``weights`` is the sum of all parameters (rounded to 6 places; ranks agree when
training stayed in sync) and ``allreduce`` the all_reduce sum of ``rank + 1``, which
is world_size * (world_size + 1) / 2 on every rank of a healthy process group.
"""

from __future__ import annotations

import argparse
import itertools
import json
import logging
import os
import re
import resource
import shutil
import sys
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from quick_exit import quick_exit
from resnet_model import MODEL_NAMES, build_model, shard_units
from torch import nn
from torch.distributed import checkpoint as dcp
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict, set_state_dict
from torch.distributed.elastic.multiprocessing.errors import record
from torch.utils.data import DataLoader, Dataset, DistributedSampler

METRICS_PREFIX = "DISTRUN_METRICS"
CHECKSUM_PREFIX = "DISTRUN_CHECKSUM"
CHECKPOINT_NAME = "last.pt"
# FSDP: one torch.distributed.checkpoint directory per save, written under DCP_PARTIAL
# and renamed into place once every rank finished; the highest step is the latest.
DCP_PATTERN = re.compile(r"step-(\d+)\.dcp")
DCP_PARTIAL = "step.dcp.partial"
CHECKPOINT_DIR_ENV = "DISTRUN_CHECKPOINT_DIR"
ATTEMPT_ENV = "DISTRUN_ATTEMPT"


class Strategy(str, Enum):
    SINGLE = "single"
    DP = "dp"
    DDP = "ddp"
    FSDP = "fsdp"
    FT_DDP = "ft-ddp"


# ft-ddp: one process per replica group, no process group of its own (torchft's Manager has one
# across the groups).
ONE_PROCESS_STRATEGIES = (Strategy.SINGLE, Strategy.DP, Strategy.FT_DDP)
FT_ENV = ("REPLICA_GROUP_ID", "NUM_REPLICA_GROUPS", "TORCHFT_LIGHTHOUSE")


@dataclass(frozen=True)
class Runtime:
    """Where this process sits: its rank, the job's size and the device it trains on."""

    rank: int
    world_size: int
    device: torch.device
    distributed: bool

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def env_world_size() -> int:
    return int(os.environ.get("WORLD_SIZE", "1"))


def env_checkpoint_dir() -> Path | None:
    value = os.environ.get(CHECKPOINT_DIR_ENV, "")
    return Path(value) if value else None


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=MODEL_NAMES, default="resnet50")
    parser.add_argument("--strategy", choices=[strategy.value for strategy in Strategy], default=None,
                        help="default: ddp when WORLD_SIZE > 1, else single")
    parser.add_argument("--steps", type=int, default=50, help="optimizer steps in the whole run")
    parser.add_argument("--batch-size", type=int, default=32, help="samples per process per micro-batch")
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--num-classes", type=int, default=1000)
    parser.add_argument("--lr", type=float, default=0.002, help="SGD learning rate (momentum 0.9)")
    parser.add_argument("--grad-accum", type=int, default=1, help="micro-batches per optimizer step")
    parser.add_argument("--amp", action=argparse.BooleanOptionalAction, default=True,
                        help="mixed precision on CUDA: bf16 where supported, else fp16 with GradScaler")
    parser.add_argument("--amp-on-cpu", action="store_true",
                        help="bf16 mixed precision on CPU too: slow, but runs the GPU's AMP code path (tests)")
    parser.add_argument("--log-every", type=int, default=10, help="steps between DISTRUN_METRICS lines")
    parser.add_argument("--warmup-steps", type=int, default=2, help="steps left out of mean throughput")
    parser.add_argument("--checkpoint-dir", type=Path, default=env_checkpoint_dir(),
                        help=f"save here and resume from the latest checkpoint here (default: ${CHECKPOINT_DIR_ENV})")
    parser.add_argument("--checkpoint-every", type=int, default=0,
                        help="also checkpoint every N steps (0: only at the end)")
    parser.add_argument("--fail-at-step", type=int, default=None, help="raise RuntimeError at this step (tests)")
    parser.add_argument("--fail-rank", type=int, default=0, help="the rank that fails with --fail-at-step")
    parser.add_argument("--slow-rank", type=int, default=None, help="this rank works --slow-s longer per step (tests)")
    parser.add_argument("--slow-s", type=float, default=0.0, help="seconds the --slow-rank rank sleeps each step")
    parser.add_argument("--pace", type=float, default=0.0,
                        help="every rank sleeps this many seconds before each step: a run slow enough to watch")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--print-checksum", action="store_true", help="every rank prints DISTRUN_CHECKSUM at the end")
    args = parser.parse_args(argv)
    validate_args(parser, args)
    return args


def validate_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    for name in ("steps", "batch_size", "image_size", "num_classes", "grad_accum", "log_every"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    if args.warmup_steps < 0 or args.checkpoint_every < 0:
        parser.error("--warmup-steps and --checkpoint-every must not be negative")
    if args.checkpoint_every and args.checkpoint_dir is None:
        parser.error(f"--checkpoint-every needs --checkpoint-dir or ${CHECKPOINT_DIR_ENV}")
    if args.slow_s < 0 or args.pace < 0:
        parser.error("--slow-s and --pace must not be negative")
    if args.strategy is None:
        args.strategy = Strategy.DDP if env_world_size() > 1 else Strategy.SINGLE
    args.strategy = Strategy(args.strategy)
    if args.strategy in ONE_PROCESS_STRATEGIES and env_world_size() > 1:
        parser.error(f"--strategy {args.strategy.value} runs in one process, but WORLD_SIZE is "
                     f"{env_world_size()}; launch it with nproc_per_node 1")
    missing = [name for name in FT_ENV if name not in os.environ]
    if args.strategy is Strategy.FT_DDP and missing:
        parser.error(f"--strategy ft-ddp needs {', '.join(missing)}: launch it as a job with fault_tolerance: "
                     "(jobs/resnet50-ft.yaml)")
    if args.strategy is Strategy.FT_DDP and (args.checkpoint_dir or args.grad_accum > 1 or args.fail_at_step):
        parser.error("--strategy ft-ddp heals from a peer, not a checkpoint: drop --checkpoint-dir "
                     f"(and ${CHECKPOINT_DIR_ENV}), --grad-accum and --fail-at-step")


def init_runtime(strategy: Strategy) -> Runtime:
    """Pick the device and, for ddp/fsdp, join the process group (nccl on GPUs, gloo otherwise)."""
    cuda = torch.cuda.is_available()
    if strategy in ONE_PROCESS_STRATEGIES:
        return Runtime(rank=0, world_size=1, device=torch.device("cuda" if cuda else "cpu"), distributed=False)
    device = torch.device("cpu")
    if cuda:
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
    backend = "nccl" if cuda else "gloo"
    if "RANK" in os.environ:
        dist.init_process_group(backend, device_id=device if cuda else None)
    else:
        # Started without torchrun: a one-rank group, so ddp/fsdp still run end to end.
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
    return Runtime(rank=dist.get_rank(), world_size=dist.get_world_size(), device=device, distributed=True)


def pick_amp_dtype(device: torch.device, enabled: bool, on_cpu: bool) -> torch.dtype | None:
    if not enabled or (device.type != "cuda" and not on_cpu):
        return None
    if device.type != "cuda":
        return torch.bfloat16
    return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16


def write_line(line: str) -> None:
    """One write per line, flushed: torchrun runs workers with ``python -u``, where print()
    writes the text and the newline separately and lines of two ranks sharing a pipe interleave."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def emit(prefix: str, payload: dict[str, Any]) -> None:
    write_line(f"{prefix} {json.dumps(payload)}")


def say(runtime: Runtime, message: str) -> None:
    if runtime.is_main:
        write_line(f"train_resnet50: {message}")


class SyntheticImageNet(Dataset):
    """Deterministic random images and labels: item i is the same on every rank and every run.

    Items cycle through a bank of at most ``bank_size`` image/label pairs drawn once from
    the seed: with num_workers=0, drawing a fresh 224x224 image per sample would starve a
    GPU, and pairs that repeat give the model something to fit.
    """

    def __init__(self, length: int, image_size: int, num_classes: int, seed: int, bank_size: int = 256) -> None:
        generator = torch.Generator().manual_seed(seed)
        bank = min(length, bank_size)
        self.images = torch.randn(bank, 3, image_size, image_size, generator=generator)
        self.labels = torch.randint(num_classes, (bank,), generator=generator)
        self.length = length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        slot = index % len(self.labels)
        return self.images[slot], self.labels[slot]


EPOCH_SAMPLES_PER_RANK = 256


def epoch_stream(sampler: DistributedSampler) -> Iterator[int]:
    """This rank's sample indices, epoch after epoch (reshuffled by set_epoch)."""
    for epoch in itertools.count():
        sampler.set_epoch(epoch)
        yield from sampler


def make_loader(args: argparse.Namespace, runtime: Runtime, start_step: int) -> DataLoader:
    """Steps start_step+1 .. steps of a fixed sample order: a run that resumes at step K reads
    exactly what step K+1 onwards of an uninterrupted run reads, whatever --steps either had."""
    per_rank_step = args.batch_size * args.grad_accum
    dataset = SyntheticImageNet(EPOCH_SAMPLES_PER_RANK * runtime.world_size, args.image_size,
                                args.num_classes, args.seed)
    sampler = DistributedSampler(dataset, num_replicas=runtime.world_size, rank=runtime.rank,
                                 shuffle=True, seed=args.seed, drop_last=True)
    remaining = list(itertools.islice(epoch_stream(sampler), start_step * per_rank_step,
                                      max(args.steps, start_step) * per_rank_step))
    return DataLoader(dataset, batch_size=args.batch_size, sampler=remaining, num_workers=0, drop_last=True,
                      pin_memory=runtime.device.type == "cuda")


BATCH_NORMS = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d)


def apply_fsdp(model: nn.Module, runtime: Runtime, amp_dtype: torch.dtype | None) -> nn.Module:
    try:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    except ImportError as exc:
        sys.exit(f"train_resnet50: --strategy fsdp needs FSDP2 (torch.distributed.fsdp.fully_shard, "
                 f"torch >= 2.6); this torch is {torch.__version__}: {exc}")
    mesh = init_device_mesh(runtime.device.type, (runtime.world_size,))
    policy = MixedPrecisionPolicy(param_dtype=amp_dtype, reduce_dtype=torch.float32) if amp_dtype else None
    options: dict[str, Any] = {"mesh": mesh} | ({"mp_policy": policy} if policy else {})
    if amp_dtype:
        # The policy casts BatchNorm's weight and bias to amp_dtype but not its running statistics,
        # and batch_norm refuses the mix: BatchNorm gets units of its own that stay fp32 inside.
        norm_policy = MixedPrecisionPolicy(param_dtype=torch.float32, reduce_dtype=torch.float32,
                                           output_dtype=amp_dtype)
        for norm in [module for module in model.modules() if isinstance(module, BATCH_NORMS)]:
            fully_shard(norm, mesh=mesh, mp_policy=norm_policy)
    for block in shard_units(model):
        fully_shard(block, **options)
    fully_shard(model, **options)
    return model


def mark(device: torch.device) -> Any:
    """A point in this rank's work: wall time on CPU; on CUDA an event on the current stream,
    so that the gap between two marks is the device's time, read later without a synchronize."""
    if device.type != "cuda":
        return time.perf_counter()
    event = torch.cuda.Event(enable_timing=True)
    event.record()
    return event


def seconds_between(start: Any, end: Any) -> float:
    """Seconds from one mark to a later one (CUDA marks: once the device has passed `end`)."""
    if isinstance(start, float):
        return end - start
    return start.elapsed_time(end) / 1000


@dataclass
class SyncWait:
    """How long this rank waits for the other ranks inside DDP's own collectives, per step.

    DDP waits twice a step: at the start of forward, in the broadcast of buffers (BatchNorm's
    running statistics) from rank 0, and at the end of backward, for the gradient all-reduce. The
    first wait is the gap from calling the DDP module to its inner module's forward (a pre-hook
    marks it). For the second, DDP hands each bucket of gradients to the comm hook as soon as this
    rank computed it, and backward returns once every bucket's all-reduce completed: from the last
    hand-off, where this rank's own work ended, to the end of backward it waits for the others
    (and for the last bucket's transfer). Without this, every rank's step time is the slowest
    rank's, and a straggler makes every rank look slow.
    """

    device: torch.device
    watching: bool = False
    began: Any = None
    pending: list[tuple[Any, Any]] = field(default_factory=list)

    def watch(self, ddp: nn.parallel.DistributedDataParallel) -> None:
        ddp.register_comm_hook(None, self.hook)
        ddp.module.register_forward_pre_hook(self.inner_forward)
        self.watching = True

    def forward_called(self) -> None:
        if self.watching:
            self.began = mark(self.device)

    def inner_forward(self, _module: nn.Module, _args: Any) -> None:
        self._waited()

    # Unannotated: DDP checks a hook's annotations as objects, and this module's are strings.
    def hook(self, process_group, bucket):
        self.began = mark(self.device)
        return allreduce_hook(process_group, bucket)

    def backward_done(self) -> None:
        self._waited()

    def _waited(self) -> None:
        if self.began is not None:
            self.pending.append((self.began, mark(self.device)))
            self.began = None

    def take(self) -> float:
        """Seconds waited since the previous take (on CUDA: after the device was synchronized)."""
        waited = sum(seconds_between(start, end) for start, end in self.pending)
        self.pending.clear()
        return waited


def wrap_model(model: nn.Module, strategy: Strategy, runtime: Runtime, amp_dtype: torch.dtype | None,
               sync_wait: SyncWait) -> nn.Module:
    """Put the model on its device and wrap it for the strategy; FSDP2 shards in place."""
    model = model.to(runtime.device)
    if strategy is Strategy.DDP:
        device_ids = [runtime.device.index] if runtime.device.type == "cuda" else None
        ddp = nn.parallel.DistributedDataParallel(model, device_ids=device_ids)
        sync_wait.watch(ddp)
        return ddp
    if strategy is Strategy.FSDP:
        return apply_fsdp(model, runtime, amp_dtype)
    if strategy is Strategy.DP:
        if runtime.device.type != "cuda":
            say(runtime, "note: dp without GPUs is a plain single process")
            return model
        say(runtime, f"dp: DataParallel over {torch.cuda.device_count()} GPU(s)")
        return nn.DataParallel(model)
    return model


def unwrap(model: nn.Module) -> nn.Module:
    """The module that owns the parameters (DDP and DataParallel keep it as .module)."""
    if isinstance(model, (nn.parallel.DistributedDataParallel, nn.DataParallel)):
        return model.module
    return model


@dataclass
class Trainer:
    model: nn.Module
    optimizer: torch.optim.Optimizer
    strategy: Strategy
    runtime: Runtime
    amp_dtype: torch.dtype | None
    grad_accum: int
    sync_wait: SyncWait
    scaler: torch.amp.GradScaler | None = None
    loss_fn: nn.Module = field(default_factory=nn.CrossEntropyLoss)

    def autocast(self) -> AbstractContextManager[Any]:
        # FSDP2 casts through its MixedPrecisionPolicy instead of autocast.
        if self.amp_dtype is None or self.strategy is Strategy.FSDP:
            return nullcontext()
        return torch.autocast(device_type=self.runtime.device.type, dtype=self.amp_dtype)

    def grad_sync(self, sync: bool) -> AbstractContextManager[Any]:
        """Skip the gradient all-reduce on all but the last micro-batch of a step."""
        if self.strategy is Strategy.FSDP:
            self.model.set_requires_gradient_sync(sync)
        elif self.strategy is Strategy.DDP and not sync:
            return self.model.no_sync()
        return nullcontext()

    def step(self, micro_batches: list[tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
        """One optimizer step over grad_accum micro-batches; returns the mean loss (no host sync)."""
        self.optimizer.zero_grad(set_to_none=True)
        total = torch.zeros((), device=self.runtime.device)
        for index, (images, labels) in enumerate(micro_batches):
            images = images.to(self.runtime.device, non_blocking=True)
            labels = labels.to(self.runtime.device, non_blocking=True)
            with self.grad_sync(index == len(micro_batches) - 1), self.autocast():
                self.sync_wait.forward_called()
                loss = self.loss_fn(self.model(images), labels) / self.grad_accum
                self.backward(loss)
            self.sync_wait.backward_done()
            total += loss.detach().float()
        if self.scaler is None:
            self.optimizer.step()
        else:
            self.scaler.step(self.optimizer)
            self.scaler.update()
        return total

    def backward(self, loss: torch.Tensor) -> None:
        if self.scaler is None:
            loss.backward()
        else:
            self.scaler.scale(loss).backward()


def all_reduce_scalar(runtime: Runtime, value: float, op: dist.ReduceOp.RedOpType) -> float:
    if not runtime.distributed:
        return value
    tensor = torch.tensor([value], dtype=torch.float64, device=runtime.device)
    dist.all_reduce(tensor, op=op)
    return tensor.item()


def peak_mem_mb(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    max_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    # Linux reports KiB, macOS bytes.
    return max_rss / (2**20 if sys.platform == "darwin" else 2**10)


def clock(device: torch.device) -> float:
    """Wall time after the device finished its queued work, so intervals measure real steps."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


@dataclass
class Meter:
    """Turns step timings and losses into DISTRUN_METRICS lines."""

    runtime: Runtime
    common: dict[str, Any]
    warmup_end: int
    last_step: int
    last_time: float
    measure_start: float | None
    loss_sum: torch.Tensor
    sync_wait: SyncWait

    @classmethod
    def start(cls, runtime: Runtime, common: dict[str, Any], start_step: int, warmup_steps: int,
              sync_wait: SyncWait) -> Meter:
        now = clock(runtime.device)
        sync_wait.take()
        return cls(runtime=runtime, common=common, warmup_end=start_step + warmup_steps, last_step=start_step,
                   last_time=now, measure_start=now if warmup_steps == 0 else None,
                   loss_sum=torch.zeros((), device=runtime.device), sync_wait=sync_wait)

    def record(self, step: int, loss: torch.Tensor, log: bool) -> None:
        """Account for a finished step; the clock is read only at interval boundaries."""
        self.loss_sum += loss
        if step != self.warmup_end and not log:
            return
        # One timestamp per boundary, so consecutive intervals tile the run (logging included).
        now = clock(self.runtime.device)
        if step == self.warmup_end:
            self.measure_start = now
        if log:
            self.log(step, now)

    def log(self, step: int, now: float) -> None:
        """Every rank's own line; rank 0's also carries the job's figures."""
        steps = step - self.last_step
        elapsed = now - self.last_time
        wait = min(self.sync_wait.take(), elapsed) / steps
        world = self.runtime.world_size
        loss = all_reduce_scalar(self.runtime, self.loss_sum.item() / steps, dist.ReduceOp.SUM) / world
        record: dict[str, Any] = {
            "step": step,
            "rank": self.runtime.rank,
            "step_time_s": round(elapsed / steps, 6),
            "wait_s": round(wait, 6),
            "busy_s": round(elapsed / steps - wait, 6),
        }
        if self.runtime.is_main:
            record |= {
                "samples_per_s": round(self.common["global_batch"] * steps / elapsed, 3),
                "loss": round(loss, 6),
                "peak_mem_mb": round(peak_mem_mb(self.runtime.device), 1),
                **self.common,
                "warmup": step <= self.warmup_end,
            }
        emit(METRICS_PREFIX, record)
        self.last_step, self.last_time = step, now
        self.loss_sum.zero_()

    def finish(self, step: int, steps_run: int, wall_s: float) -> None:
        """The final line; the last step always logs, so last_time is the end of the run."""
        measured = step - self.warmup_end
        mean = None
        if measured > 0 and self.measure_start is not None:
            mean = round(self.common["global_batch"] * measured / (self.last_time - self.measure_start), 3)
        peak = all_reduce_scalar(self.runtime, peak_mem_mb(self.runtime.device), dist.ReduceOp.MAX)
        if self.runtime.is_main:
            emit(METRICS_PREFIX, {
                "final": True, "step": step, "steps_run": steps_run, "mean_samples_per_s": mean,
                "peak_mem_mb": round(peak, 1), "wall_s": round(wall_s, 3), **self.common,
            })


def checkpoint_state(trainer: Trainer, step: int, full: bool) -> dict[str, Any]:
    """Model, optimizer (and scaler) state and the step. Collective under FSDP, so every rank
    calls it; full: unsharded, gathered to CPU; otherwise FSDP's sharded state for DCP."""
    options = StateDictOptions(full_state_dict=full, cpu_offload=full and trainer.runtime.distributed)
    model_state, optim_state = get_state_dict(unwrap(trainer.model), trainer.optimizer, options=options)
    state = {"step": step, "model": model_state, "optimizer": optim_state}
    if trainer.scaler is not None:
        state["scaler"] = trainer.scaler.state_dict()
    return state


def restore_state(trainer: Trainer, state: dict[str, Any], full: bool) -> int:
    set_state_dict(unwrap(trainer.model), trainer.optimizer, model_state_dict=state["model"],
                   optim_state_dict=state["optimizer"], options=StateDictOptions(full_state_dict=full))
    if trainer.scaler is not None and "scaler" in state:
        trainer.scaler.load_state_dict(state["scaler"])
    return int(state["step"])


def save_checkpoint(trainer: Trainer, directory: Path, step: int) -> None:
    if trainer.strategy is Strategy.FSDP:
        save_dcp(trainer, directory, step)
        return
    state = checkpoint_state(trainer, step, full=True)
    if not trainer.runtime.is_main:
        return
    directory.mkdir(parents=True, exist_ok=True)
    partial = directory / f"{CHECKPOINT_NAME}.partial"
    # Write then rename: a run killed mid-save leaves the previous last.pt intact.
    torch.save(state, partial)
    partial.replace(directory / CHECKPOINT_NAME)
    say(trainer.runtime, f"saved {directory / CHECKPOINT_NAME} at step {step}")


def dcp_checkpoints(directory: Path) -> dict[int, Path]:
    """The complete DCP checkpoints in directory by step (a partial one is never named step-K.dcp)."""
    if not directory.is_dir():
        return {}
    found = (DCP_PATTERN.fullmatch(path.name) for path in directory.iterdir() if path.is_dir())
    return {int(match[1]): directory / match[0] for match in found if match}


def save_dcp(trainer: Trainer, directory: Path, step: int) -> None:
    """Every rank writes its shards into the partial directory; after a barrier rank 0 renames
    it to step-K.dcp and drops the older ones. The directory must be shared between hosts."""
    runtime = trainer.runtime
    partial = directory / DCP_PARTIAL
    if runtime.is_main:
        directory.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(partial, ignore_errors=True)  # what a save killed midway left
    dist.barrier()
    dcp.save(checkpoint_state(trainer, step, full=False), checkpoint_id=partial)
    dist.barrier()
    if not runtime.is_main:
        return
    final = directory / f"step-{step}.dcp"
    shutil.rmtree(final, ignore_errors=True)
    partial.rename(final)
    for older, path in dcp_checkpoints(directory).items():
        if older != step:
            shutil.rmtree(path, ignore_errors=True)
    say(runtime, f"saved {final} at step {step}")


def latest_checkpoint(runtime: Runtime, directory: Path, strategy: Strategy) -> Path | None:
    """Rank 0 picks the checkpoint and tells the others, so all ranks load the same one."""
    latest = None
    if runtime.is_main:
        if strategy is Strategy.FSDP:
            found = dcp_checkpoints(directory)
            latest = found[max(found)] if found else None
        elif (directory / CHECKPOINT_NAME).is_file():
            latest = directory / CHECKPOINT_NAME
    if runtime.distributed:
        box = [latest]
        dist.broadcast_object_list(box, src=0)
        latest = box[0]
    return latest


def read_checkpoint_on_rank0(runtime: Runtime, path: Path) -> dict[str, Any]:
    """Rank 0 reads the file and sends it to the others, so only rank 0 needs to see it."""
    state = torch.load(path, map_location="cpu", weights_only=True) if runtime.is_main else None
    if runtime.distributed:
        box = [state]
        dist.broadcast_object_list(box, src=0)
        state = box[0]
    assert state is not None
    return state


def load_checkpoint(trainer: Trainer, directory: Path) -> int:
    """Restore the latest checkpoint in directory; returns the step to continue from (0 without one)."""
    runtime = trainer.runtime
    path = latest_checkpoint(runtime, directory, trainer.strategy)
    if path is None:
        say(runtime, f"no checkpoint in {directory}; starting from step 0")
        return 0
    if trainer.strategy is Strategy.FSDP:
        # Only with a checkpoint to load: on a fresh optimizer get_state_dict runs a zero step
        # that sets SGD's momentum buffers from the weight decay.
        state = checkpoint_state(trainer, 0, full=False)
        dcp.load(state, checkpoint_id=path)
        step = restore_state(trainer, state, full=False)
    else:
        step = restore_state(trainer, read_checkpoint_on_rank0(runtime, path), full=True)
    write_line(f"train_resnet50: rank {runtime.rank}: resumed from step {step} ({path})")
    return step


def weights_checksum(model: nn.Module) -> float:
    """Sum of every parameter; under FSDP the shards are gathered first (a collective)."""
    from torch.distributed.tensor import DTensor

    total = 0.0
    for param in model.parameters():
        tensor = param.full_tensor() if isinstance(param, DTensor) else param
        total += tensor.detach().double().sum().item()
    return round(total, 6)


def print_checksum(trainer: Trainer) -> None:
    runtime = trainer.runtime
    weights = weights_checksum(trainer.model)
    reduced = all_reduce_scalar(runtime, float(runtime.rank + 1), dist.ReduceOp.SUM)
    emit(CHECKSUM_PREFIX, {"rank": runtime.rank, "weights": weights, "allreduce": reduced})


def micro_batch_groups(loader: DataLoader, grad_accum: int) -> Iterator[list[tuple[torch.Tensor, torch.Tensor]]]:
    batches: list[tuple[torch.Tensor, torch.Tensor]] = []
    for batch in loader:
        batches.append(batch)
        if len(batches) == grad_accum:
            yield batches
            batches = []


def build_trainer(args: argparse.Namespace, runtime: Runtime) -> Trainer:
    # Same seed on every rank: FSDP2 shards each rank's own copy of the initial weights.
    torch.manual_seed(args.seed)
    model = build_model(args.model, args.num_classes)
    amp_dtype = pick_amp_dtype(runtime.device, args.amp, args.amp_on_cpu)
    params = sum(p.numel() for p in model.parameters())
    say(runtime, f"model={args.model} params={params:,} strategy={args.strategy.value} "
                 f"world_size={runtime.world_size} device={runtime.device.type} amp={amp_dtype}")
    sync_wait = SyncWait(runtime.device)
    model = wrap_model(model, args.strategy, runtime, amp_dtype, sync_wait)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9, weight_decay=1e-4)
    scaler = torch.amp.GradScaler("cuda") if amp_dtype == torch.float16 else None
    return Trainer(model=model, optimizer=optimizer, strategy=args.strategy, runtime=runtime,
                   amp_dtype=amp_dtype, grad_accum=args.grad_accum, sync_wait=sync_wait, scaler=scaler)


def should_log(step: int, args: argparse.Namespace) -> bool:
    return step % args.log_every == 0 or step == args.steps


def train(args: argparse.Namespace, trainer: Trainer, start_step: int) -> None:
    runtime = trainer.runtime
    common = {
        "world_size": runtime.world_size,
        "global_batch": args.batch_size * args.grad_accum * runtime.world_size,
        "strategy": args.strategy.value,
        "device": runtime.device.type,
        "amp": str(trainer.amp_dtype).removeprefix("torch.") if trainer.amp_dtype else None,
    }
    began = time.perf_counter()
    trainer.model.train()
    groups = micro_batch_groups(make_loader(args, runtime, start_step), args.grad_accum)
    meter = Meter.start(runtime, common, start_step, args.warmup_steps, trainer.sync_wait)
    step = start_step
    for step, micro_batches in enumerate(groups, start=start_step + 1):
        if step == args.fail_at_step and runtime.rank == args.fail_rank:
            raise RuntimeError(f"injected failure at step {step} on rank {runtime.rank} (--fail-at-step)")
        if runtime.rank == args.slow_rank:
            time.sleep(args.slow_s)  # a straggler: this rank's own work takes longer (--slow-rank)
        time.sleep(args.pace)  # every rank alike: no straggler, only a slower run (--pace)
        loss = trainer.step(micro_batches)
        meter.record(step, loss, log=should_log(step, args))
        if args.checkpoint_dir and args.checkpoint_every and step % args.checkpoint_every == 0 \
                and step != args.steps:
            save_checkpoint(trainer, args.checkpoint_dir, step)
    if args.checkpoint_dir and step > start_step:
        save_checkpoint(trainer, args.checkpoint_dir, step)
    meter.finish(step, step - start_step, time.perf_counter() - began)


def group_batches(args: argparse.Namespace, device: torch.device, group: int,
                  groups: int) -> Iterator[list[tuple[torch.Tensor, torch.Tensor]]]:
    """Replica group `group`'s share of the data (as a rank of `groups`), step after step, for as
    many steps as the group runs (a step torchft does not commit is done again on the next batch)."""
    share = Runtime(rank=group, world_size=groups, device=device, distributed=False)
    while True:
        yield from micro_batch_groups(make_loader(args, share, 0), 1)


def ft_comm_hook(state, bucket):  # unannotated: DDP refuses the string annotations of this module
    """torchft 0.2.0's DDP comm hook, safe for a peer group that dies mid-allreduce.

    torchft's own asserts on the future of an allreduce that failed (`assert fut._fut`: the manager
    caught the error before it chained the future), so a peer group SIGKILLed mid-allreduce crashed
    this group too. Here a failed allreduce hands DDP the bucket as it is: the manager has the error
    and does not commit the step, as torchft intends. A good one returns what torchft's returns."""
    work = state.allreduce(bucket.buffer())
    work.wait()
    chained = getattr(work.get_future(), "_fut", None)
    if chained is not None:
        return chained
    as_is: torch.futures.Future[torch.Tensor] = torch.futures.Future()
    as_is.set_result(bucket.buffer())
    return as_is


def ft_ddp(manager: Any, model: nn.Module) -> nn.Module:
    """torchft's DistributedDataParallel with `ft_comm_hook` for its comm hook."""
    import torchft

    class SafeHook(torchft.DistributedDataParallel):
        _comm_hook = staticmethod(ft_comm_hook)

    return SafeHook(manager, model)


def train_ft(args: argparse.Namespace, runtime: Runtime) -> None:
    """--strategy ft-ddp: train until torchft's step count reaches --steps, which a group that
    healed from a peer continues from; only committed steps count and log."""
    from datetime import timedelta

    import torchft

    group, groups = int(os.environ["REPLICA_GROUP_ID"]), int(os.environ["NUM_REPLICA_GROUPS"])
    torch.manual_seed(args.seed)
    model = build_model(args.model, args.num_classes).to(runtime.device)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9, weight_decay=1e-4)
    amp_dtype = pick_amp_dtype(runtime.device, args.amp, args.amp_on_cpu)
    if amp_dtype == torch.float16:
        amp_dtype = None  # GradScaler cannot step torchft's Optimizer wrapper
    say(runtime, f"model={args.model} strategy=ft-ddp replica group {group} of {groups} "
                 f"device={runtime.device.type} amp={amp_dtype}")

    def load_state_dict(state: dict[str, Any]) -> None:
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])

    def state_dict() -> dict[str, Any]:
        return {"model": model.state_dict(), "optimizer": optimizer.state_dict()}

    # Gloo takes CPU tensors only; on GPUs torchft's reconfigurable NCCL group.
    pg_class = torchft.ProcessGroupNCCL if runtime.device.type == "cuda" else torchft.ProcessGroupGloo
    manager = torchft.Manager(pg=pg_class(timeout=timedelta(seconds=10)), min_replica_size=1,
                              load_state_dict=load_state_dict, state_dict=state_dict, replica_id=f"group{group}",
                              timeout=timedelta(seconds=10), quorum_timeout=timedelta(seconds=30))
    trainer = Trainer(model=ft_ddp(manager, model),
                      optimizer=torchft.Optimizer(manager, optimizer), strategy=Strategy.FT_DDP, runtime=runtime,
                      amp_dtype=amp_dtype, grad_accum=1, sync_wait=SyncWait(runtime.device))
    common = {"world_size": 1, "global_batch": args.batch_size, "strategy": Strategy.FT_DDP.value,
              "device": runtime.device.type, "amp": str(amp_dtype).removeprefix("torch.") if amp_dtype else None}
    began = time.perf_counter()
    trainer.model.train()
    meter = Meter.start(runtime, common, 0, args.warmup_steps, trainer.sync_wait)
    committed = 0
    batches = group_batches(args, runtime.device, group, groups)
    while manager.current_step() < args.steps:
        before = manager.current_step()
        if runtime.rank == args.slow_rank:
            time.sleep(args.slow_s)  # a straggler: this rank's own work takes longer (--slow-rank)
        loss = trainer.step(next(batches))
        step = manager.current_step()
        if step == before:
            continue
        committed += 1
        meter.record(step, loss, log=should_log(step, args))
        if should_log(step, args):
            write_line(f"train_resnet50: ft step {step} group {group} participants {manager.num_participants()}")
    meter.finish(manager.current_step(), committed, time.perf_counter() - began)
    manager.shutdown(wait=False)


@record
def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    runtime = init_runtime(args.strategy)
    logging.basicConfig(level=logging.INFO if runtime.is_main else logging.WARNING,
                        format="train_resnet50: %(message)s", stream=sys.stdout)
    if ATTEMPT_ENV in os.environ:
        say(runtime, f"attempt {os.environ[ATTEMPT_ENV]}")
    if args.strategy is Strategy.FT_DDP:
        train_ft(args, runtime)
        return 0
    trainer = build_trainer(args, runtime)
    start_step = load_checkpoint(trainer, args.checkpoint_dir) if args.checkpoint_dir else 0
    train(args, trainer, start_step)
    if args.print_checksum:
        print_checksum(trainer)
    if runtime.distributed:
        # The DDP reducer must go before its process group, and no rank may tear gloo down
        # under a peer still in a collective: either hangs the job at exit.
        del trainer
        dist.barrier()
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    status = main()
    # Not sys.exit: interpreter teardown can abort a rank whose work is done (see quick_exit).
    quick_exit(status)
