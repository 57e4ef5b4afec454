"""A job whose last rank dies at exit after the work is done: rank 0 prints the final metrics line,
every rank prints its last step, the other ranks exit 0, and the last rank aborts (SIGABRT) a
little later, as a rank caught by a teardown race in torch does."""

from __future__ import annotations

import json
import os
import time

rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
if rank == 0:
    print("DISTRUN_METRICS " + json.dumps({"step": 2, "final": True, "samples_per_s": 1.0}), flush=True)
print(f"rank {rank}: step 2/2 done", flush=True)
if rank == world - 1:
    time.sleep(3)  # the others have exited and wait in torchrun's exit barrier
    os.abort()
