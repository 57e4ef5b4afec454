"""The checks `distrun launch` runs before anything starts, on the facts its one probe round found."""

from __future__ import annotations

from collections.abc import Mapping

from orchestrator.errors import DistrunError, ExitCode
from orchestrator.facts import HostFacts
from orchestrator.hostcheck.checks import (
    Context,
    Status,
    check_deepspeed,
    check_entry,
    check_extension_locks,
    check_port_free,
    check_port_reachable,
    check_python,
    check_torch,
    uses_deepspeed,
)
from orchestrator.hostcheck.firewall import with_forward_note
from orchestrator.hostcheck.render import render_check
from orchestrator.plan import LaunchPlan
from orchestrator.spec.model import JobSpec, NodeSpec

PORT_CHECKS = frozenset({"port-free", "port-reachable"})


class PreflightError(DistrunError):
    """A check failed before anything started: exit 1, nothing was launched."""

    exit_code = ExitCode.FAILED


class EntryMissingError(PreflightError):
    """The job's script or module is not there on some host: the job file is wrong, exit 2."""

    exit_code = ExitCode.USAGE


class PortError(PreflightError):
    """The rendezvous port is not reachable from another host (a firewall, a route): exit 3."""

    exit_code = ExitCode.INFRA


class PortBusyError(PreflightError):
    """The rendezvous port is in use on the master: the operator picks another, exit 2 (as --metrics-port)."""

    exit_code = ExitCode.USAGE


def launch_preflight(plan: LaunchPlan, nodes: Mapping[str, NodeSpec], facts: Mapping[str, HostFacts],
                     master_addr_error: str | None = None, job: JobSpec | None = None) -> None:
    """Python and torch alike on every host, the job's script or module there; on several hosts, the
    rendezvous port was free on the master and every other host connected to it (the launch's probe
    round tested all of it). For a job that imports DeepSpeed, deepspeed alike on every host and no
    stale torch extension build lock, on which the job would wait for ever at start.

    Args:
        plan: The job's plan (its hosts, master and address).
        nodes: The plan's hosts' inventory entries, by name.
        facts: What the launch's probe round found on each host.
        master_addr_error: Why no address of the master could be chosen, if so.
        job: The job (its script tells whether it uses DeepSpeed); None: not known.

    Raises:
        PreflightError: listing every failed check as doctor shows it (EntryMissingError, exit 2,
            when the entry is one of them).
    """
    ctx = Context(tuple(nodes[h.node] for h in plan.hosts), plan.master_node, plan.master_addr, master_addr_error,
                  job=job)
    checks = [check_python(facts, ctx), check_torch(facts, ctx), check_entry(facts, ctx)]
    if uses_deepspeed(job):
        checks += [check_deepspeed(facts, ctx), check_extension_locks(facts, ctx)]
    if len(plan.hosts) > 1:
        checks += [check_port_free(facts, ctx), check_port_reachable(facts, ctx)]
    failed = [c for c in with_forward_note(checks) if c.status is Status.ERROR]
    if [c.name for c in failed] == ["port-free"]:
        raise PortBusyError(f"rendezvous port: {failed[0].detail}; nothing was started (fix: {failed[0].hint})")
    if failed:
        width = max(len(c.name) for c in failed)
        rows = [line for c in failed for line in render_check(c, width)]
        error = _error_for({c.name for c in failed})
        raise error("preflight failed; nothing was started (--skip-preflight starts anyway):\n" + "\n".join(rows))


def _error_for(failed: set[str]) -> type[PreflightError]:
    """A missing entry or a busy port is bad input (2), above a port cut off (3), above the rest (1)."""
    if "entry" in failed:
        return EntryMissingError
    if "port-free" in failed:
        return PortBusyError
    return PortError if failed & PORT_CHECKS else PreflightError
