"""Choosing a job's nodes from an inventory: names, labels, nnodes, and errors that point at the right place."""

from __future__ import annotations

import pytest

from orchestrator.errors import SpecError, UsageError
from orchestrator.spec import Inventory, JobSpec, inventory_from_text, job_from_text, select_nodes

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
    assert names(select_nodes(job("select: {names: [node3]}\n"), inv, names=["node2", "node0"])) == ["node0", "node2"]


def test_nnodes_takes_the_first_selected_nodes(inv: Inventory) -> None:
    assert names(select_nodes(job("nnodes: 2\n"), inv)) == ["node0", "node1"]


def test_cli_nnodes_overrides_the_job_nnodes(inv: Inventory) -> None:
    assert names(select_nodes(job("nnodes: 2\n"), inv, nnodes=3)) == ["node0", "node1", "node2"]


def test_job_nnodes_above_the_selection_points_at_the_nnodes_line(inv: Inventory) -> None:
    with pytest.raises(SpecError) as caught:
        select_nodes(job("select: {labels: [ib]}\nnnodes: 3\n"), inv)
    assert str(caught.value) == (
        "job.yaml:4: nnodes: 3 nodes requested but only 2 selected (node0, node3) "
        "(lower nnodes, or select more nodes with --nodes, select or the inventory)"
    )


def test_cli_nnodes_above_the_selection_is_a_usage_error(inv: Inventory) -> None:
    with pytest.raises(UsageError) as caught:
        select_nodes(job(), inv, names=["node1"], nnodes=2)
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
        select_nodes(job(), inv, names=["nodee2"])
    assert not isinstance(caught.value, SpecError)
    assert str(caught.value) == "--nodes: unknown node 'nodee2' in inventory inv.yaml (did you mean 'node2'?)"


def test_named_node_without_a_required_label_is_refused(inv: Inventory) -> None:
    with pytest.raises(UsageError) as caught:
        select_nodes(job("select: {labels: [h100]}\n"), inv, names=["node2"])
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
