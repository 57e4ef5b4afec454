"""A tiny gloo DDP job for the Slurm tests.

A few SGD steps of a linear model under DistributedDataParallel, then every rank prints
`CHECKSUM {"rank", "world", "host", "allreduce", "weights"}`: ranks that trained together
print the same weights. --fail-rank R makes rank R raise after its first step; --sleep S keeps
the job stepping for S seconds (for stop tests).
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--sleep", type=float, default=0.0)
    parser.add_argument("--fail-rank", type=int, default=-1)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = DistributedDataParallel(torch.nn.Linear(8, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    deadline = time.monotonic() + args.sleep
    step = 0
    while step < args.steps or time.monotonic() < deadline:
        loss = model(torch.full((4, 8), float(rank + 1))).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        print(f"step {step} loss {loss.item():.4f}", flush=True)
        if rank == args.fail_rank:
            raise RuntimeError(f"rank {rank} fails on purpose")
        step += 1
        if step >= args.steps:
            time.sleep(0.5)
    total = torch.tensor([float(rank + 1)])
    dist.all_reduce(total)
    weights = sum(p.detach().sum().item() for p in model.parameters())
    print("CHECKSUM " + json.dumps({"rank": rank, "world": world, "host": os.uname().nodename,
                                    "allreduce": total.item(), "weights": round(weights, 6)}), flush=True)
    dist.barrier()
    # Free DDP's reducer before the process group: destroying the group under a live reducer
    # can deadlock gloo at interpreter exit.
    del model, optimizer
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
