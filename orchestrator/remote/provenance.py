"""Which processes of a host are provably a job's, not merely claiming to be.

The markers the supervisor puts in the job's environment (DISTRUN_JOB_ID, DISTRUN_NODE) are in
`ps` for every user, who can start a process that carries them; and a rank's own children may
carry none (a program started with an environment of its own). A process is the job's when it
is the job's user's (real and effective uid) and descends from a recorded root: the supervisor,
or the torchrun it started, each known by its pid and start time (a reused pid has another start
time); descent is enough, markers or not (`descendants`). The supervisor becomes its children's
subreaper, so a worker whose torchrun is gone, or a rank's child whose rank is gone (in a
session of its own or not), is reparented to it and stays provable; a stop (`supervisor.end_job`) adds each process
it proves to its roots, so one whose torchrun exits while no supervisor is left to adopt it stays
provable to the end of that stop. Programs run beside the job later (`stack`, the `stop`
cleanup) read the roots from the record the supervisor wrote into the host's private job
directory (`record`, `recorded`); the supervisor adds to it, each heartbeat, what it adopted, so
that a SIGKILLed supervisor's adoptions (reparented to init) are still found. Stdlib-only (runs on the hosts).
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


def _table() -> dict[int, tuple[int, int]]:
    """Every running process of the host (zombies aside): pid -> (parent pid, start time), read once
    from /proc."""
    table = {}
    for entry in os.listdir("/proc"):
        fields = _stat(int(entry)) if entry.isdigit() else None
        if fields is not None and len(fields) >= 20 and fields[0] not in (b"Z", b"X"):
            table[int(entry)] = (int(fields[1]), int(fields[19]))
    return table


def _below(pid: int, table: dict[int, tuple[int, int]], wanted: set[Root], known: dict[int, bool]) -> bool:
    """Whether `pid` is a root or descends from one, by its parent links in `table`; each process
    on the way is remembered in `known`, so that a whole tree costs one walk."""
    chain, result, current = [], False, pid
    for _ in range(MAX_DEPTH):
        if current in known:
            result = known[current]
            break
        entry = table.get(current)
        if entry is None:
            break
        chain.append(current)
        if Root(current, entry[1]) in wanted:
            result = True
            break
        if entry[0] <= 0 or entry[0] == current:
            break
        current = entry[0]
    known.update(dict.fromkeys(chain, result))
    return result


def descendants(roots: Iterable[Root], exclude: int) -> list[Root]:
    """Every process of this user's that is one of `roots` or descends from one (a root matches by
    pid and start time), `exclude` (the caller) left out: found by walking each process's parent
    links from /proc, read once."""
    wanted = set(roots)
    if not wanted:
        return []
    table, known = _table(), {}
    return [Root(pid, start) for pid, (_, start) in table.items()
            if pid != exclude and _below(pid, table, wanted, known) and _owned(pid)]


def children(pid: int) -> list[int]:
    """The children of `pid` (every thread's, from /proc/PID/task/*/children); none when unknown."""
    found: list[int] = []
    with contextlib.suppress(OSError):
        for tid in os.listdir(f"/proc/{pid}/task"):
            with contextlib.suppress(OSError), open(f"/proc/{pid}/task/{tid}/children", "rb") as fh:
                found += [int(child) for child in fh.read().split()]
    return found


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
    """Have orphaned descendants (workers whose torchrun is gone, a rank's children whose rank is
    gone, daemons that a rank's program detached) reparented to this process, so that they stay
    provable and end with the job; nothing where the call is not available."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
