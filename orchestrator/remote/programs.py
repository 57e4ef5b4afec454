"""The programs a host runs by name, written by the supervisor before torchrun starts.

The plan shows each host's argv as it runs: `python -P ~/.distrun/jobs/<id>/bin/distrun_torchrun.py
--log-dir ~/.distrun/jobs/<id>/<node>/torchrun ... ~/.distrun/jobs/<id>/bin/distrun_worker.py
train.py ...`. The supervisor writes the programs named there (their source comes in its
configuration) into the job's `bin/` (a directory only this user can enter), and expands `~` in
the words of the job's own directory as a shell does: pasted into a shell on the host, the plan's
line runs the same processes. Stdlib-only: shipped to the hosts.
"""

from __future__ import annotations

import os

from orchestrator.remote.private import make_private_dirs, write_private


def write_programs(bin_dir: str, programs: dict[str, str]) -> None:
    """Write each program (file name -> source) into `bin_dir`, whole or not at all: a file is
    written beside its name and renamed over it (hosts that share a home write the same bytes).

    Raises:
        OSError: the directory or a file could not be written (the job does not start).
        ValueError: a name is not a plain file name.
    """
    if not programs:
        return
    make_private_dirs(bin_dir)
    for name, source in programs.items():
        if os.path.basename(name) != name or not name.endswith(".py"):
            raise ValueError(f"not a program's file name: {name!r}")
        path = os.path.join(bin_dir, name)
        part = f"{path}.{os.getpid()}.part"
        write_private(part, source)  # 0600, as every file of the job's on the host
        os.replace(part, path)


def expand_job_words(argv: list[str], job_dir: str) -> list[str]:
    """argv with `~` expanded in each word under `job_dir` (`~/.distrun/jobs/<id>`), as a shell
    expands it at the start of a word; every other word, the job's own arguments included, as is."""
    if not job_dir.startswith("~"):
        return list(argv)
    prefix = job_dir.rstrip("/") + "/"
    return [os.path.expanduser(word) if word.startswith(prefix) else word for word in argv]
