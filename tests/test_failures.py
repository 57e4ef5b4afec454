"""Failures as data, and the choice of the root cause: pure, no cluster."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from orchestrator.diagnose.failures import (
    AT_EXIT,
    STOPPED_BY_DISTRUN,
    Failure,
    FailureKind,
    failed_summary,
    is_collateral,
    other_hosts_line,
    root_cause,
)

RESET = ("[rank0]: RuntimeError: [gloo] Connection reset by peer",)
RAISED = ("Traceback (most recent call last):", "RuntimeError: deliberate failure on rank 3")


def exit_failure(host: str, at: float, code: int = 1, rank: int | None = None,
                 lines: tuple[str, ...] = RAISED) -> Failure:
    return Failure(host, FailureKind.EXIT, rank=rank, exit_code=code, last_lines=lines, time=at)


def test_the_earliest_failure_is_the_root_cause_when_none_is_an_echo():
    failures = [exit_failure("node0", 10.4, rank=0), exit_failure("node1", 10.1, rank=3),
                exit_failure("node2", 10.2, rank=5)]
    assert root_cause(failures).host == "node1"


def test_a_lost_host_is_blamed_over_the_earlier_connection_resets_it_caused():
    failures = [exit_failure("node0", 3.0, rank=0, lines=RESET), exit_failure("node1", 3.1, rank=2, lines=RESET),
                Failure("node2", FailureKind.LOST, reason="host lost: nothing heard for 15 s", time=15.0)]
    cause = root_cause(failures)
    assert cause.host == "node2" and cause.kind is FailureKind.LOST


def test_a_process_killed_by_a_signal_is_blamed_over_an_exit_code_seen_at_the_same_moment():
    failures = [exit_failure("node0", 7.0, rank=0, lines=("RuntimeError: gloo timeout",)),
                Failure.from_returncode("node1", -9, rank=2, time=7.0)]
    cause = root_cause(failures)
    assert cause.host == "node1" and cause.describe() == "killed by SIGKILL (out of memory?)"


def test_a_rank_ended_by_sigterm_is_an_echo_and_the_exit_code_elsewhere_is_blamed():
    failures = [Failure.from_returncode("node0", -15, rank=0, time=1.0), exit_failure("node1", 2.0, rank=3)]
    assert is_collateral(failures[0])
    assert root_cause(failures).host == "node1"


def test_a_failure_seen_after_distrun_stopped_its_host_is_an_echo_whatever_its_lines_say():
    stopped = Failure.from_returncode("node0", 1, rank=0, time=1.0, last_lines=RAISED, stopped=True)
    assert is_collateral(stopped) and not is_collateral(replace(stopped, stopped=False))
    assert root_cause([stopped, exit_failure("node1", 2.0, rank=3)]).host == "node1"


def test_a_supervisor_ended_by_a_signal_is_an_echo_and_the_rank_that_failed_elsewhere_is_blamed():
    """Slurm ends a step's other tasks once one failed: that host's supervisor may report first."""
    ended = Failure("node0", FailureKind.INFRA, reason="its supervisor ended the job: supervisor got signal 15",
                    time=1.0, stopped=True)
    assert is_collateral(ended) and not is_collateral(replace(ended, stopped=False))
    assert root_cause([ended, exit_failure("node1", 1.4, rank=3)]).host == "node1"
    assert root_cause([replace(ended, stopped=False), exit_failure("node1", 1.4, rank=3)]).host == "node0", (
        "a heartbeat gone silent is no echo")


def test_distruns_own_words_in_a_hosts_lines_do_not_make_its_failure_an_echo():
    """Whether distrun stopped a host is a field (`stopped`), not a phrase searched in its lines."""
    words = ("distrun: job processes ended (stopped by the controller); 0 needed SIGKILL",
             "its supervisor ended the job: controller heartbeat silent for more than 4 s")
    assert not is_collateral(exit_failure("node0", 1.0, rank=0, lines=words))


def test_when_every_failure_is_an_echo_the_earliest_is_blamed():
    failures = [exit_failure("node0", 5.0, lines=RESET), exit_failure("node1", 4.0, lines=RESET)]
    assert root_cause(failures).host == "node1"


def test_simultaneous_failures_of_one_kind_blame_the_first_host_given():
    failures = [exit_failure("node3", 1.0), exit_failure("node1", 1.0)]
    assert root_cause(failures).host == "node3"


def test_root_cause_of_nothing_is_an_error():
    with pytest.raises(ValueError):
        root_cause([])


def test_a_failure_survives_its_dict_and_json():
    failure = Failure("node1", FailureKind.SIGNAL, rank=3, signal="SIGSEGV", address="10.0.0.11",
                      last_lines=("a", "b"), time=1700000000.5, after_final=True, barrier_hosts=("node0",),
                      message="ValueError: boom", traceback=("Traceback (most recent call last):", "ValueError: boom"),
                      stopped=True)
    data = json.loads(json.dumps(failure.to_dict()))
    assert data["kind"] == "signal" and data["signal"] == "SIGSEGV" and data["last_lines"] == ["a", "b"]
    assert data["after_final"] is True and data["barrier_hosts"] == ["node0"]
    assert Failure.from_dict(data) == failure


def test_from_dict_refuses_an_unknown_kind():
    with pytest.raises(ValueError):
        Failure.from_dict({"host": "node0", "kind": "meltdown"})


def test_render_leads_with_host_rank_and_exit_then_the_last_lines():
    failure = exit_failure("node1", 1.0, rank=3)
    failure = Failure(**{**failure.__dict__, "address": "10.0.0.11"})
    assert failure.render().splitlines() == [
        "  host: node1 (10.0.0.11)", "  rank: 3", "  exit: exit code 1", "  last 2 lines of rank 3:",
        "    Traceback (most recent call last):", "    RuntimeError: deliberate failure on rank 3"]


def test_render_says_the_ranks_exception_in_a_line_when_it_recorded_one():
    failure = replace(exit_failure("node1", 1.0, rank=3), message="RuntimeError: deliberate failure on rank 3")
    assert failure.render().splitlines()[:4] == [
        "  host: node1", "  rank: 3", "  exit: exit code 1", "  error: RuntimeError: deliberate failure on rank 3"]


def test_a_rank_that_died_after_the_final_line_says_so_and_names_the_hosts_stopped_in_the_barrier():
    failure = Failure("node1", FailureKind.SIGNAL, rank=3, signal="SIGABRT", last_lines=("step 10/10",),
                      after_final=True, barrier_hosts=("node0", "node2"))
    assert failure.render().splitlines() == [
        "  host: node1", "  rank: 3", "  exit: killed by SIGABRT",
        "  when: at exit, after the job's final metrics line (its work was done)",
        "  finished: every rank of node[0,2] had exited; distrun stopped those hosts in torchrun's exit barrier",
        "  last 1 lines of rank 3:", "    step 10/10"]


def test_a_lost_host_renders_its_reason_not_an_exit():
    failure = Failure("node2", FailureKind.LOST, reason="connection to the host closed")
    assert failure.render().splitlines() == ["  host: node2", "  reason: connection to the host closed",
                                             "  last lines of node2: none arrived before it was lost"]
    assert failure.brief() == "node2: connection to the host closed"


def test_brief_says_exit_code_once():
    failure = Failure("node1", FailureKind.EXIT, rank=3, exit_code=1, address="10.0.0.11")
    assert failure.brief() == "node1 (10.0.0.11) rank 3: exit code 1"


def test_hosts_that_ended_alike_are_folded_into_one_range():
    line = other_hosts_line({"node0": STOPPED_BY_DISTRUN, "node2": STOPPED_BY_DISTRUN, "node3": "exit code 1"})
    assert line == "Other hosts: node[0,2]: stopped by distrun, node3: exit code 1"
    assert other_hosts_line({}) == ""


def test_the_failed_summary_has_the_title_the_block_and_the_other_hosts():
    text = failed_summary("j-1", Failure("node1", FailureKind.EXIT, exit_code=2), {"node0": STOPPED_BY_DISTRUN})
    assert text.splitlines() == ["job j-1 FAILED", "Root Cause (first observed failure):", "  host: node1",
                                 "  exit: exit code 2", "Other hosts: node0: stopped by distrun"]


def test_a_host_whose_address_is_its_name_is_named_once() -> None:
    local = Failure(host="localhost", address="localhost", rank=1, kind=FailureKind.EXIT, exit_code=1)
    remote = Failure(host="node1", address="10.0.0.11", rank=3, kind=FailureKind.EXIT, exit_code=1)
    assert local.brief().startswith("localhost rank 1: ")
    assert "  host: localhost" in local.render().splitlines()
    assert remote.brief().startswith("node1 (10.0.0.11) rank 3: ")


def test_a_failure_no_evidence_ties_to_a_host_names_none_and_keeps_that_through_the_record():
    hang = Failure("", FailureKind.HANG, reason="hang: no progress from any rank for 15 s; unknown: every rank "
                                               "silent, no stacks", stack=("to find the stuck rank: install py-spy",))
    lines = hang.render().splitlines()
    assert lines[0] == "  host: unknown (distrun cannot tell which host is at fault)"
    assert not any("node" in line for line in lines)
    assert hang.brief().startswith("unknown: hang")
    assert Failure.from_dict(json.loads(json.dumps(hang.to_dict()))) == hang


def test_a_crash_at_exit_is_said_at_the_top_of_a_failed_summary_and_kept_as_when():
    crash = Failure("node1", FailureKind.SIGNAL, rank=1, signal="SIGABRT", last_lines=("done",), when=AT_EXIT)
    lines = failed_summary("j-1", crash, {"node0": STOPPED_BY_DISTRUN}).splitlines()
    assert lines[:3] == ["job j-1 FAILED",
                         "the work finished on every rank; rank 1 crashed at interpreter exit (SIGABRT)",
                         "Root Cause (first observed failure):"]
    assert crash.to_dict()["when"] == "at exit" and Failure.from_dict(crash.to_dict()) == crash
    plain = failed_summary("j-1", replace(crash, when=""), {}).splitlines()
    assert plain[1] == "Root Cause (first observed failure):"


def test_a_summary_under_lines_just_shown_on_the_screen_does_not_repeat_them() -> None:
    failure = Failure("node1", FailureKind.EXIT, rank=3, exit_code=1,
                      last_lines=("Traceback (most recent call last):", "ValueError: planted"))
    said = failed_summary("j-1", failure, {"node0": "exit code 1"}, above=True).splitlines()
    assert "    ValueError: planted" not in said
    assert "  last 2 lines of rank 3: shown above (not repeated here)" in said
    assert "    ValueError: planted" in failed_summary("j-1", failure, {}).splitlines(), "the record keeps them"
