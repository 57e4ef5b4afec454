"""All-reduce timing across every rank, run through torchrun by `distrun doctor --bandwidth`.

Each message size is reduced `--iters` times after `--warmup` untimed rounds; a size's time
is the slowest rank's mean. Rank 0 prints one `DISTRUN_METRICS {...}` line with
{"final": true, "allreduce": {"backend", "world_size", "results": [{"bytes", "time_s"}]}};
bandwidths are computed by the controller, as nccl-tests defines them.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch
import torch.distributed as dist
from quick_exit import quick_exit


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--backend", choices=["gloo", "nccl"], required=True)
    parser.add_argument("--sizes", required=True, help="Comma-separated message sizes in bytes.")
    parser.add_argument("--iters", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=2)
    return parser.parse_args()


def device_for(backend: str) -> torch.device:
    if backend == "nccl":
        local = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local)
        return torch.device("cuda", local)
    return torch.device("cpu")


def time_size(size: int, iters: int, warmup: int, device: torch.device) -> float:
    """Seconds per all-reduce of `size` bytes of float32, the slowest rank's mean."""
    tensor = torch.ones(max(1, size // 4), dtype=torch.float32, device=device)
    for _ in range(warmup):
        dist.all_reduce(tensor)
    dist.barrier()
    synchronize(device)
    began = time.perf_counter()
    for _ in range(iters):
        dist.all_reduce(tensor)
    synchronize(device)
    elapsed = torch.tensor([(time.perf_counter() - began) / iters], dtype=torch.float64, device=device)
    dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
    return float(elapsed.item())


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def main() -> None:
    args = parse_args()
    dist.init_process_group(args.backend)
    device = device_for(args.backend)
    sizes = [int(s) for s in args.sizes.split(",")]
    results = [{"bytes": size, "time_s": time_size(size, args.iters, args.warmup, device)} for size in sizes]
    if dist.get_rank() == 0:
        report = {"backend": args.backend, "world_size": dist.get_world_size(), "results": results}
        print("DISTRUN_METRICS " + json.dumps({"final": True, "allreduce": report}), flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
    # Not a plain return: interpreter teardown can abort a rank whose work is done (see quick_exit).
    quick_exit(0)
