"""The leader of a process group this program started, signalled only while it is certainly ours.

A process group is named by its leader's pid. Once the leader is reaped its pid may be reused,
by a process that leads a group of its own: a `killpg` sent then could hit strangers. An
unreaped child (even a zombie) keeps its pid, so the group is signalled only before the leader
is reaped; reaping and signalling share a lock, and waiting for the exit does not reap.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import threading


class Leader:
    """A child started with `start_new_session=True` (so it leads its own process group)."""

    def __init__(self, popen: subprocess.Popen[bytes]) -> None:
        self.popen = popen
        self.lock = threading.Lock()

    @property
    def pid(self) -> int:
        return self.popen.pid

    def wait_exit(self) -> None:
        """Wait until the leader has exited, without reaping it: its group stays signallable."""
        if self.popen.returncode is None:
            with contextlib.suppress(ChildProcessError):
                os.waitid(os.P_PID, self.popen.pid, os.WEXITED | os.WNOWAIT)

    def wait(self) -> int:
        """Wait for the leader's exit, reap it, and return its status (negative N: signal N)."""
        self.wait_exit()
        with self.lock:
            return self.popen.wait()

    def poll(self) -> int | None:
        """Reap the leader if it has exited; its status, or None while it runs."""
        with self.lock:
            return self.popen.poll()

    def signal_group(self, sig: int) -> None:
        """Send `sig` to the leader's process group, if the leader is not reaped yet."""
        with self.lock:
            if self.popen.returncode is None:
                with contextlib.suppress(OSError):
                    os.killpg(self.popen.pid, sig)
