"""Fetching a rank's Flight Recorder dump over its socket on a host.

Every job (unless `flight_recorder: false`) gets DISTRUN_WORKER_SOCKETS in its ranks' environment;
each rank serves torch's control plane (`worker_main()`, entered by distrun's worker entry,
remote/distrun_worker.py) on `$DISTRUN_WORKER_SOCKETS/rank<RANK>.sock` (jobs/README.md). The plan
names the directory under the host-side job directory with a `~`;
the supervisor makes it (remote/sockdir.py), and remote/stack.py fetches each rank's
`fr_trace_json` from it when the hang watchdog asks (`fetch`). An answer is believed only when it
is a record distrun can read (`not_a_record`: what a rank serves is the rank's program's, not
distrun's, and may be anything), and every error is one line. Stdlib-only: shipped to the hosts.
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
ERROR_CHARS = 200  # the most characters of an error's text, on one line
CPU_HANDLER = "fr_trace_json"
NCCL_HANDLER = "dump_nccl_trace_json?includecollectives=true"
MAX_ANSWER = 64 << 20  # a rank's dump is a few MiB at most; a larger answer is not a rank's
CHUNK = 1 << 16
# The fields of an fr_trace_json entry that distrun reads, and the JSON type each must have where present.
ENTRY_FIELDS: dict[str, type] = {"collective_seq_id": int, "time_created_ns": int, "profiling_name": str,
                                 "state": str, "retired": bool, "is_p2p": bool, "process_group": list}


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
    """A rank's Flight Recorder dump as {"flight": its JSON}, or {"flight_error": why}.

    torch keeps two records: gloo's (and every CPU backend's) behind the `fr_trace_json` handler,
    NCCL's behind `dump_nccl_trace_json` (on NCCL, `fr_trace_json` answers with no entries: seen on
    torch 2.11 + NCCL 2.28, bench/results/gpu.md). The first is asked first; when it holds no
    collective, NCCL's is asked too, within the same time, and kept if it holds some.

    Args:
        path: The rank's socket: a socket of this user's, never a link.
        timeout: Seconds the whole fetch may take.
        peer: Whether the pid serving the socket may be believed (None: any of this user's).
        limit: The most bytes an answer may have.
    """
    deadline = time.monotonic() + timeout
    got = _ask(path, CPU_HANDLER, timeout, peer, limit)
    flight = got.get("flight")
    if not isinstance(flight, dict) or flight.get("entries"):
        return got
    nccl = _ask(path, NCCL_HANDLER, max(0.1, deadline - time.monotonic()), peer, limit)
    answer = nccl.get("flight")
    return nccl if isinstance(answer, dict) and answer.get("entries") else got


def _ask(path: str, handler: str, timeout: float, peer: Callable[[int], bool] | None,
         limit: int) -> dict[str, object]:
    """One handler's JSON answer on a rank's socket as {"flight": its JSON}, or {"flight_error": why}."""
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
        connection.request("POST", f"/handler/{handler}")
        response = connection.getresponse()
        body = _read_capped(response, limit, deadline)
    except (OSError, http.client.HTTPException, ValueError) as exc:
        return {"flight_error": one_line(f"{type(exc).__name__}: {exc}")}
    finally:
        connection.close()
    if response.status != 200:
        return {"flight_error": f"HTTP {response.status}: {one_line(body.decode(errors='replace'))}"}
    try:
        dump = json.loads(body)
    except ValueError:
        return {"flight_error": "the answer is not JSON"}
    why = not_a_record(dump)
    return {"flight_error": f"the answer is not a record: {why}"} if why else {"flight": dump}


def one_line(text: str, limit: int = ERROR_CHARS) -> str:
    """`text` on one line (newlines and other control characters as spaces), at most `limit` characters."""
    flat = " ".join("".join(c if c.isprintable() else " " for c in text).split())
    return flat if len(flat) <= limit else flat[:limit - 3] + "..."


class BadRecord(ValueError):
    """A rank's Flight Recorder answer that is not a record distrun can read (its one-line reason): a
    note on that rank, never an error of the run; raised by the host's poller (remote/frpoll.py) and
    by the controller's readers (diagnose/flight.py)."""


def not_a_record(dump: object) -> str | None:
    """Why `dump` is not a Flight Recorder record distrun can read, or None: fr_trace_json's JSON is an
    object whose `entries` (if any) is a list of objects, each with a collective_seq_id, and with the
    fields distrun reads (ENTRY_FIELDS) of the JSON type torch writes them as."""
    if not isinstance(dump, dict):
        return f"a JSON {_kind(dump)}, not an object"
    entries = dump.get("entries", [])
    if not isinstance(entries, list):
        return f"its entries are a JSON {_kind(entries)}, not a list"
    for index, entry in enumerate(entries):
        why = _not_an_entry(entry)
        if why is not None:
            return f"entry {index} {why}"
    return None


def _not_an_entry(entry: object) -> str | None:
    """Why one entry of a record is not one distrun can read, or None."""
    if not isinstance(entry, dict):
        return f"is {_shown(entry)}, not an object"
    if "collective_seq_id" not in entry:
        return "has no collective_seq_id (a record of another schema)"
    for key, kind in ENTRY_FIELDS.items():
        value = entry.get(key)
        if value is not None and (not isinstance(value, kind) or (kind is int and isinstance(value, bool))):
            return f"has {key} {_shown(value)}, not a JSON {_kind(kind())}"
    if not all(isinstance(part, str) for part in entry.get("process_group") or ()):
        return f"has process_group {_shown(entry['process_group'])}, not a list of strings"
    return None


def _kind(value: object) -> str:
    """The JSON name of a value's type."""
    names = {bool: "boolean", int: "number", float: "number", str: "string", list: "list", dict: "object"}
    return "null" if value is None else names.get(type(value), type(value).__name__)


def _shown(value: object) -> str:
    return one_line(json.dumps(value) if isinstance(value, (str, list, dict)) else repr(value), 40)


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
