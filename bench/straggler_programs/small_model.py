"""A small model whose ranks spend most of a step in the all-reduce, written as the multi-node examples
of PyTorch's tutorials are (a Trainer class, a DataLoader with a DistributedSampler, epochs), but our
own: a 20-input linear model on random data, batch 32, DDP on gloo (CPU). Rank 0 prints one line an
epoch; nothing for distrun. Runs for `--seconds` on rank 0's clock."""

from __future__ import annotations

import argparse
import os
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


class Trainer:
    def __init__(self, loader: DataLoader) -> None:
        self.loader = loader
        self.model = DistributedDataParallel(torch.nn.Linear(20, 1))
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=1e-3)

    def epoch(self, number: int) -> float:
        self.loader.sampler.set_epoch(number)
        loss = torch.zeros(())
        for source, target in self.loader:
            self.optimizer.zero_grad()
            loss = torch.nn.functional.mse_loss(self.model(source), target)
            loss.backward()
            self.optimizer.step()
        return float(loss)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=60.0)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    data = TensorDataset(torch.rand(2048, 20), torch.rand(2048, 1))
    trainer = Trainer(DataLoader(data, batch_size=32, sampler=DistributedSampler(data)))
    end, going, number = time.monotonic() + args.seconds, torch.ones(1), 0
    while going.item():
        loss = trainer.epoch(number)
        if int(os.environ["RANK"]) == 0:
            print(f"epoch {number} loss {loss:.4f}", flush=True)
            going = torch.ones(1) if time.monotonic() < end else torch.zeros(1)
        dist.broadcast(going, 0)
        number += 1
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
