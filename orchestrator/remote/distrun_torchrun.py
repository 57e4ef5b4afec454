"""torchrun as distrun runs it on a host, keeping torchrun's record of each failed worker.

`python -P distrun_torchrun.py ARGS...` is `python -P -m torch.distributed.run ARGS...`: torchrun
runs as `-m` runs it, this program's directory off sys.path (what `-P` does, on any Python 3).
When torchrun raises `ChildFailedError`, every `ProcessFailure` (global rank and its fields) is
written to `failures.json` in torchrun's `--log-dir` (its first option) before torchrun reports and exits as always;
the supervisor reads it there (remote/workerfail.py's `read_records`).

A worker's own error file (`TORCHELASTIC_ERROR_FILE`) that torch elastic cannot read (truncated
JSON, another shape) would crash torchrun itself as it records the failure, and lose the worker's
record: every `ProcessFailure` first checks the file as torch will read it (`error_file_problem`),
and a bad one is set aside as `error.json.malformed`, said on torchrun's stderr, and the worker
recorded as one without an error file (its exit code), at the time the file was written.

The supervisor writes this file to `~/.distrun/jobs/<id>/bin/` on the host (remote/programs.py);
stdlib-only, and it imports nothing of distrun.
"""

from __future__ import annotations

import sys

if __name__ == "__main__" and not (getattr(sys.flags, "safe_path", 0) or sys.flags.isolated):
    sys.path.pop(0)  # this program's own directory, before anything is imported from it

import contextlib
import datetime
import json
import os
import runpy
from typing import Any

RECORDS = "failures.json"
SET_ASIDE = ".malformed"  # a worker's bad error file is renamed with this suffix


def records_path(argv: list[str]) -> str | None:
    """Where the failed workers go: torchrun's `--log-dir`, which distrun gives as its first option
    (the plan, or the supervisor where the plan cannot name the host's directory); None without."""
    if len(argv) > 1 and argv[0] == "--log-dir":
        return os.path.join(argv[1], RECORDS)
    return None


def write_records(path: str, failures: dict[int, Any]) -> None:
    rows = [{"rank": rank, "local_rank": f.local_rank, "pid": f.pid, "exitcode": f.exitcode,
             "timestamp": f.timestamp, "message": f.message} for rank, f in failures.items()]
    with contextlib.suppress(Exception), open(path, "w") as fh:
        json.dump({"failures": rows}, fh)


def error_file_problem(path: str) -> str | None:
    """Why a worker's error file cannot be read as torch elastic reads it (`ProcessFailure`, then
    `ChildFailedError`'s report), in words; None when it can, or there is none."""
    if not os.path.isfile(path):
        return None
    try:
        with open(path) as fh:  # as torch opens it: the locale's encoding
            data = json.load(fh)
    except (OSError, ValueError) as exc:
        return f"{type(exc).__name__}: {exc}"
    return shape_problem(data)


def shape_problem(data: Any) -> str | None:
    """What of torch elastic's error-file shape `data` lacks: `{"message": TEXT, "timestamp": N}` or
    `{"message": {"message": TEXT, "extraInfo": {"py_callstack": TEXT, "timestamp": N}}}`."""
    message = data.get("message") if isinstance(data, dict) else None
    if isinstance(message, str):
        stamp = data.get("timestamp", 0)
    elif isinstance(message, dict) and isinstance(message.get("extraInfo"), dict):
        extra = message["extraInfo"]
        if not isinstance(message.get("message", ""), str) or not isinstance(extra.get("py_callstack", ""), str):
            return "its message or traceback is not text"
        stamp = extra.get("timestamp")
    else:
        return "no message of torch elastic's shape"
    try:
        datetime.datetime.fromtimestamp(int(stamp))
    except (TypeError, ValueError, OverflowError, OSError):
        return f"no usable timestamp ({stamp!r:.40})"
    return None


def set_aside(path: str, local_rank: int) -> float | None:
    """A bad error file renamed out of torch's way and said on stderr; when it was written (None: it was fine)."""
    problem = error_file_problem(path)
    if problem is None:
        return None
    aside = path + SET_ASIDE
    try:
        written = os.stat(path).st_mtime
        os.replace(path, aside)
    except OSError as exc:
        problem += f"; it could not be set aside ({exc})"
        written = None
    sys.stderr.write(f"distrun: local rank {local_rank}'s error file {path} is not torch elastic's ({problem}); "
                     f"set aside as {aside}, the worker recorded by its exit code\n")
    sys.stderr.flush()
    return written


def tolerate_bad_error_files(process_failure: Any) -> None:
    """Have torch elastic's `ProcessFailure` set a worker's bad error file aside before it reads it."""
    original = process_failure.__post_init__

    def __post_init__(self: Any) -> None:
        written = set_aside(self.error_file, self.local_rank)
        original(self)
        if written is not None:
            self.timestamp = int(written)

    process_failure.__post_init__ = __post_init__


def main() -> None:
    path = records_path(sys.argv[1:])
    try:
        from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    except Exception:
        ChildFailedError = ()  # type: ignore[assignment,misc]
    with contextlib.suppress(Exception):  # a torch without it reads error files as it always did
        from torch.distributed.elastic.multiprocessing.errors import ProcessFailure
        tolerate_bad_error_files(ProcessFailure)
    try:
        runpy.run_module("torch.distributed.run", run_name="__main__", alter_sys=True)
    except ChildFailedError as exc:
        if path is not None:
            write_records(path, exc.failures)
        raise


if __name__ == "__main__":
    main()
