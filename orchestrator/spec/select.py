"""Choose the inventory nodes a job runs on: the one check that needs both files.

Names come from `--nodes`, else from the job's `select.names`, else every node; every named
node must carry all of `select.labels`, which otherwise filter the whole inventory. The
first `nnodes` of the selected nodes, in inventory order, are the job's nodes.
"""

from __future__ import annotations

from collections.abc import Sequence

from orchestrator.errors import SpecError, UsageError
from orchestrator.spec.fields import suggestion
from orchestrator.spec.model import Inventory, JobSpec, NodeSpec


def select_nodes(
    job: JobSpec, inv: Inventory, names: list[str] | None = None, nnodes: int | None = None
) -> list[NodeSpec]:
    """The nodes a job runs on, in inventory order.

    Args:
        job: The job; its `select` and `nnodes` apply unless overridden.
        inv: The inventory to choose from.
        names: Node names from `--nodes`; None or empty to use the job's `select.names`.
        nnodes: The `--nnodes` value; None to use the job's `nnodes`, else every selected node.

    Returns:
        The first `nnodes` selected nodes, in inventory order.

    Raises:
        UsageError: A `--nodes` name is unknown or lacks a required label, or `--nnodes` is
            below 1 or above the number of selected nodes.
        SpecError: A name in the job's `select.names` is unknown or lacks a required label,
            no node has the job's `select.labels`, or the job's `nnodes` is above the number
            of selected nodes.
    """
    if names:
        selected = _named(job, inv, names, from_cli=True)
    elif job.select.names:
        selected = _named(job, inv, job.select.names, from_cli=False)
    else:
        selected = _labelled(job, inv)
    return selected[: _count(job, selected, nnodes)]


def _named(job: JobSpec, inv: Inventory, names: Sequence[str], *, from_cli: bool) -> list[NodeSpec]:
    known = [node.name for node in inv.nodes]
    for index, name in enumerate(names):
        if name not in known:
            what = f"unknown node {name!r} in inventory {inv.path}"
            raise _name_error(job, f"select.names[{index}]", what, suggestion(name, known, "nodes"), from_cli)
        missing = [label for label in job.select.labels if label not in inv.node(name).labels]
        if missing:
            what = f"node {name!r} lacks label(s) {', '.join(missing)} that the job's select.labels requires"
            hint = "choose nodes that have the labels, or change select.labels"
            raise _name_error(job, f"select.names[{index}]", what, hint, from_cli)
    wanted = set(names)
    return [node for node in inv.nodes if node.name in wanted]


def _labelled(job: JobSpec, inv: Inventory) -> list[NodeSpec]:
    required = set(job.select.labels)
    selected = [node for node in inv.nodes if required.issubset(node.labels)]
    if not selected:
        present = sorted({label for node in inv.nodes for label in node.labels})
        hint = f"labels in the inventory: {', '.join(present)}" if present else "the inventory's nodes have no labels"
        what = f"no node of inventory {inv.path} has all of the labels {', '.join(job.select.labels)}"
        raise SpecError(job.path, _line(job, "select.labels", "select"), "select.labels", what, hint)
    return selected


def _count(job: JobSpec, selected: list[NodeSpec], nnodes: int | None) -> int:
    chosen = ", ".join(node.name for node in selected)
    if nnodes is not None:
        if not 1 <= nnodes <= len(selected):
            raise UsageError(
                f"--nnodes {nnodes}: must be from 1 to the number of selected nodes, {len(selected)} ({chosen})"
            )
        return nnodes
    if job.nnodes is None:
        return len(selected)
    if job.nnodes > len(selected):
        what = f"{job.nnodes} nodes requested but only {len(selected)} selected ({chosen})"
        hint = "lower nnodes, or select more nodes with --nodes, select or the inventory"
        raise SpecError(job.path, _line(job, "nnodes"), "nnodes", what, hint)
    return job.nnodes


def _name_error(job: JobSpec, path: str, what: str, hint: str, from_cli: bool) -> UsageError:
    """A bad node name: a usage error for `--nodes`, a SpecError at the job's `select.names` item."""
    if from_cli:
        return UsageError(f"--nodes: {what} ({hint})")
    return SpecError(job.path, _line(job, path, "select.names", "select"), path, what, hint)


def _line(job: JobSpec, *paths: str) -> int:
    """The line of the first of `paths` the job file has; 1 for a job built in code."""
    return next((job.lines[path] for path in paths if path in job.lines), 1)
