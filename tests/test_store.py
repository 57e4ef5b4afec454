"""The job database: records round-trip, databases written by an older distrun are migrated, the controller
is identified by pid and start time, a recorded end is final, ids are unique."""

from __future__ import annotations

import os
import re
import signal
import sqlite3
import subprocess
import threading
import time
from pathlib import Path

import pytest

from orchestrator import store as store_module
from orchestrator.diagnose.failures import Failure, FailureKind
from orchestrator.errors import InfraError, UsageError
from orchestrator.liveness import controller_alive, process_start, signal_controller
from orchestrator.run.recorded import refresh_lost
from orchestrator.store import JobRecord, JobState, Store, new_job_id, prunable

# The schema distrun wrote before records kept a generic backend reference and failures.
OLD_SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
    id TEXT PRIMARY KEY, name TEXT NOT NULL, spec_path TEXT, inventory TEXT, hosts TEXT,
    master_addr TEXT, master_port INTEGER, backend TEXT, state TEXT NOT NULL,
    started REAL NOT NULL, ended REAL, exit_code INTEGER, controller_pid INTEGER,
    restarts INTEGER DEFAULT 0, slurm_id TEXT, detail TEXT DEFAULT '', alerts TEXT DEFAULT '[]'
)
"""
OLD_ROW = ("old-1", "old", "jobs/x.yaml", "<built-in>", '["node0", "node1"]', "node0", 29500, "slurm",
           "failed", 1700000000.0, 1700000060.0, 1, 4242, 0, "8812", "job old-1 FAILED", "[]")


def old_database(home: Path) -> None:
    home.mkdir(parents=True, exist_ok=True)
    db = sqlite3.connect(home / "distrun.db")
    with db:
        db.execute(OLD_SCHEMA)
        db.execute(f"INSERT INTO jobs VALUES ({','.join('?' * len(OLD_ROW))})", OLD_ROW)
    db.close()


def test_a_database_of_the_old_schema_is_migrated_keeping_every_record(tmp_path: Path) -> None:
    old_database(tmp_path)

    rec = Store(tmp_path).get("old-1")

    assert rec.backend == "slurm" and rec.backend_ref == "8812"
    assert rec.failures == [] and rec.state is JobState.FAILED and rec.hosts == ["node0", "node1"]
    columns = {row[1] for row in sqlite3.connect(tmp_path / "distrun.db").execute("PRAGMA table_info(jobs)")}
    assert "slurm_id" not in columns and {"backend_ref", "failures"} <= columns


def test_a_migrated_database_takes_new_records_with_failures(tmp_path: Path) -> None:
    old_database(tmp_path)
    store = Store(tmp_path)
    failure = Failure("node1", FailureKind.EXIT, rank=3, exit_code=1)
    store.save(JobRecord(id="new-1", name="new", spec_path="x.yaml", inventory="i.yaml", hosts=["node1"]))
    store.end("new-1", JobState.FAILED, 1, "job new-1 FAILED", failures=[failure.to_dict()])

    rec = store.get("new-1")

    assert [Failure.from_dict(d) for d in rec.failures] == [failure]
    assert rec.to_dict()["failures"][0]["exit_code"] == 1 and rec.to_dict()["backend_ref"] is None
    assert store.job_dir("new-1").summary.read_text() == "job new-1 FAILED\n"


def test_several_processes_opening_an_old_database_at_once_migrate_it_once(tmp_path: Path) -> None:
    old_database(tmp_path)
    errors: list[BaseException] = []

    def open_store() -> None:
        try:
            Store(tmp_path).get("old-1")
        except BaseException as exc:  # collected for the assertion below
            errors.append(exc)

    threads = [threading.Thread(target=open_store) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert errors == []
    assert Store(tmp_path).get("old-1").backend_ref == "8812"


def test_opening_a_current_database_changes_nothing(tmp_path: Path) -> None:
    Store(tmp_path).save(JobRecord(id="a-1", name="a", spec_path="a.yaml", inventory="i", hosts=[],
                                   backend="slurm", backend_ref="77"))
    assert Store(tmp_path).get("a-1").backend_ref == "77"


# ---------------------------------------------------------------- identity, transitions, ids


def running_record(store: Store, job_id: str, pid: int | None, start: str | None) -> JobRecord:
    rec = JobRecord(id=job_id, name="x", spec_path="x.yaml", inventory="<built-in>", hosts=["localhost"],
                    state=JobState.RUNNING, controller_pid=pid, controller_start=start)
    store.save(rec)
    return rec


def test_stop_never_signals_a_process_that_reused_the_controller_pid(tmp_path: Path) -> None:
    stranger = subprocess.Popen(["sleep", "30"])
    try:
        # The pid is the stranger's, the start time the controller's that had it before.
        rec = running_record(Store(tmp_path), "j-1", stranger.pid, "another-boot:12345")
        assert not controller_alive(rec)
        assert not signal_controller(rec, signal.SIGTERM)
        time.sleep(0.2)
        assert stranger.poll() is None, "the stranger was signalled"
    finally:
        stranger.kill()
        stranger.wait()


def test_the_recorded_controller_is_alive_and_signalled(tmp_path: Path) -> None:
    controller = subprocess.Popen(["sleep", "30"])
    try:
        rec = running_record(Store(tmp_path), "j-2", controller.pid, process_start(controller.pid))
        assert controller_alive(rec)
        assert signal_controller(rec, signal.SIGTERM)
        assert controller.wait(timeout=5) == -signal.SIGTERM
        assert not controller_alive(rec)
    finally:
        controller.kill()
        controller.wait()


def test_a_record_without_a_start_time_names_no_live_controller(tmp_path: Path) -> None:
    rec = running_record(Store(tmp_path), "j-3", os.getpid(), None)
    assert not controller_alive(rec) and not signal_controller(rec, 0)


def test_a_recorded_end_is_never_overwritten_by_a_later_state(tmp_path: Path) -> None:
    store = Store(tmp_path)
    running_record(store, "j-4", None, None)
    assert store.end("j-4", JobState.SUCCEEDED, 0, "job j-4 succeeded")
    assert not store.update("j-4", state=JobState.LOST)
    assert not store.end("j-4", JobState.FAILED, 1, "late")
    rec = store.get("j-4")
    assert (rec.state, rec.exit_code, rec.detail) == (JobState.SUCCEEDED, 0, "job j-4 succeeded")
    assert store.update("j-4", alerts=["a"]) and store.get("j-4").alerts == ["a"]


def test_a_lost_job_can_be_settled_as_stopped_but_a_finished_one_cannot(tmp_path: Path) -> None:
    store = Store(tmp_path)
    running_record(store, "j-5", None, None)
    store.update("j-5", state=JobState.LOST)
    assert store.settle_lost("j-5", JobState.STOPPED)
    assert not store.settle_lost("j-5", JobState.LOST)
    assert store.get("j-5").state is JobState.STOPPED


def test_saving_an_id_already_recorded_is_refused_never_replaced(tmp_path: Path) -> None:
    store = Store(tmp_path)
    running_record(store, "j-6", None, None)
    store.end("j-6", JobState.SUCCEEDED, 0, "done")
    with pytest.raises(UsageError, match="job id j-6 is already recorded"):
        running_record(store, "j-6", None, None)
    assert store.get("j-6").state is JobState.SUCCEEDED


def test_job_ids_made_in_the_same_second_almost_never_collide() -> None:
    # 2000 ids on one stamp, 24 random bits each: the birthday bound expects 0.12 equal
    # pairs, and 6 or more happen once in about 300 million runs. A collision that does
    # happen is refused by Store.save (the test above), never a replaced record.
    ids = {new_job_id("resnet50", now=1_800_000_000.0) for _ in range(2000)}
    assert len(ids) >= 1995
    assert all(re.fullmatch(r"resnet50-\d{8}-\d{6}-[0-9a-f]{6}", i) for i in ids)


def test_an_end_the_database_could_not_take_is_settled_from_the_job_directory(tmp_path: Path, monkeypatch) -> None:
    store = Store(tmp_path)
    running_record(store, "j-7", 2 ** 22 + 1, "gone:1")
    monkeypatch.setattr(store_module, "BUSY_TIMEOUT", 0.2)
    holder = sqlite3.connect(tmp_path / "distrun.db", isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    try:
        with pytest.raises(InfraError, match=r"end of job j-7 is not recorded: job database .*locked"):
            store.end("j-7", JobState.FAILED, 1, "job j-7 FAILED", failures=[{"host": "node1", "kind": "exit"}])
    finally:
        holder.execute("COMMIT")
        holder.close()
    assert store.job_dir("j-7").summary.read_text() == "job j-7 FAILED\n"
    stale = store.get("j-7")
    assert stale.state is JobState.RUNNING
    refresh_lost(store, [stale])
    assert (stale.state, stale.exit_code, stale.failures) == (JobState.FAILED, 1, [{"host": "node1", "kind": "exit"}])


def test_refresh_never_overwrites_an_end_recorded_after_the_record_was_read(tmp_path: Path) -> None:
    store = Store(tmp_path)
    stale = running_record(store, "j-8", 2 ** 22 + 1, "gone:1")
    store.update("j-8", state=JobState.SUCCEEDED, exit_code=0)  # the controller ends the job, then exits
    refresh_lost(store, [stale])
    assert stale.state is JobState.SUCCEEDED and store.get("j-8").state is JobState.SUCCEEDED


def test_a_locked_database_is_an_infrastructure_error_naming_it(tmp_path: Path, monkeypatch) -> None:
    store = Store(tmp_path)
    monkeypatch.setattr(store_module, "BUSY_TIMEOUT", 0.2)
    holder = sqlite3.connect(tmp_path / "distrun.db", isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    try:
        with pytest.raises(InfraError, match=f"job database {tmp_path / 'distrun.db'}: database is locked"):
            running_record(store, "j-9", None, None)
    finally:
        holder.execute("COMMIT")
        holder.close()
# ---------------------------------------------------------------- last, prefixes, internal runs, prune


def job(store: Store, job_id: str, started: float, *, internal: bool = False,
        state: JobState = JobState.SUCCEEDED, ended: float | None = None) -> JobRecord:
    record = JobRecord(id=job_id, name=job_id.split("-")[0], spec_path="j.yaml", inventory="<built-in>",
                       hosts=["localhost"], state=state, started=started,
                       ended=ended if ended is not None else (started + 10 if state.finished else None),
                       internal=internal)
    store.save(record)
    return record


def test_last_is_the_newest_job_the_user_launched_not_an_internal_run(tmp_path: Path) -> None:
    store = Store(tmp_path)
    job(store, "tiny-1", 100.0)
    job(store, "doctor-bandwidth-1", 200.0, internal=True)

    assert store.get("last").id == "tiny-1"
    assert [r.id for r in store.list()] == ["tiny-1"]
    assert [r.id for r in store.list(internal=True)] == ["doctor-bandwidth-1", "tiny-1"]
    assert store.get("doctor-bandwidth").internal is True


def test_an_ambiguous_prefix_lists_the_candidates_newest_first(tmp_path: Path) -> None:
    store = Store(tmp_path)
    for i, started in enumerate((300.0, 100.0, 200.0)):
        job(store, f"tiny-{i}", started)

    with pytest.raises(UsageError) as caught:
        store.get("tiny")
    assert str(caught.value) == "'tiny' matches 3 jobs, newest first: tiny-0, tiny-2, tiny-1 (give more of the id)"


def test_an_ambiguous_prefix_of_many_jobs_says_how_many_more(tmp_path: Path) -> None:
    store = Store(tmp_path)
    for i in range(12):
        job(store, f"t-{i:02d}", float(i))

    with pytest.raises(UsageError, match=r"matches 12 jobs, newest first: t-11, t-10, .*, t-04 and 4 more"):
        store.get("t-")


def test_records_keep_the_internal_flag_and_the_launch_command(tmp_path: Path) -> None:
    store = Store(tmp_path)
    store.save(JobRecord(id="a-1", name="a", spec_path="a.yaml", inventory="inv.yaml", hosts=["n0"],
                         internal=True, command=["a.yaml", "--nodes", "n0", "--", "--steps", "3"]))

    again = Store(tmp_path).get("a-1")
    assert again.internal is True and again.command == ["a.yaml", "--nodes", "n0", "--", "--steps", "3"]
    assert again.to_dict()["command"] == again.command and again.to_dict()["internal"] is True


def test_ids_for_completion_are_newest_first_and_match_the_prefix(tmp_path: Path) -> None:
    store = Store(tmp_path)
    job(store, "tiny-1", 1.0)
    job(store, "tiny-2", 2.0)
    job(store, "resnet-1", 3.0)

    assert store.ids("tiny") == ["tiny-2", "tiny-1"] and store.ids("x%") == []


def test_prune_chooses_finished_jobs_by_age_and_keeps_the_newest(tmp_path: Path) -> None:
    store = Store(tmp_path)
    now = 1_000_000.0
    day = 86400.0
    old = [job(store, f"old-{i}", now - (10 + i) * day) for i in range(3)]
    recent = job(store, "recent-1", now - day)
    running = job(store, "running-1", now - 30 * day, state=JobState.RUNNING)
    pending = job(store, "pending-1", now - 30 * day, state=JobState.PENDING)
    records = store.list(internal=True)

    assert [r.id for r in prunable(records, 7 * day, None, now)] == [r.id for r in old]
    assert [r.id for r in prunable(records, None, 2, now)] == [old[1].id, old[2].id]
    assert [r.id for r in prunable(records, 7 * day, 2, now)] == [old[1].id, old[2].id]
    assert [r.id for r in prunable(records, None, 0, now)] == [recent.id, *(r.id for r in old)]
    assert {running.id, pending.id}.isdisjoint(r.id for r in prunable(records, None, 0, now))


def test_delete_forgets_the_record_and_its_directory(tmp_path: Path) -> None:
    store = Store(tmp_path)
    job(store, "gone-1", 1.0)
    store.job_dir("gone-1").create()
    (store.job_dir("gone-1").root / "combined.log").write_text("x\n")

    store.delete("gone-1")

    assert not store.job_dir("gone-1").root.exists()
    with pytest.raises(UsageError, match="no job matches 'gone-1'"):
        store.get("gone-1")


def test_every_host_of_a_restarted_job_holds_its_earlier_attempts_hosts_first() -> None:
    rec = JobRecord(id="j", name="j", spec_path="", inventory="", hosts=["node0", "node2"],
                    attempts=[{"number": 1, "hosts": ["node0", "node1"]}, {"number": 2, "hosts": ["node0", "node2"]}])
    assert rec.every_host == ["node0", "node1", "node2"]
