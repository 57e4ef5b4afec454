"""A small torchrun worker for the launch tests: env dump, all-reduce, log floods, failures, sleeps."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch
import torch.distributed as dist

TORCHRUN_VARS = (
    "RANK",
    "LOCAL_RANK",
    "GROUP_RANK",
    "ROLE_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "GROUP_WORLD_SIZE",
    "ROLE_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "TORCHELASTIC_RESTART_COUNT",
    "TORCHELASTIC_MAX_RESTARTS",
    "TORCHELASTIC_RUN_ID",
    "DISTRUN_JOB_ID",
    "GLOO_SOCKET_IFNAME",
)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sleep", type=float, default=0.0)
    parser.add_argument("--lines", type=int, default=0)
    parser.add_argument("--fail-rank", type=int, default=-1)
    parser.add_argument("--fail-before-init", action="store_true")
    args = parser.parse_args()
    if args.fail_before_init and os.environ.get("TORCHELASTIC_RESTART_COUNT") == "0":
        # No rank of the failing attempt may reach the process group: torch 2.13's gloo then
        # fails to re-form it after the restart (it dials a dead worker's stale address).
        if int(os.environ["RANK"]) == args.fail_rank:
            raise RuntimeError("deliberate failure before init")
        time.sleep(60)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    env = {k: os.environ.get(k) for k in TORCHRUN_VARS}
    env["hostname"] = os.uname().nodename
    print("ENV " + json.dumps(env), flush=True)
    value = torch.tensor([float(rank + 1)])
    dist.all_reduce(value)
    print(f"ALLREDUCE {value.item():g}", flush=True)
    if rank == args.fail_rank and not args.fail_before_init:
        raise RuntimeError(f"deliberate failure on rank {rank}")
    # One write per line: under torchrun's `python -u`, print() writes text and newline
    # separately, and torchrun's --tee can then splice two ranks' half lines together.
    for i in range(args.lines):
        sys.stdout.write(f"line {rank} {i}\n")
    deadline = time.monotonic() + args.sleep
    while time.monotonic() < deadline:
        print(f"tick {rank}", flush=True)
        time.sleep(0.5)
    dist.barrier()
    dist.destroy_process_group()
    print(f"DONE {rank}/{world}", flush=True)


if __name__ == "__main__":
    main()
