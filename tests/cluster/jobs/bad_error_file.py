"""Ranks that write torch elastic's error file (TORCHELASTIC_ERROR_FILE) badly and exit 1, as a
program with its own error handling might: rank 1 a truncated JSON file, rank 4 one of another
shape a second later; the others wait. torchrun used to crash on either (issue 46.5)."""

from __future__ import annotations

import os
import sys
import time

BAD = {1: (0.0, '{"message": {"message": "RuntimeError: cut sh'), 4: (1.0, '{"message": {"extraInfo": 7}}')}

rank = int(os.environ["RANK"])
print(f"rank {rank} up", flush=True)
time.sleep(2.0)
if rank in BAD:
    delay, text = BAD[rank]
    time.sleep(delay)
    with open(os.environ["TORCHELASTIC_ERROR_FILE"], "w") as fh:
        fh.write(text)
    print(f"rank {rank} wrote a bad error file and exits 1", flush=True)
    sys.exit(1)
time.sleep(60)
