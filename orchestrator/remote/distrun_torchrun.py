"""torchrun as distrun runs it on a host, keeping torchrun's record of each failed worker.

`python -P distrun_torchrun.py ARGS...` is `python -P -m torch.distributed.run ARGS...`: torchrun
runs as `-m` runs it, this program's directory off sys.path (what `-P` does, on any Python 3).
When torchrun raises `ChildFailedError`, every `ProcessFailure` (global rank and its fields) is
written to `failures.json` in torchrun's `--log-dir` (its first option) before torchrun reports and exits as always;
the supervisor reads it there (remote/workerfail.py's `read_records`).

The supervisor writes this file to `~/.distrun/jobs/<id>/bin/` on the host (remote/programs.py);
stdlib-only, and it imports nothing of distrun.
"""

from __future__ import annotations

import sys

if __name__ == "__main__" and not (getattr(sys.flags, "safe_path", 0) or sys.flags.isolated):
    sys.path.pop(0)  # this program's own directory, before anything is imported from it

import contextlib
import json
import os
import runpy
from typing import Any

RECORDS = "failures.json"


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


def main() -> None:
    path = records_path(sys.argv[1:])
    try:
        from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    except Exception:
        ChildFailedError = ()  # type: ignore[assignment,misc]
    try:
        runpy.run_module("torch.distributed.run", run_name="__main__", alter_sys=True)
    except ChildFailedError as exc:
        if path is not None:
            write_records(path, exc.failures)
        raise


if __name__ == "__main__":
    main()
