"""`distrun doctor`: probe every host at once and check what makes multi-host jobs hang.

Every selected host runs the shipped probe with its own python (`full` facts; doctor/probe.py
drives it). The master's probe also listens on the rendezvous port while every other host's
probe opens a TCP connection to it, so firewalls and wrong interfaces show up before a job hangs
on them. doctor/checks.py turns the facts into checks, doctor/render.py into the table or JSON.

Exit status: 3 when any selected host could not be reached over SSH (authentication
included), even when other checks failed too: the report is incomplete and the
infrastructure comes first (the reachable hosts are still checked and reported); otherwise
1 when any check is an error (or a warning, with --strict); otherwise 0.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TextIO

from orchestrator.console import terminal
from orchestrator.console.terminal import ProgressCounter
from orchestrator.doctor.bandwidth_check import bandwidth_check, busbw_threshold, render_bandwidth
from orchestrator.doctor.links import links_check, measure_links, render_links
from orchestrator.errors import DistrunError, ExitCode
from orchestrator.fanout.group import Group
from orchestrator.hostcheck.checks import (
    Check,
    Context,
    Status,
    run_checks,
    skipped,
)
from orchestrator.hostcheck.firewall import with_forward_note
from orchestrator.hostcheck.probe import ProbeResult, import_options, probe_round
from orchestrator.hostcheck.render import render_table, to_json
from orchestrator.spec.model import Inventory, JobSpec, NodeSpec
from orchestrator.spec.select import HostSelection, SelectionGuard

if TYPE_CHECKING:
    from orchestrator.doctor.bandwidth import BandwidthReport


@dataclass(frozen=True)
class DoctorRequest:
    """Everything `distrun doctor` was asked."""

    inventory: str | None = None
    job_file: str | None = None
    selection: HostSelection = field(default_factory=HostSelection)
    guard: SelectionGuard | None = None
    as_json: bool = False
    strict: bool = False
    bandwidth: bool = False
    min_busbw: float | None = None
    links: bool = False


def run_doctor(request: DoctorRequest, out: TextIO = sys.stdout) -> int:
    """Check the selected hosts and print the report.

    Returns:
        The exit status (see the module docstring).

    Raises:
        UsageError: the inventory, the job or `--nodes` is invalid.
    """
    from orchestrator.spec import load_job, resolve_inventory_path, select_hosts, select_nodes

    began = time.monotonic()
    inventory = resolve_inventory_path(request.inventory)
    job = load_job(request.job_file) if request.job_file else None
    if job is not None:
        nodes = select_nodes(job, inventory, request.selection, None, request.guard)
    else:
        nodes = select_hosts(inventory, request.selection, request.guard, "doctor")
    results, ctx = collect(nodes, inventory.master_of(nodes), job)
    checks = with_forward_note(run_checks(results, ctx))
    report = None
    if request.bandwidth:
        check, report = _bandwidth(checks, results, inventory, nodes, ctx, request.min_busbw)
        checks.append(check)
    links = measure_links(nodes) if request.links else None
    if links is not None:
        checks.append(links_check(links))
    seconds = time.monotonic() - began
    code = exit_code(checks, results, request.strict)
    if request.as_json:
        data = report.to_dict() | {"min_busbw_gbps": busbw_threshold(report.backend, request.min_busbw)} \
            if report else None
        shown = to_json(results, checks, ctx, seconds, code, data)
        if links is not None:
            shown["links"] = links.to_dict()
        terminal.show(json.dumps(shown, indent=2), stream=out)
    else:
        terminal.show(render_table(checks, ctx, seconds, terminal.colour(out)), stream=out)
        if report is not None and report.results:
            terminal.show("\n" + render_bandwidth(report), stream=out)
        if links is not None and links.pairs:
            terminal.show("\n" + render_links(links), stream=out)
    return code


def _bandwidth(checks: list[Check], results: Mapping[str, ProbeResult], inventory: Inventory,
               nodes: list[NodeSpec], ctx: Context, min_busbw: float | None) -> tuple[Check, BandwidthReport | None]:
    """Run the all-reduce when every check passed; a job on broken hosts would only hang."""
    from orchestrator.doctor.bandwidth import BandwidthReport, measure

    if any(c.status is Status.ERROR for c in checks):
        return skipped("bandwidth", "the all-reduce runs only when no check failed"), None
    facts = [r.facts for r in results.values() if r.facts is not None]
    backend = "nccl" if facts and all(f.gpu_total for f in facts) else "gloo"
    try:
        report = measure(ctx.job, inventory, nodes, backend)
    except DistrunError as exc:
        report = BandwidthReport(backend, len(nodes), "", error=f"the all-reduce job did not start: {exc}")
    return bandwidth_check(report, busbw_threshold(backend, min_busbw), [n.name for n in nodes]), report


def collect(nodes: list[NodeSpec], master: NodeSpec, job: JobSpec | None) -> tuple[dict[str, ProbeResult], Context]:
    """Reach every node at once, run the full probe round, and build the checks' context.

    Returns:
        Every node's result, in node order, and the context for `run_checks`.
    """
    workdir = (job.workdir if job else None) or os.getcwd()
    base = {"full": True, "workdir": workdir}
    with Group(nodes, progress=ProgressCounter(len(nodes), "connected")) as group:
        outcome = probe_round(group, master, base, job.rendezvous.port if job else None, None,
                              per_host=import_options(nodes, job, workdir),
                              progress=ProgressCounter(len(nodes), "probed"))
    ctx = Context(tuple(nodes), master.name, outcome.master_addr, outcome.master_addr_error,
                  outcome.master_hostname, job)
    return outcome.results, ctx


def exit_code(checks: list[Check], results: Mapping[str, ProbeResult], strict: bool) -> int:
    """3 when a host could not be reached; else 1 on an error (or a warning with `strict`); else 0."""
    if any(r.unreachable for r in results.values()):
        return int(ExitCode.INFRA)
    failing = {Status.ERROR, Status.WARN} if strict else {Status.ERROR}
    return int(ExitCode.FAILED) if any(c.status in failing for c in checks) else int(ExitCode.OK)
