"""Directories and files only their owner can read, whatever the umask.

Job directories hold everything a job printed (secrets it echoed, paths, hostnames) and its
plan; the controller's under DISTRUN_HOME and each host's copy under ~/.distrun are created
with these. Stdlib-only: shipped to the hosts with the supervisor, and used by the controller.
"""

from __future__ import annotations

import os
from typing import IO, Any

DIR_MODE = 0o700
FILE_MODE = 0o600


def make_private_dirs(path: str | os.PathLike[str]) -> None:
    """`mkdir -p path`, each directory it creates mode 0700 whatever the umask.

    Directories that exist already are left as they are: a DISTRUN_HOME the operator made, or
    a parent such as /tmp, keeps its own mode.
    """
    missing: list[str] = []
    current = os.path.abspath(os.fspath(path))
    while not os.path.isdir(current):
        missing.append(current)
        parent = os.path.dirname(current)
        if parent == current:
            break
        current = parent
    for directory in reversed(missing):
        try:
            os.mkdir(directory, DIR_MODE)
        except FileExistsError:
            continue  # made meanwhile by another process (another host on a shared filesystem)
        # mkdir's mode passes through the umask; this sets it exactly.
        os.chmod(directory, DIR_MODE)


def open_private(path: str | os.PathLike[str], mode: str = "a", **kwargs: Any) -> IO[Any]:
    """Open a file for writing ("w", "a", "wb", "ab"), created (or brought to) mode 0600.

    Args:
        path: The file.
        mode: As for `open`; only writing modes.
        kwargs: Passed to `open` (encoding, buffering).
    """
    flags = os.O_WRONLY | os.O_CREAT | (os.O_APPEND if "a" in mode else os.O_TRUNC)
    fd = os.open(path, flags, FILE_MODE)
    try:
        os.fchmod(fd, FILE_MODE)
        return open(fd, mode, **kwargs)
    except BaseException:
        os.close(fd)
        raise


def write_private(path: str | os.PathLike[str], data: str | bytes) -> None:
    """Write a whole file, mode 0600 from its creation on."""
    if isinstance(data, bytes):
        with open_private(path, "wb") as fh:
            fh.write(data)
    else:
        with open_private(path, "w", encoding="utf-8") as fh:
            fh.write(data)
