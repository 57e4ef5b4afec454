"""A rank's own error where torchrun's record has none, and records that cannot be read (issue 46:
5, 9, 15, 18): a worker's malformed error file (real torchrun through distrun's program), the
exception a rank's output ends with (no `@record`), a rank that had raised when the stop reached
its host (the shipped supervisor, real torchrun), and a controller that failed on its own."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from orchestrator import remote
from orchestrator.backends.base import LaunchRequest
from orchestrator.backends.ssh import SUPERVISOR_ONLY
from orchestrator.remote.stream import EVENT, STDERR, Batch
from orchestrator.remote.workerfail import WorkerRecord, final_exception, first_failure, raised_workers, read_records
from orchestrator.run import attempt, launch
from orchestrator.store import JobState, Store
from tests.helpers import REPO, wait_for
from tests.test_failure_records import TORCHRUN, exit_event, first_of, host_run, run_torchrun
from tests.test_supervisor_lifecycle import config, decode

DATA = Path(__file__).parent / "data" / "torchrun"
GLOO = "RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer [10.0.0.12]:4130"
TRACEBACK = ("Traceback (most recent call last):", '  File "/w/train.py", line 40, in <module>', "    main()",
             '  File "/w/train.py", line 31, in main', "    loss = ddp(batch).sum()", GLOO)
# torchrun's record of a worker without `@record` that exited 1 (failures-exit.json's shape).
NO_RECORD = {"rank": 1, "local_rank": 1, "pid": 4242, "exitcode": 1, "timestamp": 1795656817.0, "traceback": "",
             "message": "To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html"}


# ---------------------------------------------------------------- 5: a malformed error file


@pytest.mark.parametrize("kind", ["truncated-error-file", "misshapen-error-file"])
def test_a_workers_malformed_error_file_is_set_aside_and_the_worker_recorded_with_its_exit_code_and_time(
        tmp_path, kind):
    """torch elastic's own reader raised on it and torchrun crashed with no record of the worker."""
    first = first_of(run_torchrun(TORCHRUN, kind, tmp_path))
    assert (first.rank, first.exitcode, first.traceback) == (1, 1, "")
    aside = list((tmp_path / "logs").glob("*/attempt_0/1/error.json.malformed"))
    assert len(aside) == 1 and not list((tmp_path / "logs").glob("*/attempt_0/1/error.json"))
    assert first.timestamp == int(aside[0].stat().st_mtime)  # when the rank wrote it, not when torchrun saw it


def test_a_record_file_with_one_bad_row_keeps_the_others(tmp_path):
    path = tmp_path / "failures.json"
    path.write_text(json.dumps({"failures": [{"rank": 4, "message": {"extraInfo": "x"}}, NO_RECORD]}))
    assert [(r.rank, r.exitcode) for r in read_records(str(path))] == [(1, 1)]
    path.write_text(json.dumps({"failures": [{**NO_RECORD, "message": {"message": "E", "extraInfo": "not a dict"}}]}))
    assert read_records(str(path))[0].message == "E"


# ---------------------------------------------------------------- the exception a rank's output ends with


@pytest.mark.parametrize(("lines", "message"), [
    (TRACEBACK, GLOO),
    (TRACEBACK[2:], GLOO),  # the traceback's head is out of view: its frames still say it is one
    ([f"[rank4]: {line}" for line in TRACEBACK], GLOO),  # torch's excepthook prefix
    ((*TRACEBACK[:-1], "ValueError: planted", "", "[W1128 05:01:02.000 ProcessGroupGloo.cpp:1] warning",
      "terminate called without an active exception"), "ValueError: planted"),
    ((*TRACEBACK[:-1], "torch.distributed.DistBackendError: store get failed",
      "Exception raised from recvBytes at Utils.hpp:678 (most recent call first):", "frame #0: c10::Error + 0x96"),
     "torch.distributed.DistBackendError: store get failed"),
    ((*TRACEBACK, "epoch 9 | loss 0.3"), None),  # a logged traceback, then more work
    (("epoch 8 | loss 0.4", "Note: done"), None),  # no frames above it
    ((), None),
])
def test_the_exception_a_ranks_output_ends_with(lines, message):
    raised = final_exception(lines)
    assert (raised and raised[0]) == message or (raised is None and message is None)
    if raised:
        assert raised[1][-1] == message and raised[1][0].startswith(("Traceback", "  File", "    "))


def write_rank(log_dir: Path, local: int, stderr: str | None = None, error: str | None = None) -> Path:
    rank_dir = log_dir / "run_x" / "attempt_0" / str(local)
    rank_dir.mkdir(parents=True)
    if stderr is not None:
        (rank_dir / "stderr.log").write_text(stderr)
    if error is not None:
        (rank_dir / "error.json").write_text(error)
    return rank_dir


def test_a_rank_that_raised_without_record_or_with_an_unreadable_error_file_has_raised(tmp_path):
    write_rank(tmp_path, 0, stderr="step 1\n" + "\n".join(TRACEBACK) + "\n")  # no @record: its traceback
    write_rank(tmp_path, 1, stderr="step 1\n", error='{"message": {"mess')  # @record's file, half written
    write_rank(tmp_path, 2, stderr="\n".join(TRACEBACK) + "\nstep 2\n")  # logged, then went on
    write_rank(tmp_path, 3, error=(DATA / "error-raise.json").read_text())

    raised = {w.rank: w for w in raised_workers(str(tmp_path), lambda _restart, local: local)}

    assert sorted(raised) == [0, 1, 3]
    assert raised[0].message == GLOO and raised[0].traceback.startswith("Traceback") and raised[0].timestamp > 1.7e9
    assert (raised[1].message, raised[1].exitcode) == ("", 1) and raised[1].timestamp > 1.7e9
    assert raised[3].message == "ValueError: rank 1 says boom"


# ---------------------------------------------------------------- 18 and 15: the controller's side


def test_a_root_cause_without_record_takes_its_error_from_the_traceback_its_rank_ended_with(tmp_path):
    host = host_run(tmp_path)
    for line in ("epoch 7 | loss 0.5", *TRACEBACK[:-1], "ValueError: planted"):
        host.sink.batch("node1", Batch(1, STDERR, 1, f"{line}\n".encode()))
    failure = exit_event(host, rc=1, workers=[NO_RECORD]).failure(60.0)
    assert (failure.rank, failure.describe(), failure.message) == (1, "exit code 1", "ValueError: planted")
    assert "  error: ValueError: planted" in failure.render() and failure.traceback[-1] == "ValueError: planted"


def test_a_root_cause_seen_before_its_traceback_arrived_is_retold_with_it(tmp_path):
    """torchrun's records (the `failing` event) go ahead of the rank's queued lines."""
    host = host_run(tmp_path)
    host.on_data(EVENT + json.dumps({"ev": "failing", "workers": [NO_RECORD]}).encode() + b"\n")
    early = host.failure(60.0)
    assert (early.rank, early.message) == (1, "")
    for line in (*TRACEBACK[:-1], "ValueError: planted"):
        host.sink.batch("node1", Batch(1, STDERR, 1, f"{line}\n".encode()))
    told = host.retold(early)
    assert (told.message, told.last_lines[-1], told.time) == ("ValueError: planted", "ValueError: planted", early.time)


def test_a_host_whose_rank_failed_before_the_stop_without_record_says_so_with_its_own_error(tmp_path):
    host = host_run(tmp_path)
    host.stop_sent = True
    for line in TRACEBACK:
        host.sink.batch("node1", Batch(1, STDERR, 1, f"{line}\n".encode()))
    exit_event(host, rc=1, workers=[NO_RECORD], stop_cause="controller")
    assert host.end() == "failed as a consequence (rank 1: RuntimeError: Connection closed by peer [10.0.0.12]:4130)"


SLOW_TO_EXIT = """
import atexit, os, sys, time
if os.environ["LOCAL_RANK"] == "1":
    atexit.register(time.sleep, 30)  # a rank that has raised can take seconds to exit under load
    print("step 1", flush=True)
    raise RuntimeError("Connection closed by peer [10.0.0.12]:4130")
time.sleep(30)
"""


def test_the_stop_finds_the_rank_that_had_raised_without_record_and_the_host_says_it_failed_itself(tmp_path):
    """The shipped supervisor, real torchrun: rank 1 raised (no `@record`), its process still exiting when
    the controller's stop comes. Its traceback on stderr is the evidence."""
    script = tmp_path / "slow_to_exit.py"
    script.write_text(SLOW_TO_EXIT)
    argv = [*TORCHRUN, "--standalone", "--nproc-per-node", "2", "--redirects", "3", str(script)]
    cfg = config(tmp_path, argv, heartbeat_timeout=60.0)
    ended = stop_once(cfg, lambda: _raised_in(tmp_path, cfg))
    assert ended["raised_at_stop"] == [1] and ended["alive_at_stop"], ended
    workers = [WorkerRecord.from_event(w) for w in ended["workers"]]
    first = first_failure(workers)
    assert first is not None and (first.rank, first.message) == (1, "RuntimeError: Connection closed by peer "
                                                                    "[10.0.0.12]:4130")
    host = host_run(tmp_path)
    host.stop_sent = True
    exit_event(host, **ended)
    assert host.end().startswith("failed as a consequence (rank 1: RuntimeError: Connection closed by peer")
    assert not host.failure(60.0).stopped


def stop_once(cfg: dict, ready: Callable[[], bool]) -> dict:
    """Run the shipped supervisor; once `ready()`, send the controller's stop; its exit event."""
    payload = remote.bundle("supervisor", SUPERVISOR_ONLY)
    argv = remote.bootstrap_argv(sys.executable, payload, "distrun-supervisor", cfg["job_id"], cfg["node"])
    with subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE) as proc:
        assert proc.stdin is not None
        proc.stdin.write(payload + json.dumps(cfg).encode() + b"\n")
        proc.stdin.flush()
        assert wait_for(ready, 120, every=0.05), "rank 1 never raised"
        proc.stdin.write(b'{"op": "stop"}\n')
        proc.stdin.flush()
        time.sleep(1.0)
        out, _ = proc.communicate(timeout=60)
    return decode(out)[1][-1]


def _raised_in(tmp_path: Path, cfg: dict) -> bool:
    logs = tmp_path / "host" / "jobs" / cfg["job_id"] / cfg["node"] / "torchrun"
    return any("RuntimeError" in p.read_text() for p in logs.glob("*/attempt_0/1/stderr.log"))


# ---------------------------------------------------------------- 9: the controller's own error


def test_a_job_the_controller_stopped_on_its_own_error_is_recorded_failed_with_that_reason(
        tmp_path, monkeypatch):
    """A controller-side exception (a bad record crashed the stall look, say) stops every host: the
    record says failed and why, and `ps` does not take it for lost."""
    monkeypatch.setenv("DISTRUN_HOME", str(tmp_path / "home"))
    job = tmp_path / "job.yaml"
    script = REPO / "tests" / "cluster" / "jobs" / "abort_after_last_line.py"
    job.write_text(f"name: own\nscript: {script}\nargs: [--delay, '60', --others-wait, '60']\nnproc_per_node: 2\n"
                   "env: {OMP_NUM_THREADS: '1'}\ntelemetry: {enabled: false}\nstop_grace: 2\n")
    calls = []

    def planted(self: attempt.Attempt) -> None:
        calls.append(time.monotonic())
        if len(calls) > 20:
            raise ValueError("planted controller error")

    monkeypatch.setattr(attempt.Attempt, "_follow_rendezvous", planted)
    with pytest.raises(ValueError, match="planted controller error"):
        launch.launch(LaunchRequest(str(job), backend="local", job_id="own-1", live=False, quiet=True,
                                    skip_preflight=True))
    record = Store().get("own-1")
    assert (record.state, record.exit_code) == (JobState.FAILED, 1)
    assert "distrun failed: ValueError: planted controller error" in record.detail
