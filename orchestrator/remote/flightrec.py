"""Fetching a rank's Flight Recorder dump over its socket on a host.

Every job (unless `flight_recorder: false`) gets DISTRUN_WORKER_SOCKETS in its ranks' environment;
each rank serves torch's control plane (`worker_main()`, entered by distrun's worker entry,
remote/distrun_worker.py) on `$DISTRUN_WORKER_SOCKETS/rank<RANK>.sock` (jobs/README.md). The plan
names the directory under the host-side job directory with a `~`;
the supervisor makes it (remote/sockdir.py), and remote/stack.py fetches each rank's
`fr_trace_json` from it when the hang watchdog asks (`fetch`). Stdlib-only: shipped to the hosts.
"""

from __future__ import annotations

import functools
import json
import os
import socket
import stat
import struct
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import http.client

FETCH_TIMEOUT = 5.0
MAX_ANSWER = 64 << 20  # a rank's dump is a few MiB at most; a larger answer is not a rank's
CHUNK = 1 << 16


@functools.lru_cache(maxsize=None)  # noqa: UP033 - functools.cache is 3.9's; hosts may run 3.8
def unix_http_connection() -> type[http.client.HTTPConnection]:
    """The connection class, made at the first fetch: the supervisor ships this module (its Flight
    Recorder polls) and starts without importing http.client (about 17 ms of each host's CPU at
    every launch)."""
    import http.client

    class UnixHTTPConnection(http.client.HTTPConnection):
        """HTTP over a Unix socket (torch's worker server listens on one); `peer` is the pid of the
        process serving it once connected (SO_PEERCRED), None where the kernel does not say."""

        def __init__(self, path: str, timeout: float) -> None:
            super().__init__("localhost", timeout=timeout)
            self.path = path
            self.peer: tuple[int, int] | None = None

        def connect(self) -> None:
            self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            self.sock.settimeout(self.timeout)
            self.sock.connect(self.path)
            creds = getattr(socket, "SO_PEERCRED", None)
            if creds is not None:
                pid, uid, _ = struct.unpack("3i", self.sock.getsockopt(socket.SOL_SOCKET, creds, struct.calcsize("3i")))
                self.peer = (pid, uid)

    return UnixHTTPConnection


def _socket_of_ours(path: str) -> str | None:
    """Why `path` is not a socket of this user's (a link, another user's, something else), or None."""
    try:
        info = os.lstat(path)
    except OSError:
        return "no socket served"
    if not stat.S_ISSOCK(info.st_mode):
        return "not a socket (a link or a file is never followed)"
    if info.st_uid != os.getuid():
        return "the socket is another user's"
    return None


def fetch(path: str, timeout: float = FETCH_TIMEOUT, peer: Callable[[int], bool] | None = None,
          limit: int = MAX_ANSWER) -> dict[str, object]:
    """A rank's Flight Recorder dump (torch's `fr_trace_json` handler) as {"flight": its JSON}, or
    {"flight_error": why}.

    Args:
        path: The rank's socket: a socket of this user's, never a link.
        timeout: Seconds the whole fetch may take.
        peer: Whether the pid serving the socket may be believed (None: any of this user's).
        limit: The most bytes an answer may have.
    """
    why = _socket_of_ours(path)
    if why is not None:
        return {"flight_error": why}
    import http.client

    connection = unix_http_connection()(path, timeout)
    deadline = time.monotonic() + timeout
    try:
        connection.connect()
        why = _unbelieved(connection.peer, peer)
        if why is not None:
            return {"flight_error": why}
        connection.request("POST", "/handler/fr_trace_json")
        response = connection.getresponse()
        body = _read_capped(response, limit, deadline)
    except (OSError, http.client.HTTPException, ValueError) as exc:
        return {"flight_error": f"{type(exc).__name__}: {exc}"}
    finally:
        connection.close()
    if response.status != 200:
        return {"flight_error": f"HTTP {response.status}: {body[:200].decode(errors='replace')}"}
    try:
        return {"flight": json.loads(body)}
    except ValueError:
        return {"flight_error": "the answer is not JSON"}


def _unbelieved(served_by: tuple[int, int] | None, peer: Callable[[int], bool] | None) -> str | None:
    """Why the process serving the socket is not believed, or None."""
    if served_by is None:
        return "the kernel does not say which process serves the socket"
    pid, uid = served_by
    if uid != os.getuid() or (peer is not None and not peer(pid)):
        return f"the socket is served by process {pid}, which is not the job's"
    return None


def _read_capped(response: http.client.HTTPResponse, limit: int, deadline: float) -> bytes:
    """The answer's body, at most `limit` bytes, read before `deadline`.

    Raises:
        ValueError: it is longer, or slower.
    """
    parts: list[bytes] = []
    size = 0
    while chunk := response.read1(CHUNK):
        size += len(chunk)
        if size > limit:
            raise ValueError(f"the answer is longer than {limit >> 20} MiB")
        if time.monotonic() > deadline:
            raise ValueError("the answer took too long")
        parts.append(chunk)
    return b"".join(parts)
