"""The job database: records round-trip, and databases written by an older distrun are migrated."""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path

from orchestrator.failures import Failure, FailureKind
from orchestrator.store import JobRecord, JobState, Store

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
