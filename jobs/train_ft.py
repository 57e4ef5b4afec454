"""A replica group's training loop under torchft: the smallest script for `fault_tolerance:`
(jobs/README.md's contract; tests and jobs/ft.yaml run it).

A linear model under torchft's Optimizer wrapper with ProcessGroupGloo, its gradients averaged
across the groups by `Manager.allreduce`. Not torchft's DistributedDataParallel: in torchft 0.2.0
its comm hook asserts on the future of an allreduce that failed (a peer group died in it), which
crashed the surviving group too; `Manager.allreduce` reports the error and the step is not
committed, as torchft intends. Each committed step printed as
`ft step S group G participants P t SECONDS` (S: the step just committed, torchft's own count, which
a group that healed from a peer continues from). `--steps N`: stop once step N is committed;
`--step-time T`: seconds each step sleeps (so that a fault lands mid-run);
`--fail-group G --fail-at S`: group G's ranks exit 3 once step S is committed; `--until FILE`:
stop once FILE exists (the fault matrix ends a job as soon as what it watches has happened).
"""

from __future__ import annotations

import argparse
import logging
import os
import time
from datetime import timedelta

import torch
from quick_exit import quick_exit
from torchft import Manager, Optimizer, ProcessGroupGloo


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--step-time", type=float, default=0.2)
    parser.add_argument("--fail-group", type=int, default=-1, help="this group's ranks exit 3 at --fail-at")
    parser.add_argument("--fail-at", type=int, default=0)
    parser.add_argument("--until", help="stop once this file exists")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(name)s: %(message)s")
    group = int(os.environ["REPLICA_GROUP_ID"])
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)

    def load_state_dict(state: dict) -> None:
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optim"])

    def state_dict() -> dict:
        return {"model": model.state_dict(), "optim": optimizer.state_dict()}

    manager = Manager(pg=ProcessGroupGloo(timeout=timedelta(seconds=10)), min_replica_size=1,
                      load_state_dict=load_state_dict, state_dict=state_dict, replica_id=f"group{group}",
                      timeout=timedelta(seconds=10), quorum_timeout=timedelta(seconds=30))
    opt = Optimizer(manager, optimizer)
    while manager.current_step() < args.steps and not (args.until and os.path.exists(args.until)):
        batch = torch.randn(16, 8)
        opt.zero_grad()  # starts this step's quorum
        model(batch).pow(2).mean().backward()
        for work in [manager.allreduce(param.grad) for param in model.parameters()]:
            work.wait()
        before = manager.current_step()
        opt.step()
        if manager.current_step() > before:
            print(f"ft step {manager.current_step()} group {group} participants {manager.num_participants()} "
                  f"t {time.time():.3f}",
                  flush=True)
        if group == args.fail_group and manager.current_step() >= args.fail_at:
            print(f"ft group {group} fails at step {manager.current_step()}", flush=True)
            quick_exit(3)
        time.sleep(args.step_time)
    manager.shutdown(wait=False)
    quick_exit(0)


if __name__ == "__main__":
    main()
