"""Runs one command for `distrun exec`, and ends it, with every process it started in its
process group, when the controller goes away. argv: GRACE COMMAND...

Without a pty nothing ends a remote command when its SSH channel closes: after `--timeout`
or Ctrl-C it would run on. This program starts the command in a session (so a process group)
of its own, stdin from /dev/null (its output goes straight to the channel), and watches its own
stdin, which the controller keeps open: end of stdin (the channel closed, or the connection
dropped), SIGTERM, SIGHUP or SIGINT send SIGTERM to the group, and SIGKILL after GRACE seconds
to what is left. The group is signalled only while its leader is unreaped (remote/leader.py
says why): the command's exit is seen with WNOWAIT, and it is reaped last.

Exit status: the command's; 128+N when signal N ended it, as a shell reports it; 126 or 127
when it could not be started (not executable, not found).

It runs once per host for every `exec`, so it costs the host as little as it can: the
controller runs it as `python -I -S` (no site, no environment: lean_argv in remote/__init__.py),
and it imports only what the interpreter has built in or at hand (`_signal`, not `signal`,
which imports enum; no subprocess, no threads; select waits for stdin and signals at once).
That is about 9 ms of the host's CPU per command against 23-26 ms with subprocess and threads
(measured beside `sh -c true`'s 1 ms; the hosts' total at 244 hosts is in bench/results/exec.md).
Python 3.8 or newer.
"""

import _signal
import os
import select
import sys
import time

ENDING = (_signal.SIGTERM, _signal.SIGHUP, _signal.SIGINT)
# What Python ignores and a program expects at its default (subprocess restores the same).
DEFAULT_IN_CHILD = (_signal.SIGPIPE, _signal.SIGXFSZ)


class Guard:
    """One command, ended with its process group once asked (a signal or the end of stdin)."""

    def __init__(self, grace, stdin, wakeup):
        self.grace = grace
        self.stdin = stdin  # the fd watched for its end; None once it ended
        self.wakeup = wakeup  # the read end of the signals' wakeup pipe
        self.pid = None
        self.asked = False
        self.kill_at = None  # once the group's end began: when its SIGKILL is due
        self.killed = False

    def ask_end(self, *_signal_args):
        """End the command's group (a signal handler: the loop does it, once the command runs)."""
        self.asked = True

    def start(self, command):
        """Start the command in a new session, stdin from /dev/null.

        Raises:
            SystemExit: it could not be started (126 or 127, with the reason on stderr).
        """
        try:
            self.pid = os.posix_spawnp(command[0], command, os.environ,
                                       file_actions=[(os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0)],
                                       setsid=True, setsigdef=DEFAULT_IN_CHILD)
        except OSError as exc:
            os.write(2, f"distrun: cannot run {command[0]}: {exc.strerror or exc}\n".encode())
            raise SystemExit(127 if isinstance(exc, FileNotFoundError) else 126) from None

    def wait(self):
        """Wait for the command, and for its group's end if one began; its shell-style status."""
        while True:
            if self.asked and self.kill_at is None:
                self._signal_group(_signal.SIGTERM)
                self.kill_at = time.monotonic() + self.grace
            exited = self._exited()
            if self.kill_at is not None and not self.killed and (exited or time.monotonic() >= self.kill_at):
                self._signal_group(_signal.SIGKILL)  # what is left of the group; its leader is not reaped
                self.killed = True
            if exited:
                break
            self._pause()
        _, status = os.waitpid(self.pid, 0)
        return 128 + os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)

    def _exited(self):
        """Whether the command has exited; it stays unreaped, so its group stays ours."""
        return os.waitid(os.P_PID, self.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None

    def _signal_group(self, sig):
        try:  # noqa: SIM105 (contextlib would import collections and functools)
            os.killpg(self.pid, sig)
        except OSError:
            pass  # the group is empty already

    def _pause(self):
        """Sleep until stdin says something, a signal arrives (SIGCHLD too), or the SIGKILL is due."""
        watched = [self.wakeup] + ([self.stdin] if self.stdin is not None else [])
        timeout = None
        if self.kill_at is not None and not self.killed:
            timeout = max(0.0, self.kill_at - time.monotonic())
        readable = select.select(watched, [], [], timeout)[0]
        if self.wakeup in readable:
            _drain(self.wakeup)
        if self.stdin is not None and self.stdin in readable and not _read_some(self.stdin):
            self.stdin = None
            self.asked = True  # the controller closed the channel or is gone


def _drain(fd):
    try:
        while os.read(fd, 512):
            pass
    except BlockingIOError:
        pass


def _read_some(fd):
    """Read what is there; False at its end (or when it cannot be read)."""
    try:
        return bool(os.read(fd, 4096))
    except OSError:
        return False


def main(argv):
    if sys.version_info < (3, 8):  # noqa: UP036 (the host's python): no posix_spawnp, no setsid for it
        found = ".".join(map(str, sys.version_info[:3]))
        os.write(2, f"distrun: exec needs Python 3.8 or later on this host, and its python is {found}: point "
                 "the node's `python:` in the inventory at a newer one\n".encode())
        os._exit(126)
    grace, command = float(argv[0]), argv[1:]
    wakeup, wake = os.pipe()
    os.set_blocking(wakeup, False)
    os.set_blocking(wake, False)
    guard = Guard(grace, 0, wakeup)
    _signal.set_wakeup_fd(wake)
    # Handlers before the command starts: a SIGTERM while it starts ends it once it runs,
    # instead of killing the guard and orphaning it. SIGCHLD's only wakes the loop.
    for sig in ENDING:
        _signal.signal(sig, guard.ask_end)
    _signal.signal(_signal.SIGCHLD, lambda *_signal_args: None)
    try:
        guard.start(command)
        code = guard.wait()
    except SystemExit as exc:
        code = exc.code
    os._exit(code)
