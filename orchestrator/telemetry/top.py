"""`distrun top`: a job's table from its job directory's telemetry and metrics files."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.live import Live
from rich.table import Table

from orchestrator.remote.follow import Follower
from orchestrator.store import JobDir, JobRecord
from orchestrator.telemetry.alerts import Aggregator
from orchestrator.telemetry.view import TABLE_CHROME, render

TICK = 1.0  # seconds between redraws

TAIL_BYTES = 4 << 20  # how much of a telemetry file `top` reads to find the latest samples


class JsonlFollower:
    """The JSON lines appended to a file since the last read; starts near the end of a big file."""

    def __init__(self, path: Path, tail_bytes: int = TAIL_BYTES) -> None:
        self.follower = Follower(path, last=tail_bytes)

    def read(self) -> list[dict[str, Any]]:
        lines = self.follower.lines().splitlines()
        return [r for r in (_json(line) for line in lines) if r is not None]

    def close(self) -> None:
        self.follower.close()


def _json(line: bytes) -> dict[str, Any] | None:
    try:
        value = json.loads(line)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


class History:
    """A job directory's telemetry and metrics files, followed into an aggregator (for `top`)."""

    def __init__(self, job_dir: JobDir, nodes: list[str]) -> None:
        self.aggregator = Aggregator(nodes, plan_interval(job_dir), clock=time.time)
        self.telemetry = JsonlFollower(job_dir.telemetry)
        self.metrics = JsonlFollower(job_dir.metrics)

    def poll(self) -> None:
        for sample in self.telemetry.read():
            node = sample.get("node") or sample.get("host")
            if node:
                self.aggregator.observe(str(node), sample, at=sample.get("t"))
        for record in self.metrics.read():
            self.aggregator.observe_metrics(record)

    def close(self) -> None:
        self.telemetry.close()
        self.metrics.close()


def plan_interval(job_dir: JobDir) -> float | None:
    """The job's telemetry interval from its plan.json (None when telemetry was off or unknown)."""
    try:
        value = json.loads(job_dir.plan.read_text(encoding="utf-8")).get("telemetry_interval")
    except (OSError, ValueError):
        return None
    return float(value) if value else None


def top_sample(job_dir: JobDir, record: JobRecord) -> dict[str, Any]:
    """`distrun top --json`: the job's latest figures as one JSON-ready sample.

    Returns:
        {"job", "state", "time", "hosts": [{"node", "seen", "host": the host's latest sample or
        null, "gpus": [each GPU's latest sample]}], "metrics": the latest metrics record or null,
        "progress": the ranks' progress from their Flight Recorders (collectives_per_s, collectives,
        ranks: each rank's last completed) or null,
        "alerts": [...]}; samples carry the keys the samplers write (telemetry.jsonl).
    """
    history = History(job_dir, record.hosts)
    history.poll()
    history.close()
    hosts, metrics = history.aggregator.snapshot()
    return {
        "job": record.id, "state": record.state.value, "time": time.time(),
        "hosts": [{"node": h.node, "seen": h.seen, "host": h.host, "gpus": [h.gpus[g] for g in sorted(h.gpus)]}
                  for h in hosts],
        "metrics": metrics, "progress": record.progress or None, "alerts": list(record.alerts),
    }


def top(job_dir: JobDir, current: Callable[[], JobRecord], console: Console, once: bool = False) -> None:
    """Show a job's table: refreshed every TICK seconds until a running job ends, else one frame.

    Args:
        current: the job's record as it is now (state and alerts).
        once: print one frame even for a running job.
    """
    record = current()
    history = History(job_dir, record.hosts)
    try:
        _show(history, current, record, console, once)
    finally:
        history.close()


def _show(history: History, current: Callable[[], JobRecord], record: JobRecord, console: Console,
          once: bool) -> None:
    """`top`'s frames: one, or one every TICK seconds until the job ends."""
    history.poll()

    def frame() -> Table:
        running = not record.state.finished
        return render(history.aggregator, f"{record.id} · {record.state.value}", time.time() if running else None,
                      record.alerts, max(console.height - TABLE_CHROME, 1) if console.is_terminal else None,
                      record.progress, fit=console.is_terminal)

    if once or record.state.finished or not console.is_terminal:
        console.print(frame())
        return
    with Live(console=console, get_renderable=frame, refresh_per_second=1, transient=False) as live:
        while not record.state.finished:
            time.sleep(TICK)
            record = current()
            history.poll()
            live.refresh()
