"""The trivial job the launch benchmarks time: init, one all-reduce, optional log lines, exit."""

import os
import sys

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
value = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(value)
lines = int(sys.argv[1]) if len(sys.argv) > 1 else 0
out = open(os.devnull, "w") if os.environ.get("BENCH_DEVNULL") else sys.stdout  # noqa: SIM115
for i in range(lines):
    out.write(f"rank {dist.get_rank()} line {i} " + "x" * 60 + "\n")
out.flush()
dist.barrier()
dist.destroy_process_group()
