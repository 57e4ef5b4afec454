"""How a command reaches a host: one interface (base.Transport), local and SSH behind it."""

import json
from typing import Any

from orchestrator import remote
from orchestrator.errors import InfraError
from orchestrator.spec.model import NodeSpec, TransportKind
from orchestrator.transport.base import CommandResult, RemoteProcess, Transport

REMOTE_TIMEOUT = 30.0


def transport_for(node: NodeSpec) -> Transport:
    """Build the transport a node's inventory entry asks for (the SSH one is imported lazily)."""
    if node.transport is TransportKind.LOCAL:
        from orchestrator.transport.local import LocalTransport

        return LocalTransport(node)
    from orchestrator.transport.ssh import SSHTransport

    return SSHTransport(node)


def run_remote(transport: Transport, main: str, modules: list[str], stdin_line: dict[str, Any] | bytes,
               *tags: str, timeout: float = REMOTE_TIMEOUT) -> str:
    """Ship remote modules to a host, run `main` with the host's python, return its stdout.

    Args:
        transport: A connected host.
        main: The short name of the remote module whose `main(argv)` runs.
        modules: The remote modules to ship, dependencies first.
        stdin_line: What follows the bundle on stdin: a dict as one JSON line, bytes as they are.
        tags: Arguments after the bundle's size (the program's argv; they show in `ps`).
        timeout: Seconds the program may take.

    Raises:
        InfraError: the program failed on the host, or did not finish in time.
    """
    payload = remote.bundle(main, modules)
    argv = remote.bootstrap_argv(transport.node.python, payload, *tags)
    tail = stdin_line if isinstance(stdin_line, bytes) else json.dumps(stdin_line).encode() + b"\n"
    result = transport.run(argv, stdin=payload + tail, timeout=timeout)
    if result.returncode != 0:
        last = (result.stderr.strip().splitlines() or ["no output"])[-1]
        raise InfraError(
            f"{transport.name}: {main} failed with exit code {result.returncode} using python "
            f"'{transport.node.python}': {last}"
        )
    return result.stdout


__all__ = ["CommandResult", "RemoteProcess", "Transport", "run_remote", "transport_for"]
