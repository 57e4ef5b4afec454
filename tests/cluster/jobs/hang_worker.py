"""A torchrun worker for the hang tests: steps of one all_reduce each; one rank can stop outside
the collective (in load_batch) while the others wait in it, or only rank 0 can report, through
DISTRUN_METRICS lines alone. It does nothing for the Flight Recorder: distrun's worker entry serves it."""

from __future__ import annotations

import argparse
import json
import time

import torch
import torch.distributed as dist

STUCK = 3600.0  # far past every test's bound: the watchdog, not this, ends a stuck rank


def load_batch(stuck: bool) -> torch.Tensor:
    """The data of one step; a stuck rank never gets it (it sleeps outside the collective)."""
    if stuck:
        print(f"HANG START {time.time():.3f}", flush=True)
        time.sleep(STUCK)
    return torch.ones(1)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--step-time", type=float, default=0.1)
    parser.add_argument("--hang-rank", type=int, default=-1)
    parser.add_argument("--hang-step", type=int, default=30)
    parser.add_argument("--metrics-only", action="store_true", help="print nothing but rank 0's DISTRUN_METRICS")
    args = parser.parse_args()
    steps(args)


def steps(args: argparse.Namespace) -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    for step in range(args.steps):
        batch = load_batch(rank == args.hang_rank and step == args.hang_step)
        dist.all_reduce(batch)
        if not args.metrics_only:
            print(f"step {step}", flush=True)
        elif rank == 0:
            print("DISTRUN_METRICS " + json.dumps({"step": step, "loss": 1.0 / (step + 1)}), flush=True)
        time.sleep(args.step_time)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
