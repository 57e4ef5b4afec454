"""The job's checkpoint_dir on a host, made only where no other user can replace what it holds.

A root job that loads a checkpoint another user wrote runs that user's pickle. So a checkpoint_dir
is refused when any of its existing components (the workdir's included, for a relative one) is
owned by another user than this one or root, or can be written by group or others, unless it is
sticky and root's (as /tmp is: nobody can rename or remove another's entry there). The components
that are missing are created 0700. `~` is this host's home, in the directory and in the ranks'
DISTRUN_CHECKPOINT_DIR alike.

Run by the launch before anything starts (`main`: one JSON line on stdin, {"path", "cwd"}; prints
{"refused": why or null}), and by the supervisor again as it creates the directory.

The directories distrun itself runs programs from and writes into on a host (`job_dirs`:
~/.distrun, jobs, jobs/<id>, its bin/, the node's directory, sock/) are held to more: each must be
a directory (not a link) of this user's that neither group nor others can write, and the
directories above ~/.distrun must pass the checkpoint rule. The supervisor checks them before
anything of the job runs (`make_job_dirs`); one that fails refuses the job. Stdlib-only.
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


def job_dirs(host_dir: str, job_id: str, node: str) -> tuple[list[str], list[str]]:
    """The job's directories on this host, outermost first: those made when missing (~/.distrun,
    jobs, jobs/<id>, the node's), and those checked when present (bin, sock: made later, inside a
    directory only this user can write)."""
    root = os.path.abspath(os.path.expanduser(host_dir))
    job = os.path.join(root, "jobs", job_id)
    return [root, os.path.join(root, "jobs"), job, os.path.join(job, node)], [os.path.join(job, "bin"),
                                                                          os.path.join(job, "sock")]


def _not_private(path: str) -> str | None:
    """Why `path` (one of the job's own directories) may not be used, with the fix; None when it is
    a directory of this user's that neither group nor others can write, or missing."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return None
    except OSError as exc:
        return f"host directory {path} cannot be checked: {exc.strerror or exc}"
    if stat.S_ISLNK(info.st_mode):
        return f"host directory {path} is a symbolic link, not a directory of yours; remove it: rm {path}"
    if not stat.S_ISDIR(info.st_mode):
        return f"host directory {path} is not a directory; remove it: rm {path}"
    if info.st_uid != os.getuid():
        return (f"host directory {path} belongs to uid {info.st_uid}, not to you (uid {os.getuid()}), and "
                f"distrun runs programs from it; remove it (as root: rm -rf {path}) and launch again")
    if info.st_mode & 0o022:
        return (f"host directory {path} can be written by group or others (mode {stat.S_IMODE(info.st_mode):o}), "
                f"and distrun runs programs from it; make it yours alone: chmod go-w {path}")
    return None


def make_job_dirs(host_dir: str, job_id: str, node: str) -> None:
    """Check the job's directories on this host before anything of the job runs, making the missing
    ones 0700 on the way (`job_dirs`).

    Raises:
        UnsafeDirError: one of them, or a directory above ~/.distrun, is unsafe (one line: the
            path, what is wrong and the fix; nothing below it is made).
        OSError: one could not be made (a full disk).
    """
    made, present = job_dirs(host_dir, job_id, node)
    why = unsafe_component(os.path.dirname(made[0]))
    if why is not None:
        raise UnsafeDirError(f"{why}, above distrun's host directory {made[0]}; use a home only you (or root) "
                             "can write")
    make_private_dirs(os.path.dirname(made[0]))  # a home not made yet (nothing there to check)
    for path in [*made, *present]:
        if path in made and not os.path.lexists(path):
            try:
                os.mkdir(path, 0o700)
                os.chmod(path, 0o700)  # whatever the umask
            except FileExistsError:
                pass  # made meanwhile (hosts that share a home): checked below like any other
        why = _not_private(path)
        if why is not None:
            raise UnsafeDirError(why)


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
