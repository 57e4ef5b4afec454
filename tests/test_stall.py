"""A stall (no progress from any rank for `stall_after`) is explained without killing: the watchdog's
states, what each rank is doing now (diagnose/ranks.py) and the stall's verdict on real processes,
and a real local job that stalls, is marked `stalled`, then moves on and is `running` again."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from orchestrator.diagnose.failures import Failure, FailureKind
from orchestrator.diagnose.ranks import Position, look
from orchestrator.diagnose.watchdog import Looked, Progress, Stalls, Watchdog, look_at_stall
from orchestrator.errors import UsageError
from orchestrator.logs import LogSink
from orchestrator.plan import HostPlan
from orchestrator.remote.stream import Batch
from orchestrator.run.hostrun import HostRun
from orchestrator.run.recorded import for_record
from orchestrator.spec.job import job_from_text
from orchestrator.store import Store
from tests.helpers import REPO, wait_for
from tests.test_flight import real_dumps
from tests.test_stack import ranks  # noqa: F401  (the fixture: four ranks, rank 3 elsewhere)

VERDICT = Failure("node1", FailureKind.HANG, rank=3,
                  reason="stall: no progress from any rank for 20 s; rank 3 on node1 is not where the others wait",
                  stack=("stack of rank 3 (spin (train.py:9)):",))

STALLING_SCRIPT = """\
import os, sys, time
print("epoch 0 loss 1.0", flush=True)
while not os.path.exists(sys.argv[1]):  # stuck outside any collective, printing nothing
    time.sleep(0.05)
print("epoch 1 loss 0.5", flush=True)
"""


def test_a_stall_the_look_confirms_is_stalled_until_progress_returns_it_to_moving():
    last = [100.0]
    stalls = Stalls(20.0)
    dog = Watchdog(None, lambda: last[0], stalls)
    assert not stalls.due(last[0], 119.0) and stalls.due(last[0], 120.0)
    assert dog.check(125.0) is Progress.MOVING  # silent, but not stalled before a look confirms it
    stalls.looking(last[0])
    assert not stalls.due(last[0], 130.0)  # one look per silence
    stall = stalls.found(Looked(failure=VERDICT, kept=("/j/stacks",)), now=121.0)
    assert stall is not None and dog.check(130.0) is Progress.STALLED
    assert stall.verdict() == "no progress from any rank for 20 s; rank 3 on node1 is not where the others wait"
    last[0] = 140.0  # a line arrived
    assert stalls.progressed(last[0]) is stall and stall.ended is not None
    assert dog.check(141.0) is Progress.MOVING
    summary = stalls.lines()
    assert summary[0].startswith("  stalled at ") and "(until " in summary[0] and summary[0].endswith(stall.verdict())
    assert summary[1:] == ["    stack of rank 3 (spin (train.py:9)):", "    kept in: /j/stacks"]


def test_collectives_entered_during_the_silence_are_progress_and_put_the_next_look_later():
    stalls = Stalls(20.0)
    stalls.looking(100.0)
    assert stalls.found(Looked(moved=115.0)) is None and stalls.current is None
    assert stalls.flight_progress == 115.0
    assert not stalls.stalled(100.0) and not stalls.due(115.0, 130.0) and stalls.due(115.0, 135.0)


def test_collectives_every_rank_completed_as_the_hosts_read_them_are_progress_and_the_same_count_is_not():
    stalls = Stalls(20.0)
    stalls.completed(40, now=100.0)
    stalls.completed(40, now=118.0)  # a rank stuck: the count stands still, the others wait
    assert stalls.flight_progress == 100.0 and stalls.due(100.0, 120.0)
    stalls.completed(41, now=119.0)
    assert stalls.flight_progress == 119.0 and not stalls.due(119.0, 130.0)


HOSTNAME_WARNING = (b"[W1128 05:21:49.123456789 socket.cpp:755] [c10d] The hostname of the client socket cannot be "
                    b"retrieved. err=-3\n")


def test_the_warnings_distrun_folds_as_harmless_do_not_arm_the_watchdog_and_a_real_line_does(tmp_path: Path):
    plan = HostPlan("node0", "10.0.0.10", 0, 2, "python3", "/w", [], {}, [], None)
    host = HostRun(plan, LogSink(Store(tmp_path).job_dir("arm-1")))
    host.on_batch(Batch(0, "e", 2, HOSTNAME_WARNING * 2))  # c10d, while the ranks connect, before any step
    host.on_batch(Batch(1, "e", 1, HOSTNAME_WARNING))
    assert host.last_progress is None and Watchdog(None, lambda: host.last_progress, Stalls(2.0)).check() \
        is Progress.MOVING
    host.on_batch(Batch(1, "e", 2, HOSTNAME_WARNING + b"epoch 0 loss 1.0\n"))
    assert host.last_progress is not None


def test_without_hang_timeout_a_silent_job_is_never_hung_and_off_is_never_stalled():
    dog = Watchdog(None, lambda: 0.0, Stalls(None))
    assert dog.check(1e9) is Progress.MOVING and not dog.stalls.due(0.0, 1e9)


@pytest.mark.parametrize(("text", "expected"), [("", 300.0), ("stall_after: 20\n", 20.0),
                                                ("stall_after: off\n", None), ("stall_after: false\n", None)])
def test_stall_after_is_300_s_by_default_and_off_turns_it_off(tmp_path: Path, text: str, expected: float | None):
    (tmp_path / "t.py").write_text("")
    job = job_from_text(f"name: t\nscript: {tmp_path / 't.py'}\n{text}", str(tmp_path / "j.yaml"))
    assert job.stall_after == expected


@pytest.mark.parametrize("value", ["0", "on", "-5"])
def test_a_bad_stall_after_says_how_to_write_it_in_one_line(tmp_path: Path, value: str):
    (tmp_path / "t.py").write_text("")
    with pytest.raises(UsageError, match=r"j.yaml:3: stall_after: must be a number.*, or off\)$"):
        job_from_text(f"name: t\nscript: {tmp_path / 't.py'}\nstall_after: {value}\n", str(tmp_path / "j.yaml"))


def test_a_ranks_position_is_its_last_collective_entered_and_completed_from_its_flight_recorder():
    dump = real_dumps()[1]  # rank 1 slept before the 4th all_reduce: it completed #3
    position = Position.of(dump)
    assert (position.entered, position.completed, position.collective) == (3, 3, "gloo:all_reduce")
    assert position.text() == "done with #3 gloo:all_reduce (completed #3)"
    waiting = Position.of(real_dumps()[0])
    assert (waiting.entered, waiting.completed) == (4, 3) and waiting.text().startswith("in #4")
    assert abs(waiting.entered_at - 1795622011.1242) < 1
    assert Position.of({**copy.deepcopy(dump), "entries": []}) is None


def test_one_look_says_what_every_rank_does_now_and_the_stall_verdict_names_the_odd_one(ranks):  # noqa: F811
    store, rec = ranks
    seen = look(for_record(store, rec), rec, last_lines={0: 12.5})
    assert sorted(seen.ranks) == [0, 1, 2, 3]
    assert seen.ranks[3].where() == "load_batch (train.py:9)" and seen.ranks[0].last_line == 12.5
    assert seen.ranks[0].position is None and seen.ranks[0].no_position == "no socket served"
    assert seen.last_collective() is None
    job_dir = store.job_dir(rec.id)
    looked = look_at_stall(for_record(store, rec), rec, job_dir, 20, {"localhost": "127.0.0.1"})
    assert looked.moved is None and looked.failure is not None
    assert (looked.failure.host, looked.failure.rank) == ("localhost", 3)
    assert looked.failure.reason.endswith("rank 3 on localhost is not where the others wait")
    assert looked.kept == (str(job_dir.stacks),)
    assert sorted(p.name for p in job_dir.stacks.glob("rank*.txt")) == [f"rank{r}.txt" for r in range(4)]


def stored_state(home: Path, job_id: str) -> str | None:
    try:
        return Store(home).get(job_id).state.value
    except (UsageError, OSError):
        return None


def test_a_stalled_local_job_is_marked_stalled_explained_not_killed_and_running_again_once_it_moves(tmp_path):
    script, go = tmp_path / "stall.py", tmp_path / "go"
    script.write_text(STALLING_SCRIPT)
    job = tmp_path / "job.yaml"
    job.write_text(f"name: st\nscript: {script}\nargs: ['{go}']\nnproc_per_node: 1\nstall_after: 2\n"
                   "telemetry: {enabled: false}\n")
    home = tmp_path / "home"
    env = {**os.environ, "DISTRUN_HOME": str(home), "OMP_NUM_THREADS": "1", "XDG_CONFIG_HOME": str(tmp_path / "no")}
    env.pop("DISTRUN_INVENTORY", None)
    proc = subprocess.Popen([sys.executable, "-m", "orchestrator", "launch", str(job), "--job-id", "st-1",
                             "--no-live"], cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    try:
        assert wait_for(lambda: stored_state(home, "st-1") == "stalled", 120, every=0.2)
        rec = json.loads(subprocess.run([sys.executable, "-m", "orchestrator", "ps", "--json"], cwd=REPO, env=env,
                                        capture_output=True, text=True, check=True).stdout)[0]
        assert rec["state"] == "stalled" and proc.poll() is None  # explained, nothing killed
        said = [alert["message"] for alert in rec["alerts"]]
        assert any("stall: no progress from any rank for 2 s" in line for line in said), said
        assert (home / "jobs" / "st-1" / "stacks" / "rank0.txt").exists()
        time.sleep(1)
        go.touch()
        assert wait_for(lambda: stored_state(home, "st-1") in ("running", "succeeded"), 60, every=0.1)
        out, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, out
    assert "job progressing again" in out and "epoch 1 loss 0.5" in out
    summary = out[out.index("job st-1 succeeded"):]
    assert "  stalled at " in summary and "(until " in summary, summary
    assert f"kept in: {home / 'jobs' / 'st-1' / 'stacks'}" in summary
