"""Helpers for the benchmark scripts: alternate runs, medians, a results table."""

from __future__ import annotations

import os
import platform
import statistics
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "bench" / "results"


def timed(argv: Sequence[str], env: dict[str, str] | None = None, cwd: Path = REPO,
          stdout: int | None = subprocess.DEVNULL) -> float:
    """Seconds from start to exit of a command; raises if it fails."""
    began = time.perf_counter()
    subprocess.run(list(argv), env={**os.environ, **(env or {})}, cwd=cwd, stdout=stdout,
                   stderr=subprocess.DEVNULL, check=True)
    return time.perf_counter() - began


def alternate(runs: dict[str, Callable[[], float]], rounds: int) -> dict[str, list[float]]:
    """Run each contender once per round, in turn, so drift hits all of them alike."""
    times: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(rounds):
        for name, run in runs.items():
            times[name].append(run())
    return times


def median(values: list[float]) -> float:
    return statistics.median(values)


def machine() -> str:
    return f"{platform.platform()}, {os.cpu_count()} cores, Python {platform.python_version()}"


def write_results(name: str, title: str, command: str, body: list[str]) -> Path:
    path = RESULTS / name
    RESULTS.mkdir(parents=True, exist_ok=True)
    text = [f"# {title}", "", f"Command: `{command}`", "", f"Machine: {machine()}",
            f"Date: {time.strftime('%Y-%m-%d %H:%M')}", "", *body, ""]
    path.write_text("\n".join(text), encoding="utf-8")
    return path
