"""A torchrun worker for the log tests: numbered print() lines, ticks, a failing rank, a partial line.

No process group: the lines are what is tested, and torchrun's own rendezvous still runs.
"""

from __future__ import annotations

import argparse
import os
import sys
import time


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--lines", type=int, default=0)
    parser.add_argument("--ticks", type=int, default=0)
    parser.add_argument("--tick-every", type=float, default=0.2)
    parser.add_argument("--fail-rank", type=int, default=-1)
    parser.add_argument("--fail-at", type=int, default=2, help="the tick at which --fail-rank raises")
    parser.add_argument("--secret-from", default="")
    args = parser.parse_args()
    rank = int(os.environ["RANK"])
    if args.secret_from:
        print("token", os.environ[args.secret_from], "title \x1b]0;owned\x07 clear \x1b[2J end")
    # print() under torchrun's `python -u` writes the text and the newline separately.
    for i in range(args.lines):
        print(f"rank {rank} line {i}")
    for i in range(args.ticks):
        print(f"tick {rank} {i}")
        if rank == args.fail_rank and i == args.fail_at:
            print("the last words")
            raise RuntimeError("deliberate failure")
        time.sleep(args.tick_every)
    sys.stdout.write(f"partial {rank} without newline")


if __name__ == "__main__":
    main()
