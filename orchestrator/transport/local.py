"""The local transport: the same interface as SSH, run with subprocess on this machine."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Mapping, Sequence
from typing import BinaryIO, cast

from orchestrator.errors import InfraError
from orchestrator.transport.base import RemoteProcess, Transport


class LocalProcess(RemoteProcess):
    def __init__(self, popen: subprocess.Popen[bytes]) -> None:
        super().__init__()
        self.popen = popen
        self.stdout = cast(BinaryIO, popen.stdout)  # opened with PIPE by LocalTransport.start
        self.stderr = cast(BinaryIO, popen.stderr)

    def _stdout(self) -> BinaryIO:
        return self.stdout

    def _stderr(self) -> BinaryIO:
        return self.stderr

    def _write(self, data: bytes) -> None:
        if self.popen.stdin is None or self.popen.stdin.closed:
            return
        with contextlib.suppress(OSError):
            self.popen.stdin.write(data)
            self.popen.stdin.flush()

    def close_stdin(self) -> None:
        if self.popen.stdin is not None and not self.popen.stdin.closed:
            with contextlib.suppress(OSError):
                self.popen.stdin.close()

    def _wait(self, timeout: float | None) -> int | None:
        try:
            return self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def terminate(self) -> None:
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)


class LocalTransport(Transport):
    def connect(self) -> None:
        return None

    def start(
        self, argv: Sequence[str], env: Mapping[str, str] | None = None, cwd: str | None = None
    ) -> LocalProcess:
        full_env = {**os.environ, **(env or {})}
        try:
            popen = subprocess.Popen(
                list(argv),
                env=full_env,
                cwd=cwd,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,
            )
        except OSError as exc:
            raise InfraError(f"{self.name}: cannot start {argv[0]}: {exc.strerror}") from exc
        return LocalProcess(popen)

    def peer_address(self) -> str:
        return "127.0.0.1"
