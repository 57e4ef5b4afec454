"""A stop holds on to the processes it proved the job's: a worker stays provable after its torchrun
exits first while its supervisor is already gone (the fault matrix's stopping-supervisor-killed
cell on this machine), and nothing outside the recorded tree is signalled for it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator.remote import cleanup, provenance
from orchestrator.remote.private import make_private_dirs

JOB, NODE = "orphan-1", "n0"
MARKERS = {"DISTRUN_JOB_ID": JOB, "DISTRUN_NODE": NODE}
# A rank that takes its time to stop (SIGTERM ignored), and a torchrun stand-in that starts it in a
# session of its own, as torchrun does, prints its pid, and dies at the first SIGTERM.
RANK = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('ready', flush=True); time.sleep(60)"
TORCHRUN = ("import subprocess, sys, time; "
            f"rank = subprocess.Popen([sys.executable, '-c', {RANK!r}], start_new_session=True, "
            "stdout=subprocess.PIPE); rank.stdout.readline(); print(rank.pid, flush=True); time.sleep(60)")


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()[0] not in (b"Z", b"X")
    except (OSError, IndexError):
        return False


def gone_soon(pid: int, within: float = 5.0) -> bool:
    deadline = time.monotonic() + within
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not alive(pid)


def dead_root() -> provenance.Root:
    """The root of a supervisor that was SIGKILLed (its pid and start time match no process now)."""
    proc = subprocess.Popen(["sleep", "30"])
    root = provenance.root_of(proc.pid)
    proc.kill()
    proc.wait()
    assert root is not None
    return root


@pytest.fixture
def orphaned_job(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[int, int, int]]:
    """The job's torchrun stand-in and its rank, recorded as the supervisor records them (the
    supervisor dead already), and an outsider: this user's process with the job's markers, outside
    the tree. Their pids (torchrun, rank, outsider); whatever is left is killed on leaving."""
    monkeypatch.setenv("HOME", str(tmp_path))
    env = {**os.environ, **MARKERS}
    torchrun = subprocess.Popen([sys.executable, "-c", TORCHRUN], env=env, stdout=subprocess.PIPE, text=True)
    outsider = subprocess.Popen([sys.executable, "-c", RANK], env=env, stdout=subprocess.PIPE, text=True)
    assert torchrun.stdout is not None and outsider.stdout is not None
    rank = int(torchrun.stdout.readline())
    assert outsider.stdout.readline().strip() == "ready"
    job_dir = tmp_path / ".distrun" / "jobs" / JOB
    make_private_dirs(job_dir)
    torchrun_root = provenance.root_of(torchrun.pid)
    assert torchrun_root is not None
    provenance.record(provenance.record_path(str(job_dir), NODE), [dead_root(), torchrun_root])
    try:
        yield torchrun.pid, rank, outsider.pid
    finally:
        for proc in (torchrun, outsider):
            proc.kill()
            proc.wait()
        if alive(rank):
            os.kill(rank, signal.SIGKILL)


def test_stop_ends_a_rank_whose_torchrun_exits_first_after_its_supervisor_died(orphaned_job, capsys) -> None:
    torchrun, rank, outsider = orphaned_job
    cleanup.main([JOB, NODE, "1"])
    assert json.loads(capsys.readouterr().out) == {"found": 2, "killed": 1, "gpus_freed": []}
    assert gone_soon(torchrun)
    assert gone_soon(rank), "the rank outlived the stop once its torchrun had exited"
    assert alive(outsider), "a process outside the job's recorded tree was signalled"


def test_a_process_proven_once_stays_the_jobs_by_its_pid_and_start_time_only() -> None:
    child = subprocess.Popen(["sleep", "30"])
    try:
        pinned = provenance.proven_root(child.pid, provenance.own_roots())
        assert pinned == provenance.root_of(child.pid)
        assert provenance.proven(child.pid, [pinned])
        assert not provenance.proven(child.pid, [provenance.Root(child.pid, pinned.start + 1)])  # a reused pid
        assert provenance.proven_root(os.getpid(), [pinned]) is None  # not its parent
    finally:
        child.kill()
        child.wait()
