"""A job without metrics lines whose one rank aborts after its last line: every rank prints its
last line; the others exit 0 at once, and rank `--abort-rank` calls os.abort() `--delay` seconds
later (the others have exited by then: a crash at interpreter exit, as torch's teardown race
gives). With `--others-wait S` the others sleep S seconds before exiting, so they are still
running when it aborts (a crash while the job still runs)."""

from __future__ import annotations

import argparse
import os
import time

parser = argparse.ArgumentParser()
parser.add_argument("--abort-rank", type=int, default=1)
parser.add_argument("--delay", type=float, default=3.0)
parser.add_argument("--others-wait", type=float, default=0.0)
args = parser.parse_args()
rank = int(os.environ["RANK"])
print(f"rank {rank}: all done", flush=True)
if rank == args.abort_rank:
    time.sleep(args.delay)
    os.abort()
time.sleep(args.others_wait)
