"""A third-party-style DDP program for the end-of-job bench (bench/teardown_thirdparty.py --end).

Written as pytorch/examples' `ddp-tutorial-series/multinode.py` is (CPU, gloo): a Trainer over a
DistributedSampler, one `[RANKn] Epoch K | Batchsize: B | Steps: S` line per epoch and rank, then
`destroy_process_group()` and a plain return from main: the interpreter's own exit, no
`os._exit`, nothing of distrun's. The last epoch line is the bench's "last line".
"""

from __future__ import annotations

import argparse
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=32)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank = int(os.environ["RANK"])
    torch.manual_seed(0)
    data = TensorDataset(torch.rand(2048, 20), torch.rand(2048, 1))
    sampler = DistributedSampler(data)
    loader = DataLoader(data, batch_size=args.batch_size, sampler=sampler)
    model = DDP(torch.nn.Linear(20, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        print(f"[RANK{rank}] Epoch {epoch} | Batchsize: {args.batch_size} | Steps: {len(loader)}", flush=True)
        for source, targets in loader:
            optimizer.zero_grad()
            F.mse_loss(model(source), targets).backward()
            optimizer.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
