"""The restart policy (orchestrator/run/restarts.py): which failures restart a job, which host is set
aside, and on which hosts the next attempt runs."""

from __future__ import annotations

import pytest

from orchestrator.diagnose.failures import Failure, FailureKind
from orchestrator.run.restarts import AttemptHistory, AttemptRecord, after_failure, blames_host, refill, trigger
from orchestrator.spec.model import Restarts

POLICY = Restarts(max=2, backoff=0)
LOST = Failure("node1", FailureKind.LOST, reason="host lost: nothing heard for 6 s", address="10.0.0.11")
EXIT = Failure("node0", FailureKind.EXIT, rank=1, exit_code=1)
SEGV = Failure("node1", FailureKind.SIGNAL, rank=3, signal="SIGSEGV")
TERM = Failure("node1", FailureKind.SIGNAL, rank=3, signal="SIGTERM")
HANG = Failure("node1", FailureKind.HANG, rank=3, reason="hang")
INFRA = Failure("node1", FailureKind.INFRA, reason="its supervisor ended the job: controller heartbeat silent")


@pytest.mark.parametrize(("failure", "name"), [(LOST, "host-lost"), (INFRA, "host-lost"), (EXIT, "rank-failed"),
                                               (SEGV, "rank-failed"), (HANG, "hang")])
def test_each_kind_of_failure_has_its_restarts_on_name(failure: Failure, name: str) -> None:
    assert trigger(failure) == name


@pytest.mark.parametrize(("failure", "blamed"), [(LOST, True), (INFRA, True), (SEGV, True), (TERM, False),
                                                 (EXIT, False), (HANG, False)])
def test_only_a_lost_host_or_a_rank_killed_by_a_crash_signal_blames_its_host(failure: Failure, blamed: bool) -> None:
    assert blames_host(failure) is blamed


def test_a_lost_host_is_quarantined_and_the_first_spare_takes_its_place_in_its_rank() -> None:
    verdict = after_failure(POLICY, 1, LOST, ["node0", "node1"], ["node2", "node3"], min_hosts=2)
    assert (verdict.hosts, verdict.spares, verdict.quarantined) == (("node0", "node2"), ("node3",), "node1")
    assert verdict.why == "attempt 2 on node[0,2]: node2 in place of node1"


def test_a_rank_that_exits_restarts_on_the_same_hosts_and_keeps_the_spares() -> None:
    verdict = after_failure(POLICY, 1, EXIT, ["node0", "node1"], ["node2"], min_hosts=2)
    assert (verdict.hosts, verdict.spares, verdict.quarantined) == (("node0", "node1"), ("node2",), None)


def test_without_a_spare_the_job_goes_on_with_fewer_hosts_when_min_allows() -> None:
    verdict = after_failure(POLICY, 1, SEGV, ["node0", "node1"], [], min_hosts=1)
    assert (verdict.hosts, verdict.quarantined) == (("node0",), "node1")
    assert "without node1" in verdict.why


def test_without_a_spare_and_no_fewer_hosts_allowed_there_is_no_next_attempt() -> None:
    verdict = after_failure(POLICY, 1, LOST, ["node0", "node1"], [], min_hosts=2)
    assert verdict.hosts is None and verdict.quarantined == "node1"
    assert verdict.why.startswith("no spare host left to take node1's place, and the job needs 2 host(s)")


def test_after_max_restarts_there_is_no_next_attempt() -> None:
    assert after_failure(POLICY, 2, EXIT, ["node0"], [], 1).hosts == ("node0",)
    last = after_failure(POLICY, 3, EXIT, ["node0"], [], 1)
    assert (last.hosts, last.why) == (None, "no restart left: restarts.max is 2")


def test_a_failure_that_restarts_on_does_not_list_ends_the_job() -> None:
    verdict = after_failure(POLICY, 1, HANG, ["node0", "node1"], ["node2"], 2)
    assert (verdict.hosts, verdict.why) == (None, "no restart: hang is not in restarts.on (host-lost, rank-failed)")
    assert after_failure(Restarts(max=1, on=("hang",)), 1, HANG, ["node0"], [], 1).hosts == ("node0",)


def test_an_attempt_history_records_every_attempt_and_lists_them_for_the_summary() -> None:
    history = AttemptHistory(POLICY, min_hosts=2, spares=("node2",))
    history.begin(["node0", "node1"], 29501)
    verdict = history.verdict(LOST)
    assert verdict is not None and verdict.hosts == ("node0", "node2")
    history.end(LOST, verdict.quarantined)
    history.begin(verdict.hosts)
    history.end(None)
    history.end(EXIT)  # a second end keeps the first
    assert history.quarantined == ["node1"]
    assert [AttemptRecord.from_dict(data) for data in history.records()] == history.attempts
    assert history.attempts[0].port == 29501
    lines = history.lines()
    assert lines[0] == "Attempts (2 of at most 3):"
    assert "attempt 1 on node[0-1]" in lines[1] and lines[1].endswith(
        "node1 (10.0.0.11): host lost: nothing heard for 6 s; node1 quarantined")
    assert "attempt 2 on node[0,2]" in lines[2] and lines[2].endswith(": succeeded")


def test_an_attempt_ended_by_a_stop_shows_stopped_not_succeeded() -> None:
    history = AttemptHistory(POLICY, min_hosts=2)
    history.begin(["node0", "node1"])
    history.end(None, state="stopped")
    (attempt,) = history.attempts
    assert attempt.state == "stopped" and attempt.line().endswith(": stopped")
    assert AttemptRecord.from_dict(attempt.to_dict()) == attempt


def test_a_job_that_allows_no_restart_has_no_verdict_and_no_attempt_list() -> None:
    history = AttemptHistory(Restarts(), min_hosts=1)
    history.begin(["node0"])
    assert history.verdict(EXIT) is None
    history.end(EXIT)
    assert history.lines() == []


def test_refill_puts_spares_in_the_place_of_bad_hosts_and_skips_bad_spares() -> None:
    assert refill(["node0", "node2"], {"node2"}, ["node3", "node4"], 2) == (("node0", "node3"), ("node4",))
    assert refill(["node0", "node2"], {"node2", "node3"}, ["node3", "node4"], 2) == (("node0", "node4"), ())
    assert refill(["node0", "node2"], {"node2"}, [], 1) == (("node0",), ())
    assert refill(["node0", "node2"], {"node2"}, [], 2) is None


def test_an_attempt_history_lists_unreachable_spares_with_its_quarantined_hosts() -> None:
    history = AttemptHistory(POLICY, min_hosts=1)
    history.begin(["node0"])
    history.end(SEGV, "node0")
    history.unreachable.append("node1")
    assert history.quarantined == ["node0", "node1"]
