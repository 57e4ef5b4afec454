"""The HTTP endpoint a launch serves while its job runs: prometheus_client's own server, in its own
thread, answering each scrape from a snapshot of the figures (the run loop never waits for it)."""

from __future__ import annotations

import errno
import threading
from dataclasses import dataclass
from wsgiref.simple_server import WSGIServer

from prometheus_client import start_http_server

from orchestrator.errors import UsageError
from orchestrator.metrics.families import Source, registry_of

DEFAULT_ADDR = "127.0.0.1"


@dataclass
class Endpoint:
    """A bound and serving /metrics endpoint; `close` ends it (the port is free again)."""

    server: WSGIServer
    thread: threading.Thread
    addr: str
    port: int

    @property
    def url(self) -> str:
        host = f"[{self.addr}]" if ":" in self.addr else self.addr
        return f"http://{host}:{self.port}/metrics"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)


def bind(addr: str, port: int, source: Source) -> Endpoint:
    """Serve `source`'s jobs at http://ADDR:PORT/metrics from now on.

    Raises:
        UsageError: the address cannot be bound (the port is in use, the address is not this machine's).
    """
    try:
        server, thread = start_http_server(port, addr, registry_of(source))
    except OSError as exc:
        why = "is in use" if exc.errno == errno.EADDRINUSE else f"cannot be bound ({exc.strerror or exc})"
        raise UsageError(f"--metrics-port {port}: {addr}:{port} {why}; pick another port "
                         f"(--metrics-port), or another address (--metrics-addr)") from None
    return Endpoint(server, thread, addr, server.server_address[1])
