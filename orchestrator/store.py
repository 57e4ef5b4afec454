"""Job records (embedded SQLite) and the job-directory layout under DISTRUN_HOME.

The `jobs` table's schema is `_SCHEMA`; a database written by an older distrun is brought up
to it when a Store opens it (`_migrate`): columns are added or renamed, never dropped, so an
older distrun can still read what it knows.

Everything distrun creates under DISTRUN_HOME is its owner's alone, whatever the umask:
directories 0700, files 0600 (remote/private.py, which the hosts' copies use too).
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import sqlite3
import stat
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import IO, Any

from orchestrator.errors import UsageError
from orchestrator.remote.private import FILE_MODE, make_private_dirs, open_private, write_private


class JobState(str, Enum):
    PENDING = "pending"
    RUNNING = "running"
    STALLED = "stalled"  # running, but no rank has progressed for a third of its hang_timeout
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    STOPPED = "stopped"
    LOST = "lost"

    @property
    def finished(self) -> bool:
        return self not in (JobState.PENDING, JobState.RUNNING, JobState.STALLED)


@dataclass
class JobRecord:
    """One job as the database keeps it.

    Attributes:
        backend: The backend's NAME (ssh, local, slurm, ...).
        backend_ref: The backend's own handle on the job (Slurm's job id), None when it has none.
        detail: The summary people read (also in the job directory's summary.txt).
        failures: `Failure.to_dict()` of each failure, the root cause first; [] when none.
        alerts: Telemetry alerts raised while the job ran.
        internal: A run distrun made for itself (doctor --bandwidth's all-reduce): never `last`,
            listed only by `ps --all`.
        command: The `distrun launch` arguments that start the job again on the same hosts
            ([] when unknown).
    """

    id: str
    name: str
    spec_path: str
    inventory: str
    hosts: list[str]
    master_addr: str = ""
    master_port: int = 0
    backend: str = "ssh"
    state: JobState = JobState.PENDING
    started: float = field(default_factory=time.time)
    ended: float | None = None
    exit_code: int | None = None
    controller_pid: int | None = None
    restarts: int = 0
    backend_ref: str | None = None
    detail: str = ""
    alerts: list[str] = field(default_factory=list)
    failures: list[dict[str, Any]] = field(default_factory=list)
    internal: bool = False
    command: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id, "name": self.name, "spec": self.spec_path, "inventory": self.inventory,
            "hosts": self.hosts, "master_addr": self.master_addr, "master_port": self.master_port,
            "backend": self.backend, "state": self.state.value, "started": self.started,
            "ended": self.ended, "exit_code": self.exit_code, "controller_pid": self.controller_pid,
            "restarts": self.restarts, "backend_ref": self.backend_ref, "detail": self.detail,
            "alerts": self.alerts, "failures": self.failures, "internal": self.internal,
            "command": self.command,
        }


_COLUMNS = ("id", "name", "spec_path", "inventory", "hosts", "master_addr", "master_port", "backend",
            "state", "started", "ended", "exit_code", "controller_pid", "restarts", "backend_ref",
            "detail", "alerts", "failures", "internal", "command")
_JSON_COLUMNS = ("hosts", "alerts", "failures", "command")
AMBIGUOUS_SHOWN = 8

_SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
    id TEXT PRIMARY KEY, name TEXT NOT NULL, spec_path TEXT, inventory TEXT, hosts TEXT,
    master_addr TEXT, master_port INTEGER, backend TEXT, state TEXT NOT NULL,
    started REAL NOT NULL, ended REAL, exit_code INTEGER, controller_pid INTEGER,
    restarts INTEGER DEFAULT 0, backend_ref TEXT, detail TEXT DEFAULT '', alerts TEXT DEFAULT '[]',
    failures TEXT DEFAULT '[]', internal INTEGER DEFAULT 0,
    command TEXT DEFAULT '[]'
)
"""
# Columns renamed since a release wrote them: old name -> new name.
_RENAMED = {"slurm_id": "backend_ref"}
# Columns added since the first release: name -> its definition.
_ADDED = {"failures": "TEXT DEFAULT '[]'", "internal": "INTEGER DEFAULT 0",
          "command": "TEXT DEFAULT '[]'"}


def distrun_home() -> Path:
    return Path(os.environ.get("DISTRUN_HOME") or "~/.distrun").expanduser()


def new_job_id(name: str, now: float | None = None) -> str:
    """A readable, unique id: `resnet50-20261121-143012-a3f9`."""
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(now or time.time()))
    return f"{name}-{stamp}-{secrets.token_hex(2)}"


class JobDir:
    """The files of one job: plan.json, combined.log, nodes/, ranks/, metrics, telemetry."""

    def __init__(self, root: Path) -> None:
        self.root = root

    @property
    def plan(self) -> Path:
        return self.root / "plan.json"

    @property
    def combined(self) -> Path:
        return self.root / "combined.log"

    @property
    def facts(self) -> Path:
        return self.root / "facts.json"

    @property
    def metrics(self) -> Path:
        return self.root / "metrics.jsonl"

    @property
    def telemetry(self) -> Path:
        return self.root / "telemetry.jsonl"

    @property
    def controller_log(self) -> Path:
        return self.root / "controller.log"

    @property
    def summary(self) -> Path:
        return self.root / "summary.txt"

    @property
    def stacks(self) -> Path:
        """Where a hang's stacks are kept: rank<R>.txt for each rank, folded.txt, stacks.json."""
        return self.root / "stacks"

    def write_plan(self, plan: dict[str, Any], facts: dict[str, Any] | None = None) -> None:
        """plan.json (the plan with its secrets masked) and, when given, facts.json (what each host's probe found)."""
        self.create()
        write_private(self.plan, json.dumps(plan, indent=2) + "\n")
        if facts is not None:
            write_private(self.facts, json.dumps(facts, indent=2) + "\n")

    def node_log(self, node: str) -> Path:
        return self.root / "nodes" / f"{node}.log"

    def rank_log(self, rank: int) -> Path:
        return self.root / "ranks" / f"{rank}.log"

    def create(self) -> None:
        """The job directory and its nodes/ and ranks/, each 0700."""
        make_private_dirs(self.root / "nodes")
        make_private_dirs(self.root / "ranks")

    def open(self, path: Path, mode: str = "a", **kwargs: Any) -> IO[Any]:
        """A file of this job (its directory created), mode 0600: every writer of the job's files opens them here.

        Args:
            path: One of this job's files (`combined`, `node_log(...)`, ...).
            mode: A writing mode of `open`.
            kwargs: Passed to `open` (encoding, buffering).
        """
        make_private_dirs(path.parent)
        return open_private(path, mode, **kwargs)


class Store:
    """The job database; every call opens a short connection so several processes can share it."""

    def __init__(self, home: Path | None = None) -> None:
        self.home = home or distrun_home()
        make_private_dirs(self.home)
        self.db_path = self.home / "distrun.db"
        _private_database(self.db_path)
        with self._connect() as db:
            db.execute(_SCHEMA)
        self._migrate()

    @contextmanager
    def _connect(self) -> Iterator[sqlite3.Connection]:
        db = sqlite3.connect(self.db_path, timeout=30)
        try:
            with db:
                yield db
        finally:
            db.close()

    def _migrate(self) -> None:
        """Bring a database written by an older distrun up to `_SCHEMA`.

        Two processes may open an old database at once: the first takes the write lock
        (BEGIN IMMEDIATE) and migrates; the second then finds nothing left to do.
        """
        db = sqlite3.connect(self.db_path, timeout=30, isolation_level=None)
        try:
            if set(_RENAMED.values()) | set(_ADDED) <= self._columns(db):
                return
            db.execute("BEGIN IMMEDIATE")
            columns = self._columns(db)
            for old, new in _RENAMED.items():
                if old in columns and new not in columns:
                    db.execute(f"ALTER TABLE jobs RENAME COLUMN {old} TO {new}")
            for name, definition in _ADDED.items():
                if name not in columns:
                    db.execute(f"ALTER TABLE jobs ADD COLUMN {name} {definition}")
            db.execute("COMMIT")
        finally:
            db.close()

    @staticmethod
    def _columns(db: sqlite3.Connection) -> set[str]:
        return {row[1] for row in db.execute("PRAGMA table_info(jobs)")}

    def job_dir(self, job_id: str) -> JobDir:
        return JobDir(self.home / "jobs" / job_id)

    def save(self, rec: JobRecord) -> None:
        row = (rec.id, rec.name, rec.spec_path, rec.inventory, json.dumps(rec.hosts), rec.master_addr,
               rec.master_port, rec.backend, rec.state.value, rec.started, rec.ended, rec.exit_code,
               rec.controller_pid, rec.restarts, rec.backend_ref, rec.detail, json.dumps(rec.alerts),
               json.dumps(rec.failures), int(rec.internal), json.dumps(rec.command))
        marks = ",".join("?" * len(_COLUMNS))
        with self._connect() as db:
            db.execute(f"INSERT OR REPLACE INTO jobs ({','.join(_COLUMNS)}) VALUES ({marks})", row)

    def update(self, job_id: str, **fields: Any) -> None:
        """Set some fields of a record (enum and list values are stored as the record does)."""
        values = [json.dumps(v) if isinstance(v, list) else (v.value if isinstance(v, Enum) else v)
                  for v in fields.values()]
        sets = ",".join(f"{k}=?" for k in fields)
        with self._connect() as db:
            db.execute(f"UPDATE jobs SET {sets} WHERE id=?", [*values, job_id])

    def end(self, job_id: str, state: JobState, exit_code: int, detail: str, **fields: Any) -> None:
        """Record how a job ended and write its summary.txt (the same `detail`).

        Args:
            job_id: The job.
            state: Its final state.
            exit_code: What its controller exits with.
            detail: The summary people read.
            fields: Other fields to set (e.g. failures, restarts).
        """
        self.update(job_id, state=state, exit_code=exit_code, ended=time.time(), detail=detail, **fields)
        job_dir = self.job_dir(job_id)
        make_private_dirs(job_dir.root)
        write_private(job_dir.summary, detail + "\n")

    def list(self, limit: int | None = None, *, internal: bool = False) -> list[JobRecord]:
        """Records, newest first.

        Args:
            limit: At most this many (None: all).
            internal: Include the runs distrun made for itself.
        """
        query = f"SELECT {','.join(_COLUMNS)} FROM jobs"
        if not internal:
            query += " WHERE NOT internal"
        query += " ORDER BY started DESC"
        if limit:
            query += f" LIMIT {int(limit)}"
        with self._connect() as db:
            return [_record(row) for row in db.execute(query)]

    def get(self, ref: str) -> JobRecord:
        """A record by id, unique id prefix, or `last` (the newest job the user launched).

        Raises:
            UsageError: no job matches, or the prefix is ambiguous (the candidates named, newest first).
        """
        with self._connect() as db:
            if ref == "last":
                rows = list(db.execute(f"SELECT {','.join(_COLUMNS)} FROM jobs WHERE NOT internal "
                                       "ORDER BY started DESC LIMIT 1"))
            else:
                rows = list(db.execute(
                    f"SELECT {','.join(_COLUMNS)} FROM jobs WHERE id = ? OR id LIKE ? ESCAPE '\\' "
                    "ORDER BY started DESC",
                    (ref, _like_prefix(ref)),
                ))
                exact = [r for r in rows if r[0] == ref]
                rows = exact or rows
        if not rows:
            hint = "no jobs recorded yet" if ref == "last" else "see `distrun ps` for job ids"
            raise UsageError(f"no job matches '{ref}' ({hint})")
        if len(rows) > 1:
            shown = ", ".join(r[0] for r in rows[:AMBIGUOUS_SHOWN])
            more = f" and {len(rows) - AMBIGUOUS_SHOWN} more" if len(rows) > AMBIGUOUS_SHOWN else ""
            raise UsageError(f"'{ref}' matches {len(rows)} jobs, newest first: {shown}{more} (give more of the id)")
        return _record(rows[0])

    def ids(self, prefix: str = "") -> list[str]:
        """Job ids starting with `prefix`, newest first (for shell completion)."""
        with self._connect() as db:
            return [row[0] for row in db.execute("SELECT id FROM jobs WHERE id LIKE ? ESCAPE '\\' "
                                                 "ORDER BY started DESC", (_like_prefix(prefix),))]

    def delete(self, job_id: str) -> None:
        """Forget a job: its record and its directory on this machine."""
        with self._connect() as db:
            db.execute("DELETE FROM jobs WHERE id=?", (job_id,))
        shutil.rmtree(self.job_dir(job_id).root, ignore_errors=True)


def prunable(records: Iterable[JobRecord], older_than: float | None, keep: int | None,
             now: float | None = None) -> list[JobRecord]:
    """The finished jobs `distrun prune` removes; a job that has not finished is never one of them.

    Args:
        records: Every record, in any order.
        older_than: Seconds: only jobs that ended (else started) longer ago than this.
        keep: The newest this many finished jobs are kept whatever their age.
        now: The time to measure ages from (default: now).

    Returns:
        The jobs to remove, newest first.
    """
    now = time.time() if now is None else now
    finished = sorted((r for r in records if r.state.finished), key=lambda r: r.started, reverse=True)
    candidates = finished[keep:] if keep is not None else finished
    if older_than is None:
        return candidates
    return [r for r in candidates if now - (r.ended or r.started) > older_than]


def _private_database(path: Path) -> None:
    """Create the database file 0600 (SQLite takes an empty file as an empty database; its journal
    gets the same mode); one that an older distrun left readable by others is made 0600."""
    try:
        info = path.stat()
    except FileNotFoundError:
        write_private(path, b"")
        return
    if stat.S_IMODE(info.st_mode) & 0o077 and info.st_uid == os.geteuid():
        path.chmod(FILE_MODE)


def _like_prefix(prefix: str) -> str:
    return prefix.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"


def _record(row: tuple[Any, ...]) -> JobRecord:
    data = dict(zip(_COLUMNS, row, strict=True))
    for name in _JSON_COLUMNS:
        data[name] = json.loads(data[name] or "[]")
    data["state"] = JobState(data["state"])
    data["restarts"] = data["restarts"] or 0
    data["detail"] = data["detail"] or ""
    data["internal"] = bool(data["internal"])
    return JobRecord(**data)


def controller_alive(rec: JobRecord) -> bool:
    """Whether the process recorded as the job's controller still runs distrun."""
    if not rec.controller_pid:
        return False
    try:
        cmdline = Path(f"/proc/{rec.controller_pid}/cmdline").read_bytes()
    except OSError:
        return False
    return b"orchestrator" in cmdline or b"distrun" in cmdline
