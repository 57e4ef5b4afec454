"""A replica group's stable address for the torchft lighthouse, on its host: a thread of the
supervisor listening on 127.0.0.1 and forwarding each TCP connection to the lighthouse wherever
it runs now.

torchft reads TORCHFT_LIGHTHOUSE once, when a rank starts, but distrun moves the lighthouse to
another host when its host is lost. So a group's env names the hosts the lighthouse may run on
(`DISTRUN_LIGHTHOUSE_UPSTREAMS=host:port,...`, the lighthouse job's hosts) and the supervisor points
TORCHFT_LIGHTHOUSE at this forwarder. Each connection goes to the first upstream that accepts it,
the one that accepted last tried first. Nobody has to tell the forwarder where the lighthouse went:
only one host runs it (a lighthouse on a host the controller lost is ended there by its own
supervisor, on the controller's silent heartbeat), and a host without it refuses the connection
(or, cut off, lets it time out after CONNECT_TIMEOUT). A connection refused here is what torchft
sees while no lighthouse listens; its quorum retries cover the move. A connection whose upstream
went silent (its host cut off: nothing comes back for SILENT seconds while the rank sends, and
the ranks heartbeat every 100 ms) is closed, so that torchft asks again, through a new connection,
instead of waiting out its quorum timeout on a lighthouse that is gone.

Stdlib only: it runs on the hosts, shipped with the supervisor.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time

UPSTREAMS = "DISTRUN_LIGHTHOUSE_UPSTREAMS"
LIGHTHOUSE = "TORCHFT_LIGHTHOUSE"
CONNECT_TIMEOUT = 1.0  # per upstream: a cut host must not hold up a connection for long
CHUNK = 65536
SILENT = 10.0  # seconds without a byte back from the lighthouse, while the rank sends, that end a connection


class Forwarder:
    """Forwards connections on 127.0.0.1:`port` to the first upstream that takes them."""

    def __init__(self, upstreams: list[tuple[str, int]]) -> None:
        self.upstreams = upstreams
        self.last = 0  # the index of the upstream that accepted last
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = int(self.server.getsockname()[1])
        threading.Thread(target=self._accept, daemon=True, name="lighthouse-forward").start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.server.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _connect(self) -> socket.socket | None:
        order = [self.last, *(i for i in range(len(self.upstreams)) if i != self.last)]
        for index in order:
            with contextlib.suppress(OSError):
                upstream = socket.create_connection(self.upstreams[index], timeout=CONNECT_TIMEOUT)
                upstream.settimeout(None)
                self.last = index
                return upstream
        return None

    def _serve(self, client: socket.socket) -> None:
        upstream = self._connect()
        if upstream is None:
            client.close()
            return
        heard = [time.monotonic(), 0.0]  # when the upstream last sent, when the rank first sent since
        threading.Thread(target=_pipe, args=(upstream, client, heard, 0), daemon=True).start()
        _pipe(client, upstream, heard, 1)


def _pipe(source: socket.socket, sink: socket.socket, heard: list[float], side: int) -> None:
    """Copy `source` to `sink` until either ends, then close both; reading the upstream (side 0),
    also end when it was silent for SILENT seconds since the rank sent (`heard`)."""
    source.settimeout(1.0)
    try:
        while True:
            try:
                data = source.recv(CHUNK)
            except TimeoutError:
                if side == 0 and heard[1] and time.monotonic() - max(heard[0], heard[1]) > SILENT:
                    break
                continue
            if not data:
                break
            if side == 0:
                heard[0], heard[1] = time.monotonic(), 0.0
            elif not heard[1]:
                heard[1] = time.monotonic()
            sink.sendall(data)
    except OSError:
        pass
    finally:
        for end in (source, sink):
            with contextlib.suppress(OSError):
                end.shutdown(socket.SHUT_RDWR)
            end.close()


def parse(value: str) -> list[tuple[str, int]]:
    """`host:port,host:port` as (host, port) pairs, in order, without repeats."""
    pairs = []
    for item in value.split(","):
        host, _, port = item.strip().rpartition(":")
        if host and port.isdigit() and (host, int(port)) not in pairs:
            pairs.append((host, int(port)))
    return pairs


def forward_lighthouse(env: dict[str, str]) -> Forwarder | None:
    """Where the env names the lighthouse's hosts, start the forwarder and point TORCHFT_LIGHTHOUSE
    at it; None (env untouched) otherwise."""
    upstreams = parse(env.get(UPSTREAMS, ""))
    if not upstreams:
        return None
    forwarder = Forwarder(upstreams)
    env[LIGHTHOUSE] = f"http://127.0.0.1:{forwarder.port}"
    return forwarder
