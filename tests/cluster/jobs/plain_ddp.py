"""A DDP training script written the way third-party examples are, with nothing for distrun and no
torch elastic `@record`: a small regression model on synthetic data, a DistributedSampler, gloo,
one line per epoch from rank 0. `--raise-rank R --raise-epoch E` plants a bug: rank R raises a
ValueError in its 4th step of epoch E, as a user's own error shows up in training."""

from __future__ import annotations

import argparse
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def synthetic(samples: int, features: int) -> TensorDataset:
    """y = x·w + noise, the same on every rank."""
    gen = torch.Generator().manual_seed(7)
    x = torch.randn(samples, features, generator=gen)
    w = torch.randn(features, 1, generator=gen)
    return TensorDataset(x, x @ w + 0.1 * torch.randn(samples, 1, generator=gen))


def train(args: argparse.Namespace) -> None:
    rank = dist.get_rank()
    data = synthetic(args.samples, 16)
    sampler = DistributedSampler(data)
    loader = DataLoader(data, batch_size=args.batch_size, sampler=sampler)
    model = DistributedDataParallel(nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 1)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        total = 0.0
        for step, (x, y) in enumerate(loader):
            if rank == args.raise_rank and epoch == args.raise_epoch and step == 3:
                raise ValueError(f"planted on rank {rank} at epoch {epoch}")
            optimizer.zero_grad()
            loss = nn.functional.mse_loss(model(x), y)
            loss.backward()
            optimizer.step()
            total += loss.item()
        if rank == 0:
            print(f"epoch {epoch} | loss {total / len(loader):.4f}", flush=True)
        time.sleep(args.pause)


def main() -> None:
    parser = argparse.ArgumentParser(description="plain DDP regression")
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--samples", type=int, default=1536)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--pause", type=float, default=0.1, help="seconds between epochs")
    parser.add_argument("--raise-rank", type=int, default=-1)
    parser.add_argument("--raise-epoch", type=int, default=-1)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    try:
        train(args)
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
