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


class GroupEnder:
    """Ends the command's process group once (SIGTERM, then SIGKILL after the grace period). Its
    signal handlers are installed before the command starts: a SIGTERM that arrives while
    it starts ends the command once it has, instead of killing the guard and orphaning it."""

    def __init__(self, grace: float) -> None:
        self.leader: Leader | None = None
        self.grace = grace
        self.ender: threading.Thread | None = None
        self.asked = False
        # Reentrant: a signal handler calls `end` in the main thread, maybe while it holds the lock.
        self.lock = threading.RLock()

    def begin(self, leader: Leader) -> None:
        """The command started; end it now if that was asked while it started."""
        with self.lock:
            self.leader = leader
            if self.asked:
                self.end()

    def end(self) -> None:
        """End the command's group (once): SIGTERM, then SIGKILL after the grace period."""
        with self.lock:
            self.asked = True
            if self.ender is not None or self.leader is None:
                return
            self.ender = threading.Thread(target=self._end, args=(self.leader,), daemon=True)
            self.ender.start()

    def _end(self, leader: Leader) -> None:
        leader.signal_group(signal.SIGTERM)
        exited = threading.Thread(target=leader.wait_exit, daemon=True)
        exited.start()
        exited.join(self.grace)
        # The leader is not reaped before this returns (see `status`), so the group is still ours.
        leader.signal_group(signal.SIGKILL)

    def watch(self, stdin: BinaryIO) -> None:
        """End the command when stdin ends: the controller closed the channel or is gone."""
        while stdin.read(4096):
            pass
        self.end()

    def status(self, leader: Leader) -> int:
        """Wait for the command, and for its group's ending if one began; its shell-style status."""
        leader.wait_exit()
        with self.lock:
            ender = self.ender
        if ender is not None:
            ender.join()
        rc = leader.wait()
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
    ender = GroupEnder(grace)
    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(sig, lambda _signum, _frame: ender.end())
    leader = start(command)
    ender.begin(leader)
    threading.Thread(target=ender.watch, args=(sys.stdin.buffer,), daemon=True).start()
    code = ender.status(leader)
    sys.stdout.flush()
    sys.stderr.flush()
    # The watching thread sits in a blocking read of stdin; leave without joining it.
    os._exit(code)
