"""Each failed worker's record, as torchrun's agent knew it: rank, exit code or signal, message,
traceback, time.

Who writes what (torch 2.13, torch/distributed/elastic):
- torchrun gives every worker `TORCHELASTIC_ERROR_FILE` (`<log dir>/<run id>/attempt_N/<local
  rank>/error.json`). A worker whose entry point has elastic's `@record` writes its uncaught
  exception there: `{"message": {"message": "ValueError: ...", "extraInfo": {"py_callstack":
  TRACEBACK, "timestamp": "SECONDS"}}}`.
- A worker killed by a signal (SIGKILL, SIGSEGV) or that exits without `@record` writes nothing:
  only torchrun's agent knows its exit status. It builds a `ProcessFailure` per failed worker
  (the error file's message and time, else "Signal 9 (SIGKILL) received by PID ..." and the time
  it saw the exit) and raises them all in one `ChildFailedError`.

So torchrun runs as distrun's program (remote/distrun_torchrun.py): when torchrun raises
`ChildFailedError`, it writes every `ProcessFailure` to `failures.json` in torchrun's log
directory, then lets torchrun report and exit as always. The supervisor reads that file
(`read_records`) and sends the records in its `exit` event; the controller builds a `Failure`
from the first by time (`first_failure`, as elastic's `ChildFailedError.get_first_failure`).
Stdlib-only: it runs on the hosts.
"""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

RECORDS = "failures.json"  # in torchrun's --log-dir (= remote/distrun_torchrun.py's RECORDS)


@dataclass(frozen=True)
class WorkerRecord:
    """One failed worker, from torchrun's `ProcessFailure`.

    Attributes:
        rank: The global rank.
        local_rank: The rank on its host.
        pid: The worker's process id.
        exitcode: Its exit code; negative N: killed by signal N.
        message: What failed in a line ("ValueError: boom", "Signal 9 (SIGKILL) received by PID 12").
        traceback: The worker's Python traceback ("" when it wrote none: a signal, no `@record`).
        timestamp: When it failed (seconds since the epoch, whole seconds as torch keeps them).
    """

    rank: int
    local_rank: int
    pid: int
    exitcode: int
    message: str
    traceback: str
    timestamp: float

    @property
    def signal(self) -> str | None:
        """The signal that killed it ("SIGKILL"), None when it exited."""
        if self.exitcode >= 0:
            return None
        try:
            return signal.Signals(-self.exitcode).name
        except ValueError:
            return f"signal {-self.exitcode}"

    def to_event(self) -> dict[str, Any]:
        """The record as the supervisor sends it; `from_event` reads it back."""
        return asdict(self)

    @classmethod
    def from_event(cls, data: dict[str, Any]) -> WorkerRecord:
        """A record from `to_event`'s data.

        Raises:
            ValueError: a field is missing or of the wrong type.
        """
        try:
            return cls(int(data["rank"]), int(data["local_rank"]), int(data["pid"]), int(data["exitcode"]),
                       str(data["message"]), str(data.get("traceback") or ""), float(data["timestamp"]))
        except (KeyError, TypeError) as exc:
            raise ValueError(f"malformed worker failure record: {exc}") from exc


def error_message(message: Any) -> tuple[str, str]:
    """(message, traceback) from what torch elastic keeps as a failure's message: the `message` of a
    worker's error file (a dict with `extraInfo.py_callstack`) or the agent's own line (a str)."""
    if not isinstance(message, dict):
        return str(message or ""), ""
    extra = message.get("extraInfo") or {}
    return str(message.get("message") or ""), str(extra.get("py_callstack") or "")


def from_process_failure(rank: int, failure: dict[str, Any]) -> WorkerRecord:
    """A record from one of distrun_torchrun.py's rows (a `ProcessFailure`'s fields).

    Raises:
        ValueError: a field is missing or of the wrong type.
    """
    message, traceback = error_message(failure.get("message"))
    try:
        return WorkerRecord(int(rank), int(failure["local_rank"]), int(failure["pid"]), int(failure["exitcode"]),
                            message, traceback, float(failure["timestamp"]))
    except (KeyError, TypeError) as exc:
        raise ValueError(f"malformed torchrun failure record: {exc}") from exc


def read_records(path: str) -> list[WorkerRecord]:
    """The failed workers distrun_torchrun.py wrote to `path`, in torchrun's order; [] when it wrote none (the
    job did not fail in its workers) or the file cannot be read."""
    try:
        with open(path, encoding="utf-8") as fh:
            rows = json.load(fh).get("failures") or []
        return [from_process_failure(row.get("rank"), row) for row in rows]
    except (OSError, ValueError, AttributeError):
        return []


def first_failure(records: Sequence[WorkerRecord]) -> WorkerRecord | None:
    """The record that failed first, by its timestamp, as `ChildFailedError.get_first_failure`.
    torch keeps whole seconds: within one, a worker that torchrun itself ended (SIGTERM, its
    teardown of the others) comes after one that failed alone, then the order given. None when
    there is none."""
    return min(records, key=lambda record: (record.timestamp, record.exitcode == -signal.SIGTERM), default=None)


def raised_workers(log_dir: str, rank_of: Callable[[int, int], int]) -> list[WorkerRecord]:
    """The workers of torchrun's latest attempt that have raised through elastic's `@record`: each
    one's error file (`<log_dir>/<run>/attempt_<n>/<local rank>/error.json`), which it writes as its
    exception leaves its main, while the process may take seconds more to exit. Such a worker exits
    1; its pid is not in the file (0 here).

    Args:
        log_dir: torchrun's `--log-dir`.
        rank_of: (restart, local rank) -> global rank.
    """
    found: dict[int, WorkerRecord] = {}
    for run in _subdirs(log_dir):
        attempts = [(int(name[len("attempt_"):]), path) for path in _subdirs(run)
                    if (name := os.path.basename(path)).startswith("attempt_") and name[len("attempt_"):].isdigit()]
        for restart, attempt in sorted(attempts)[-1:]:
            for rank_dir in _subdirs(attempt):
                local = os.path.basename(rank_dir)
                record = _raised(os.path.join(rank_dir, "error.json"), restart, local, rank_of)
                if record is not None:
                    found[record.rank] = record
    return [found[rank] for rank in sorted(found)]


def _raised(path: str, restart: int, local: str, rank_of: Callable[[int, int], int]) -> WorkerRecord | None:
    try:
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
        message, traceback = error_message(data.get("message"))
        stamp = float((data.get("message") or {}).get("extraInfo", {}).get("timestamp") or 0)
        return WorkerRecord(rank_of(restart, int(local)), int(local), 0, 1, message, traceback, stamp)
    except (OSError, ValueError, AttributeError, TypeError):
        return None


def _subdirs(path: str) -> list[str]:
    try:
        return sorted(entry.path for entry in os.scandir(path) if entry.is_dir())
    except OSError:
        return []
