"""The local transport: the same interface as SSH, run with subprocess on this machine."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import BinaryIO

from orchestrator.errors import InfraError
from orchestrator.transport.base import RemoteProcess, Transport


class LocalProcess(RemoteProcess):
    def __init__(self, popen: subprocess.Popen[bytes]) -> None:
        super().__init__()
        self.popen = popen

    def _stdout(self) -> BinaryIO:
        assert self.popen.stdout is not None  # noqa: S101 - opened with PIPE by LocalTransport.start
        return self.popen.stdout

    def _stderr(self) -> BinaryIO:
        assert self.popen.stderr is not None  # noqa: S101 - opened with PIPE by LocalTransport.start
        return self.popen.stderr

    def _write(self, data: bytes) -> None:
        if self.popen.stdin is None or self.popen.stdin.closed:
            return
        try:
            self.popen.stdin.write(data)
            self.popen.stdin.flush()
        except (BrokenPipeError, OSError):
            pass

    def close_stdin(self) -> None:
        if self.popen.stdin is not None and not self.popen.stdin.closed:
            try:
                self.popen.stdin.close()
            except (BrokenPipeError, OSError):
                pass

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
            popen = subprocess.Popen(  # noqa: S603 - argv list, no shell
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

    def put(self, local: Path, remote: str, mode: int | None = None) -> None:
        target = Path(os.path.expanduser(remote))
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(local, target)
        if mode is not None:
            target.chmod(mode)

    def peer_address(self) -> str:
        return "127.0.0.1"
