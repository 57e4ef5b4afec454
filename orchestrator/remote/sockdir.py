"""Where the ranks' Flight Recorder sockets live on a host: the directory the supervisor makes
for every job with the Flight Recorder on (DISTRUN_WORKER_SOCKETS) and each rank's socket in it.

Apart from remote/flightrec.py, which fetches a rank's dump over HTTP (and imports http.client
only then). Stdlib-only: shipped to the hosts.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
import tempfile

from orchestrator.remote.private import make_private_dirs, write_private

# AF_UNIX paths are at most 107 bytes on Linux (108 with the terminating NUL).
MAX_SOCKET_PATH = 107
LONGEST_NAME = len("/rank99999.sock")


def socket_path(directory: str, rank: int | str) -> str:
    return os.path.join(directory, f"rank{rank}.sock")


def socket_dir(wanted: str, job_id: str) -> str | None:
    """Make the job's socket directory and return it: `wanted` (`~` is this host's home), or a
    short private one under the temporary directory when `wanted` is too long for a socket path.

    The short one is made by `tempfile.mkdtemp` (a fresh random name, created 0700 with O_EXCL
    semantics: no other user can have made it, blocked it or pointed it elsewhere); the supervisor
    records it in the job's directory and removes it when the job ends (`remove_sockets`); a
    supervisor SIGKILLed leaves it to the `distrun stop` that follows, or `distrun prune`
    (`remove_recorded`).

    Returns:
        The directory, or None when neither could be made ours (the ranks then get no variable).
    """
    first = os.path.expanduser(wanted)
    if len(first) + LONGEST_NAME <= MAX_SOCKET_PATH:
        try:
            make_private_dirs(first)
            if _ours(first) and _ours(os.path.dirname(first)):
                return first
        except OSError:
            pass
    short = os.path.join(tempfile.gettempdir(), f"distrun-{job_id[:8]}-XXXXXXXX")
    if len(short) + LONGEST_NAME > MAX_SOCKET_PATH:
        return None
    try:
        return tempfile.mkdtemp(prefix=f"distrun-{job_id[:8]}-")
    except OSError:
        return None


def fallback_record(job_dir: str, node: str) -> str:
    """Where the supervisor records a fallback directory it made, so that a `distrun stop` or `prune`
    after a SIGKILLed supervisor still removes it (`remove_recorded`)."""
    return os.path.join(job_dir, f"{node}.sockdir")


def record_fallback(job_dir: str, node: str, made: str) -> None:
    """Record the fallback directory `made` (0600, in the job's private directory)."""
    write_private(fallback_record(job_dir, node), made + "\n")


def remove_sockets(wanted: str, made: str) -> None:
    """Once the ranks are gone: the short directory `socket_dir` made in place of `wanted` removed
    whole, or in `wanted` (under the job's directory, which stays with the job's files) every
    socket a rank left (a rank killed before it could remove its own)."""
    if made != os.path.expanduser(wanted):
        shutil.rmtree(made, ignore_errors=True)
        return
    with contextlib.suppress(OSError):
        for entry in os.scandir(made):
            if entry.name.startswith("rank") and stat.S_ISSOCK(entry.stat(follow_symlinks=False).st_mode):
                with contextlib.suppress(OSError):
                    os.remove(entry.path)


def remove_recorded(job_dir: str, job_id: str, node: str) -> None:
    """Remove the fallback directory the job's supervisor recorded for `node`, and the record: only
    a record that is a plain file of this user's, naming a directory of this user's (not a link)
    directly under the temporary directory with this job's prefix."""
    record = fallback_record(job_dir, node)
    try:
        fd = os.open(record, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return
    with open(fd, encoding="utf-8", errors="replace") as fh:
        info = os.fstat(fh.fileno())
        made = fh.read(4096).strip()
    if not stat.S_ISREG(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o022:
        return
    prefix = os.path.join(tempfile.gettempdir(), f"distrun-{job_id[:8]}-")
    if made.startswith(prefix) and "/" not in made[len(prefix):] and _ours(made):
        shutil.rmtree(made, ignore_errors=True)
    with contextlib.suppress(OSError):
        os.remove(record)


def _ours(path: str) -> bool:
    """Whether `path` itself (not what a link points to) is a directory of this user that no
    other user can write."""
    try:
        info = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISDIR(info.st_mode) and info.st_uid == os.getuid() and not info.st_mode & 0o022
