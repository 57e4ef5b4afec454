"""A tiny gloo job for the restart tests: numbered all_reduce steps, checkpointed and resumed.

Each step all-reduces a one, prints `step S attempt A world W` on every rank, and then rank 0
writes the next step's number into DISTRUN_CHECKPOINT_DIR/step atomically (a temporary file,
then a rename), the contract jobs/README.md asks of a training script. At start every rank
reads it, before the first all_reduce (so before rank 0 can write again), and prints
`resumed from step K`. Faults for the tests: `--fail-rank R --fail-at S` raises on rank R at
step S in every attempt (in attempt 1 only with `--fail-once`); `--hang-rank R --hang-at S`
sleeps there in attempt 1 only.
"""

from __future__ import annotations

import argparse
import os
import time

import torch
import torch.distributed as dist


def checkpoint_path() -> str:
    return os.path.join(os.environ["DISTRUN_CHECKPOINT_DIR"], "step")


def resume_step() -> int:
    try:
        with open(checkpoint_path()) as fh:
            return int(fh.read())
    except FileNotFoundError:
        return 0


def save_step(step: int) -> None:
    tmp = f"{checkpoint_path()}.{os.getpid()}.tmp"
    with open(tmp, "w") as fh:
        fh.write(str(step))
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, checkpoint_path())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--step-time", type=float, default=0.2)
    parser.add_argument("--fail-rank", type=int, default=-1)
    parser.add_argument("--fail-at", type=int, default=-1)
    parser.add_argument("--fail-once", action="store_true")
    parser.add_argument("--hang-rank", type=int, default=-1)
    parser.add_argument("--hang-at", type=int, default=-1)
    args = parser.parse_args()
    attempt = os.environ["DISTRUN_ATTEMPT"]
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    start = resume_step()
    if start:
        print(f"resumed from step {start}", flush=True)
    for step in range(start, args.steps):
        if rank == args.fail_rank and step == args.fail_at and (attempt == "1" or not args.fail_once):
            raise RuntimeError(f"rank {rank} fails at step {step}")
        if rank == args.hang_rank and step == args.hang_at and attempt == "1":
            time.sleep(3600)
        ones = torch.ones(1)
        dist.all_reduce(ones)
        print(f"step {step} attempt {attempt} world {int(ones.item())}", flush=True)
        if rank == 0:
            save_step(step + 1)
        time.sleep(args.step_time)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
