"""Processes of test hosts, found through /proc.

A test host is a network namespace, so "the host's processes" are exactly the processes
in that namespace: sshd's sessions and everything they started, daemonised or not.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

PROC = Path("/proc")

NsId = tuple[int, int]


@dataclass(frozen=True)
class Proc:
    """One process running on a test host."""

    pid: int
    ppid: int
    cmdline: tuple[str, ...]

    def uid(self) -> int | None:
        """The process's owner; None once it is gone."""
        try:
            return (PROC / str(self.pid)).stat().st_uid
        except OSError:
            return None

    def alive(self) -> bool:
        """Whether it still runs (neither gone nor a zombie)."""
        try:
            return (PROC / str(self.pid) / "stat").read_text().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
        except (OSError, IndexError):
            return False

    def environ(self) -> dict[str, str]:
        """The process's environment as it started; empty once the process is gone."""
        try:
            raw = (PROC / str(self.pid) / "environ").read_bytes()
        except OSError:
            return {}
        pairs = (item.decode(errors="replace").partition("=") for item in raw.split(b"\0") if item)
        return {key: value for key, _, value in pairs}

    def environ_has(self, value: str, key: str | None = None) -> bool:
        """True when an environment variable (the one named `key`, if given) equals `value`."""
        env = self.environ()
        if key is not None:
            return env.get(key) == value
        return value in env.values()


def ns_id(path: str | Path) -> NsId:
    """Identity of the namespace behind `path` (/run/netns/NAME or /proc/PID/ns/net).

    Raises:
        OSError: the path does not exist.
    """
    st = os.stat(path)
    return st.st_dev, st.st_ino


def pids_in_netns(namespaces: Mapping[NsId, str]) -> dict[str, list[int]]:
    """Pids of the live processes in each network namespace, by namespace name."""
    found: dict[str, list[int]] = {name: [] for name in namespaces.values()}
    for entry in os.scandir(PROC):
        if not entry.name.isdigit():
            continue
        try:
            name = namespaces.get(ns_id(f"{entry.path}/ns/net"))
        except OSError:
            continue
        if name is not None:
            found[name].append(int(entry.name))
    return found


def _stat_fields(pid: int) -> list[str] | None:
    """Fields of /proc/PID/stat from the state on (field 3), or None when pid is gone."""
    try:
        stat = (PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    return stat.rpartition(")")[2].split()


def read_proc(pid: int) -> Proc | None:
    """The process `pid`, or None when it has exited meanwhile."""
    fields = _stat_fields(pid)
    try:
        cmdline = (PROC / str(pid) / "cmdline").read_bytes()
    except OSError:
        return None
    if fields is None:
        return None
    args = cmdline.rstrip(b"\0").split(b"\0") if cmdline else []
    return Proc(pid, int(fields[1]), tuple(arg.decode(errors="replace") for arg in args))


def start_time(pid: int) -> str | None:
    """When `pid` started (clock ticks since boot): tells a live owner from a reused pid."""
    fields = _stat_fields(pid)
    return None if fields is None else fields[19]


def _gone(pid: int) -> bool:
    fields = _stat_fields(pid)
    return fields is None or fields[0] == "Z"


def kill_and_wait(pids: Iterable[int], timeout: float = 5.0) -> None:
    """SIGKILL every pid and wait until each has exited (zombies count as exited)."""
    pending = set(pids)
    for pid in pending:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + timeout
    while True:
        pending = {pid for pid in pending if not _gone(pid)}
        if not pending or time.monotonic() > deadline:
            return
        time.sleep(0.01)


SECOND_USER = "distrun-impostor"


def second_user() -> int:
    """The uid of an unprivileged second user of the test hosts (all share /etc/passwd), made with
    useradd when missing: a system account with no home, no password and no login shell, left in
    place (harmless) for the next run."""
    import pwd
    import subprocess

    try:
        return pwd.getpwnam(SECOND_USER).pw_uid
    except KeyError:
        subprocess.run(["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", SECOND_USER],
                       check=True, capture_output=True)
        return pwd.getpwnam(SECOND_USER).pw_uid


def pose_as_rank_argv(uid: int, job_id: str, node: str, rank: int) -> list[str]:
    """argv (for a host's shell) that starts, as `uid`, a detached process carrying a job's markers
    (DISTRUN_JOB_ID, DISTRUN_NODE, RANK), as any user who reads `ps` can."""
    return ["sh", "-c", f"setsid -f setpriv --reuid={uid} --regid={uid} --clear-groups env DISTRUN_JOB_ID={job_id} "
            f"DISTRUN_NODE={node} RANK={rank} LOCAL_RANK=0 sleep 600 </dev/null >/dev/null 2>&1"]
