"""The SSH transport: paramiko, one connection per host reused for every step.

Where to connect comes from the inventory first, then ~/.ssh/config, then OpenSSH's defaults
(ssh_config.py). Host keys are checked against the node's known_hosts file before any
credential is offered (known_hosts.py). A remote shell is unavoidable over SSH, so every word
of a command is quoted.
"""

from __future__ import annotations

import contextlib
import functools
import ipaddress
import logging
import os
import re
import shlex
import socket
import threading
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import BinaryIO

from orchestrator.errors import InfraError, UsageError
from orchestrator.spec.model import NodeSpec
from orchestrator.transport.base import ConnectError, ConnectFailure, RemoteProcess, Transport, unread_bytes
from orchestrator.transport.known_hosts import HostKeyChecker
from orchestrator.transport.ssh_config import (
    DEFAULT_IDENTITIES,
    Route,
    SshTarget,
    connect_timeout,
    error_reason,
    load_ssh_config,
    paramiko,
    resolve_route,
)

KEEPALIVE_EVERY = 5
# Keepalives are only sent; with this, unacknowledged ones end a connection whose link is cut.
DEAD_LINK_AFTER_MS = 30_000
# How often an idle connection's paramiko thread wakes up (paramiko: 10 times a second) to see
# whether it was closed and whether a keepalive is due. Each wake-up costs CPU, so with 0.1 s,
# 244 connections open for 15 s cost the controller a second of CPU; closing does not wait on it.
IDLE_POLL = 1.0
# Authenticated ciphers OpenSSH offers by default, preferred over paramiko's first choice (CTR + HMAC).
AEAD_CIPHERS = ("aes128-gcm@openssh.com", "aes256-gcm@openssh.com")
NO_EXIT_STATUS = 255  # what ssh(1) exits with when the remote side gave no exit status
_SSH_ERRORS = (OSError, EOFError, paramiko.SSHException)

# paramiko logs socket errors it also raises; without a handler Python prints them to stderr.
logging.getLogger("paramiko").addHandler(logging.NullHandler())


def command_line(argv: Sequence[str], env: Mapping[str, str] | None = None, cwd: str | None = None) -> str:
    """The one string the remote login shell runs: every word quoted, env passed through `env`.

    Args:
        argv: The command and its arguments, each delivered literally.
        env: Extra environment variables for the command.
        cwd: The directory to run in (the login directory when None); a leading `~/` is the
            remote home.

    Returns:
        `cd CWD && exec env K=V ... ARGV...`, with every word shell-quoted.

    Raises:
        UsageError: `argv` is empty or an environment variable name is not valid.
    """
    if not argv:
        raise UsageError("no command to run")
    words = ["exec"]
    if env:
        bad = [key for key in env if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key)]
        if bad:
            raise UsageError(f"invalid environment variable name {bad[0]!r}")
        words += ["env", *(f"{key}={value}" for key, value in env.items())]
    line = shlex.join([*words, *argv])
    return f"cd {_quote_dir(cwd)} && {line}" if cwd else line


def _quote_dir(path: str) -> str:
    """Quote a directory for the shell, leaving a leading `~` to expand to the home directory."""
    if path == "~" or path.startswith("~/"):
        return "~" + (f"/{shlex.quote(path[2:])}" if path[2:] else "")
    return shlex.quote(path)



class SSHProcess(RemoteProcess):
    """A command running in a session channel; closing the channel ends it."""

    def __init__(self, channel: paramiko.Channel) -> None:
        super().__init__()
        self._channel = channel
        self._out = channel.makefile("rb")
        self._err = channel.makefile_stderr("rb")

    def _stdout(self) -> BinaryIO:
        return self._out

    def _stderr(self) -> BinaryIO:
        return self._err

    def _read_stdout(self, size: int) -> bytes:
        """Straight from the channel's buffer: what arrived, up to `size` bytes (b"" at the end)."""
        return self._channel.recv(size)

    def _queued(self) -> int:
        """What waits in the channel's buffer, and in the connection's socket for paramiko's reader."""
        sock = getattr(self._channel.get_transport(), "sock", None)
        waiting = unread_bytes(sock.fileno()) if isinstance(sock, socket.socket) else 0
        return waiting + int(self._channel.recv_ready())

    def _write(self, data: bytes) -> None:
        # After the command or the connection ended, input has nowhere to go.
        with contextlib.suppress(*_SSH_ERRORS):
            self._channel.sendall(data)

    def close_stdin(self) -> None:
        with contextlib.suppress(*_SSH_ERRORS):
            self._channel.shutdown_write()

    def _wait(self, timeout: float | None) -> int | None:
        # Also set when the connection drops: the transport closes every channel it had.
        if not self._channel.status_event.wait(timeout):
            return None
        status = self._channel.recv_exit_status()
        return status if status >= 0 else NO_EXIT_STATUS

    def terminate(self) -> None:
        self._channel.close()


class SSHTransport(Transport):
    """One paramiko connection to a node (through its jump hosts), opened once, reused."""

    def __init__(self, node: NodeSpec) -> None:
        super().__init__(node)
        self._lock = threading.Lock()
        self._route: Route | None = None
        self._links: list[paramiko.Transport] = []
        self._peer = ""
        self._home: str | None = None
        self._closed = False

    @property
    def label(self) -> str:
        """`node1 (10.0.0.1:22)`: how errors name this host."""
        route = self._route
        return f"{self.name} ({route.target.address})" if route else f"{self.name} ({self.node.host})"

    def connect(self) -> None:
        """Open the connection, or check it is still open (idempotent).

        Raises:
            ConnectError: the node (or a jump host) could not be reached or logged into.
            InfraError: the transport was closed; a closed transport does not reconnect.
        """
        with self._lock:
            if self._closed:
                raise InfraError(f"{self.label}: connection closed")
            if self._links and self._links[-1].is_active():
                return
            self._close_links()
            self._route = resolve_route(self.node, load_ssh_config())
            self._open(self._route, HostKeyChecker(self.node.known_hosts, self.node.host_key_policy))

    def _open(self, route: Route, checker: HostKeyChecker) -> None:
        timeout = connect_timeout()
        try:
            sock = self._tcp(route.hops[0], self._hop_label(route, 0), timeout)
            for index, hop in enumerate(route.hops):
                if index:
                    sock = self._tunnel(self._links[-1], hop, self._hop_label(route, index), timeout)
                self._links.append(_login(sock, hop, self._hop_label(route, index), checker, timeout))
        except BaseException:
            self._close_links()
            raise
        self._peer = _peer_ip(route, self._links[0])

    def _hop_label(self, route: Route, index: int) -> str:
        if index == len(route.hops) - 1:
            via = f" via {route.hops[-2].address}" if len(route.hops) > 1 else ""
            return f"{self.name} ({route.target.address}{via})"
        return f"{self.name} (jump host {route.hops[index].address})"

    @staticmethod
    def _tcp(endpoint: SshTarget, label: str, timeout: float) -> socket.socket:
        try:
            sock = socket.create_connection((endpoint.hostname, endpoint.port), timeout=timeout)
        except TimeoutError as exc:
            raise ConnectError(f"{label}: connection timed out after {timeout:g} s", ConnectFailure.TIMEOUT) from exc
        except socket.gaierror as exc:
            raise ConnectError(f"{label}: unreachable: cannot resolve host name: {exc.strerror}",
                               ConnectFailure.UNREACHABLE) from exc
        except OSError as exc:
            raise ConnectError(f"{label}: unreachable: {error_reason(exc)}", ConnectFailure.UNREACHABLE) from exc
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, DEAD_LINK_AFTER_MS)
        return sock

    @staticmethod
    def _tunnel(jump: paramiko.Transport, endpoint: SshTarget, label: str, timeout: float) -> paramiko.Channel:
        try:
            return jump.open_channel(
                "direct-tcpip", (endpoint.hostname, endpoint.port), ("127.0.0.1", 0), timeout=timeout
            )
        except paramiko.ChannelException as exc:
            raise ConnectError(f"{label}: unreachable from the jump host: {exc.text}",
                               ConnectFailure.UNREACHABLE) from exc
        except _SSH_ERRORS as exc:
            raise ConnectError(f"{label}: connection timed out after {timeout:g} s (through the jump host: "
                               f"{error_reason(exc)})", ConnectFailure.TIMEOUT) from exc

    def _client(self) -> paramiko.Transport:
        self.connect()
        links = self._links
        if not links:
            raise InfraError(f"{self.label}: connection closed")
        return links[-1]

    def start(
        self, argv: Sequence[str], env: Mapping[str, str] | None = None, cwd: str | None = None
    ) -> SSHProcess:
        """Start `argv` through the login shell, every word quoted; no pty.

        Raises:
            InfraError: the connection failed or the server refused the session.
        """
        line = command_line(argv, env, cwd)
        client = self._client()
        try:
            channel = client.open_session(timeout=connect_timeout())
            channel.exec_command(line)
        except _SSH_ERRORS as exc:
            raise InfraError(f"{self.label}: cannot start {argv[0]}: {error_reason(exc)}") from exc
        return SSHProcess(channel)

    def connected(self) -> bool:
        """Whether the connection (and each jump host's) is open: a closed or dropped one is not."""
        links = self._links
        return not self._closed and bool(links) and all(link.is_active() for link in links)

    def peer_address(self) -> str:
        """The IP address this connection reached (through jumps: the node's, as resolved here)."""
        self.connect()
        return self._peer

    def close(self) -> None:
        """Close the connection and its jump hosts'; final."""
        self._closed = True
        with self._lock:
            self._close_links()

    def _close_links(self) -> None:
        for link in reversed(self._links):
            link.close()
        self._links = []


def _login(sock: socket.socket | paramiko.Channel, endpoint: SshTarget, label: str, checker: HostKeyChecker,
           timeout: float) -> paramiko.Transport:
    """Handshake, check the host key, authenticate; the transport is closed on failure.

    Raises:
        ConnectError: any step failed (named by `label`).
    """
    link = paramiko.Transport(sock)
    sock.settimeout(IDLE_POLL)
    link.banner_timeout = link.handshake_timeout = link.auth_timeout = timeout
    try:
        _prefer_known_key_types(link, checker.known_types(label, endpoint))
        _prefer_aead_ciphers(link)
        _handshake(link, label, timeout)
        checker.check(label, endpoint, link.get_remote_server_key())
        _authenticate(link, endpoint, label)
    except BaseException:
        link.close()
        raise
    link.set_keepalive(KEEPALIVE_EVERY)
    return link


def _prefer_known_key_types(link: paramiko.Transport, known: list[str]) -> None:
    # Otherwise the server may offer a key type known_hosts lacks, which would look unknown.
    options = link.get_security_options()
    offered = list(options.key_types)
    options.key_types = [t for t in offered if t in known] + [t for t in offered if t not in known]


def _prefer_aead_ciphers(link: paramiko.Transport) -> None:
    # AES-GCM authenticates in OpenSSL; with paramiko's CTR + HMAC each packet's MAC is compared
    # byte by byte in Python (0.1 to 0.6 ms of a 5.7 ms connection running one command, more per
    # packet after). Same ciphers offered, only reordered.
    options = link.get_security_options()
    offered = list(options.ciphers)
    options.ciphers = [c for c in offered if c in AEAD_CIPHERS] + [c for c in offered if c not in AEAD_CIPHERS]


def _handshake(link: paramiko.Transport, label: str, timeout: float) -> None:
    done = threading.Event()
    link.start_client(event=done)
    if not done.wait(timeout):
        raise ConnectError(f"{label}: connection timed out after {timeout:g} s (no ssh handshake)",
                           ConnectFailure.TIMEOUT)
    if not link.is_active():
        cause = link.get_exception() or paramiko.SSHException("connection closed")
        raise ConnectError(f"{label}: unreachable: ssh handshake failed: {error_reason(cause)}",
                           ConnectFailure.UNREACHABLE) from cause


def _authenticate(link: paramiko.Transport, endpoint: SshTarget, label: str) -> None:
    tried: list[str] = []
    for source, key in _identities(endpoint, label):
        tried.append(source)
        try:
            link.auth_publickey(endpoint.user, key)
        except paramiko.AuthenticationException:
            continue
        except _SSH_ERRORS as exc:
            raise ConnectError(f"{label}: authentication failed as {endpoint.user}: {error_reason(exc)}",
                               ConnectFailure.AUTH) from exc
        if link.is_authenticated():
            return
    offered = ", ".join(tried) if tried else "no key (none found, and no ssh-agent)"
    raise ConnectError(
        f"{label}: authentication failed as {endpoint.user} with {offered} (check identity_file / user)",
        ConnectFailure.AUTH,
    )


def _identities(endpoint: SshTarget, label: str) -> Iterator[tuple[str, paramiko.PKey]]:
    """(what to call it, key) for each key to offer: named files, then ssh-agent, then defaults.

    Raises:
        ConnectError: a named identity file is missing or unreadable.
    """
    for path in endpoint.identity_files:
        if endpoint.identities_from_config and not Path(os.path.expanduser(path)).is_file():
            continue
        yield path, _key_file(path, label)
    if os.environ.get("SSH_AUTH_SOCK"):
        agent = paramiko.Agent()
        try:
            for key in agent.get_keys():
                yield f"ssh-agent key {key.fingerprint}", key
        finally:
            agent.close()
    if endpoint.use_default_keys:
        for path in DEFAULT_IDENTITIES:
            if Path(os.path.expanduser(path)).is_file():
                yield path, _key_file(path, label)


def _key_file(path: str, label: str) -> paramiko.PKey:
    full = Path(os.path.expanduser(path))
    try:
        return _load_key(str(full), full.stat().st_mtime_ns)
    except FileNotFoundError as exc:
        raise ConnectError(f"{label}: identity file {path} not found (check identity_file)",
                           ConnectFailure.AUTH) from exc
    except paramiko.PasswordRequiredException as exc:
        raise ConnectError(f"{label}: identity file {path} is passphrase-protected (load it into ssh-agent)",
                           ConnectFailure.AUTH) from exc
    except (OSError, paramiko.SSHException, ValueError) as exc:
        raise ConnectError(f"{label}: cannot read identity file {path}: {error_reason(exc)}",
                           ConnectFailure.AUTH) from exc


@functools.lru_cache(maxsize=32)
def _load_key(path: str, _mtime_ns: int) -> paramiko.PKey:
    return paramiko.PKey.from_path(path)


def _peer_ip(route: Route, first: paramiko.Transport) -> str:
    if not route.jumps:
        return str(first.getpeername()[0])
    name = route.target.hostname
    with contextlib.suppress(ValueError):
        return str(ipaddress.ip_address(name))
    try:
        return socket.getaddrinfo(name, route.target.port, type=socket.SOCK_STREAM)[0][4][0]
    except OSError:
        return name


__all__ = ["SSHProcess", "SSHTransport", "command_line"]
