"""The job's checkpoint_dir on a host, made only where no other user can replace what it holds.

A root job that loads a checkpoint another user wrote runs that user's pickle. So a checkpoint_dir
is refused when any of its existing components (the workdir's included, for a relative one) is
owned by another user than this one or root, or can be written by group or others, unless it is
sticky and root's (as /tmp is: nobody can rename or remove another's entry there). The components
that are missing are created 0700. `~` is this host's home, in the directory and in the ranks'
DISTRUN_CHECKPOINT_DIR alike.

Run by the launch before anything starts (`main`: one JSON line on stdin, {"path", "cwd"}; prints
{"refused": why or null}), and by the supervisor again as it creates the directory. Stdlib-only.
"""

from __future__ import annotations

import json
import os
import stat
import sys

from orchestrator.remote.private import make_private_dirs

CHECKPOINT_VAR = "DISTRUN_CHECKPOINT_DIR"


class UnsafeDirError(OSError):
    """A directory another user could write into, named with the reason and the fix."""


def full_path(path: str, cwd: str | None) -> str:
    """`path` on this host: `~` expanded, relative to the workdir `cwd`."""
    return os.path.abspath(os.path.join(os.path.expanduser(cwd or "."), os.path.expanduser(path)))


def unsafe_component(path: str) -> str | None:
    """Why `path` (absolute) is not safe for checkpoints: its first existing component that another
    user owns or can write; None when it is safe (missing components are fine: they will be ours)."""
    current = "/"
    for part in [p for p in path.split("/") if p]:
        current = os.path.join(current, part)
        why = _unsafe(current)
        if why is not None:
            return why
    return None


def _unsafe(path: str) -> str | None:
    try:
        info = os.lstat(path)
        if stat.S_ISLNK(info.st_mode) and info.st_uid not in (0, os.getuid()):
            return f"{path} is a link of uid {info.st_uid}, another user's"
        info = os.stat(path)
    except FileNotFoundError:
        return None
    except OSError as exc:
        return f"{path} cannot be checked: {exc.strerror or exc}"
    if info.st_uid not in (0, os.getuid()):
        return f"{path} belongs to uid {info.st_uid}, another user"
    if info.st_mode & 0o022 and not (info.st_mode & stat.S_ISVTX and info.st_uid == 0):
        return f"{path} can be written by other users (mode {stat.S_IMODE(info.st_mode):o})"
    return None


def make_safe_dir(path: str, cwd: str | None) -> str:
    """Create the checkpoint directory (missing components 0700) after checking every component.

    Returns:
        The directory, absolute.

    Raises:
        UnsafeDirError: a component is another user's or writable by others (nothing is created).
        OSError: it could not be created.
    """
    full = full_path(path, cwd)
    why = unsafe_component(full)
    if why is not None:
        raise UnsafeDirError(f"checkpoint_dir {path}: {why}; use a directory only you (or root) can write")
    try:
        make_private_dirs(full)
    except OSError as exc:
        raise OSError(f"cannot create {full}: {exc.strerror or exc}") from exc
    return full


def expand_var(env: dict[str, str]) -> None:
    """DISTRUN_CHECKPOINT_DIR with `~` as this host's home, as the directory is made."""
    if CHECKPOINT_VAR in env:
        env[CHECKPOINT_VAR] = os.path.expanduser(env[CHECKPOINT_VAR])


def main(argv: list[str]) -> None:
    request = json.loads(sys.stdin.readline())
    why = unsafe_component(full_path(request["path"], request.get("cwd")))
    sys.stdout.write(json.dumps({"refused": why}) + "\n")
