"""A training script that prints nothing for distrun: DDP on gloo (CPU), one `epoch N loss X` line
per epoch from rank 0, as third-party examples do. It does nothing for its Flight Recorder either:
distrun's worker entry serves it."""

from __future__ import annotations

import argparse
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel


def train(seconds: float, steps: int) -> None:
    """Epochs of `steps` steps until `seconds` passed on rank 0's clock (every rank takes as many)."""
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = DistributedDataParallel(torch.nn.Sequential(torch.nn.Linear(128, 256), torch.nn.ReLU(),
                                                        torch.nn.Linear(256, 1)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    data, target = torch.randn(64, 128), torch.randn(64, 1)
    end = time.monotonic() + seconds
    going = torch.ones(1)
    epoch = 0
    while going.item():
        for _ in range(steps):
            time.sleep(0.02)  # the data loader
            optimizer.zero_grad()
            loss = torch.nn.functional.mse_loss(model(data), target)
            loss.backward()
            optimizer.step()
        if dist.get_rank() == 0:
            print(f"epoch {epoch} loss {loss.item():.4f}", flush=True)
            going = torch.ones(1) if time.monotonic() < end else torch.zeros(1)
        dist.broadcast(going, 0)
        epoch += 1
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--steps", type=int, default=20, help="steps an epoch")
    args = parser.parse_args()
    train(args.seconds, args.steps)


if __name__ == "__main__":
    main()
