"""A DDP training script written as third-party examples are: it prints nothing for distrun (one
`epoch N loss X` line from rank 0 each epoch), serves nothing, and runs a small model on gloo (CPU),
so that its ranks spend much of a step in the all-reduce. Used by the trace's and the report's tests."""

from __future__ import annotations

import argparse
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel


def train(seconds: float, steps: int) -> None:
    """Epochs of `steps` steps until `seconds` passed on rank 0's clock (every rank takes as many)."""
    dist.init_process_group("gloo")
    torch.manual_seed(1)
    model = DistributedDataParallel(torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.Tanh(),
                                                        torch.nn.Linear(128, 8)))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    inputs, labels = torch.randn(32, 64), torch.randint(0, 8, (32,))
    end = time.monotonic() + seconds
    more, epoch = torch.ones(1), 0
    while more.item():
        for _ in range(steps):
            time.sleep(0.03)  # reading the next batch
            optimizer.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(inputs), labels)
            loss.backward()
            optimizer.step()
        if dist.get_rank() == 0:
            print(f"epoch {epoch} loss {loss.item():.4f}", flush=True)
            more = torch.ones(1) if time.monotonic() < end else torch.zeros(1)
        dist.broadcast(more, 0)
        epoch += 1
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--steps", type=int, default=10, help="steps an epoch")
    args = parser.parse_args()
    train(args.seconds, args.steps)


if __name__ == "__main__":
    main()
