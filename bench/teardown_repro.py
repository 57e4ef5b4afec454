"""The smallest program that shows torch's own abort at exit (issue 20), made likely.

Run it under torchrun with two processes; rank 1 often dies with `terminate called without an
active exception` and SIGABRT after leaving main:

    .venv/bin/python -m torch.distributed.run --nproc-per-node 2 bench/teardown_repro.py

Rank 1 joins the all-reduce a second late, so the collective completes on gloo's runloop thread
just as rank 1 leaves main; the object below keeps the interpreter's finalization busy while
that thread still holds the last reference to a tensor Python also refers to. Releasing it
needs the GIL, which finalization no longer hands out: CPython ends the thread in take_gil with
pthread_exit, the forced unwind meets torch's noexcept decref_pyobject, std::terminate.
bench/results/teardown.md has the backtrace; jobs/quick_exit.py is how the bundled jobs avoid it.
"""

import time

import torch
import torch.distributed as dist


class SlowExit:
    def __del__(self) -> None:
        time.sleep(3)


slow_exit = SlowExit()  # first global cleared at exit: finalization waits here, `tensor` still alive
dist.init_process_group("gloo")
if dist.get_rank() == 1:
    time.sleep(1)  # join late, so the all_reduce completes as the rank leaves main
tensor = torch.ones(1)
dist.all_reduce(tensor, async_op=True)
print(f"rank {dist.get_rank()} leaves main", flush=True)
