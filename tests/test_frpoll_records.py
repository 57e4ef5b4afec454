"""The host's reader of the ranks' Flight Recorders (orchestrator/remote/frpoll.py) against records of
the wrong shape and against processes held off the CPU: a bad record is a per-rank reason in the
event's `skipped`, the poller's thread goes on, and each rank's scheduler figures come with its record."""

from __future__ import annotations

import gzip
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from orchestrator.remote import frpoll
from orchestrator.remote.frpoll import BadRecord, ProcWatch, reduce, sched_figures

DATA = Path(__file__).parent / "data" / "flight" / "entries"


def real_dump() -> dict[str, Any]:
    return json.loads(gzip.decompress((DATA / "even_rank0.json.gz").read_bytes()))


@pytest.mark.parametrize(("dump", "said"), [
    ({"entries": [1, 2, 3]}, "entry 0 is int, not an object"),
    ({"entries": [{"collective_seq_id": "7", "process_group": ["0", "default_pg"]}]},
     "entry 0 collective_seq_id is str, not an integer"),
    ({"entries": {"0": {}}}, "entries is dict, not a list"),
    ({"entries": [{"collective_seq_id": 3, "process_group": 5}]}, "entry 0 process_group is int, not a list"),
    ({"entries": [], "pg_status": {"0": "done"}}, "pg_status is str, not an object"),
    ({"entries": [], "pg_status": {"0": {"last_completed_collective": "x"}}},
     "pg_status last_completed_collective is 'x', not an integer"),
    ({"entries": [{"collective_seq_id": 3, "process_group": ["0"], "time_created_ns": 1.5}]},
     "entry 0 time_created_ns is float, not an integer"),
])
def test_a_record_of_another_shape_is_one_line_naming_what_is_wrong(dump, said):
    with pytest.raises(BadRecord) as raised:
        reduce(dump, 0)
    assert str(raised.value) == said


def test_a_real_record_still_reduces_and_gloo_gives_no_duration():
    summary = reduce(real_dump(), 0)
    assert summary["done"] == summary["entered"] > 0
    assert {len(c) for c in summary["c"]} == {3}  # gloo leaves the start and completion times 0


def test_a_record_that_times_its_collectives_gives_each_its_duration():
    dump = real_dump()
    for entry in dump["entries"]:
        entry["time_discovered_started_ns"] = entry["time_created_ns"] + 1_000_000
        entry["time_discovered_completed_ns"] = entry["time_created_ns"] + 4_500_000
    assert {c[3] for c in reduce(dump, 0)["c"]} == {3500}


class Served:
    """A poller whose fetch answers `answers[rank]` for sockets that exist in `directory`."""

    def __init__(self, directory: str, answers: dict[int, dict[str, object]]) -> None:
        for rank in answers:
            Path(directory, f"rank{rank}.sock").touch()
        self.answers = answers

    def fetch(self, path: str, timeout: float, peer: Any) -> dict[str, object]:
        rank = int(Path(path).stem[4:])
        peer(os.getpid())
        return self.answers[rank]


def test_a_rank_with_a_bad_record_is_skipped_with_its_reason_and_the_others_are_read(tmp_path, monkeypatch):
    served = Served(str(tmp_path), {0: {"flight": real_dump()}, 1: {"flight": {"entries": [1, 2, 3]}}})
    monkeypatch.setattr(frpoll, "fetch", served.fetch)
    monkeypatch.setattr(frpoll, "proven", lambda pid, roots: True)
    fields = frpoll.Poller(str(tmp_path), []).round()
    assert fields is not None
    assert list(fields["ranks"]) == ["0"]
    assert fields["skipped"] == {"1": "a Flight Recorder record of another shape: entry 0 is int, not an object"}
    assert fields["sched"]["1"]["cpu_ms"] >= 0  # its process's figures come all the same
    assert fields["ranks"]["0"]["sched"]["cpu_ms"] >= 0  # the believed server's process: this one
    assert abs(fields["at"] - time.time()) < 5


def test_the_poller_thread_survives_a_round_that_fails(tmp_path, monkeypatch):
    rounds = iter([RuntimeError("boom"), {"at": 1.0, "ranks": {}, "skipped": {}}])

    def round_(self: frpoll.Poller) -> dict[str, Any]:
        found = next(rounds)
        if isinstance(found, Exception):
            raise found
        return found

    monkeypatch.setattr(frpoll.Poller, "round", round_)
    emitted: list[dict[str, Any]] = []
    done = threading.Event()

    def emit(_kind: str, **fields: Any) -> None:
        emitted.append(fields)
        if len(emitted) == 2:
            done.set()

    thread = threading.Thread(target=frpoll.run, args=(str(tmp_path), [], emit, done, 0.05), daemon=True)
    thread.start()
    thread.join(5)
    assert not thread.is_alive()
    assert emitted[0]["skipped"] == {"*": "the round failed: RuntimeError('boom')"}
    assert emitted[1] == {"at": 1.0, "ranks": {}, "skipped": {}}


def test_rounds_fall_on_the_wall_clocks_multiples_so_every_host_reads_at_one_moment():
    wait = frpoll._next_round(5.0)
    assert 0 < wait <= 5.0
    assert abs((time.time() + wait) % 5.0) < 0.05 or abs((time.time() + wait) % 5.0 - 5.0) < 0.05


def test_a_process_stopped_from_outside_is_found_stopped_and_its_cpu_counted():
    child = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        watch = ProcWatch()
        watch.watch(0, child.pid)
        time.sleep(0.3)
        child.send_signal(signal.SIGSTOP)
        time.sleep(0.1)
        for _ in range(5):
            watch.look()
        child.send_signal(signal.SIGCONT)
        time.sleep(0.05)
        watch.look()
        figures = watch.figures(0)
        assert (figures["stopped"], figures["looks"]) == (5, 6)
        assert figures["cpu_ms"] > 0 and "wait_ms" in figures
    finally:
        child.kill()
        child.wait()
    assert sched_figures(child.pid) == {}  # gone


def test_a_process_under_a_cfs_quota_has_its_cgroups_throttled_time():
    group = Path(f"/sys/fs/cgroup/cpu/distrun-test-{os.getpid()}")
    try:
        group.mkdir()
    except OSError as exc:
        pytest.skip(f"no cgroup v1 cpu controller to write here: {exc}")
    child = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        (group / "cpu.cfs_period_us").write_text("100000")
        (group / "cpu.cfs_quota_us").write_text("1000")  # 1 % of a CPU: it binds even on a loaded machine
        (group / "cgroup.procs").write_text(str(child.pid))
        deadline = time.monotonic() + 20
        while sched_figures(child.pid).get("nr_throttled", 0) < 3 and time.monotonic() < deadline:
            time.sleep(0.2)
        figures = sched_figures(child.pid)
        assert figures["nr_throttled"] >= 3 and figures["throttled_ms"] > 0
    finally:
        child.kill()
        child.wait()
        group.rmdir()


def test_a_restarted_rank_is_sent_its_collectives_from_the_first_again(tmp_path, monkeypatch):
    served = Served(str(tmp_path), {0: {"flight": real_dump()}})
    monkeypatch.setattr(frpoll, "fetch", served.fetch)
    monkeypatch.setattr(frpoll, "proven", lambda pid, roots: True)
    poller = frpoll.Poller(str(tmp_path), [])
    first = poller.round()
    assert first is not None and first["ranks"]["0"]["c"]
    assert poller.round()["ranks"]["0"]["c"] == []  # nothing new
    poller.procs.pids[0] = -1  # the rank's process was another: restarted
    assert poller.round()["ranks"]["0"]["c"] == first["ranks"]["0"]["c"]
