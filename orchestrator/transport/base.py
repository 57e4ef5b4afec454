"""The transport interface shared by the local and SSH transports.

A backend fills in a few small hooks (connect, open a process, copy a file); streaming
lines to callbacks, waiting and collecting output are written once here, as invoke's
Runner does it.
"""

from __future__ import annotations

import fcntl
import struct
import termios
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import BinaryIO

from orchestrator.errors import InfraError
from orchestrator.spec.model import NodeSpec

LineCallback = Callable[[str], None]
DataCallback = Callable[[bytes], None]
CHUNK = 1 << 16


class ConnectFailure(str, Enum):
    """Why a host could not be reached or logged into, in the words of a failure summary."""

    UNREACHABLE = "unreachable"
    TIMEOUT = "connect timed out"
    AUTH = "auth failed"
    UNKNOWN_HOST_KEY = "unknown host key"
    HOST_KEY_CHANGED = "host key changed"
    HOST_KEY_REVOKED = "host key revoked"


# How to fix a host that was not reached or not logged into: doctor's `reachable` hint, which every
# command's error about such a host ends with.
REACH_HINT = "check the host is up and `ssh USER@HOST` works with the inventory's user, port and identity_file"
# The failures whose own message does not say how to fix them (host key messages do).
_NEEDS_HINT = frozenset({ConnectFailure.UNREACHABLE, ConnectFailure.TIMEOUT, ConnectFailure.AUTH})


class ConnectError(InfraError):
    """Connecting to a host failed: `str()` is the whole message, `failure` says how."""

    def __init__(self, message: str, failure: ConnectFailure) -> None:
        super().__init__(message)
        self.failure = failure


def reach_hint(errors: Iterable[BaseException]) -> str:
    """REACH_HINT when some error is a host not reached or not logged into; else ""."""
    needed = any(isinstance(e, ConnectError) and e.failure in _NEEDS_HINT for e in errors)
    return REACH_HINT if needed else ""


@dataclass(frozen=True)
class CommandResult:
    node: str
    returncode: int
    stdout: str
    stderr: str


class RemoteProcess(ABC):
    """A command started on a host: its stdin, a way to end it, its exit status."""

    def __init__(self) -> None:
        self._pumps: list[threading.Thread] = []
        self._stdin_lock = threading.Lock()
        self._handling = False  # a chunk of stdout is in stream_bytes' callback

    @abstractmethod
    def _stdout(self) -> BinaryIO: ...

    @abstractmethod
    def _stderr(self) -> BinaryIO: ...

    @abstractmethod
    def _write(self, data: bytes) -> None: ...

    @abstractmethod
    def close_stdin(self) -> None: ...

    @abstractmethod
    def _wait(self, timeout: float | None) -> int | None: ...

    @abstractmethod
    def terminate(self) -> None:
        """End the command without asking it (local: SIGTERM; SSH: close the channel)."""

    def _read_stdout(self, size: int) -> bytes:
        """Up to `size` bytes of stdout as soon as there are any; b"" at its end. The default reads
        through `_stdout()`'s read1; a transport with a cheaper way overrides it."""
        return self._stdout().read1(size)  # type: ignore[attr-defined]  # io.BufferedReader

    def unread(self) -> bool:
        """Whether stdout that reached this process is not handled yet: a chunk in stream_bytes'
        callback, or bytes waiting to be read (the reader is behind; the command is not silent)."""
        return self._handling or self._queued() > 0

    def _queued(self) -> int:
        """Bytes of stdout that arrived and wait to be read; a transport with a buffer of its own overrides it."""
        try:
            return unread_bytes(self._stdout().fileno())
        except (OSError, ValueError):  # closed
            return 0

    def write(self, data: bytes) -> None:
        """Send bytes to the command's stdin; several threads may call this."""
        with self._stdin_lock:
            self._write(data)

    def stream(self, on_stdout: LineCallback, on_stderr: LineCallback) -> None:
        """Start one thread per output stream calling back with each decoded line (no newline)."""
        for stream, callback in ((self._stdout(), on_stdout), (self._stderr(), on_stderr)):
            thread = threading.Thread(target=_pump, args=(stream, callback), daemon=True)
            thread.start()
            self._pumps.append(thread)

    def stream_bytes(self, on_data: DataCallback, on_stderr: LineCallback,
                     on_end: Callable[[], None] | None = None) -> None:
        """Start one thread calling back with stdout's bytes as they come, in chunks of any size
        (no per-line work: the caller frames them), then `on_end`; and one with each stderr line."""
        for target, args in ((self._pump_bytes, (on_data, on_end)), (_pump, (self._stderr(), on_stderr))):
            thread = threading.Thread(target=target, args=args, daemon=True)
            thread.start()
            self._pumps.append(thread)

    def wait(self, timeout: float | None = None) -> int | None:
        """Wait for exit and for every output line to be delivered.

        Returns:
            The exit status, or None when `timeout` passed first.
        """
        rc = self._wait(timeout)
        if rc is None:
            return None
        # The exit status can arrive before the last buffered lines are read: only report
        # the exit once every line has been delivered.
        for thread in self._pumps:
            thread.join(timeout)
        return None if any(thread.is_alive() for thread in self._pumps) else rc

    def _pump_bytes(self, callback: DataCallback, on_end: Callable[[], None] | None) -> None:
        try:
            while True:
                data = self._read_stdout(CHUNK)
                if not data:
                    return
                self._handling = True
                try:
                    callback(data)
                finally:
                    self._handling = False
        except (OSError, ValueError):
            return  # the channel or pipe went away: its end is reported by the exit status
        finally:
            if on_end is not None:
                on_end()


def _pump(stream: BinaryIO, callback: LineCallback) -> None:
    for raw in iter(stream.readline, b""):
        callback(raw.decode("utf-8", "replace").rstrip("\r\n"))


def unread_bytes(fd: int) -> int:
    """Bytes that reached a pipe or socket and wait to be read (FIONREAD); 0 where it cannot say."""
    try:
        return int(struct.unpack("i", fcntl.ioctl(fd, termios.FIONREAD, b"\0\0\0\0"))[0])
    except OSError:
        return 0


class Transport(ABC):
    """Reaches one host. Connections are opened once and reused until `close`."""

    def __init__(self, node: NodeSpec) -> None:
        self.node = node

    @property
    def name(self) -> str:
        return self.node.name

    @abstractmethod
    def connect(self) -> None:
        """Open the connection (idempotent). Raises InfraError naming the host on failure."""

    @abstractmethod
    def start(
        self, argv: Sequence[str], env: Mapping[str, str] | None = None, cwd: str | None = None
    ) -> RemoteProcess:
        """Start `argv` on the host with extra environment `env`; output is not read yet."""

    @abstractmethod
    def peer_address(self) -> str:
        """The address of the host as this controller reaches it."""

    def close(self) -> None:  # noqa: B027 - a hook: the local transport has nothing to release
        """Release the connection; the default has nothing to release."""

    def connected(self) -> bool:
        """Whether the connection is open and working now (the default has none to lose)."""
        return True

    def run(
        self,
        argv: Sequence[str],
        env: Mapping[str, str] | None = None,
        stdin: bytes = b"",
        timeout: float | None = None,
    ) -> CommandResult:
        """Run a command to completion and collect its output.

        Raises:
            InfraError: the command did not finish within `timeout` seconds.
        """
        out: list[str] = []
        err: list[str] = []
        proc = self.start(argv, env)
        proc.stream(out.append, err.append)
        if stdin:
            proc.write(stdin)
        proc.close_stdin()
        rc = proc.wait(timeout)
        if rc is None:
            proc.terminate()
            raise InfraError(f"{self.name}: command timed out after {timeout:g} s: {argv[0]}")
        return CommandResult(self.name, rc, "\n".join(out), "\n".join(err))
