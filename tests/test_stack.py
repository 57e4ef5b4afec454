"""`distrun stack` and the hang watchdog: folding, and real py-spy dumps of processes started as a job's ranks.

The ranks here are plain python processes with the environment torchrun and the supervisor give a
rank (DISTRUN_JOB_ID, DISTRUN_NODE, RANK, LOCAL_RANK), dumped by the real py-spy through the local
backend: no torch, a second or two. tests/cluster/test_hang_cluster.py runs real torchrun jobs.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator.diagnose.failures import Failure, FailureKind
from orchestrator.diagnose.stack import (
    Frame,
    RankStack,
    Thread,
    fold,
    gather,
    parse_frame,
    parse_host,
    rank_ranges,
    render,
    stack_lines,
)
from orchestrator.diagnose.watchdog import Progress, Watchdog, diagnose
from orchestrator.errors import InfraError, UsageError
from orchestrator.run.recorded import for_record
from orchestrator.store import JobRecord, JobState, Store
from tests.helpers import distrun, ready_processes, record_this_process_as_the_jobs_root

RANK_SCRIPT = """\
import sys, time

def wait_in_collective():
    print("ready", flush=True)
    time.sleep(120)

def load_batch():
    print("ready", flush=True)
    time.sleep(120)

(load_batch if sys.argv[1] == "odd" else wait_in_collective)()
"""


def stack_of(rank: int, *frames: tuple[str, str, int], node: str = "node0") -> RankStack:
    return RankStack(node, rank, 1000 + rank, (Thread("MainThread", tuple(Frame(*f) for f in frames)),))


COLLECTIVE = (("all_reduce", "torch/distributed/distributed_c10d.py", 2806), ("train_step", "train.py", 88))
SLEEP = (("load_batch", "train.py", 40), ("train_step", "train.py", 85))


def test_rank_ranges_fold_consecutive_ranks():
    assert rank_ranges([5, 0, 1, 2, 4, 9]) == "0-2,4-5,9"
    assert rank_ranges([3]) == "3"


def test_the_odd_rank_comes_first_under_its_own_range_and_the_others_under_theirs():
    ranks = [stack_of(r, *(SLEEP if r == 3 else COLLECTIVE), node=f"node{r // 2}") for r in range(6)]
    ranks[0] = stack_of(0, (COLLECTIVE[0][0], COLLECTIVE[0][1], COLLECTIVE[0][2], True), COLLECTIVE[1])
    groups = fold(ranks)
    assert [g.label() for g in groups] == ["rank 3", "ranks 0-2,4-5"]
    assert [g.sample.where() for g in groups] == ["load_batch (train.py:40)", "all_reduce ← train_step (train.py:88)"]
    assert groups[0].hosts() == ["node1"]


def test_of_two_ranks_the_one_outside_the_collective_is_the_odd_one():
    groups = fold([stack_of(0, *COLLECTIVE), stack_of(1, *SLEEP)])
    assert [g.label() for g in groups] == ["rank 1", "rank 0"]


def test_native_frames_are_not_taken_for_the_users_code():
    stack = RankStack("node0", 3, 1, (Thread("MainThread", (
        parse_frame({"name": "clock_nanosleep", "filename": "/usr/lib/x86_64-linux-gnu/libc.so.6",
                     "short_filename": "libc.so.6", "line": 0}),
        parse_frame({"name": "load_batch", "filename": "/work/train.py", "short_filename": "train.py", "line": 40}),
    )),))
    assert stack.where() == "clock_nanosleep ← load_batch (train.py:40)"


def test_a_rank_still_importing_shows_its_importlib_frames_as_one_line():
    bootstrap = [("_call_with_frames_removed", "<frozen importlib._bootstrap>", 241),
                 ("exec_module", "<frozen importlib._bootstrap_external>", 940),
                 ("_load_unlocked", "<frozen importlib._bootstrap>", 690)] * 18
    stack = stack_of(0, ("<module>", "torch/nn/modules/conv.py", 12), *bootstrap,
                     ("<module>", "torch/__init__.py", 2016),
                     ("_find_and_load", "<frozen importlib._bootstrap>", 1176), ("<module>", "train.py", 3))
    assert stack_lines(stack) == [
        "  thread MainThread:", "    <module> (torch/nn/modules/conv.py:12)",
        "    ... 54 importlib frames (<frozen importlib._bootstrap>, ...)", "    <module> (torch/__init__.py:2016)",
        "    _find_and_load (<frozen importlib._bootstrap>:1176)", "    <module> (train.py:3)"]


def test_stacks_that_differ_only_in_addresses_fold_into_one_group():
    a = stack_of(0, ("0x7f3a2c001234 (libc.so.6)", "libc.so.6", 0), *COLLECTIVE)
    b = stack_of(1, ("0x7f99aa00ffee (libc.so.6)", "libc.so.6", 0), *COLLECTIVE)
    assert [g.label() for g in fold([a, b])] == ["ranks 0-1"]


def test_a_host_that_found_ranks_but_has_no_pyspy_says_how_to_install_it():
    with pytest.raises(InfraError, match=r"node2: py-spy is not installed .* \(pip install py-spy"):
        parse_host("node2", json.dumps({"pyspy": None, "ranks": [{"rank": 4, "local_rank": 0, "pid": 7}]}))


def test_watchdog_is_stalled_after_a_third_of_the_timeout_and_hung_after_all_of_it():
    dog = Watchdog(15.0, lambda: 100.0)
    assert [dog.check(now) for now in (104.9, 105.0, 114.9, 115.0)] == [
        Progress.MOVING, Progress.STALLED, Progress.STALLED, Progress.HUNG]
    assert Watchdog(None, lambda: 0.0).check(1e9) is Progress.MOVING
    assert Watchdog(15.0, lambda: None).check(1e9) is Progress.MOVING  # armed by the first line only


def test_a_hang_failure_keeps_its_stack_through_the_record():
    failure = Failure("node1", FailureKind.HANG, rank=3, reason="hang: no progress", stack=("stack of rank 3:",))
    again = Failure.from_dict(json.loads(json.dumps(failure.to_dict())))
    assert again == failure
    assert "  stack of rank 3:" in again.render().splitlines()


@pytest.fixture
def ranks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Store, JobRecord]]:
    """Four processes recorded as the ranks of a running local job; rank 3 is elsewhere than 0-2. The job
    has a socket directory for the Flight Recorder (as with hang_timeout) but the ranks serve none.
    This test process stands for their supervisor: it is recorded as their root."""
    script = tmp_path / "train.py"
    script.write_text(RANK_SCRIPT)
    store = Store(tmp_path / "home")
    rec = JobRecord(id="stk-1", name="stk", spec_path="x.yaml", inventory="<built-in>", hosts=["localhost"],
                    backend="local", state=JobState.RUNNING)
    store.save(rec)
    monkeypatch.setenv("HOME", str(tmp_path))
    record_this_process_as_the_jobs_root(tmp_path, rec.id, "localhost")
    commands = [([sys.executable, str(script), "odd" if rank == 3 else "even"],
                 {**os.environ, "DISTRUN_JOB_ID": rec.id, "DISTRUN_NODE": "localhost", "RANK": str(rank),
                  "LOCAL_RANK": str(rank), "DISTRUN_WORKER_SOCKETS": str(tmp_path / "sock")}) for rank in range(4)]
    with ready_processes(commands):
        yield store, rec


def test_gather_dumps_every_rank_of_the_job_with_pyspy_and_folds_the_odd_one_first(ranks):
    store, rec = ranks
    gathered = gather(for_record(store, rec), rec)
    assert gathered.failed == {}
    assert [r.rank for r in gathered.ranks] == [0, 1, 2, 3]
    text = render(gathered).splitlines()
    assert text[1] == "rank 3 (on localhost)"
    assert "    load_batch (train.py:9)" in text
    assert "ranks 0-2 (on localhost)" in text


def test_gather_refuses_a_node_the_job_did_not_run_on(ranks):
    store, rec = ranks
    with pytest.raises(UsageError, match="--node node7: job stk-1 ran on localhost"):
        gather(for_record(store, rec), rec, ["node7"])


def test_diagnose_of_ranks_without_flight_recorder_names_the_odd_rank_by_its_stack_and_keeps_every_stack(ranks):
    store, rec = ranks
    job_dir = store.job_dir(rec.id)
    failure = diagnose(for_record(store, rec), rec, job_dir, 15, {"localhost": "127.0.0.1"})
    assert (failure.kind, failure.host, failure.rank, failure.address) == (FailureKind.HANG, "localhost", 3,
                                                                           "127.0.0.1")
    assert failure.reason == ("hang: no progress from any rank for 15 s; rank 3 on localhost is not where "
                              "the others wait")
    assert failure.stack[0] == "stack of rank 3 (load_batch (train.py:9)):"
    assert failure.stack[-2] == "ranks 0-2 wait in: wait_in_collective (train.py:5)"
    assert failure.stack[-1] == "no Flight Recorder: ranks 0-3: no socket served; see jobs/README.md"
    assert failure.flight == () and not job_dir.flight.exists()
    kept = sorted(p.name for p in job_dir.stacks.iterdir())
    assert kept == ["folded.txt", "rank0.txt", "rank1.txt", "rank2.txt", "rank3.txt", "stacks.json"]
    assert "load_batch (train.py:9)" in (job_dir.stacks / "rank3.txt").read_text()


def test_stack_of_a_finished_job_is_refused_in_one_line(tmp_path: Path):
    store = Store(tmp_path)
    store.save(JobRecord(id="old-1", name="old", spec_path="x.yaml", inventory="<built-in>", hosts=["localhost"],
                         backend="local", state=JobState.FAILED))
    done = distrun("stack", "old-1", home=tmp_path, timeout=60)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "distrun: error: job old-1 is failed: only a running job's ranks have stacks (it kept none: no hang was "
        "diagnosed)"]


def test_stack_of_a_finished_job_points_to_its_stacks_only_when_a_hang_kept_some(tmp_path: Path):
    store = Store(tmp_path)
    store.save(JobRecord(id="hung-1", name="hung", spec_path="x.yaml", inventory="<built-in>", hosts=["localhost"],
                         backend="local", state=JobState.FAILED))
    store.job_dir("hung-1").stacks.mkdir(parents=True)
    done = distrun("stack", "hung-1", home=tmp_path, timeout=60)
    assert done.returncode == 2
    assert done.stderr.strip().endswith(f"(its hang's stacks are kept in {tmp_path / 'jobs' / 'hung-1' / 'stacks'})")


def test_a_ranks_stack_leaves_out_distrun_worker_entry_frames_as_plain_torchrun_would_show_it():
    entry = "/home/u/.distrun/jobs/j-1/bin/distrun_worker.py"
    frames = [{"name": "all_reduce", "filename": "/venv/lib/python3.11/site-packages/torch/distributed/c10d.py",
               "short_filename": "torch/distributed/c10d.py", "line": 9},
              {"name": "<module>", "filename": "/w/train.py", "short_filename": "train.py", "line": 3},
              {"name": "_run_script", "filename": entry, "short_filename": "distrun_worker.py", "line": 160},
              {"name": "<module>", "filename": entry, "short_filename": "distrun_worker.py", "line": 240}]
    (rank,) = parse_host("node0", json.dumps({"pyspy": "/bin/py-spy", "ranks": [
        {"rank": 0, "local_rank": 0, "pid": 7, "threads": [{"thread_name": "MainThread", "frames": frames}]}]}))
    assert [f.file for f in rank.threads[0].frames] == ["torch/distributed/c10d.py", "train.py"]
    assert rank.where() == "all_reduce ← <module> (train.py:3)"


def test_a_stopped_ranks_stack_is_its_state_and_kernel_wait_channel_not_a_py_spy_error(ranks):
    store, rec = ranks
    pid = next(r.pid for r in gather(for_record(store, rec), rec).ranks if r.rank == 3)
    os.kill(pid, signal.SIGSTOP)
    try:
        gathered = gather(for_record(store, rec), rec, flight=True)
    finally:
        os.kill(pid, signal.SIGCONT)
    stopped = next(r for r in gathered.ranks if r.rank == 3)
    assert stopped.error.startswith(f"stopped: state T in /proc/{pid}/stat (stopped by a signal (SIGSTOP, SIGTSTP)), "
                                    "kernel wait channel "), stopped.error
    assert stopped.error.endswith("; py-spy cannot read a stopped process") and "waitpid" not in stopped.error
    assert gathered.flight.errors[3].startswith("it cannot answer: stopped: state T")
    assert [g.label() for g in fold(gathered.ranks)] == ["rank 3", "ranks 0-2"]
