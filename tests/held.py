"""A transport a test holds back, around a real one (local or SSH): a host reached late in the
fan-out, or a host whose probe gets where to connect late; and a way to learn when its command ended.

A probe round with such hosts runs the real probe on the real hosts; only the timing is the test's.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from typing import BinaryIO

from orchestrator.transport import RemoteProcess, Transport
from orchestrator.transport.base import LineCallback

HOLD = 20.0  # the longest a hold lasts: past it, the host goes on as if released (and `released` says so)


class HeldProcess(RemoteProcess):
    """`inner`, with every write after the first (the probe's options) delivered once `later` is set."""

    def __init__(self, inner: RemoteProcess, later: threading.Event | None) -> None:
        super().__init__()
        self.inner = inner
        self.later = later
        self._first = True

    def _stdout(self) -> BinaryIO:
        return self.inner._stdout()

    def _stderr(self) -> BinaryIO:
        return self.inner._stderr()

    def _write(self, data: bytes) -> None:
        self.inner.write(data)

    def write(self, data: bytes) -> None:
        if self._first or self.later is None:
            self._first = False
            self.inner.write(data)
            return
        later = self.later
        threading.Thread(target=lambda: (later.wait(HOLD), self.inner.write(data)), daemon=True).start()

    def close_stdin(self) -> None:
        self.inner.close_stdin()

    def _wait(self, timeout: float | None) -> int | None:
        return self.inner._wait(timeout)

    def wait(self, timeout: float | None = None) -> int | None:
        return self.inner.wait(timeout)

    def stream(self, on_stdout: LineCallback, on_stderr: LineCallback) -> None:
        self.inner.stream(on_stdout, on_stderr)

    def terminate(self) -> None:
        self.inner.terminate()


class HeldTransport(Transport):
    """`inner`, reached only once `reach_after` is set, its commands' later writes held until
    `tell_after` is set; `exited` is set when a command it started ends.

    `released` is whether the connect hold ended because `reach_after` was set (not because HOLD passed).
    """

    def __init__(self, inner: Transport, reach_after: threading.Event | None = None,
                 tell_after: threading.Event | None = None) -> None:
        super().__init__(inner.node)
        self.inner = inner
        self.reach_after = reach_after
        self.tell_after = tell_after
        self.exited = threading.Event()
        self.released: bool | None = None

    def connect(self) -> None:
        if self.reach_after is not None:
            self.released = self.reach_after.wait(HOLD)
        self.inner.connect()

    def start(self, argv: Sequence[str], env: Mapping[str, str] | None = None,
              cwd: str | None = None) -> RemoteProcess:
        proc = self.inner.start(argv, env, cwd)
        threading.Thread(target=lambda: (proc._wait(None), self.exited.set()), daemon=True).start()
        return HeldProcess(proc, self.tell_after)

    def peer_address(self) -> str:
        return self.inner.peer_address()

    def close(self) -> None:
        self.inner.close()

    def connected(self) -> bool:
        return self.inner.connected()
