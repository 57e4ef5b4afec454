"""Which processes of a host are provably a job's, not merely claiming to be.

The markers the supervisor puts in the job's environment (DISTRUN_JOB_ID, DISTRUN_NODE) are in
`ps` for every user, who can start a process that carries them. A process is the job's only when
it is the job's user's (real and effective uid) and descends from a recorded root: the
supervisor, or the torchrun it started, each known by its pid and start time (a reused pid has
another start time). The supervisor becomes its children's subreaper, so a worker whose torchrun
is gone is reparented to it and stays provable; a stop (`supervisor.end_job`) adds each process
it proves to its roots, so one whose torchrun exits while no supervisor is left to adopt it stays
provable to the end of that stop. Programs run beside the job later (`stack`, the `stop`
cleanup) read the roots from the record the supervisor wrote into the host's private job
directory (`record`, `recorded`). Stdlib-only (runs on the hosts).
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import stat
from collections.abc import Iterable
from typing import NamedTuple

from orchestrator.remote.private import write_private

MAX_DEPTH = 64  # ancestors looked at; a job's processes are a few levels below its supervisor
PR_SET_CHILD_SUBREAPER = 36


class Root(NamedTuple):
    """A process the job's processes descend from: its pid and start time (clock ticks since boot)."""

    pid: int
    start: int


def _stat(pid: int) -> list[bytes] | None:
    """The fields of /proc/PID/stat after the command name (state first), or None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            return fh.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return None


def root_of(pid: int) -> Root | None:
    """`pid` as a root (its start time pins it against reuse), or None when it is gone."""
    fields = _stat(pid)
    return None if fields is None or len(fields) < 20 else Root(pid, int(fields[19]))


def _owned(pid: int) -> bool:
    """Whether the process's real and effective uid are this process's."""
    try:
        with open(f"/proc/{pid}/status", "rb") as fh:
            uids = next(line for line in fh if line.startswith(b"Uid:")).split()[1:3]
    except (OSError, StopIteration):
        return False
    return [int(u) for u in uids] == [os.getuid(), os.getuid()]


def proven(pid: int, roots: Iterable[Root]) -> bool:
    """Whether `pid` is the job's: this user's, and a root or a descendant of one."""
    return proven_root(pid, roots) is not None


def proven_root(pid: int, roots: Iterable[Root]) -> Root | None:
    """`pid` as a Root (its start time read in the look that proved it) when it is the job's, else
    None. Added to the roots, it stays provable after its parent exits and nothing of the job
    adopts it (torchrun gone after its supervisor): how a stop holds on to what it found."""
    wanted = set(roots)
    if not wanted or not _owned(pid):
        return None
    current, found = pid, None
    for _ in range(MAX_DEPTH):
        fields = _stat(current)
        if fields is None or len(fields) < 20:
            return None
        here = Root(current, int(fields[19]))
        found = found or here
        if here in wanted:
            return found
        parent = int(fields[1])
        if parent <= 0 or parent == current:
            return None
        current = parent
    return None


def own_roots() -> list[Root]:
    """This process as the only root (the supervisor finds its own job's processes)."""
    me = root_of(os.getpid())
    return [me] if me is not None else []


def record_path(job_dir: str, node: str) -> str:
    """Where the supervisor records a node's roots, in the host's private job directory."""
    return os.path.join(job_dir, f"{node}.roots.json")


def record(path: str, roots: Iterable[Root]) -> None:
    """Write the roots (0600, in the job's 0700 directory)."""
    write_private(path, json.dumps([list(r) for r in roots]) + "\n")


def recorded(path: str) -> list[Root]:
    """The roots the supervisor recorded; none when the record is missing, not a plain file of this
    user's, writable by another, or unreadable (nothing is then provably the job's)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return []
    with open(fd, "rb") as fh:
        info = os.fstat(fh.fileno())
        if not stat.S_ISREG(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o022:
            return []
        try:
            return [Root(int(pid), int(start)) for pid, start in json.loads(fh.read(1 << 16))]
        except (ValueError, TypeError):
            return []


def become_subreaper() -> None:
    """Have orphaned descendants (workers whose torchrun is gone) reparented to this process, so
    that they stay provable; nothing where the call is not available."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
