"""doctor's bandwidth check and table, from the all-reduce job's report (orchestrator/doctor/bandwidth.py).

Apart from checks.py and render.py so that those, which the launch's preflight uses, never
import the bandwidth job, which runs a launch."""

from __future__ import annotations

from typing import TYPE_CHECKING

from orchestrator.console.display import size_text
from orchestrator.hostcheck.checks import Check, Status

if TYPE_CHECKING:  # the job itself is imported when it runs: it imports the SSH backend, which imports doctor
    from orchestrator.doctor.bandwidth import BandwidthReport


def busbw_threshold(backend: str, requested: float | None) -> float:
    """`--min-busbw` when given, else the backend's default (GB/s)."""
    from orchestrator.doctor.bandwidth import DEFAULT_MIN_BUSBW

    return requested if requested is not None else DEFAULT_MIN_BUSBW[backend]


def bandwidth_check(report: BandwidthReport, min_busbw: float, hosts: list[str]) -> Check:
    """Warn when the best busbw over the message sizes is under `min_busbw` GB/s (one rank has no link to measure)."""
    if report.error:
        return Check("bandwidth", Status.ERROR, hosts, report.error,
                     "run the job by hand with NCCL_DEBUG=INFO to see where it stops")
    if report.world_size < 2:  # busbw = algbw * 2(n-1)/n: one rank sends nothing over a link
        return Check("bandwidth", Status.OK, hosts, f"{report.backend} all-reduce over 1 rank: no link to measure")
    best = report.best_busbw() or 0.0
    detail = f"{report.backend} all-reduce over {report.world_size} ranks: busbw up to {best:.2f} GB/s"
    if best < min_busbw:
        return Check("bandwidth", Status.WARN, hosts, f"{detail} (under {min_busbw:g} GB/s)",
                     "check the interface NCCL/gloo use (`iface:`), its link speed, and NCCL_IB_* settings")
    return Check("bandwidth", Status.OK, hosts, f"{detail} (at least {min_busbw:g} GB/s)")


def render_bandwidth(report: BandwidthReport) -> str:
    """The per-size table of the all-reduce, nccl-tests' columns."""
    if not report.results:
        return ""
    lines = [f"all-reduce ({report.backend}, {report.world_size} ranks on {report.nnodes} host(s)):",
             f"{'size':>10} {'time':>10} {'algbw':>12} {'busbw':>12}"]
    lines += [f"{size_text(r.bytes):>10} {r.time_s * 1000:>7.2f} ms {r.algbw:>7.3f} GB/s {r.busbw:>7.3f} GB/s"
              for r in report.results]
    return "\n".join(lines)
