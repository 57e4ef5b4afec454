"""A CPU training loop for bench/shim_bench.py: 2 gloo ranks, a small MLP, forward, backward and
one all_reduce per parameter each step (the Flight Recorder records every one); rank 0 prints
`STEP_S <median wall seconds per step> <median CPU seconds of the process per step>` over the
steps after the warm-up.

    torchrun --nproc-per-node 2 bench/shim_job.py [--steps 300]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.distributed as dist


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--warmup", type=int, default=30)
    args = parser.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 256))
    batch = torch.randn(64, 256)
    times, cpu = [], []
    for step in range(args.warmup + args.steps):
        began, began_cpu = time.perf_counter(), time.process_time()
        model.zero_grad()
        model(batch).square().mean().backward()
        for param in model.parameters():
            dist.all_reduce(param.grad)  # type: ignore[arg-type]
        if step >= args.warmup:
            times.append(time.perf_counter() - began)
            cpu.append(time.process_time() - began_cpu)
    if dist.get_rank() == 0:
        print(f"STEP_S {statistics.median(times):.6f} {statistics.median(cpu):.6f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
