"""A training script whose steps compute for tens of milliseconds (a wider MLP on a bigger batch), DDP on
gloo (CPU), as third-party examples are written: it prints `epoch N loss X` from rank 0 and nothing for
distrun. Runs for `--seconds` on rank 0's clock."""

from __future__ import annotations

import argparse
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=60.0)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = DistributedDataParallel(torch.nn.Sequential(torch.nn.Linear(512, 1024), torch.nn.ReLU(),
                                                        torch.nn.Linear(1024, 512), torch.nn.ReLU(),
                                                        torch.nn.Linear(512, 1)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.001)
    data, target = torch.randn(256, 512), torch.randn(256, 1)
    end, going, epoch = time.monotonic() + args.seconds, torch.ones(1), 0
    while going.item():
        for _ in range(10):
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


if __name__ == "__main__":
    main()
