"""How the other hosts ended after one rank raised (issue 41, part 1), decided from real supervisor
exit events captured on the namespace lab (tests/data/torchrun/planted-raise-exits.json: node1's
rank 3 raised at step 20 of a DDP loop on 3 hosts x 2 ranks), and from torchrun's error files."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from orchestrator.diagnose.ending import Ending, HostEnd, ending, first_line
from orchestrator.diagnose.failures import STOPPED_BY_DISTRUN, is_collateral
from orchestrator.logs import LogSink
from orchestrator.plan import HostPlan
from orchestrator.remote.stream import EVENT
from orchestrator.remote.workerfail import raised_workers
from orchestrator.run.hostrun import HostRun
from orchestrator.store import Store

DATA = Path(__file__).parent / "data" / "torchrun"
CAPTURED = json.loads((DATA / "planted-raise-exits.json").read_text())


def stopped_host(tmp_path: Path, node: str, event: dict[str, Any]) -> HostRun:
    """A host the controller had asked to stop, its supervisor's exit event delivered."""
    plan = HostPlan(node, "10.0.0.10", 0, 2, "python3", "/w", [], {}, [], None)
    host = HostRun(plan, LogSink(Store(tmp_path).job_dir(f"other-{node}")))
    host.stop_sent = True
    host.on_data(EVENT + json.dumps(event).encode() + b"\n")
    return host


@pytest.mark.parametrize("run", ["stopped_while_exiting", "torchrun_alone"])
def test_hosts_whose_ranks_failed_after_the_raise_say_so_with_their_error_and_are_not_in_an_exit_barrier(
        tmp_path, run):
    ends = {node: stopped_host(tmp_path, node, event) for node, event in CAPTURED[run].items()}

    for host in ends.values():
        said = host.end()
        assert said.startswith("failed as a consequence (rank "), said
        assert "Connection closed by peer" in said and "pair.cc" not in said, said
        assert not host.in_exit_barrier
        failure = host.failure(60.0)
        assert failure is not None and not failure.stopped  # it failed before distrun's stop reached it
    assert ends["node0"].end().startswith("failed as a consequence (rank 1: RuntimeError: Connection closed by peer")


def test_a_stop_that_finds_torchrun_alone_with_no_failed_worker_is_its_exit_barrier(tmp_path):
    event = {**CAPTURED["stopped_while_exiting"]["node0"], "workers": [], "raised_at_stop": [], "alive_at_stop": [],
             "workers_at_stop": 0}
    host = stopped_host(tmp_path, "node0", event)
    assert host.in_exit_barrier and host.end() == STOPPED_BY_DISTRUN


def test_a_stop_that_finds_ranks_running_that_had_not_failed_is_distruns(tmp_path):
    event = {**CAPTURED["stopped_while_exiting"]["node2"], "workers": [], "raised_at_stop": []}
    host = stopped_host(tmp_path, "node2", event)
    assert host.end() == STOPPED_BY_DISTRUN and not host.in_exit_barrier
    assert ending(HostEnd((), event["alive_at_stop"])) is Ending.STOPPED


def test_a_worker_torchrun_stopped_when_distruns_stop_came_is_not_its_own_failure(tmp_path):
    event = dict(CAPTURED["stopped_while_exiting"]["node0"])
    event["raised_at_stop"] = []
    event["workers"] = [{**w, "pid": event["alive_at_stop"][0], "exitcode": -15} for w in event["workers"]]
    host = stopped_host(tmp_path, "node0", event)
    assert host.end() == STOPPED_BY_DISTRUN
    failure = host.failure(60.0)
    assert failure is not None and failure.stopped and is_collateral(failure)


def test_the_quoted_error_is_the_first_sentence_of_its_first_line_without_source_locations():
    gloo = CAPTURED["torchrun_alone"]["node0"]["workers"][0]["message"]
    assert "pair.cc:553]" in gloo
    assert first_line(gloo).startswith("RuntimeError: Connection closed by peer [")
    assert "typically" not in first_line(gloo)
    assert first_line("ValueError: boom\nmore") == "ValueError: boom"
    assert len(first_line("E: " + "x" * 300)) == 120


def test_the_workers_that_raised_are_read_from_torchruns_error_files_of_its_latest_attempt(tmp_path):
    for attempt, local in (("attempt_0", "0"), ("attempt_1", "1")):
        rank_dir = tmp_path / "run_x" / attempt / local
        rank_dir.mkdir(parents=True)
        shutil.copy(DATA / "error-raise.json", rank_dir / "error.json")
    (tmp_path / "run_x" / "attempt_1" / "0").mkdir()  # a rank that has not raised

    raised = raised_workers(str(tmp_path), lambda restart, local: 10 * restart + local + 4)

    assert [(w.rank, w.local_rank, w.exitcode, w.pid) for w in raised] == [(15, 1, 1, 0)]
    assert raised[0].message == "ValueError: rank 1 says boom" and raised[0].timestamp == 1795656817.0
    assert raised[0].traceback.endswith("ValueError: rank 1 says boom\n")
