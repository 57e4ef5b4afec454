"""Failures from torchrun's own record: real torchrun runs of a worker that raises, is SIGKILLed or
crashes with SIGSEGV, through distrun_torchrun.py, the records, the supervisor's exit event and the host's
`Failure` built from them; and who stopped a host, as the exit event's `stop_cause`."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from orchestrator import remote
from orchestrator.backends.ssh import SUPERVISOR_ONLY
from orchestrator.diagnose.failures import Failure, FailureKind, is_collateral, own_error
from orchestrator.logs import LogSink
from orchestrator.plan import HostPlan
from orchestrator.remote.distrun_torchrun import records_path
from orchestrator.remote.stream import EVENT, STDERR, Batch
from orchestrator.remote.supervisor import StopCause
from orchestrator.remote.workerfail import (
    WorkerRecord,
    error_message,
    first_failure,
    from_process_failure,
    read_records,
)
from orchestrator.run.hostrun import HostRun
from orchestrator.store import Store
from tests.test_supervisor_lifecycle import config, decode, run_shipped

DATA = Path(__file__).parent / "data" / "torchrun"
WORKER = DATA / "worker.py"
PROGRAM = Path(remote.__file__).parent / remote.TORCHRUN_PROGRAM
TORCHRUN = [sys.executable, "-P", str(PROGRAM)]


def run_torchrun(head: list[str], kind: str, tmp_path: Path, script: Path = WORKER) -> Path:
    """Run a real 1-host, 2-worker torchrun of `script` as distrun's program runs it; the path of its record."""
    logs = tmp_path / "logs"
    argv = [*head, "--log-dir", str(logs), "--standalone", "--nproc-per-node", "2", "--redirects", "3",
            str(script), kind]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1, done.stderr[-2000:]
    return logs / "failures.json"


def first_of(path: Path) -> WorkerRecord:
    first = first_failure(read_records(str(path)))
    assert first is not None, path.read_text() if path.exists() else "no record written"
    return first


@pytest.mark.parametrize(("kind", "exitcode", "signal", "message"), [
    ("raise", 1, None, "ValueError: rank 1 says boom"),
    ("kill", -9, "SIGKILL", "Signal 9 (SIGKILL) received by PID"),
    ("segv", -11, "SIGSEGV", "Signal 11 (SIGSEGV) received by PID"),
    ("exit", 3, None, "To enable traceback see"),
    ("raise-abort", -6, "SIGABRT", "Signal 6 (SIGABRT) received by PID"),
])
def test_a_real_torchrun_records_the_failed_worker_for_each_kind_of_failure(tmp_path, kind, exitcode, signal,
                                                                            message):
    first = first_of(run_torchrun(TORCHRUN, kind, tmp_path))
    assert (first.rank, first.local_rank, first.exitcode, first.signal) == (1, 1, exitcode, signal)
    assert first.message.startswith(message) and first.pid > 0 and first.timestamp > 1.7e9
    assert bool(first.traceback) == (kind == "raise")


def test_the_program_keeps_the_records_without_dash_p_too(tmp_path):
    """Where the host's python may lack -P, the plan runs the program alone: it drops its own
    directory from sys.path itself and keeps the records the same."""
    assert first_of(run_torchrun([sys.executable, str(PROGRAM)], "segv", tmp_path)).signal == "SIGSEGV"


def test_the_records_go_to_the_log_dir_given_as_torchruns_first_option_only():
    assert records_path(["--log-dir", "/d", "--nnodes", "2", "train.py"]) == "/d/failures.json"
    assert records_path(["--nnodes", "2", "train.py", "--log-dir", "/mine"]) is None  # the script's own


def captured(kind: str) -> list[WorkerRecord]:
    rows = json.loads((DATA / f"failures-{kind}.json").read_text())["failures"]
    return [from_process_failure(row["rank"], row) for row in rows]


def test_a_raised_exception_becomes_a_failure_with_its_rank_message_and_traceback():
    failure = Failure.from_worker("node1", first_failure(captured("raise")))
    assert (failure.rank, failure.describe(), failure.message) == (1, "exit code 1", "ValueError: rank 1 says boom")
    assert failure.traceback[0] == "Traceback (most recent call last):" and failure.traceback[-1] == failure.message
    assert "  error: ValueError: rank 1 says boom" in failure.render()


@pytest.mark.parametrize(("kind", "described"), [("kill", "killed by SIGKILL (out of memory?)"),
                                                 ("segv", "killed by SIGSEGV")])
def test_a_worker_killed_by_a_signal_becomes_a_failure_of_that_signal_and_rank(kind, described):
    failure = Failure.from_worker("node1", first_failure(captured(kind)))
    assert (failure.rank, failure.describe(), failure.message, failure.traceback) == (1, described, "", ())
    assert not is_collateral(failure)


def test_a_worker_that_exits_without_raising_gives_its_rank_and_exit_code_and_no_message():
    failure = Failure.from_worker("node1", first_failure(captured("exit")))
    assert (failure.rank, failure.describe(), failure.message, failure.traceback) == (1, "exit code 3", "", ())


# What rank 1 of worker.py's raise-abort printed on stderr (the same real run as failures-raise-abort.json),
# then what gloo's thread prints as it aborts the interpreter's exit.
RAISED_THEN_ABORTED = (*(DATA / "stderr-raise-abort.log").read_text().splitlines(),
                       "terminate called without an active exception")


def test_a_rank_that_raised_then_died_of_sigabrt_at_exit_is_reported_as_its_exception_first(tmp_path):
    """torchrun records only the signal; the exception comes from the rank's own output."""
    host = host_run(tmp_path)
    for line in ("step 1", *RAISED_THEN_ABORTED):
        host.sink.batch("node1", Batch(1, STDERR, 1, f"{line}\n".encode()))
    workers = [record.to_event() for record in captured("raise-abort")]
    failure = exit_event(host, rc=1, workers=workers).failure(60.0)
    assert (failure.rank, failure.kind, failure.signal) == (1, FailureKind.SIGNAL, "SIGABRT")
    assert failure.describe() == "raised RuntimeError: rank 1 says boom, then aborts, then SIGABRT at exit"
    assert failure.traceback[0] == "Traceback (most recent call last):" and failure.traceback[-1] == failure.message
    assert "  exit: raised RuntimeError: rank 1 says boom, then aborts, then SIGABRT at exit" in failure.render()
    assert "error:" not in failure.render()


@pytest.mark.parametrize("lines", [
    ("step 1",),  # no traceback: a crash, as before
    (*RAISED_THEN_ABORTED[:-1], "step 2 after a logged traceback"),  # the rank went on after it
], ids=["no-traceback", "work-after-the-traceback"])
def test_a_signal_after_output_that_does_not_end_in_an_exception_stays_killed_by_that_signal(tmp_path, lines):
    failure = Failure.from_worker("node1", first_failure(captured("raise-abort")), last_lines=lines,
                                  **own_error(lines, "SIGABRT"))
    assert (failure.describe(), failure.message) == ("killed by SIGABRT", "")


def test_a_recorded_exception_then_a_signal_at_exit_names_the_exception_first():
    """A worker with `@record` that raised and then aborted: torchrun's record has both."""
    raised = first_failure(captured("raise"))
    failure = Failure.from_worker("node1", replace(raised, exitcode=-6))
    assert failure.describe() == "raised ValueError: rank 1 says boom, then SIGABRT at exit"


def test_a_workers_own_error_file_gives_its_message_and_traceback():
    message, traceback = error_message(json.loads((DATA / "error-raise.json").read_text())["message"])
    assert message == "ValueError: rank 1 says boom"
    assert traceback.startswith("Traceback (most recent call last):")
    assert 'raise ValueError("rank 1 says boom")' in traceback


def test_the_first_failure_is_the_earliest_record_and_at_the_same_second_not_one_torchrun_ended():
    raised = captured("raise")
    assert [r.rank for r in raised] == [1, 0] and first_failure(raised[::-1]).rank == 1  # 1 s earlier
    killed = captured("kill")
    assert killed[0].timestamp == killed[1].timestamp
    assert first_failure(killed[::-1]).rank == 1  # rank 0 was torchrun's SIGTERM, in the same second
    assert first_failure([]) is None


def test_a_record_survives_the_supervisors_event():
    record = captured("raise")[0]
    assert WorkerRecord.from_event(json.loads(json.dumps(record.to_event()))) == record
    with pytest.raises(ValueError):
        WorkerRecord.from_event({"rank": 1})


def test_an_unreadable_or_missing_record_is_no_record(tmp_path):
    assert read_records(str(tmp_path / "none.json")) == []
    (tmp_path / "bad.json").write_text("{not json")
    assert read_records(str(tmp_path / "bad.json")) == []


def test_the_shipped_supervisor_sends_torchruns_records_of_its_failed_workers_secrets_masked(tmp_path):
    """The supervisor as a host runs it (the bundle, real torchrun): its exit event carries each
    failed worker's record, the job's secret masked in the exception's words."""
    script = tmp_path / "leak.py"
    script.write_text(WORKER.read_text().replace('"rank 1 says boom"', 'f"token {os.environ[\'TOKEN\']}"'))
    argv = [*TORCHRUN, "--standalone", "--nproc-per-node", "2", "--redirects", "3", str(script), "raise"]
    cfg = config(tmp_path, argv, env={"TOKEN": "s3cr3t-value"}, secret_names=["TOKEN"])
    _, events = run_shipped(cfg)
    exit_event = events[-1]
    workers = [WorkerRecord.from_event(w) for w in exit_event["workers"]]
    first = first_failure(workers)
    assert exit_event["rc"] == 1 and first is not None and (first.rank, first.exitcode) == (1, 1)
    assert first.message == "ValueError: token ***" and "s3cr3t-value" not in json.dumps(exit_event)
    assert not (tmp_path / "host" / "jobs" / cfg["job_id"] / "n0" / "torchrun").exists()


# ---------------------------------------------------------------- the host's failure, from its exit event


def host_run(tmp_path: Path) -> HostRun:
    plan = HostPlan("node1", "10.0.0.11", 1, 2, "python3", "/w", [], {}, [], None)
    return HostRun(plan, LogSink(Store(tmp_path).job_dir("records-1")))


def exit_event(host: HostRun, **fields: Any) -> HostRun:
    host.on_data(EVENT + json.dumps({"ev": "exit", **fields}).encode() + b"\n")
    return host


def test_a_hosts_failure_is_its_first_failed_worker_whatever_torchrun_printed(tmp_path):
    workers = [record.to_event() for record in captured("kill")[::-1]]  # torchrun's SIGTERM first, same second
    failure = exit_event(host_run(tmp_path), rc=1, workers=workers).failure(60.0)
    assert (failure.host, failure.rank, failure.kind, failure.signal) == ("node1", 1, FailureKind.SIGNAL, "SIGKILL")
    assert not failure.stopped and not is_collateral(failure)


def test_a_host_with_no_worker_record_fails_with_its_supervisors_exit_status_and_no_rank(tmp_path):
    """torchrun itself killed, or a worker killed before torchrun could record it: the exit status is all
    there is, and no rank is guessed."""
    failure = exit_event(host_run(tmp_path), rc=-9, workers=[]).failure(60.0)
    assert (failure.rank, failure.describe(), failure.message) == (None, "killed by SIGKILL (out of memory?)", "")
    assert exit_event(host_run(tmp_path), rc=1).failure(60.0).describe() == "exit code 1"


@pytest.mark.parametrize(("cause", "itself"), [("heartbeat", True), ("channel", True), ("signal", True),
                                               ("controller", False)])
def test_a_host_ended_itself_only_when_its_supervisor_stopped_without_the_controllers_stop(tmp_path, cause, itself):
    host = exit_event(host_run(tmp_path), rc=-15, reason="any words at all", stop_cause=cause)
    assert host.ended_itself is itself
    failure = host.failure(60.0)
    if itself:
        assert (failure.kind, failure.reason) == (FailureKind.INFRA, "its supervisor ended the job: any words at all")
        # A signal is someone's teardown (Slurm ends a step's other tasks): an echo; a lost controller is not.
        assert is_collateral(failure) is (cause == "signal")
    else:
        assert failure.stopped and is_collateral(failure)


def test_a_malformed_record_is_reported_and_the_exit_still_counts(tmp_path):
    host = exit_event(host_run(tmp_path), rc=1, workers=[{"rank": 1}])
    assert host.exited.is_set() and host.handling_errors == 1
    assert (host.failure(60.0).rank, host.failure(60.0).describe()) == (None, "exit code 1")


# ---------------------------------------------------------------- who stopped a host, as its supervisor says


def supervise(cfg: dict[str, Any], control: bytes, hold: float = 0.0) -> dict[str, Any]:
    """Run the shipped supervisor, write `control` to its stdin, keep stdin open `hold` seconds,
    close it; its exit event."""
    payload = remote.bundle("supervisor", SUPERVISOR_ONLY)
    argv = remote.bootstrap_argv(sys.executable, payload, "distrun-supervisor", cfg["job_id"], cfg["node"])
    with subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE) as proc:
        proc.stdin.write(payload + json.dumps(cfg).encode() + b"\n" + control)
        proc.stdin.flush()
        time.sleep(hold)
        out, _ = proc.communicate(timeout=30)
    return decode(out)[1][-1]


@pytest.mark.parametrize(("control", "hold", "cause"), [
    (b'{"op": "stop"}\n', 2.0, StopCause.CONTROLLER),  # asked, before the channel closed
    (b"", 0.0, StopCause.CHANNEL),  # the controller's connection closed
    (b'{"op": "hb"}\n', 4.0, StopCause.HEARTBEAT),  # open, but silent past the 1 s timeout
])
def test_the_supervisors_exit_event_says_who_stopped_the_job(tmp_path, control, hold, cause):
    cfg = config(tmp_path, ["sleep", "30"], heartbeat_timeout=1.0)
    ended = supervise(cfg, control, hold)
    assert (ended["ev"], StopCause(ended["stop_cause"]), ended["workers"]) == ("exit", cause, [])

