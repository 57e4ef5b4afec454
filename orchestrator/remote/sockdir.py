"""Where the ranks' Flight Recorder sockets live on a host: the directory the supervisor makes
for every job with the Flight Recorder on (DISTRUN_WORKER_SOCKETS) and each rank's socket in it.

Apart from remote/flightrec.py, which fetches a rank's dump over HTTP (and imports http.client
only then). Stdlib-only: shipped to the hosts.
"""

from __future__ import annotations

import os
import shutil
import stat
import tempfile

from orchestrator.remote.private import make_private_dirs

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
    removes it when the job ends (`remove_fallback`).

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


def remove_fallback(wanted: str, made: str) -> None:
    """Remove the short directory `socket_dir` made in place of `wanted`, once the ranks are gone;
    `wanted` itself is under the job's directory on the host and stays with the job's files."""
    if made != os.path.expanduser(wanted):
        shutil.rmtree(made, ignore_errors=True)


def _ours(path: str) -> bool:
    """Whether `path` itself (not what a link points to) is a directory of this user that no
    other user can write."""
    info = os.lstat(path)
    return stat.S_ISDIR(info.st_mode) and info.st_uid == os.getuid() and not info.st_mode & 0o022
