"""Helpers for the benchmark scripts: alternate runs, medians, a results table."""

from __future__ import annotations

import os
import platform
import resource
import statistics
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "bench" / "results"
TICK = os.sysconf("SC_CLK_TCK")


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


def checkout(rev: str, into: Path) -> Path:
    """The repository's files at `rev` (e.g. the commit before a change), unpacked under `into`."""
    target = into / rev
    target.mkdir(parents=True)
    archive = subprocess.run(["git", "-C", str(REPO), "archive", rev], capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(target)], input=archive, check=True)
    return target


def before_all_flag(argv: list[str], checkout: Path) -> list[str]:
    """A distrun command line for the `checkout`: without `--all` where it is older than that
    flag (every host was then the default)."""
    select = checkout / "orchestrator" / "spec" / "select.py"
    if select.exists() and "class SelectionGuard" in select.read_text():  # it came with --all
        return argv
    return [arg for arg in argv if arg != "--all"]


def children_cpu() -> tuple[float, float]:
    """(user, sys) CPU seconds of every child reaped so far."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime, usage.ru_stime


def sshd_listeners(state_dir: Path) -> list[int]:
    """The pids of a test cluster's sshd listeners, whose CPU counts every session they ran."""
    found = subprocess.run(["pgrep", "-f", f"sshd -D -f {state_dir}/"], capture_output=True, text=True)
    return [int(pid) for pid in found.stdout.split()]


def sshd_cpu(listeners: list[int]) -> float:
    """CPU seconds used so far by the sshd listeners and every session they reaped."""
    total = 0
    for pid in listeners:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
        total += sum(int(value) for value in fields[11:15])  # utime stime cutime cstime
    return total / TICK


def median(values: list[float]) -> float:
    return statistics.median(values)


def machine() -> str:
    return f"{platform.platform()}, {os.cpu_count()} cores, Python {platform.python_version()}"


def write_results(name: str, title: str, command: str, body: list[str], keep: Sequence[str] = ()) -> Path:
    """Write a results file; the sections headed `## K` for K in `keep`, which other series
    of the same script write (see write_section), are carried over from the file as it was."""
    path = RESULTS / name
    RESULTS.mkdir(parents=True, exist_ok=True)
    old = path.read_text(encoding="utf-8").splitlines() if path.exists() else []
    kept = [line for heading in keep for line in _section(old, f"## {heading}")]
    text = [f"# {title}", "", f"Command: `{command}`", "", f"Machine: {machine()}",
            f"Date: {time.strftime('%Y-%m-%d %H:%M')}", "", *body, "", *kept]
    path.write_text("\n".join(text).rstrip("\n") + "\n", encoding="utf-8")
    return path


def _section(lines: list[str], title: str) -> list[str]:
    """The lines from `title` to the next `## ` heading (none when absent)."""
    if title not in lines:
        return []
    start = lines.index(title)
    end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("## ")), len(lines))
    return lines[start:end]


def write_section(name: str, heading: str, command: str, body: list[str]) -> Path:
    """Replace the `## heading` section of a results file (or append it), keeping the rest.

    A series run on its own (larger clusters, another day) thus extends the file that an
    earlier series wrote, with its own command, machine and date.
    """
    path = RESULTS / name
    lines = path.read_text(encoding="utf-8").splitlines() if path.exists() else []
    title = f"## {heading}"
    old = _section(lines, title)
    start = lines.index(title) if old else len(lines)
    section = [title, "", f"Command: `{command}`", "", f"Machine: {machine()}",
               f"Date: {time.strftime('%Y-%m-%d %H:%M')}", "", *body, ""]
    before = lines[:start] + ([""] if lines[:start] and lines[start - 1] != "" else [])
    path.write_text("\n".join([*before, *section, *lines[start + len(old):]]).rstrip("\n") + "\n", encoding="utf-8")
    return path
