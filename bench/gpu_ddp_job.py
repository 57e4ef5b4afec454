"""A DDP program written as third-party examples are, for a lent GPU: NCCL, a model on CUDA, one
`epoch N loss X` line from rank 0 an epoch and nothing else for distrun (bench/gpu_insight.sh)."""

from __future__ import annotations

import argparse
import os
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--steps", type=int, default=50, help="steps an epoch")
    args = parser.parse_args()
    dist.init_process_group("nccl")
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    torch.cuda.set_device(device)
    layers = [torch.nn.Linear(4096, 4096) if i % 2 == 0 else torch.nn.ReLU() for i in range(8)]
    model = DistributedDataParallel(torch.nn.Sequential(*layers).to(device))
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    inputs = torch.randn(512, 4096, device=device)
    end, epoch = time.monotonic() + args.seconds, 0
    while time.monotonic() < end:
        for _ in range(args.steps):
            optimizer.zero_grad()
            loss = model(inputs).square().mean()
            loss.backward()
            optimizer.step()
        torch.cuda.synchronize()
        if dist.get_rank() == 0:
            print(f"epoch {epoch} loss {loss.item():.5f}", flush=True)
        epoch += 1
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
