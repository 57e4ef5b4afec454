"""The HTTP endpoint a launch serves while its job runs: prometheus_client's WSGI app in a threading
server of its own thread, answering each scrape from a snapshot of the figures (the run loop never
waits for it).

The server is prometheus_client's `start_http_server` with one change: its listen backlog is the
system's (`socket.SOMAXCONN`), not socketserver's 5, with which 77 of 5,105 scrapes from 200
concurrent scrapers timed out waiting to be accepted.
"""

from __future__ import annotations

import errno
import ipaddress
import socket
import threading
from dataclasses import dataclass
from socketserver import ThreadingMixIn
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import make_wsgi_app

from orchestrator.console import terminal
from orchestrator.errors import UsageError
from orchestrator.metrics.families import Source, registry_of

DEFAULT_ADDR = "127.0.0.1"
BACKLOG = socket.SOMAXCONN  # connections the kernel holds before the server thread accepts them
# What anyone who reaches the endpoint reads (docs/security.md, "The metrics endpoint").
EXPOSED = ("the job's id and state, its hosts' names, load, CPU, memory, network and GPU figures, its ranks' "
           "step counts, step times, throughput and collectives, its alerts")


class _Server(ThreadingMixIn, WSGIServer):
    """A thread per scrape (daemon threads: none outlives the endpoint's owner), a full backlog."""

    daemon_threads = True
    request_queue_size = BACKLOG


class _QuietHandler(WSGIRequestHandler):
    """No line on stderr per scrape (the job's screen is the operator's)."""

    def log_message(self, format: str, *args: object) -> None:
        return


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
    """Serve `source`'s jobs at http://ADDR:PORT/metrics from now on; an address beyond this
    machine (not loopback) is said once on stderr, with what it exposes and to whom.

    Raises:
        UsageError: the address cannot be bound (the port is in use, the address is not this machine's).
    """
    try:
        server = _serve(addr, port, source)
    except OSError as exc:
        why = "is in use" if exc.errno == errno.EADDRINUSE else f"cannot be bound ({exc.strerror or exc})"
        raise UsageError(f"--metrics-port {port}: {addr}:{port} {why}; pick another port "
                         f"(--metrics-port), or another address (--metrics-addr)") from None
    thread = threading.Thread(target=server.serve_forever, name="metrics-endpoint", daemon=True)
    thread.start()
    endpoint = Endpoint(server, thread, addr, server.server_address[1])
    note = exposure(server.server_address[0], endpoint.url)
    if note:
        terminal.show(note, err=True)
    return endpoint


def exposure(bound: str, url: str) -> str | None:
    """The line that says an endpoint bound to `bound` (an IP address) is open beyond this
    machine, or None when it is loopback (this machine's users only)."""
    if ipaddress.ip_address(bound.split("%")[0]).is_loopback:
        return None
    who = "every interface" if ipaddress.ip_address(bound.split("%")[0]).is_unspecified else bound
    return (f"distrun: note: the metrics endpoint listens on {who} ({url}): anyone who can reach this "
            f"machine's port reads {EXPOSED}, with no password; --metrics-addr 127.0.0.1 keeps them on "
            f"this machine (docs/security.md)")


def _serve(addr: str, port: int, source: Source) -> WSGIServer:
    """The server bound (not yet serving), its address family the address's own (IPv4 or IPv6)."""
    family, _, _, _, sockaddr = socket.getaddrinfo(addr, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]

    class Server(_Server):
        address_family = family

    return make_server(sockaddr[0], port, make_wsgi_app(registry_of(source)), Server, handler_class=_QuietHandler)
