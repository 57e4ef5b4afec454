"""A training script written the way third-party examples are: DDP over gloo on CPU, its own loop, and
one print per epoch from rank 0 ("epoch N loss X"), nothing for distrun. One rank can get stuck at
an epoch in a loop outside any collective (`while True: pass`), as a bug in a data path would."""

from __future__ import annotations

import argparse

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel


def spin() -> None:
    """Stuck outside any collective, printing nothing, forever (the test stops the job)."""
    while True:
        pass


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=100000)
    parser.add_argument("--steps", type=int, default=5, help="steps per epoch")
    parser.add_argument("--stuck-rank", type=int, default=-1)
    parser.add_argument("--stuck-epoch", type=int, default=3)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DistributedDataParallel(torch.nn.Linear(8, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for epoch in range(args.epochs):
        if rank == args.stuck_rank and epoch == args.stuck_epoch:
            spin()
        for _ in range(args.steps):
            x = torch.randn(16, 8)
            loss = (model(x) - x.sum(dim=1, keepdim=True)).pow(2).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        if rank == 0:
            print(f"epoch {epoch} loss {loss.item():.4f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
