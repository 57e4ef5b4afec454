"""doctor --links without hosts: the rounds' shifts, each host's best rates, who is slow, the check's row."""

from __future__ import annotations

from orchestrator.doctor.links import LinkReport, Pair, links_check, render_links, shifts
from orchestrator.hostcheck.checks import Status

MB = 1_000_000
HOSTS = ("node0", "node1", "node2", "node3")


def ring(rates: dict[str, float], report_shifts: tuple[int, ...] = (1, 2)) -> LinkReport:
    """Every round of a ring of HOSTS, each pair carrying its sender's rate for one second."""
    pairs = [Pair(sender, HOSTS[(i + shift) % len(HOSTS)], number, int(rates[sender]), 1.0)
             for number, shift in enumerate(report_shifts) for i, sender in enumerate(HOSTS)]
    return LinkReport(HOSTS, report_shifts, pairs)


def test_the_rounds_grow_as_the_log_of_the_hosts() -> None:
    assert [shifts(n) for n in (1, 2, 3, 4, 16)] == [(), (1,), (1, 2), (1, 2), (1, 2, 4, 8)]
    assert len(shifts(64)) == 6


def test_a_host_that_sends_slowly_is_named_and_its_receivers_are_not() -> None:
    report = ring({"node0": 400 * MB, "node1": 420 * MB, "node2": 6 * MB, "node3": 390 * MB})
    slow = report.slow()
    assert list(slow) == ["node2"]
    assert slow["node2"] == "sends 6.0 MB/s against the median 395.0 MB/s"
    check = links_check(report)
    assert check.status is Status.ERROR and check.hosts == ["node2"] and "tc qdisc show" in check.hint


def test_healthy_hosts_that_differ_by_a_factor_of_three_are_all_ok() -> None:
    check = links_check(ring({"node0": 400 * MB, "node1": 150 * MB, "node2": 300 * MB, "node3": 390 * MB}))
    assert check.status is Status.OK and "medians over 2 round(s)" in check.detail


def test_a_host_that_did_not_take_part_is_named_with_why() -> None:
    report = LinkReport(HOSTS[:3], (1,), [Pair("node0", "node1", 0, 5 * MB, 1.0),
                                          Pair("node1", "node0", 0, 5 * MB, 1.0)],
                        failed={"node2": "node2 (10.0.0.12:22): connection refused"})
    check = links_check(report)
    assert check.status is Status.ERROR and check.hosts == ["node2"] and "connection refused" in check.detail


def test_a_pair_that_could_not_connect_names_its_sender() -> None:
    pairs = [*ring({h: 100 * MB for h in HOSTS}, (1,)).pairs[:3],
             Pair("node3", "node0", 0, 0, 0.0, "sending to 10.0.0.10:4000: timed out")]
    check = links_check(LinkReport(HOSTS, (1,), pairs))
    assert check.status is Status.ERROR and "node3" in check.hosts and "timed out" in check.detail


def test_the_table_marks_the_slow_host() -> None:
    table = render_links(ring({"node0": 400 * MB, "node1": 420 * MB, "node2": 6 * MB, "node3": 390 * MB}))
    assert [line[:5] for line in table.splitlines() if "✗" in line] == ["node2"]
