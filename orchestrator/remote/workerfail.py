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

A worker without `@record` (most third-party programs) leaves no error file: its exception is in
its own output, the traceback it ends with (`final_exception`). Whoever reads these files meets
what the ranks wrote, so nothing here trusts their shape: a row or a file that cannot be read
is skipped or taken for what it still says, never an exception. Stdlib-only: it runs on the hosts.
"""

from __future__ import annotations

import json
import os
import re
import signal
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

RECORDS = "failures.json"  # in torchrun's --log-dir (= remote/distrun_torchrun.py's RECORDS)
ERROR_FILES = ("error.json", "error.json.malformed")  # a worker's, and as distrun_torchrun.py sets a bad one aside
OUTPUT_TAIL = 64 << 10  # bytes of a rank's stderr.log read for the traceback it ends with
TRACEBACK = "Traceback (most recent call last)"
RANK_PREFIX = re.compile(r"^\[rank\d+\]: ?")  # torch's excepthook prefixes each line of a rank's traceback
# What a process may print after its exception while it exits or aborts (the C++ runtime, torch's
# warnings, a C++ exception's own stack in the message).
AFTER_NOISE = re.compile(r"terminate called|\s*what\(\):|Aborted|Fatal Python error|\[[WE]\d{4}|Exception raised from "
                         r"|frame #\d+:|<omitting python frames>|\s*$")
EXCEPTION_LINE = re.compile(r"^[A-Za-z_][\w.]*(?::(?: |$)|$)")  # `ValueError: planted`, `KeyboardInterrupt`


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
    worker's error file (a dict with `extraInfo.py_callstack`) or the agent's own line (a str);
    what is not of that shape is taken as text."""
    if not isinstance(message, dict):
        return str(message or ""), ""
    extra = message.get("extraInfo")
    callstack = extra.get("py_callstack") if isinstance(extra, dict) else None
    return str(message.get("message") or ""), str(callstack or "")


def final_exception(lines: Sequence[str]) -> tuple[str, tuple[str, ...]] | None:
    """The exception a rank's output ends with: (its line, its traceback's lines in view), else None.

    The last line that is not exit noise (`AFTER_NOISE`) must be an exception's line (`Name: ...`)
    right under a traceback's frames (`  File "...", line N`); the traceback's header is included
    when it is in view. A traceback logged earlier, then other work, is not how the rank ended.
    """
    plain = [RANK_PREFIX.sub("", line) for line in lines]
    end = len(plain)
    while end and AFTER_NOISE.match(plain[end - 1]):
        end -= 1
    if end < 2 or not EXCEPTION_LINE.match(plain[end - 1]):
        return None
    start = end - 1
    while start and plain[start - 1][:1].isspace():
        start -= 1
    if not any(line.lstrip().startswith('File "') for line in plain[start:end - 1]):
        return None
    if start and plain[start - 1].startswith(TRACEBACK):
        start -= 1
    return plain[end - 1], tuple(plain[start:end])


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
    job did not fail in its workers) or the file cannot be read; a row that cannot be read is left out."""
    try:
        with open(path, encoding="utf-8") as fh:
            rows = json.load(fh).get("failures") or []
    except (OSError, ValueError, AttributeError):
        return []
    records = []
    for row in rows if isinstance(rows, list) else ():
        try:
            records.append(from_process_failure(row.get("rank"), row))
        except (ValueError, AttributeError):
            continue
    return records


def first_failure(records: Sequence[WorkerRecord]) -> WorkerRecord | None:
    """The record that failed first, by its timestamp, as `ChildFailedError.get_first_failure`.
    torch keeps whole seconds: within one, a worker that torchrun itself ended (SIGTERM, its
    teardown of the others) comes after one that failed alone, then the order given. None when
    there is none."""
    return min(records, key=lambda record: (record.timestamp, record.exitcode == -signal.SIGTERM), default=None)


def raised_workers(log_dir: str, rank_of: Callable[[int, int], int]) -> list[WorkerRecord]:
    """The workers of torchrun's latest attempt that have raised, while their processes may take
    seconds more to exit: through elastic's `@record` (its error file,
    `<log_dir>/<run>/attempt_<n>/<local rank>/error.json`, which it writes as its exception leaves its
    main), else by the traceback its stderr.log ends with (a program without `@record`), else an
    error file that cannot be read (half written, or of another shape). Such a worker exits 1; its
    pid is not in its files (0 here).

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
                if not local.isdigit():
                    continue
                said = _raised(rank_dir)
                if said is not None:
                    rank = rank_of(restart, int(local))
                    found[rank] = WorkerRecord(rank, int(local), 0, 1, *said)
    return [found[rank] for rank in sorted(found)]


def _raised(rank_dir: str) -> tuple[str, str, float] | None:
    """(message, traceback, time) of a worker that has raised, from its files (see `raised_workers`)."""
    recorded = _error_file(os.path.join(rank_dir, ERROR_FILES[0]))
    if recorded is not None:
        return recorded
    output = os.path.join(rank_dir, "stderr.log")
    raised = final_exception(_tail(output))
    if raised is not None:
        return raised[0], "\n".join(raised[1]) + "\n", _mtime(output)
    for name in ERROR_FILES:  # there, but unreadable: it raised all the same
        written = _mtime(os.path.join(rank_dir, name))
        if written:
            return "", "", written
    return None


def _error_file(path: str) -> tuple[str, str, float] | None:
    """(message, traceback, time) of a well-formed `@record` error file; None without one."""
    try:
        with open(path, encoding="utf-8") as fh:
            message = json.load(fh)["message"]
        if not isinstance(message, str | dict):
            return None
        text, traceback = error_message(message)
        stamp = float(message["extraInfo"]["timestamp"]) if isinstance(message, dict) else _mtime(path)
        return text, traceback, stamp
    except (OSError, ValueError, LookupError, TypeError):
        return None


def _tail(path: str) -> list[str]:
    """The last OUTPUT_TAIL bytes of a file as lines ([] when it cannot be read)."""
    try:
        with open(path, "rb") as fh:
            fh.seek(max(0, os.fstat(fh.fileno()).st_size - OUTPUT_TAIL))
            return fh.read().decode("utf-8", "replace").splitlines()
    except OSError:
        return []


def _mtime(path: str) -> float:
    try:
        return os.stat(path).st_mtime
    except OSError:
        return 0.0


def _subdirs(path: str) -> list[str]:
    try:
        return sorted(entry.path for entry in os.scandir(path) if entry.is_dir())
    except OSError:
        return []
