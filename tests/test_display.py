"""Host ranges and clush-style gathering of identical output."""

from __future__ import annotations

import pytest

from orchestrator.console.display import Block, HostOutput, failure_summary, fold_hosts, gather, render_blocks


@pytest.mark.parametrize(
    ("names", "folded"),
    [
        ([], ""),
        (["node0"], "node0"),
        (["node0", "node1", "node2"], "node[0-2]"),
        (["node2", "node0", "node1"], "node[0-2]"),
        (["node0", "node1", "node2", "node5"], "node[0-2,5]"),
        (["node0", "node2", "node4"], "node[0,2,4]"),
        (["node9", "node10", "node11"], "node[9-11]"),
        (["node1", "node1", "node2"], "node[1-2]"),
        (["gpu08", "gpu09", "gpu10"], "gpu[08-10]"),
        (["gpu1", "gpu01"], "gpu[01,1]"),
        (["rack1-n3", "rack1-n4"], "rack1-n[3-4]"),
        (["gpu1-ib", "gpu2-ib"], "gpu[1-2]-ib"),
        (["login", "node1", "node0"], "login,node[0-1]"),
        (["node0", "gpu0", "gpu1"], "gpu[0-1],node0"),
        (["localhost"], "localhost"),
    ],
)
def test_fold_hosts_builds_clustershell_ranges(names: list[str], folded: str) -> None:
    assert fold_hosts(names) == folded


def test_fold_hosts_keeps_sixteen_hosts_in_one_range() -> None:
    assert fold_hosts(f"node{i}" for i in range(16)) == "node[0-15]"


def test_identical_output_is_gathered_into_one_block() -> None:
    same = HostOutput(("same",))
    blocks = gather({"node0": same, "node1": same, "node2": same})
    assert blocks == [Block(("node0", "node1", "node2"), same)]
    assert render_blocks(blocks) == "---------------\nnode[0-2] (3)\n---------------\nsame\n"


def test_same_lines_with_different_status_stay_apart() -> None:
    blocks = gather({
        "node0": HostOutput(("same",)),
        "node1": HostOutput(("same",), "exit code 4"),
        "node2": HostOutput(("same",)),
    })
    assert [b.header() for b in blocks] == ["node[0,2] (2)", "node1 (1): exit code 4"]


def test_blocks_follow_the_order_of_their_first_host() -> None:
    blocks = gather({"b1": HostOutput(("x",)), "a0": HostOutput(("y",)), "a1": HostOutput(("x",))})
    assert [b.hosts for b in blocks] == [("b1", "a1"), ("a0",)]


def test_blocks_without_lines_are_not_printed() -> None:
    blocks = gather({"node0": HostOutput(), "node1": HostOutput(("hello",))})
    assert render_blocks(blocks) == "---------------\nnode1 (1)\n---------------\nhello\n"
    assert render_blocks(gather({"node0": HostOutput()})) == ""


def test_failure_summary_folds_hosts_that_failed_alike() -> None:
    summary = failure_summary({"node1": "exit code 1", "node2": "exit code 1", "node5": "unreachable"}, 8)
    assert summary == "3 of 8 hosts failed: node[1-2] (exit code 1), node5 (unreachable)"


def test_failure_summary_is_empty_when_nothing_failed() -> None:
    assert failure_summary({}, 3) == ""


def test_failure_summary_says_host_for_one() -> None:
    assert failure_summary({"localhost": "timed out"}, 1) == "1 of 1 host failed: localhost (timed out)"
