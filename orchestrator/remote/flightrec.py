"""The ranks' Flight Recorder sockets on a host: where they live, and fetching a rank's dump.

A job with `hang_timeout` gets DISTRUN_WORKER_SOCKETS in its ranks' environment; a rank that opts
in serves torch's control plane (`worker_main()`) on `$DISTRUN_WORKER_SOCKETS/rank<RANK>.sock`
(jobs/README.md). The plan names the directory under the host-side job directory with a `~`;
the supervisor makes it here (`socket_dir`), and remote/stack.py fetches each rank's
`fr_trace_json` from it when the hang watchdog asks (`fetch`). Stdlib-only: shipped to the hosts.
"""

from __future__ import annotations

import http.client
import json
import os
import socket
import stat
import tempfile

from orchestrator.remote.private import make_private_dirs

# AF_UNIX paths are at most 107 bytes on Linux (108 with the terminating NUL).
MAX_SOCKET_PATH = 107
LONGEST_NAME = len("/rank99999.sock")
FETCH_TIMEOUT = 5.0


def socket_path(directory: str, rank: int | str) -> str:
    return os.path.join(directory, f"rank{rank}.sock")


def socket_dir(wanted: str, job_id: str) -> str | None:
    """Make the job's socket directory and return it: `wanted` (`~` is this host's home), or a
    short private one under the temporary directory when `wanted` is too long for a socket path.

    The short one is made by `tempfile.mkdtemp` (a fresh random name, created 0700 with O_EXCL
    semantics: no other user can have made it, blocked it or pointed it elsewhere).

    Returns:
        The directory, or None when neither could be made ours (the ranks then get no variable).
    """
    first = os.path.expanduser(wanted)
    if len(first) + LONGEST_NAME <= MAX_SOCKET_PATH:
        try:
            make_private_dirs(first)
            if _ours(first) and _ours(os.path.dirname(first)):
                return first
        except OSError:
            pass
    short = os.path.join(tempfile.gettempdir(), f"distrun-{job_id[:8]}-XXXXXXXX")
    if len(short) + LONGEST_NAME > MAX_SOCKET_PATH:
        return None
    try:
        return tempfile.mkdtemp(prefix=f"distrun-{job_id[:8]}-")
    except OSError:
        return None


def _ours(path: str) -> bool:
    """Whether `path` itself (not what a link points to) is a directory of this user that no
    other user can write."""
    info = os.lstat(path)
    return stat.S_ISDIR(info.st_mode) and info.st_uid == os.getuid() and not info.st_mode & 0o022


class UnixHTTPConnection(http.client.HTTPConnection):
    """HTTP over a Unix socket (torch's worker server listens on one)."""

    def __init__(self, path: str, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self.path = path

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(self.timeout)
        self.sock.connect(self.path)


def fetch(path: str, timeout: float = FETCH_TIMEOUT) -> dict[str, object]:
    """A rank's Flight Recorder dump (torch's `fr_trace_json` handler) as {"flight": its JSON}, or
    {"flight_error": why}."""
    if not os.path.exists(path):
        return {"flight_error": "no socket served"}
    connection = UnixHTTPConnection(path, timeout)
    try:
        connection.request("POST", "/handler/fr_trace_json")
        response = connection.getresponse()
        body = response.read()
    except (OSError, http.client.HTTPException) as exc:
        return {"flight_error": f"{type(exc).__name__}: {exc}"}
    finally:
        connection.close()
    if response.status != 200:
        return {"flight_error": f"HTTP {response.status}: {body[:200].decode(errors='replace')}"}
    try:
        return {"flight": json.loads(body)}
    except ValueError:
        return {"flight_error": "the answer is not JSON"}
