"""Ports on a test host, held or left in TIME_WAIT on purpose, whatever ran on that host before.

Tests on one cluster share each host's ports: an earlier test's rendezvous may have left a
connection to a fixed port in TIME_WAIT, and a plain bind to that port then fails. The holder
binds with SO_REUSEADDR, which a TIME_WAIT connection does not block but a live listener does.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Protocol

HOLD = """\
import socket, sys, time
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(('0.0.0.0', int(sys.argv[1])))
s.listen()
print('ready', flush=True)
time.sleep(300)
"""

# The server side closes first, so the port's side of the connection is the one left in TIME_WAIT.
TIME_WAIT = """\
import socket, sys
port = int(sys.argv[1])
server = socket.socket()
server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
server.bind(('127.0.0.1', port))
server.listen()
client = socket.create_connection(('127.0.0.1', port))
conn, _ = server.accept()
conn.close()
client.recv(1)
client.close()
server.close()
"""


class Namespaced(Protocol):
    def ns(self, i: int) -> str: ...


def in_host(cluster: Namespaced, host: int, code: str, *args: str) -> list[str]:
    """argv that runs python `code` with `args` inside host `host`'s network namespace."""
    return ["ip", "netns", "exec", cluster.ns(host), sys.executable, "-c", code, *args]


@contextmanager
def port_held(cluster: Namespaced, host: int, port: int) -> Iterator[None]:
    """A process listening on `port` of a host, ready before the block starts."""
    holder = subprocess.Popen(in_host(cluster, host, HOLD, str(port)), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stderr is not None
        if holder.stdout.readline().strip() != "ready":
            holder.wait(10)
            raise AssertionError(f"could not hold port {port} on host {host}: {holder.stderr.read()}")
        yield
    finally:
        holder.kill()
        holder.wait()


def leave_in_time_wait(cluster: Namespaced, host: int, port: int) -> None:
    """Leave a closed connection on `port` of a host in TIME_WAIT, as a finished rendezvous does."""
    subprocess.run(in_host(cluster, host, TIME_WAIT, str(port)), check=True, timeout=30)


def in_time_wait(cluster: Namespaced, host: int, port: int) -> bool:
    """Whether some connection on `port` of the host is in TIME_WAIT."""
    out = subprocess.run(["ip", "netns", "exec", cluster.ns(host), "ss", "-Htan", "state", "time-wait",
                          "sport", f"= :{port}"], capture_output=True, text=True, check=True).stdout
    return bool(out.strip())
