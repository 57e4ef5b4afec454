"""The fault matrix's training script: numbered ticks, a chosen failure, a slow stop; stdlib only.

SIGUSR1 makes a rank write a truncated torch elastic error file and exit 1; SIGUSR2 makes it raise
(no `@record`). Every line a rank prints is `tick <rank> <n>` (n = 0, 1, 2, ...), so a test can tell a line
that was lost from one that was never printed: each rank's lines in the job's files must be
0..k with no gap. The ranks do not talk to each other (the faults are about processes and
hosts, and torchrun's own rendezvous still gathers every host before a rank starts), which
keeps a cell's start cheap on a small machine.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--every", type=float, default=0.25, help="seconds between ticks")
    parser.add_argument("--ticks", type=int, default=-1, help="end well after this many ticks (-1: never)")
    parser.add_argument("--until", help="end well once this file exists")
    parser.add_argument("--fail-rank", type=int, default=-1, help="this rank exits 1 ...")
    parser.add_argument("--fail-at", type=int, default=0, help="... at this tick")
    parser.add_argument("--linger", type=float, default=0.0,
                        help="on SIGTERM, go on for this long first (not on the failing rank's host)")
    parser.add_argument("--chatty", type=int, default=0, help="extra lines printed with each tick")
    parser.add_argument("--spin", type=float, default=0.0, help="keep a core busy this long after each tick")
    parser.add_argument("--children", action="store_true",
                        help="start 3 children with an environment of their own (no distrun markers)")
    args = parser.parse_args()
    rank = int(os.environ["RANK"])
    signal.signal(signal.SIGUSR1, lambda *_: bad_error_file())
    signal.signal(signal.SIGUSR2, lambda *_: raise_on_purpose(rank))
    if args.children:
        start_children()
    # The failing rank's own torchrun stops its other ranks before it reports the failure, and
    # would wait 30 s for one that lingers: only the hosts distrun stops take their time.
    per_host = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    if args.linger and rank // per_host != args.fail_rank // per_host:
        signal.signal(signal.SIGTERM, lambda *_: linger(rank, args.linger))
    n = 0
    while args.ticks < 0 or n < args.ticks:
        if args.until and os.path.exists(args.until):
            break
        if rank == args.fail_rank and n == args.fail_at:
            sys.stdout.write(f"rank {rank} fails on purpose\n")
            sys.exit(1)
        sys.stdout.write(f"tick {rank} {n}\n")
        for i in range(args.chatty):
            sys.stdout.write(f"chat {rank} {n} {i} {'x' * 60}\n")
        n += 1
        spin(args.spin)
        time.sleep(args.every)
    sys.stdout.write(f"done {rank}\n")


def start_children() -> None:
    """Three children that would run for 611 s, none with distrun's markers, as programs start
    helpers: a plain one, one in a session of its own, one detached (its parent exits at once, so it
    is reparented to the supervisor). The job's id is in their argv, where the matrix finds them."""
    import subprocess

    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}
    child = [sys.executable, "-c", "import time; time.sleep(611)", "child-of", os.environ["DISTRUN_JOB_ID"]]
    quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL, "stdin": subprocess.DEVNULL}
    subprocess.Popen(child, env=env, **quiet)
    subprocess.Popen(child, env=env, start_new_session=True, **quiet)
    subprocess.run(["setsid", "-f", *child], env=env, check=True, **quiet)


def spin(seconds: float) -> None:
    """Compute for `seconds`, as a training step keeps its core busy."""
    deadline = time.perf_counter() + seconds
    total = 0
    while time.perf_counter() < deadline:
        total += sum(range(1000))


def bad_error_file() -> None:
    """SIGUSR1: write torch elastic's error file truncated, as a crashing handler might, and exit 1."""
    with open(os.environ["TORCHELASTIC_ERROR_FILE"], "w") as fh:
        fh.write('{"message": {"message": "RuntimeError: cut sh')
    sys.exit(1)


def raise_on_purpose(rank: int) -> None:
    """SIGUSR2: raise, as a program without `@record` does: the traceback goes to stderr only."""
    raise RuntimeError(f"rank {rank} raised on purpose")


def linger(rank: int, seconds: float) -> None:
    """A rank that takes its time to stop: it says so, waits, then exits as SIGTERM would."""
    sys.stdout.write(f"rank {rank} got SIGTERM; stopping in {seconds:g} s\n")
    time.sleep(seconds)
    sys.exit(128 + signal.SIGTERM)


if __name__ == "__main__":
    main()
