"""Telemetry on the controller: the latest figures per host and GPU, alerts, the live view, `top`.

Samples come from the hosts' samplers (schema in orchestrator/remote/sampler.py) through
the attempt (run/attempt.py), which also appends them to telemetry.jsonl. An `Aggregator` keeps the latest
sample per host and GPU and the job's latest metrics record, and turns what it sees into
alerts, each fired once per episode of its condition. A `Monitor` is what an attempt
holds: it feeds the aggregator, checks every second for hosts whose samples stopped, hands
alerts to a callback and, on a terminal, keeps a live table under the scrolling log lines.
`top` renders the same table from a job directory's files.

    alerts.py   the alert rules and the aggregator
    view.py     the table, and the live view (`Monitor`)
    top.py      `distrun top`
    rendezvous.py  while no host is past the rendezvous: what the launch waits for, the hosts that never joined
"""

from __future__ import annotations

from functools import cache
from importlib import util as import_util
from pathlib import Path

from orchestrator.remote.gpu import SHIPPED_NVML
from orchestrator.telemetry.alerts import Alert, summary_lines
from orchestrator.telemetry.view import Monitor


@cache
def _nvml_source() -> str | None:
    spec = import_util.find_spec("pynvml")
    if spec is None or spec.origin is None or not spec.origin.endswith(".py"):
        return None
    return Path(spec.origin).read_text(encoding="utf-8")


def shipped_modules(gpus: int) -> dict[str, str]:
    """Modules to ship with a host's supervisor: this controller's NVML bindings to a host with GPUs.

    The sampler prefers the host's own `pynvml`; the shipped copy (~330 KB, ~50 ms to compile
    on the host) is its fallback, and is not sent to hosts whose probe found no GPU.

    Args:
        gpus: The GPUs the host's probe found.
    """
    source = _nvml_source() if gpus > 0 else None
    return {SHIPPED_NVML: source} if source else {}


# ---------------------------------------------------------------- top


__all__ = ["Alert", "Monitor", "shipped_modules", "summary_lines"]
