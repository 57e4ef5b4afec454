"""Runs one command for `distrun exec`, and ends it, with every process it started in its
process group, when the controller goes away. argv: GRACE COMMAND...

Without a pty nothing ends a remote command when its SSH channel closes: after `--timeout`
or Ctrl-C it would run on. This program starts the command in a process group of its own
(its output goes straight to the channel) and watches its own stdin, which the controller
keeps open: end of stdin (the channel closed, or the connection dropped), SIGTERM, SIGHUP or
SIGINT send SIGTERM to the group, and SIGKILL after GRACE seconds to what is left.

Exit status: the command's; 128+N when signal N ended it, as a shell reports it; 126 or 127
when it could not be started (not executable, not found).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from typing import BinaryIO

from orchestrator.remote.leader import Leader


class Guard:
    def __init__(self, leader: Leader, grace: float) -> None:
        self.leader = leader
        self.grace = grace
        self.ender: threading.Thread | None = None
        self.lock = threading.Lock()

    def end(self) -> None:
        """End the command's group (once): SIGTERM, then SIGKILL after the grace period."""
        with self.lock:
            if self.ender is not None:
                return
            self.ender = threading.Thread(target=self._end, daemon=True)
            self.ender.start()

    def _end(self) -> None:
        self.leader.signal_group(signal.SIGTERM)
        exited = threading.Thread(target=self.leader.wait_exit, daemon=True)
        exited.start()
        exited.join(self.grace)
        # The leader is not reaped before this returns (see `status`), so the group is still ours.
        self.leader.signal_group(signal.SIGKILL)

    def watch(self, stdin: BinaryIO) -> None:
        """End the command when stdin ends: the controller closed the channel or is gone."""
        while stdin.read(4096):
            pass
        self.end()

    def status(self) -> int:
        """Wait for the command, and for its group's ending if one began; its shell-style status."""
        self.leader.wait_exit()
        with self.lock:
            ender = self.ender
        if ender is not None:
            ender.join()
        rc = self.leader.wait()
        return 128 - rc if rc < 0 else rc


def start(command: list[str]) -> Leader:
    """Start the command in a new session (its own process group), stdin from /dev/null.

    Raises:
        SystemExit: it could not be started (126 or 127, with the reason on stderr).
    """
    try:
        return Leader(subprocess.Popen(command, stdin=subprocess.DEVNULL, start_new_session=True))
    except OSError as exc:
        sys.stderr.write(f"distrun: cannot run {command[0]}: {exc.strerror or exc}\n")
        sys.exit(127 if isinstance(exc, FileNotFoundError) else 126)


def main(argv: list[str]) -> None:
    grace, command = float(argv[0]), argv[1:]
    guard = Guard(start(command), grace)
    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(sig, lambda _signum, _frame: guard.end())
    threading.Thread(target=guard.watch, args=(sys.stdin.buffer,), daemon=True).start()
    code = guard.status()
    sys.stdout.flush()
    sys.stderr.flush()
    # The watching thread sits in a blocking read of stdin; leave without joining it.
    os._exit(code)
