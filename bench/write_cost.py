"""What one write(2) of an 80-byte line costs the writer, by where a rank's stdout goes.

Figures for bench/results/logs.md: /dev/null (a peer that throws lines away), a regular file
(torchrun's per-rank files, which the supervisor tails), and a pipe with a reader (a rank
writing straight to its supervisor). Writer's CPU per call, median of 3 rounds of 200,000.
Run: `python bench/write_cost.py` (prints a markdown table).
"""

from __future__ import annotations

import os
import statistics
import tempfile
import threading
import time
from collections.abc import Callable

CALLS = 200_000
LINE = b"rank 0 line 0000000 " + b"x" * 59 + b"\n"


def cost(fd: int) -> float:
    """Microseconds of the writer's CPU per write(2) of LINE to `fd`."""
    began = time.process_time()
    for _ in range(CALLS):
        os.write(fd, LINE)
    return (time.process_time() - began) / CALLS * 1e6


def to_devnull(_: str) -> float:
    fd = os.open(os.devnull, os.O_WRONLY)
    try:
        return cost(fd)
    finally:
        os.close(fd)


def to_file(directory: str) -> float:
    fd = os.open(os.path.join(directory, "stdout.log"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        return cost(fd)
    finally:
        os.close(fd)


def drain(fd: int) -> None:
    while os.read(fd, 1 << 16):
        pass


def to_pipe(_: str) -> float:
    read_end, write_end = os.pipe()
    reader = threading.Thread(target=drain, args=(read_end,))
    reader.start()
    try:
        return cost(write_end)
    finally:
        os.close(write_end)
        reader.join()
        os.close(read_end)


def main() -> None:
    targets: dict[str, Callable[[str], float]] = {
        "/dev/null": to_devnull, "a regular file (O_APPEND, in $HOME)": to_file, "a pipe with a reader": to_pipe}
    runs: dict[str, list[float]] = {name: [] for name in targets}
    for _ in range(3):
        for name, target in targets.items():
            with tempfile.TemporaryDirectory(dir=os.path.expanduser("~")) as directory:
                runs[name].append(target(directory))
    print("| stdout to | writer's CPU per write(2), us |\n|---|---:|")
    for name, values in runs.items():
        print(f"| {name} | {statistics.median(values):.2f} |")


if __name__ == "__main__":
    main()
