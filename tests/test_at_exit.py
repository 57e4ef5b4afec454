"""A rank that crashes at interpreter exit after its work is done: the verdict's rule
(orchestrator/diagnose/at_exit.py), pure and end to end on this machine (the local backend, real torchrun, 2 ranks)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from orchestrator.diagnose.at_exit import neighbours_finished, when_failed
from orchestrator.diagnose.failures import AT_EXIT, Failure, FailureKind
from orchestrator.remote.workerfail import from_process_failure
from tests.helpers import REPO, distrun

SCRIPT = REPO / "tests" / "cluster" / "jobs" / "abort_after_last_line.py"
ABORTED = Failure("node1", FailureKind.SIGNAL, rank=1, signal="SIGABRT", last_lines=("rank 1: all done",))
# torchrun 2.13's records of a real run whose rank 1 was SIGKILLed while rank 0 still ran: torchrun
# stopped rank 0 (SIGTERM) and recorded it too; alone, rank 1's record is the only one.
STOPPED_ONE = [from_process_failure(row["rank"], row) for row in
               json.loads((REPO / "tests/data/torchrun/failures-kill.json").read_text())["failures"]]
ALONE = STOPPED_ONE[:1]


@pytest.mark.parametrize(("failure", "others", "when"), [
    (ABORTED, True, AT_EXIT),
    (ABORTED, False, ""),  # another rank was still running, or failed
    (Failure("node1", FailureKind.SIGNAL, rank=1, signal="SIGABRT",
             last_lines=("Traceback (most recent call last):", "  raise RuntimeError")), True, ""),
    (Failure("node1", FailureKind.SIGNAL, rank=1, signal="SIGTERM"), True, ""),  # a teardown's signal
    (Failure("node1", FailureKind.EXIT, rank=1, exit_code=1), True, ""),
    (Failure("node1", FailureKind.SIGNAL, signal="SIGABRT"), True, ""),  # no rank known
])
def test_only_a_ranks_crash_without_a_traceback_after_every_other_rank_exited_0_is_at_exit(
        failure: Failure, others: bool, when: str) -> None:
    assert when_failed(failure, others) == when


def test_the_other_ranks_of_the_crashed_ranks_host_finished_only_when_torchrun_recorded_no_other():
    assert neighbours_finished(1, 0, [])
    assert [w.rank for w in ALONE] == [1] and neighbours_finished(2, 1, ALONE)
    assert not neighbours_finished(2, 1, STOPPED_ONE)
    assert not neighbours_finished(2, 1, [])  # torchrun's records did not arrive: no evidence


def launch_abort(tmp_path: Path, *args: str, nproc: int = 2) -> tuple[int, str, dict]:
    home = tmp_path / "home"
    job = tmp_path / "abort.yaml"
    job.write_text(f"name: abort\nscript: {SCRIPT}\nnproc_per_node: {nproc}\nenv: {{OMP_NUM_THREADS: '1'}}\n"
                   "stop_grace: 2\n")
    result = distrun("launch", str(job), "--backend", "local", "--no-live", "--", *args, home=home, timeout=120)
    rec = json.loads(distrun("ps", "--json", home=home).stdout)[0]
    return result.returncode, result.stdout + result.stderr, rec


def test_a_rank_aborting_after_its_last_line_while_the_other_exited_0_is_a_crash_at_exit_and_still_failed(tmp_path):
    code, out, rec = launch_abort(tmp_path, "--abort-rank", "1", "--delay", "3")
    assert code == 1, out[-3000:]
    summary = out[out.index(f"job {rec['id']} FAILED"):].splitlines()
    assert summary[1] == "the work finished on every rank; rank 1 crashed at interpreter exit (SIGABRT)", summary
    assert (rec["state"], rec["exit_code"]) == ("failed", 1)
    root = rec["failures"][0]
    assert (root["rank"], root["signal"], root["when"]) == (1, "SIGABRT", "at exit")


def test_a_rank_aborting_while_another_still_runs_is_not_called_a_crash_at_exit(tmp_path):
    code, out, rec = launch_abort(tmp_path, "--abort-rank", "1", "--delay", "1", "--others-wait", "30")
    assert code == 1, out[-3000:]
    assert "crashed at interpreter exit" not in out
    root = rec["failures"][0]
    assert (root["rank"], root["signal"], root["when"]) == (1, "SIGABRT", "")


def test_the_only_rank_of_a_job_killed_without_its_final_metrics_line_is_not_called_a_crash_at_exit(tmp_path):
    # One rank and no other to witness that the work was done: a signal after its last line is
    # a kill mid-run (seen on a lent GPU: a group's worker SIGKILLed at step 6 of 12).
    code, out, rec = launch_abort(tmp_path, "--abort-rank", "0", "--delay", "1", nproc=1)
    assert code == 1, out[-3000:]
    assert "crashed at interpreter exit" not in out
    root = rec["failures"][0]
    assert (root["rank"], root["signal"], root["when"]) == (0, "SIGABRT", "")
