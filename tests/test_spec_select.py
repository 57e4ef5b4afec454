"""Choosing a job's nodes from an inventory: names, labels, nnodes, and errors that point at the right place."""

from __future__ import annotations

import pytest

from orchestrator.errors import SpecError, UsageError
from orchestrator.spec import (
    HostSelection,
    Inventory,
    JobSpec,
    SelectionGuard,
    inventory_from_text,
    job_from_text,
    select_hosts,
    select_nodes,
    select_with_spares,
)

INVENTORY = """\
nodes:
  - {name: node0, labels: [h100, ib]}
  - {name: node1, labels: [h100]}
  - {name: node2, labels: [a100]}
  - {name: node3, labels: [h100, ib]}
"""


@pytest.fixture
def inv() -> Inventory:
    return inventory_from_text(INVENTORY, "inv.yaml")


def job(extra: str = "") -> JobSpec:
    return job_from_text(f"name: t\nmodule: pkg.train\n{extra}", "job.yaml")


def names(selected: list) -> list[str]:
    return [node.name for node in selected]


def test_without_select_every_node_is_used(inv: Inventory) -> None:
    assert names(select_nodes(job(), inv)) == ["node0", "node1", "node2", "node3"]


def test_labels_keep_only_nodes_with_all_of_them(inv: Inventory) -> None:
    assert names(select_nodes(job("select: {labels: [h100, ib]}\n"), inv)) == ["node0", "node3"]


def test_job_names_are_taken_in_inventory_order(inv: Inventory) -> None:
    assert names(select_nodes(job("select: {names: [node3, node1]}\n"), inv)) == ["node1", "node3"]


def test_cli_names_override_the_job_names(inv: Inventory) -> None:
    chosen = select_nodes(job("select: {names: [node3]}\n"), inv, HostSelection(nodes=("node2,node0",)))
    assert names(chosen) == ["node0", "node2"]


def test_nnodes_takes_the_first_selected_nodes(inv: Inventory) -> None:
    assert names(select_nodes(job("nnodes: 2\n"), inv)) == ["node0", "node1"]


def test_cli_nnodes_overrides_the_job_nnodes(inv: Inventory) -> None:
    assert names(select_nodes(job("nnodes: 2\n"), inv, nnodes=3)) == ["node0", "node1", "node2"]


def test_job_nnodes_above_the_selection_points_at_the_nnodes_line(inv: Inventory) -> None:
    with pytest.raises(SpecError) as caught:
        select_nodes(job("select: {labels: [ib]}\nnnodes: 3\n"), inv)
    assert str(caught.value) == (
        "job.yaml:4: nnodes: 3 nodes requested but only 2 selected (node[0,3]) "
        "(lower nnodes, or select more nodes with --nodes, select or the inventory)"
    )


def test_cli_nnodes_above_the_selection_is_a_usage_error(inv: Inventory) -> None:
    with pytest.raises(UsageError) as caught:
        select_nodes(job(), inv, HostSelection(nodes=("node1",)), nnodes=2)
    assert not isinstance(caught.value, SpecError)
    assert str(caught.value) == "--nnodes 2: must be from 1 to the number of selected nodes, 1 (node1)"


def test_unknown_job_name_points_at_the_select_item_and_suggests_a_node(inv: Inventory) -> None:
    with pytest.raises(SpecError) as caught:
        select_nodes(job("select:\n  names:\n    - node0\n    - nod1\n"), inv)
    assert (
        str(caught.value)
        == "job.yaml:6: select.names[1]: unknown node 'nod1' in inventory inv.yaml (did you mean 'node1'?)"
    )


def test_unknown_cli_name_is_a_usage_error_naming_the_closest_node(inv: Inventory) -> None:
    with pytest.raises(UsageError) as caught:
        select_nodes(job(), inv, HostSelection(nodes=("nodee2",)))
    assert not isinstance(caught.value, SpecError)
    assert str(caught.value) == "--nodes: unknown node 'nodee2' in inventory inv.yaml (did you mean 'node2'?)"


def test_named_node_without_a_required_label_is_refused(inv: Inventory) -> None:
    with pytest.raises(UsageError) as caught:
        select_nodes(job("select: {labels: [h100]}\n"), inv, HostSelection(nodes=("node2",)))
    assert str(caught.value) == (
        "--nodes: node 'node2' lacks label(s) h100 that the job's select.labels requires "
        "(choose nodes that have the labels, or change select.labels)"
    )


def test_labels_that_match_no_node_list_the_labels_present(inv: Inventory) -> None:
    with pytest.raises(SpecError) as caught:
        select_nodes(job("select:\n  labels: [v100]\n"), inv)
    assert str(caught.value) == (
        "job.yaml:4: select.labels: no node of inventory inv.yaml has all of the labels v100 "
        "(labels in the inventory: a100, h100, ib)"
    )


# ---------------------------------------------------------------- host ranges, -x, --label


@pytest.mark.parametrize(("nodes", "expected"), [
    (("node[0-1,3]",), ["node0", "node1", "node3"]),
    (("node[2-3]", "node0"), ["node0", "node2", "node3"]),
    (("node0,node[2-3]",), ["node0", "node2", "node3"]),
])
def test_nodes_take_host_ranges_and_keep_inventory_order(inv: Inventory, nodes: tuple[str, ...],
                                                         expected: list[str]) -> None:
    assert names(select_nodes(job(), inv, HostSelection(nodes=nodes))) == expected
    assert names(select_hosts(inv, HostSelection(nodes=nodes))) == expected


def test_job_select_names_take_host_ranges_too(inv: Inventory) -> None:
    assert names(select_nodes(job("select: {names: ['node[1-2]']}\n"), inv)) == ["node1", "node2"]


def test_a_bad_range_in_the_job_points_at_its_line(inv: Inventory) -> None:
    with pytest.raises(SpecError, match=r"^job\.yaml:4: select\.names\[0\]: 'node\[3-1\]': the range '3-1' "
                                        r"runs backwards"):
        select_nodes(job("select:\n  names: ['node[3-1]']\n"), inv)


def test_exclude_removes_hosts_after_the_other_flags(inv: Inventory) -> None:
    selection = HostSelection(exclude=("node[1-2]",))
    assert names(select_hosts(inv, selection)) == ["node0", "node3"]
    assert names(select_nodes(job("nnodes: 1\n"), inv, selection)) == ["node0"]


def test_an_unknown_name_to_exclude_is_an_error_not_a_no_op(inv: Inventory) -> None:
    with pytest.raises(UsageError, match=r"^--exclude: unknown node 'nod3' in inventory inv\.yaml "
                                         r"\(did you mean 'node3'\?\)$"):
        select_hosts(inv, HostSelection(exclude=("nod3",)))


def test_excluding_every_selected_host_is_an_error(inv: Inventory) -> None:
    with pytest.raises(UsageError, match=r"no node is left of node\[0-1\]"):
        select_hosts(inv, HostSelection(nodes=("node[0-1]",), exclude=("node[0-1]",)))


def test_one_label_value_is_any_of_its_labels_and_each_value_must_match(inv: Inventory) -> None:
    assert names(select_hosts(inv, HostSelection(labels=("a100,ib",)))) == ["node0", "node2", "node3"]
    assert names(select_hosts(inv, HostSelection(labels=("h100", "ib")))) == ["node0", "node3"]
    assert names(select_nodes(job(), inv, HostSelection(labels=("a100",)))) == ["node2"]


def test_a_label_no_selected_host_has_lists_the_labels_there_are(inv: Inventory) -> None:
    with pytest.raises(UsageError, match=r"^--label tpu: no selected node of inventory inv\.yaml has it "
                                         r"\(labels there: a100, h100, ib\)$"):
        select_hosts(inv, HostSelection(labels=("tpu",)))


def test_a_malformed_range_names_the_flag_and_shows_the_form(inv: Inventory) -> None:
    with pytest.raises(UsageError, match=r"^--nodes 'node\[0-': '\[' without '\]' \(e\.g\. node\[0-7,12\]"):
        select_hosts(inv, HostSelection(nodes=("node[0-",)))


# ---------------------------------------------------------------- the guard against every host by accident

BIG = inventory_from_text("nodes:\n" + "".join(f"  - {{name: n{i:02d}, labels: [gpu]}}\n" for i in range(12)),
                          "big.yaml")


def test_a_small_inventory_needs_no_explicit_selection() -> None:
    small = inventory_from_text(INVENTORY, "inv.yaml")
    assert len(select_nodes(job(), small, guard=SelectionGuard(confirm_above=8))) == 4


def test_every_host_of_a_large_inventory_is_refused_without_a_terminal() -> None:
    with pytest.raises(UsageError) as caught:
        select_nodes(job(), BIG, guard=SelectionGuard(confirm_above=8))
    assert str(caught.value) == (
        "launch: no hosts named, and the default is all 12 hosts of big.yaml (n[00-11]) (more than 8: say which "
        "with --nodes, --label or --nnodes, or pass --all to mean every host)")


@pytest.mark.parametrize("selection", [HostSelection(all=True), HostSelection(nodes=("n[00-10]",)),
                                       HostSelection(labels=("gpu",))])
def test_an_explicit_selection_of_many_hosts_goes_ahead(selection: HostSelection) -> None:
    assert len(select_nodes(job(), BIG, selection, guard=SelectionGuard(confirm_above=8))) >= 11


def test_nnodes_in_the_job_or_on_the_command_line_is_explicit() -> None:
    assert len(select_nodes(job("nnodes: 10\n"), BIG, guard=SelectionGuard(confirm_above=8))) == 10
    assert len(select_nodes(job(), BIG, nnodes=9, guard=SelectionGuard(confirm_above=8))) == 9


def test_an_exclusion_alone_is_not_explicit() -> None:
    with pytest.raises(UsageError, match=r"all 11 hosts of big\.yaml"):
        select_hosts(BIG, HostSelection(exclude=("n00",)), SelectionGuard(confirm_above=8), "exec")


def test_on_a_terminal_the_operator_is_asked_and_a_no_stops_everything() -> None:
    asked: list[str] = []

    def answer(yes: bool):
        def ask(question: str) -> bool:
            asked.append(question)
            return yes
        return ask

    assert len(select_hosts(BIG, HostSelection(), SelectionGuard(8, answer(True)), "exec")) == 12
    with pytest.raises(UsageError, match=r"^doctor: not confirmed; nothing was done$"):
        select_hosts(BIG, HostSelection(), SelectionGuard(8, answer(False)), "doctor")
    assert asked == ["distrun exec on all 12 hosts of big.yaml (n[00-11])?",
                     "distrun doctor on all 12 hosts of big.yaml (n[00-11])?"]


def test_nodes_selected_beyond_nnodes_are_the_spares(inv: Inventory) -> None:
    chosen, spares = select_with_spares(job("nnodes: 2\n"), inv, HostSelection(nodes=("node0,node1,node3",)))
    assert (names(chosen), names(spares)) == (["node0", "node1"], ["node3"])


def test_spares_k_without_nnodes_keeps_the_last_k_selected_aside(inv: Inventory) -> None:
    chosen, spares = select_with_spares(job("spares: 1\n"), inv)
    assert (names(chosen), names(spares)) == (["node0", "node1", "node2"], ["node3"])


def test_spares_k_with_nnodes_keeps_only_k_spares(inv: Inventory) -> None:
    chosen, spares = select_with_spares(job("nnodes: 2\nspares: 1\n"), inv)
    assert (names(chosen), names(spares)) == (["node0", "node1"], ["node2"])


def test_more_spares_than_selected_beyond_nnodes_points_at_the_spares_line(inv: Inventory) -> None:
    with pytest.raises(SpecError) as caught:
        select_with_spares(job("nnodes: 3\nspares: 2\n"), inv)
    assert str(caught.value).startswith("job.yaml:4: spares: 2 spare host(s) asked but 1 selected beyond the job's 3")


def test_nnodes_min_max_runs_on_fewer_hosts_when_fewer_are_selected(inv: Inventory) -> None:
    chosen, spares = select_with_spares(job("nnodes: '2:3'\n"), inv, HostSelection(nodes=("node0,node1",)))
    assert (names(chosen), spares) == (["node0", "node1"], [])
    with pytest.raises(SpecError, match="2 nodes requested but only 1 selected"):
        select_with_spares(job("nnodes: '2:3'\n"), inv, HostSelection(nodes=("node0",)))
