"""How a command reaches a host: one interface (base.Transport), local and SSH behind it."""

from orchestrator.spec.model import NodeSpec, TransportKind
from orchestrator.transport.base import CommandResult, RemoteProcess, Transport


def transport_for(node: NodeSpec) -> Transport:
    """Build the transport a node's inventory entry asks for (the SSH one is imported lazily)."""
    if node.transport is TransportKind.LOCAL:
        from orchestrator.transport.local import LocalTransport

        return LocalTransport(node)
    from orchestrator.transport.ssh import SSHTransport

    return SSHTransport(node)


__all__ = ["CommandResult", "RemoteProcess", "Transport", "transport_for"]
