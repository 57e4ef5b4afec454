"""Host ranges read as clush and pdsh write them, checked against `fold_hosts`, their inverse."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from orchestrator.console.display import fold_hosts
from orchestrator.spec.hostrange import MAX_HOSTS, HostRangeError, expand_hosts


@pytest.mark.parametrize(("text", "names"), [
    ("node0", ["node0"]),
    ("node[0-2]", ["node0", "node1", "node2"]),
    ("node[0-7,12]", [f"node{i}" for i in range(8)] + ["node12"]),
    ("node[0-3],gpu-b", ["node0", "node1", "node2", "node3", "gpu-b"]),
    ("gpu[08-10]", ["gpu08", "gpu09", "gpu10"]),
    ("gpu[1-2]-ib", ["gpu1-ib", "gpu2-ib"]),
    ("r[1-2]n[1-2]", ["r1n1", "r1n2", "r2n1", "r2n2"]),
    ("node[1,1-2],node1", ["node1", "node2"]),
    (" node[0-1] , login ", ["node0", "node1", "login"]),
])
def test_ranges_expand_to_the_names_in_the_order_written(text: str, names: list[str]) -> None:
    assert expand_hosts(text) == names


@pytest.mark.parametrize(("text", "why"), [
    ("node[0-2", "'[' without ']'"),
    ("node0-2]", "']' without '['"),
    ("node[[0]]", "'[' inside a bracket"),
    ("node[]", "an empty bracket"),
    ("node[a-b]", "'a-b' in a bracket is not a number or a range"),
    ("node[5-3]", "the range '5-3' runs backwards (write 3-5)"),
    ("node0,,node1", "an empty name"),
    ("node0,", "an empty name"),
    (f"node[0-{MAX_HOSTS}]", f"more than {MAX_HOSTS} host names"),
])
def test_malformed_ranges_say_what_is_wrong(text: str, why: str) -> None:
    with pytest.raises(HostRangeError) as caught:
        expand_hosts(text)
    assert why in str(caught.value)


NAME = st.builds(
    lambda prefix, number, width, suffix: f"{prefix}{str(number).zfill(width)}{suffix}",
    st.sampled_from(["node", "gpu", "rack1-n", "a"]), st.integers(0, 120), st.integers(0, 3),
    st.sampled_from(["", "-ib", ".lab"]),
) | st.sampled_from(["login", "gpu-b", "head.lab"])


@given(st.lists(NAME, min_size=1, max_size=40))
def test_expanding_a_folded_set_gives_the_same_names(names: list[str]) -> None:
    assert sorted(expand_hosts(fold_hosts(names))) == sorted(set(names))


@given(st.lists(NAME, min_size=1, max_size=40))
def test_folding_is_stable_through_expansion(names: list[str]) -> None:
    folded = fold_hosts(names)
    assert fold_hosts(expand_hosts(folded)) == folded
