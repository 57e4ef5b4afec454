"""Workdir sync, host side. argv: WORKDIR MODE. Runs with the host's python (3.8 or later).

MODE `manifest`: print {relative path: sha256} of the regular files under WORKDIR as one JSON line.
MODE `unpack`: read a tar from stdin and write its files into WORKDIR; print how many were written.

Whoever runs this (often root) owns what it writes: the tar's owner and group are ignored,
and every mode loses setuid, setgid, sticky and group/other write. Only regular files and
directories are accepted, at relative paths without `..`. tarfile's `data` filter checks each
member where this python has it (3.12, 3.8.17, 3.9.17, 3.10.12, 3.11.4 and later); `allowed`
applies the same rules to the name and mode everywhere.

No write follows a symbolic link below WORKDIR, so a user of the host who swaps a directory
for a link while this runs cannot send a write elsewhere: each directory is opened relative
to its parent with O_NOFOLLOW, and a file is written under a fresh name (O_EXCL) that is then
renamed over its target, which replaces a link or a hard link rather than writing through it.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import stat
import sys
import tarfile
from typing import BinaryIO

BLOCK = 1 << 20
DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# What no synced file may keep, whatever its mode on the controller.
DROPPED_BITS = stat.S_ISUID | stat.S_ISGID | stat.S_ISVTX | stat.S_IWGRP | stat.S_IWOTH


class MemberRefused(Exception):
    """A member this program will not write; the message names it and says why."""


def manifest(root: str) -> dict[str, str]:
    found: dict[str, str] = {}
    for base, _dirs, files in os.walk(root):
        for name in files:
            path = os.path.join(base, name)
            try:
                fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
            except OSError:
                continue  # a link, or gone since the listing: not a file sync keeps
            with os.fdopen(fd, "rb") as fh:
                if stat.S_ISREG(os.fstat(fd).st_mode):
                    found[os.path.relpath(path, root)] = digest(fh)
    return found


def digest(fh: BinaryIO) -> str:
    """sha256 of a file, read a block at a time."""
    value = hashlib.sha256()
    for block in iter(lambda: fh.read(BLOCK), b""):
        value.update(block)
    return value.hexdigest()


def masked(mode: int) -> int:
    """The mode a file is written with, by the `data` filter's rules: the owner may read and
    write it, nobody may execute it unless the owner may, and none of DROPPED_BITS is kept."""
    mode = (stat.S_IMODE(mode) & ~DROPPED_BITS) | stat.S_IRUSR | stat.S_IWUSR
    if not mode & stat.S_IXUSR:
        mode &= ~(stat.S_IXGRP | stat.S_IXOTH)
    return mode


def allowed(member: tarfile.TarInfo, root: str) -> tuple[list[str], int]:
    """The path parts and mode to write `member` with.

    Raises:
        MemberRefused: not a regular file or directory, or a path that leaves `root`.
    """
    parts = [part for part in member.name.split("/") if part not in ("", ".")]
    if member.name.startswith("/") or ".." in parts or not parts:
        raise MemberRefused(f"refusing {member.name!r}: the path leaves {root}")
    data_filter = getattr(tarfile, "data_filter", None)
    if data_filter is not None:
        try:
            member = data_filter(member, root)
        except tarfile.FilterError as err:
            raise MemberRefused(f"refusing {member.name!r}: {err}") from None
        except OSError as err:  # its path changed while the filter resolved it
            raise MemberRefused(f"refusing {member.name!r}: {err.strerror or err}") from None
    if not (member.isfile() or member.isdir()):
        raise MemberRefused(f"refusing {member.name!r}: only regular files and directories are synced")
    # Directories are made 0755 (less the umask) and existing ones are left as they are.
    return parts, masked(member.mode) if member.isfile() else 0o755


def open_dirs(root_fd: int, parts: list[str]) -> int:
    """Open (making them as needed) the directories `parts` below `root_fd`, never through a link.

    Raises:
        MemberRefused: one of them is a symbolic link or not a directory.
    """
    fd = os.dup(root_fd)
    for index, part in enumerate(parts):
        try:
            with contextlib.suppress(FileExistsError):
                os.mkdir(part, 0o755, dir_fd=fd)
            child = os.open(part, DIR_FLAGS, dir_fd=fd)
        except OSError as err:
            os.close(fd)
            where = "/".join(parts[: index + 1])
            raise MemberRefused(f"refusing to write below {where!r}: not a directory of its own "
                                f"({err.strerror})") from None
        os.close(fd)
        fd = child
    return fd


def write_file(dir_fd: int, name: str, data: BinaryIO, mode: int, mtime: float) -> None:
    """Write `name` in `dir_fd` under a fresh name, then rename it over whatever `name` was."""
    temp = f".{name}.distrun-{os.getpid()}-{os.urandom(4).hex()}"
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=dir_fd)
    try:
        with os.fdopen(fd, "wb", closefd=False) as out:
            for block in iter(lambda: data.read(BLOCK), b""):
                out.write(block)
        os.fchmod(fd, mode)
        os.utime(fd, (mtime, mtime))
        os.close(fd)
        fd = -1
        os.rename(temp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        if fd >= 0:
            os.close(fd)
        os.unlink(temp, dir_fd=dir_fd)
        raise


def unpack(stream: BinaryIO, root: str) -> int:
    """Write the files of the tar on `stream` below `root`; returns how many were written.

    Raises:
        MemberRefused: a member that may not be written; the files before it are written.
    """
    root_fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    count = 0
    try:
        with tarfile.open(fileobj=stream, mode="r|") as tar:
            for member in tar:
                parts, mode = allowed(member, root)
                dir_fd = open_dirs(root_fd, parts if member.isdir() else parts[:-1])
                try:
                    data = tar.extractfile(member)
                    if data is not None:
                        write_file(dir_fd, parts[-1], data, mode, member.mtime)
                        count += 1
                except OSError as err:
                    raise MemberRefused(f"cannot write {member.name!r}: {err.strerror or err}") from None
                finally:
                    os.close(dir_fd)
    finally:
        os.close(root_fd)
    return count


def main(argv: list[str]) -> None:
    root = os.path.expanduser(argv[0])
    os.makedirs(root, exist_ok=True)
    if argv[1] == "manifest":
        sys.stdout.write(json.dumps(manifest(root)) + "\n")
        return
    try:
        written = unpack(sys.stdin.buffer, root)
    except MemberRefused as err:
        sys.stderr.write(f"distrun: {err}\n")
        sys.exit(2)
    sys.stdout.write(json.dumps({"written": written}) + "\n")
