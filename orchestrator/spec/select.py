"""Choose the inventory hosts a command uses: `--nodes`, `-x/--exclude`, `--label`, `--all`.

The flags mean the same on every command, and each takes clush/pdsh host ranges
(`node[0-7,12]`, `node[0-3],gpu-b`; see orchestrator/spec/hostrange.py):

- `--nodes R` (repeatable): exactly these hosts; every name must be in the inventory.
- `-x/--exclude R` (repeatable): not these hosts; every name must be in the inventory.
- `--label L` (repeatable): hosts with one of the labels L stands for (`--label h100,a100` is
  either); each `--label` given must match (`--label h100 --label ib` is both).
- `--all`: every host of the inventory, said on purpose (see `SelectionGuard`).

For a job, `--nodes` replaces the job's `select.names` (which may hold ranges too); the job's
`select.labels` always apply. The first `nnodes` of the selected hosts, in inventory order,
are the job's hosts; the hosts selected beyond them are its spares (`spares: K` keeps K of
them), which take a failed host's place when the controller restarts the job.

`SelectionGuard` keeps a command off every host by accident: a selection that says nothing about the
hosts (no `--nodes`, `--label`, `--all`, no `--nnodes`, and a job without `nnodes` or
`select`) is fine up to `confirm_above` hosts; above that, distrun asks on a terminal and
refuses elsewhere.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from orchestrator.console.display import fold_hosts
from orchestrator.errors import SpecError, UsageError
from orchestrator.spec.fields import suggestion
from orchestrator.spec.hostrange import HostRangeError, expand_hosts
from orchestrator.spec.model import Inventory, JobSpec, NodeSpec

DEFAULT_CONFIRM_ABOVE = 8
RANGE_EXAMPLE = "e.g. node[0-7,12] or node[0-3],gpu-b"


@dataclass(frozen=True)
class HostSelection:
    """Which hosts of an inventory a command was asked to use (see the module docstring).

    Attributes:
        nodes: `--nodes` values, each a host range.
        exclude: `-x/--exclude` values, each a host range.
        labels: `--label` values, each a range of labels a host needs one of.
        all: `--all`: every host, on purpose.
    """

    nodes: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()
    labels: tuple[str, ...] = ()
    all: bool = False

    @property
    def explicit(self) -> bool:
        """Whether the command line says which hosts (an exclusion alone does not)."""
        return bool(self.nodes or self.labels or self.all)

    def node_names(self) -> list[str]:
        """The names `--nodes` stands for, in the order given.

        Raises:
            UsageError: a `--nodes` value is not a host range.
        """
        return expand_option("--nodes", self.nodes)


@dataclass(frozen=True)
class SelectionGuard:
    """The rule that keeps a command off every host of a large inventory by accident.

    Attributes:
        confirm_above: An implicit selection of more hosts than this needs `--all`, `--nodes`,
            `--label` or `--nnodes`, or a yes on a terminal.
        ask: Asks the operator a yes/no question; None where nobody can answer (not a terminal).
    """

    confirm_above: int = DEFAULT_CONFIRM_ABOVE
    ask: Callable[[str], bool] | None = None

    def check(self, nodes: Sequence[NodeSpec], inventory: Inventory, explicit: bool, command: str) -> None:
        """Let an explicit or small selection through; ask about, or refuse, a large implicit one.

        Args:
            nodes: The hosts the command would use.
            inventory: Where they come from.
            explicit: Whether the command line or the job said which hosts.
            command: The command's name, for the question and the error.

        Raises:
            UsageError: the selection is implicit and large, and the operator did not confirm it.
        """
        if explicit or len(nodes) <= self.confirm_above:
            return
        hosts = f"all {len(nodes)} hosts of {inventory.path} ({fold_hosts(n.name for n in nodes)})"
        if self.ask is not None:
            if self.ask(f"distrun {command} on {hosts}?"):
                return
            raise UsageError(f"{command}: not confirmed; nothing was done")
        raise UsageError(
            f"{command}: no hosts named, and the default is {hosts} (more than {self.confirm_above}: "
            "say which with --nodes, --label or --nnodes, or pass --all to mean every host)"
        )


def expand_option(option: str, values: Iterable[str]) -> list[str]:
    """The names a repeatable host-range option stands for, in order, each once.

    Raises:
        UsageError: a value is not a host range (the option and the value named).
    """
    names: dict[str, None] = {}
    for value in values:
        try:
            names.update(dict.fromkeys(expand_hosts(value)))
        except HostRangeError as exc:
            raise UsageError(f"{option} {value!r}: {exc} ({RANGE_EXAMPLE})") from None
    return list(names)


def select_hosts(inv: Inventory, selection: HostSelection, guard: SelectionGuard | None = None,
                 command: str = "") -> list[NodeSpec]:
    """The hosts a command without a job uses (exec, doctor), in inventory order.

    Args:
        inv: The inventory to choose from.
        selection: The host-selection flags.
        guard: The rule for an implicit selection of many hosts; None: no rule.
        command: The command's name, for the guard's question and error.

    Returns:
        The selected hosts: `--nodes` (else every host), with one label of each `--label`,
        less `--exclude`.

    Raises:
        UsageError: a name is not in the inventory, a label is on no host, nothing is left, or
            the guard refused.
    """
    names = selection.node_names()
    chosen = _known(inv, names, "--nodes") if names else list(inv.nodes)
    selected = _exclude(inv, _with_labels(inv, chosen, selection.labels), selection.exclude)
    if guard is not None:
        guard.check(selected, inv, selection.explicit, command)
    return selected


def select_nodes(job: JobSpec, inv: Inventory, selection: HostSelection | None = None, nnodes: int | None = None,
                 guard: SelectionGuard | None = None) -> list[NodeSpec]:
    """The nodes a job runs on, in inventory order (`select_with_spares`, less the spares)."""
    return select_with_spares(job, inv, selection, nnodes, guard)[0]


def select_with_spares(job: JobSpec, inv: Inventory, selection: HostSelection | None = None, nnodes: int | None = None,
                       guard: SelectionGuard | None = None) -> tuple[list[NodeSpec], list[NodeSpec]]:
    """The nodes a job runs on and its spares, each in inventory order.

    Args:
        job: The job; its `select`, `nnodes` and `spares` apply unless overridden.
        inv: The inventory to choose from.
        selection: The command line's host selection; `--nodes` replaces the job's `select.names`.
        nnodes: The `--nnodes` value; None to use the job's `nnodes`, else every selected node
            (less the job's `spares`).
        guard: The rule for an implicit selection of many hosts; None: no rule.

    Returns:
        The first `nnodes` selected nodes, and the selected nodes beyond them (at most `spares`).

    Raises:
        UsageError: A `--nodes` name is unknown or lacks a required label, `--label` or
            `--exclude` leave no node, `--nnodes` is out of range, or the guard refused.
        SpecError: A name in the job's `select.names` is unknown or lacks a required label,
            no node has the job's `select.labels`, the job's `nnodes` is above the number
            of selected nodes (below its MIN, for `nnodes: MIN:MAX`), or fewer spares are
            selected than its `spares` asks.
    """
    selection = selection or HostSelection()
    names = selection.node_names()
    if names:
        selected = _named(job, inv, names, from_cli=True)
    elif job.select.names:
        selected = _named(job, inv, _job_names(job), from_cli=False)
    else:
        selected = _labelled(job, inv)
    selected = _exclude(inv, _with_labels(inv, selected, selection.labels), selection.exclude)
    count = _count(job, selected, nnodes)
    chosen, spares = selected[:count], _spares(job, selected, selected[count:])
    if guard is not None:
        explicit = selection.explicit or nnodes is not None or job.nnodes is not None or bool(
            job.select.names or job.select.labels)
        guard.check(chosen + spares, inv, explicit, "launch")
    return chosen, spares


def _spares(job: JobSpec, selected: list[NodeSpec], beyond: list[NodeSpec]) -> list[NodeSpec]:
    """The spares: every node selected beyond the job's, or the first `spares` of them."""
    if job.spares is None:
        return beyond
    if len(beyond) < job.spares:
        what = (f"{job.spares} spare host(s) asked but {len(beyond)} selected beyond the job's "
                f"{len(selected) - len(beyond)} ({fold_hosts(node.name for node in selected)})")
        raise SpecError(job.path, _line(job, "spares"), "spares", what,
                        "select more hosts with --nodes, select or the inventory, or lower spares")
    return beyond[:job.spares]


def _known(inv: Inventory, names: Sequence[str], option: str) -> list[NodeSpec]:
    """The inventory's nodes of these names, in inventory order; an unknown name is an error."""
    known = [node.name for node in inv.nodes]
    for name in names:
        if name not in known:
            raise UsageError(f"{option}: unknown node {name!r} in inventory {inv.path} "
                             f"({suggestion(name, known, 'nodes')})")
    wanted = set(names)
    return [node for node in inv.nodes if node.name in wanted]


def _with_labels(inv: Inventory, nodes: list[NodeSpec], labels: Sequence[str]) -> list[NodeSpec]:
    """The nodes that have one label of each `--label` value."""
    for value in labels:
        wanted = set(expand_option("--label", [value]))
        kept = [node for node in nodes if wanted.intersection(node.labels)]
        if not kept:
            present = sorted({label for node in nodes for label in node.labels})
            hint = f"labels there: {', '.join(present)}" if present else "those nodes have no labels"
            raise UsageError(f"--label {value}: no selected node of inventory {inv.path} has it ({hint})")
        nodes = kept
    return nodes


def _exclude(inv: Inventory, nodes: list[NodeSpec], exclude: Sequence[str]) -> list[NodeSpec]:
    """The nodes less those `--exclude` names; an unknown name is an error (a typo would exclude nothing)."""
    if not exclude:
        return nodes
    dropped = {node.name for node in _known(inv, expand_option("--exclude", exclude), "--exclude")}
    kept = [node for node in nodes if node.name not in dropped]
    if not kept:
        raise UsageError(f"--exclude {','.join(exclude)}: no node is left of "
                         f"{fold_hosts(node.name for node in nodes)}")
    return kept


def _job_names(job: JobSpec) -> list[str]:
    """The job's `select.names`, each a host range, expanded; a bad range is an error at its line."""
    names: dict[str, None] = {}
    for index, value in enumerate(job.select.names):
        try:
            names.update(dict.fromkeys(expand_hosts(value)))
        except HostRangeError as exc:
            path = f"select.names[{index}]"
            raise SpecError(job.path, _line(job, path, "select.names", "select"), path,
                            f"{value!r}: {exc}", RANGE_EXAMPLE) from None
    return list(names)


def _named(job: JobSpec, inv: Inventory, names: Sequence[str], *, from_cli: bool) -> list[NodeSpec]:
    known = [node.name for node in inv.nodes]
    for index, name in enumerate(names):
        if name not in known:
            what = f"unknown node {name!r} in inventory {inv.path}"
            raise _name_error(job, _name_path(job, index, name), what, suggestion(name, known, "nodes"), from_cli)
        missing = [label for label in job.select.labels if label not in inv.node(name).labels]
        if missing:
            what = f"node {name!r} lacks label(s) {', '.join(missing)} that the job's select.labels requires"
            hint = "choose nodes that have the labels, or change select.labels"
            raise _name_error(job, _name_path(job, index, name), what, hint, from_cli)
    wanted = set(names)
    return [node for node in inv.nodes if node.name in wanted]


def _name_path(job: JobSpec, index: int, name: str) -> str:
    """The key path of the `select.names` item a name came from (an item may be a range)."""
    for position, value in enumerate(job.select.names):
        try:
            if name in expand_hosts(value):
                return f"select.names[{position}]"
        except HostRangeError:
            continue
    return f"select.names[{index}]"


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
    """How many of the selected nodes the job runs on (the rest are spares)."""
    chosen = fold_hosts(node.name for node in selected)
    if nnodes is not None:
        if not 1 <= nnodes <= len(selected):
            raise UsageError(
                f"--nnodes {nnodes}: must be from 1 to the number of selected nodes, {len(selected)} ({chosen})"
            )
        return nnodes
    if job.nnodes is None:
        if job.spares is not None and job.spares >= len(selected):
            what = f"{job.spares} spare host(s) asked, but only {len(selected)} selected ({chosen})"
            hint = "select more hosts, or lower spares: at least one host must run the job"
            raise SpecError(job.path, _line(job, "spares"), "spares", what, hint)
        return len(selected) - (job.spares or 0)
    least = job.min_nnodes or job.nnodes
    if least > len(selected):
        what = f"{least} nodes requested but only {len(selected)} selected ({chosen})"
        hint = "lower nnodes, or select more nodes with --nodes, select or the inventory"
        raise SpecError(job.path, _line(job, "nnodes"), "nnodes", what, hint)
    return min(job.nnodes, len(selected))


def _name_error(job: JobSpec, path: str, what: str, hint: str, from_cli: bool) -> UsageError:
    """A bad node name: a usage error for `--nodes`, a SpecError at the job's `select.names` item."""
    if from_cli:
        return UsageError(f"--nodes: {what} ({hint})")
    return SpecError(job.path, _line(job, path, "select.names", "select"), path, what, hint)


def _line(job: JobSpec, *paths: str) -> int:
    """The line of the first of `paths` the job file has; 1 for a job built in code."""
    return next((job.lines[path] for path in paths if path in job.lines), 1)
