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

from orchestrator.console.session import origin_here
from orchestrator.console.terminal import show
from orchestrator.errors import InfraError, UsageError
from orchestrator.remote.private import FILE_MODE, make_private_dirs, open_private, write_private


class JobState(str, Enum):
    PENDING = "pending"
    RUNNING = "running"
    STALLED = "stalled"  # running, but no rank has progressed for stall_after (or a third of hang_timeout)
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    STOPPED = "stopped"
    LOST = "lost"

    @property
    def finished(self) -> bool:
        return self not in UNFINISHED


# A record's state moves only out of these: once a job's end is recorded, nothing overwrites it.
UNFINISHED = (JobState.PENDING, JobState.RUNNING, JobState.STALLED)


@dataclass
class JobRecord:
    """One job as the database keeps it.

    Attributes:
        backend: The backend's NAME (ssh, local, slurm, ...).
        backend_ref: The backend's own handle on the job (Slurm's job id), None when it has none.
        detail: The summary people read (also in the job directory's summary.txt).
        failures: `Failure.to_dict()` of each failure, the root cause first; [] when none.
        alerts: Alerts raised while the job ran (telemetry's, stragglers', stalls'), each a JSON object
            {"t", "node", "rule", "rank" (or null), "message" (the sentence), "figures" (an object),
            "evidence"} (telemetry/alerts.py `Alert.record()`, read back with `recorded`); a job an older
            distrun recorded has sentences (`14:02:11 node1: ...`) instead, which `recorded` reads too.
        controller_start: When the controller process started (`process_start`): with
            `controller_pid`, the identity of the controller; a reused pid has another start.
        internal: A run distrun made for itself (doctor --bandwidth's all-reduce): never `last`,
            listed only by `ps --all`.
        command: The `distrun launch` arguments that start the job again on the same hosts
            ([] when unknown).
        attempts: `restarts.AttemptRecord.to_dict()` of each attempt of the controller's (`restarts:`),
            in order; [] for a job recorded before it started one.
        quarantined: Hosts a failure pointed at, left out of the job's later attempts.
        gpus_freed: `node: line` for each GPU's memory the job's end freed (remote/gpu.py).
        progress: The job's progress from its ranks' Flight Recorders (diagnose/flight.py's
            `FlightProgress.to_dict`: collectives per second, each rank's last completed); {} when none.
        origin: Where the job was launched from (`origin_here`: the terminal's session), for `last`;
            "" for a job an older distrun recorded.
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
    alerts: list[Any] = field(default_factory=list)
    failures: list[dict[str, Any]] = field(default_factory=list)
    controller_start: str | None = None
    internal: bool = False
    command: list[str] = field(default_factory=list)
    attempts: list[dict[str, Any]] = field(default_factory=list)
    quarantined: list[str] = field(default_factory=list)
    gpus_freed: list[str] = field(default_factory=list)
    progress: dict[str, Any] = field(default_factory=dict)
    origin: str = field(default_factory=origin_here)

    @property
    def every_host(self) -> list[str]:
        """The hosts of every attempt, in the order they first ran the job (`hosts`: the last attempt's)."""
        earlier = [host for attempt in self.attempts for host in attempt.get("hosts", [])]
        return list(dict.fromkeys([*earlier, *self.hosts]))

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id, "name": self.name, "spec": self.spec_path, "inventory": self.inventory,
            "hosts": self.hosts, "master_addr": self.master_addr, "master_port": self.master_port,
            "backend": self.backend, "state": self.state.value, "started": self.started,
            "ended": self.ended, "exit_code": self.exit_code, "controller_pid": self.controller_pid,
            "restarts": self.restarts, "backend_ref": self.backend_ref, "detail": self.detail,
            "alerts": self.alerts, "failures": self.failures, "internal": self.internal,
            "command": self.command, "attempts": self.attempts, "quarantined": self.quarantined,
            "gpus_freed": self.gpus_freed, "progress": self.progress,
        }


_COLUMNS = ("id", "name", "spec_path", "inventory", "hosts", "master_addr", "master_port", "backend",
            "state", "started", "ended", "exit_code", "controller_pid", "restarts", "backend_ref",
            "detail", "alerts", "failures", "controller_start",
            "internal", "command", "attempts", "quarantined", "gpus_freed", "progress", "origin")
_JSON_COLUMNS = ("hosts", "alerts", "failures", "command", "attempts", "quarantined", "gpus_freed")
AMBIGUOUS_SHOWN = 8

BUSY_TIMEOUT = 30.0  # seconds a write waits for another process's lock on the database

_SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
    id TEXT PRIMARY KEY, name TEXT NOT NULL, spec_path TEXT, inventory TEXT, hosts TEXT,
    master_addr TEXT, master_port INTEGER, backend TEXT, state TEXT NOT NULL,
    started REAL NOT NULL, ended REAL, exit_code INTEGER, controller_pid INTEGER,
    restarts INTEGER DEFAULT 0, backend_ref TEXT, detail TEXT DEFAULT '', alerts TEXT DEFAULT '[]',
    failures TEXT DEFAULT '[]', controller_start TEXT, internal INTEGER DEFAULT 0,
    command TEXT DEFAULT '[]', attempts TEXT DEFAULT '[]', quarantined TEXT DEFAULT '[]',
    gpus_freed TEXT DEFAULT '[]', progress TEXT DEFAULT '{}', origin TEXT DEFAULT ''
)
"""
# Columns renamed since a release wrote them: old name -> new name.
_RENAMED = {"slurm_id": "backend_ref"}
# Columns added since the first release: name -> its definition.
_ADDED = {"failures": "TEXT DEFAULT '[]'", "controller_start": "TEXT", "internal": "INTEGER DEFAULT 0",
          "command": "TEXT DEFAULT '[]'", "attempts": "TEXT DEFAULT '[]'", "quarantined": "TEXT DEFAULT '[]'",
          "gpus_freed": "TEXT DEFAULT '[]'", "progress": "TEXT DEFAULT '{}'", "origin": "TEXT DEFAULT ''"}


ID_RANDOM_BYTES = 3


def distrun_home() -> Path:
    return Path(os.environ.get("DISTRUN_HOME") or "~/.distrun").expanduser()


def new_job_id(name: str, now: float | None = None) -> str:
    """A readable id, unique in practice: `resnet50-20261121-143012-a3f9c2`.

    24 random bits on a 1-second stamp: two launches of one job name in the same second
    collide once in about 16 million. `Store.save` refuses an id already recorded, so a
    collision is an error, never an overwritten record.
    """
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(now or time.time()))
    return f"{name}-{stamp}-{secrets.token_hex(ID_RANDOM_BYTES)}"


class JobDir:
    """The files of one job: plan.json, its lines (ranks/, nodes/, lines.idx: orchestrator/logs), metrics,
    telemetry, summary.txt."""

    def __init__(self, root: Path) -> None:
        self.root = root

    @property
    def plan(self) -> Path:
        return self.root / "plan.json"

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
    def collectives(self) -> Path:
        """The ranks' Flight Recorder rounds as they came (`fr` events, remote/frpoll.py): {"t" (the
        controller's time), "node", "ranks", "skipped"} a line, and since issue 45 "at" (the round's time
        on the host's clock; rounds fall on the wall clock's multiples of 5 s on every host), "final" (the
        ranks whose record this is as they ended) where set; a collective of "ranks" is [seq, op,
        entered_us] or [seq, op, entered_us, duration_us] where the record timed it, and a rank's summary
        may carry "sched" (its process's cpu_ms, wait_ms, throttled_ms, nr_throttled, stopped, looks), as
        the line's own "sched" ({rank: those figures}) carries them for the skipped ranks."""
        return self.root / "collectives.jsonl"

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

    @property
    def flight(self) -> Path:
        """Where a hang's Flight Recorder dumps are kept: rank<R>.json for each rank that served one, flight.json."""
        return self.root / "flight"

    @property
    def end(self) -> Path:
        """How the job ended, as its controller recorded it (written before the database is)."""
        return self.root / "end.json"

    def write_plan(self, plan: dict[str, Any], facts: dict[str, Any] | None = None) -> None:
        """plan.json (the plan with its secrets masked) and, when given, facts.json (what each host's probe found).

        Raises:
            InfraError: the files could not be written (a full disk): nothing was started.
        """
        try:
            self.create()
            write_private(self.plan, json.dumps(plan, indent=2) + "\n")
            if facts is not None:
                write_private(self.facts, json.dumps(facts, indent=2) + "\n")
        except OSError as exc:
            raise InfraError(f"cannot write the job's files into {self.root}: {exc.strerror or exc} "
                             "(free space under DISTRUN_HOME, or point DISTRUN_HOME elsewhere)") from exc

    def create(self) -> None:
        """The job directory and its nodes/ and ranks/, each 0700."""
        make_private_dirs(self.root / "nodes")
        make_private_dirs(self.root / "ranks")

    def open(self, path: Path, mode: str = "a", **kwargs: Any) -> IO[Any]:
        """A file of this job (its directory created), mode 0600: every writer of the job's files opens them here.

        Args:
            path: One of this job's files (`metrics`, `telemetry`, ...).
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
        """A short connection in one transaction.

        Raises:
            InfraError: the database stayed locked by another process for BUSY_TIMEOUT seconds,
                or cannot be written (a full disk).
        """
        try:
            db = sqlite3.connect(self.db_path, timeout=BUSY_TIMEOUT)
            try:
                with db:
                    yield db
            finally:
                db.close()
        except sqlite3.OperationalError as exc:
            raise InfraError(f"job database {self.db_path}: {exc} (another process may hold it, or its disk "
                             "is full)") from exc

    def _migrate(self) -> None:
        """Bring a database written by an older distrun up to `_SCHEMA`.

        Two processes may open an old database at once: the first takes the write lock
        (BEGIN IMMEDIATE) and migrates; the second then finds nothing left to do.
        """
        db = sqlite3.connect(self.db_path, timeout=BUSY_TIMEOUT, isolation_level=None)
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
        """Record a new job.

        Raises:
            UsageError: a job with this id is already recorded (records are never replaced).
            InfraError: the database could not be written.
        """
        row = (rec.id, rec.name, rec.spec_path, rec.inventory, json.dumps(rec.hosts), rec.master_addr,
               rec.master_port, rec.backend, rec.state.value, rec.started, rec.ended, rec.exit_code,
               rec.controller_pid, rec.restarts, rec.backend_ref, rec.detail, json.dumps(rec.alerts),
               json.dumps(rec.failures), rec.controller_start, int(rec.internal), json.dumps(rec.command),
               json.dumps(rec.attempts), json.dumps(rec.quarantined), json.dumps(rec.gpus_freed),
               json.dumps(rec.progress), rec.origin)
        marks = ",".join("?" * len(_COLUMNS))
        try:
            with self._connect() as db:
                db.execute(f"INSERT INTO jobs ({','.join(_COLUMNS)}) VALUES ({marks})", row)
        except sqlite3.IntegrityError:
            raise UsageError(f"job id {rec.id} is already recorded (see `distrun ps --all`; choose another id)") \
                from None

    def update(self, job_id: str, **fields: Any) -> bool:
        """Set some fields of a record (enum and list values are stored as the record does).

        A `state` is set only on a record that is still pending or running (with the other
        fields of the same call): a recorded end is never overwritten, whoever comes later.

        Returns:
            Whether the record was changed.

        Raises:
            InfraError: the database could not be written.
        """
        return self._set(job_id, UNFINISHED if "state" in fields else None, fields)

    def settle_lost(self, job_id: str, state: JobState, **fields: Any) -> bool:
        """Set the final state of a job recorded as pending, running or lost (its controller died
        and how it ended was unknown): `distrun stop` ended it on its hosts, or its scheduler says.

        Returns:
            Whether the record was changed.
        """
        return self._set(job_id, (*UNFINISHED, JobState.LOST), {"state": state, **fields})

    def _set(self, job_id: str, only_from: tuple[JobState, ...] | None, fields: dict[str, Any]) -> bool:
        values = [json.dumps(v) if isinstance(v, list | dict) else (v.value if isinstance(v, Enum) else v)
                  for v in fields.values()]
        sets = ",".join(f"{k}=?" for k in fields)
        where, args = "id=?", [job_id]
        if only_from is not None:
            where += f" AND state IN ({','.join('?' * len(only_from))})"
            args += [s.value for s in only_from]
        with self._connect() as db:
            return db.execute(f"UPDATE jobs SET {sets} WHERE {where}", [*values, *args]).rowcount > 0

    def end(self, job_id: str, state: JobState, exit_code: int, detail: str, **fields: Any) -> bool:
        """Record how a job ended: summary.txt and end.json in its directory first, then the record.

        The files come first so that an end the database could not take (locked by another
        process, a full disk) is still known: `recorded_end` reads it back, and `ps` then
        settles the record from it once its controller is gone.

        Args:
            job_id: The job.
            state: Its final state.
            exit_code: What its controller exits with.
            detail: The summary people read.
            fields: Other fields to set (e.g. failures, restarts).

        Returns:
            Whether the record took the end (False: it had ended already).

        Raises:
            InfraError: the database could not be written (the files may have been).
        """
        values = {"state": state.value, "exit_code": exit_code, "ended": time.time(), "detail": detail, **fields}
        job_dir = self.job_dir(job_id)
        problems = []
        try:
            make_private_dirs(job_dir.root)
            write_private(job_dir.summary, detail + "\n")
            _write_atomically(job_dir.end, json.dumps(values) + "\n")
        except OSError as exc:
            problems.append(f"cannot write into {job_dir.root}: {exc.strerror or exc}")
        try:
            changed = self.update(job_id, **{**values, "state": state})
        except InfraError as exc:
            problems.append(str(exc))
            changed = False
        if problems:
            raise InfraError(f"the end of job {job_id} is not recorded: {'; '.join(problems)}")
        return changed

    def recorded_end(self, job_id: str) -> dict[str, Any] | None:
        """The end a controller wrote into the job's directory (`end`), or None when it wrote none."""
        try:
            data = json.loads(self.job_dir(job_id).end.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        if not isinstance(data, dict) or data.get("state") not in {s.value for s in JobState}:
            return None
        return {key: value for key, value in data.items() if key in _COLUMNS and key != "id"}

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
        """A record by id, unique id prefix, or `last` (`last`'s).

        Raises:
            UsageError: no job matches, or the prefix is ambiguous (the candidates named, newest first).
        """
        if ref == "last":
            return self.last()
        with self._connect() as db:
            rows = list(db.execute(f"SELECT {','.join(_COLUMNS)} FROM jobs WHERE id = ? OR id LIKE ? ESCAPE '\\' "
                                   "ORDER BY started DESC", (ref, _like_prefix(ref))))
        rows = [r for r in rows if r[0] == ref] or rows
        if not rows:
            raise UsageError(f"no job matches '{ref}' (see `distrun ps` for job ids)")
        if len(rows) > 1:
            shown = ", ".join(r[0] for r in rows[:AMBIGUOUS_SHOWN])
            more = f" and {len(rows) - AMBIGUOUS_SHOWN} more" if len(rows) > AMBIGUOUS_SHOWN else ""
            raise UsageError(f"'{ref}' matches {len(rows)} jobs, newest first: {shown}{more} (give more of the id)")
        return _record(rows[0])

    def last(self) -> JobRecord:
        """`last`: the newest job launched from here (`origin_here`: this terminal's session), so that
        two terminals sharing DISTRUN_HOME each get their own; where none was, the newest job of
        DISTRUN_HOME, with a note on stderr naming it. Runs distrun makes for itself are never `last`.

        Raises:
            UsageError: no job is recorded.
        """
        select = f"SELECT {','.join(_COLUMNS)} FROM jobs WHERE NOT internal"
        with self._connect() as db:
            rows = list(db.execute(f"{select} AND origin = ? ORDER BY started DESC LIMIT 1", (origin_here(),)))
            newest = rows or list(db.execute(f"{select} ORDER BY started DESC LIMIT 1"))
        if not newest:
            raise UsageError("no job matches 'last' (no jobs recorded yet)")
        rec = _record(newest[0])
        if not rows:
            show(f"distrun: note: `last` is {rec.id}, the newest job of {self.home}: none was launched from "
                 "this terminal", err=True)
        return rec

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
    data["progress"] = json.loads(data["progress"] or "{}")
    data["origin"] = data["origin"] or ""
    return JobRecord(**data)


def _write_atomically(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    write_private(tmp, text)
    os.replace(tmp, path)
