"""The SSH transport: paramiko, one connection per host reused for every step.

Where to connect comes from the inventory first, then ~/.ssh/config (Host aliases,
HostName, User, Port, IdentityFile, ProxyJump), then OpenSSH's defaults. Host keys are
checked against the node's known_hosts file (parsed once per process, read as ssh(1) reads
it) before any credential is offered: an unknown key is refused under `strict` and recorded
under `accept-new`; a changed key, or one a `@revoked` line names, is always refused; so is
a host trusted only through `@cert-authority`, since host certificates are not checked. A
remote shell is unavoidable over SSH, so every word of a command is quoted.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import fcntl
import functools
import getpass
import hashlib
import hmac
import importlib.util
import ipaddress
import logging
import os
import posixpath
import re
import shlex
import socket
import sys
import threading
import types
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import BinaryIO

from orchestrator.errors import InfraError, UsageError
from orchestrator.spec.model import HostKeyPolicy, NodeSpec
from orchestrator.transport.base import ConnectError, ConnectFailure, RemoteProcess, Transport


class _Deferred(types.ModuleType):
    """Stands in for a module until one of its attributes is used, then imports it."""

    def __getattr__(self, attr: str) -> object:
        if sys.modules.get(self.__name__) is self:
            del sys.modules[self.__name__]
        return getattr(importlib.import_module(self.__name__), attr)


def _defer_invoke_import() -> None:
    """paramiko imports invoke only to run ssh_config's `Match exec`; importing it costs about
    as much CPU as the rest of paramiko, on every run, so it waits until a `Match exec` needs it."""
    if "invoke" not in sys.modules and importlib.util.find_spec("invoke") is not None:
        sys.modules["invoke"] = _Deferred("invoke")


_defer_invoke_import()

import paramiko  # noqa: E402 - after _defer_invoke_import, which must run first

CONFIG_ENV = "DISTRUN_SSH_CONFIG"
TIMEOUT_ENV = "DISTRUN_SSH_TIMEOUT"
DEFAULT_CONFIG = "~/.ssh/config"
DEFAULT_TIMEOUT = 10.0
DEFAULT_PORT = 22
DEFAULT_IDENTITIES = ("~/.ssh/id_ed25519", "~/.ssh/id_ecdsa", "~/.ssh/id_rsa")
KEEPALIVE_EVERY = 5
# Keepalives are only sent; with this, unacknowledged ones end a connection whose link is cut.
DEAD_LINK_AFTER_MS = 30_000
# How often an idle connection's paramiko thread wakes up (paramiko: 10 times a second) to see
# whether it was closed and whether a keepalive is due. Each wake-up costs CPU, so with 0.1 s,
# 244 connections open for 15 s cost the controller a second of CPU; closing does not wait on it.
IDLE_POLL = 1.0
NO_EXIT_STATUS = 255  # what ssh(1) exits with when the remote side gave no exit status
_JUMP = re.compile(r"^(?:ssh://)?(?:(?P<user>[^@]+)@)?(?:\[(?P<ip6>[^\]]+)\]|(?P<host>[^:]+))(?::(?P<port>\d+))?$")
_SSH_ERRORS = (OSError, EOFError, paramiko.SSHException)
_known_hosts_lock = threading.Lock()

# paramiko logs socket errors it also raises; without a handler Python prints them to stderr.
logging.getLogger("paramiko").addHandler(logging.NullHandler())


@dataclass(frozen=True)
class Endpoint:
    """One SSH server to log in to, after the inventory and ~/.ssh/config are combined."""

    hostname: str
    port: int
    user: str
    identity_files: tuple[str, ...]
    use_default_keys: bool = True
    # Files named by ssh_config are skipped when missing, as ssh(1) does; the inventory's must exist.
    identities_from_config: bool = False

    @property
    def address(self) -> str:
        return f"{self.hostname}:{self.port}"

    @property
    def known_hosts_name(self) -> str:
        """The name known_hosts files record this server under."""
        return self.hostname if self.port == DEFAULT_PORT else f"[{self.hostname}]:{self.port}"


@dataclass(frozen=True)
class Route:
    """The servers to pass through to reach a node: jump hosts first, the node last."""

    hops: tuple[Endpoint, ...]

    @property
    def target(self) -> Endpoint:
        return self.hops[-1]

    @property
    def jumps(self) -> tuple[Endpoint, ...]:
        return self.hops[:-1]


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


def connect_timeout() -> float:
    """Seconds to wait for a host to answer: $DISTRUN_SSH_TIMEOUT, else 10.

    Raises:
        UsageError: $DISTRUN_SSH_TIMEOUT is not a positive number.
    """
    raw = os.environ.get(TIMEOUT_ENV)
    if not raw:
        return DEFAULT_TIMEOUT
    try:
        value = float(raw)
    except ValueError:
        value = 0.0
    if value <= 0:
        raise UsageError(f"{TIMEOUT_ENV}={raw}: must be a positive number of seconds")
    return value


def load_ssh_config() -> paramiko.SSHConfig:
    """The user's ssh_config ($DISTRUN_SSH_CONFIG, else ~/.ssh/config); empty when missing.

    Raises:
        UsageError: the file cannot be parsed.
    """
    path = Path(os.path.expanduser(os.environ.get(CONFIG_ENV) or DEFAULT_CONFIG))
    try:
        stat = path.stat()
    except OSError:
        return paramiko.SSHConfig()
    return _parse_ssh_config(str(path), stat.st_mtime_ns)


@functools.lru_cache(maxsize=4)
def _parse_ssh_config(path: str, _mtime_ns: int) -> paramiko.SSHConfig:
    try:
        return paramiko.SSHConfig.from_path(path)
    except (OSError, paramiko.ConfigParseError) as exc:
        raise UsageError(f"ssh config {path}: {exc}") from exc


def resolve_route(node: NodeSpec, config: paramiko.SSHConfig) -> Route:
    """Combine the node's inventory entry with ssh_config: inventory values win.

    Jump hosts take user, port and identity from their spec, then ssh_config; a jump host
    with no identity of its own is offered the node's.

    Raises:
        UsageError: a ProxyJump value cannot be parsed.
    """
    entry = config.lookup(node.host)
    named = (node.identity_file,) if node.identity_file else ()
    configured = () if named else tuple(entry.get("identityfile", ()))
    target = Endpoint(
        hostname=entry.get("hostname", node.host),
        port=node.port or int(entry.get("port", DEFAULT_PORT)),
        user=node.user or entry.get("user") or getpass.getuser(),
        identity_files=named or configured,
        use_default_keys=not (named or configured),
        identities_from_config=bool(configured),
    )
    jump_spec = node.proxy_jump or entry.get("proxyjump")
    if not jump_spec or jump_spec.lower() == "none":
        return Route((target,))
    jumps = tuple(_jump_endpoint(part.strip(), config, target) for part in jump_spec.split(","))
    return Route((*jumps, target))


def _jump_endpoint(spec: str, config: paramiko.SSHConfig, target: Endpoint) -> Endpoint:
    match = _JUMP.match(spec)
    if match is None:
        raise UsageError(f"proxy_jump {spec!r}: expected [user@]host[:port]")
    host = match["ip6"] or match["host"]
    entry = config.lookup(host)
    own = tuple(entry.get("identityfile", ()))
    return Endpoint(
        hostname=entry.get("hostname", host),
        port=int(match["port"] or entry.get("port", DEFAULT_PORT)),
        user=match["user"] or entry.get("user") or getpass.getuser(),
        identity_files=own or target.identity_files,
        use_default_keys=not (own or target.identity_files),
        identities_from_config=bool(own) or target.identities_from_config,
    )


def key_description(key: paramiko.PKey) -> str:
    """`ED25519 SHA256:...`, as ssh(1) shows a host key."""
    kind = key.get_name().removeprefix("ssh-").split("-")[0].upper()
    return f"{kind} {key.fingerprint}"


class Marker(str, Enum):
    """What a known_hosts line says about its key: a host key, a host-certificate CA, or revoked."""

    HOST_KEY = ""
    CERT_AUTHORITY = "@cert-authority"
    REVOKED = "@revoked"


@dataclass(frozen=True)
class KnownKey:
    """One line of a known_hosts file that could be read.

    `patterns` is the host field split at commas: names, `[name]:port`, wildcard patterns
    (`*`, `?`, `!` to negate) or hashed names (`|1|salt|hash`), as OpenSSH writes and reads them.
    """

    patterns: tuple[str, ...]
    key: paramiko.PKey
    marker: Marker
    line: int

    @property
    def literal(self) -> bool:
        """Every pattern is a plain name, so the line can be found by name without matching."""
        return not any(p.startswith("|") or any(c in p for c in "*?!") for p in self.patterns)

    def matches(self, name: str) -> bool:
        """Whether the host field covers `name` (lower case), by OpenSSH's rules: a negated
        pattern that matches excludes the host whatever the others say."""
        found = False
        for pattern in self.patterns:
            negated = pattern.startswith("!")
            if _pattern_matches(pattern[1:] if negated else pattern, name):
                if negated:
                    return False
                found = True
        return found


def _pattern_matches(pattern: str, name: str) -> bool:
    if pattern.startswith("|1|"):
        return _hashed_matches(pattern, name)
    return _wildcard(pattern.lower()).fullmatch(name) is not None


@functools.lru_cache(maxsize=1024)
def _wildcard(pattern: str) -> re.Pattern[str]:
    """OpenSSH's patterns know only `*` and `?`; brackets (`[host]:2222`) are literal."""
    return re.compile("".join(".*" if c == "*" else "." if c == "?" else re.escape(c) for c in pattern))


def _hashed_matches(field: str, name: str) -> bool:
    """`|1|base64(salt)|base64(HMAC-SHA1(salt, name))`, as `HashKnownHosts yes` writes names."""
    try:
        salt, digest = (base64.b64decode(part, validate=True) for part in field[3:].split("|", 1))
    except (binascii.Error, ValueError):
        return False
    return hmac.compare_digest(hmac.new(salt, name.encode(), hashlib.sha1).digest(), digest)


class KnownHosts:
    """A known_hosts file, parsed once: lines naming hosts plainly are found by name, the
    others (wildcards, hashed names) are matched one by one, as ssh(1) does.

    Lines that cannot be read (too few fields, bad base64, a key type paramiko lacks, an
    unknown `@marker`) are skipped, as ssh(1) skips them.
    """

    def __init__(self, entries: Sequence[KnownKey] = (), lines: int = 0) -> None:
        self.lines = lines  # how many lines the file has: the next one appended is lines + 1
        self._by_name: dict[str, list[KnownKey]] = {}
        self._matched: list[KnownKey] = []
        # Scans of the matched lines by host name, valid while no matched line is added.
        self._scans: dict[str, tuple[int, list[KnownKey]]] = {}
        for entry in entries:
            self.add(entry)

    @classmethod
    def parse(cls, text: str) -> KnownHosts:
        """Read known_hosts text (OpenSSH's format, `@cert-authority` and `@revoked` included)."""
        lines = text.splitlines()
        entries = [entry for number, line in enumerate(lines, 1) if (entry := _known_key(line, number)) is not None]
        return cls(entries, len(lines))

    def add(self, entry: KnownKey) -> None:
        if not entry.literal:
            self._matched.append(entry)
            return
        for name in {pattern.lower() for pattern in entry.patterns}:
            self._by_name.setdefault(name, []).append(entry)

    def lookup(self, name: str) -> list[KnownKey]:
        """Every line that covers the host `name` (as known_hosts names it), in file order."""
        name = name.lower()
        seen, scanned = self._scans.get(name, (-1, []))
        if seen != len(self._matched):
            seen = len(self._matched)
            scanned = [entry for entry in self._matched[:seen] if entry.matches(name)]
            self._scans[name] = (seen, scanned)
        return sorted([*self._by_name.get(name, ()), *scanned], key=lambda entry: entry.line)


def _known_key(line: str, number: int) -> KnownKey | None:
    fields = line.split()
    if not fields or fields[0].startswith("#"):
        return None
    marker = Marker.HOST_KEY
    if fields[0].startswith("@"):
        try:
            marker = Marker(fields[0])
        except ValueError:
            return None
        fields = fields[1:]
    if len(fields) < 3:
        return None
    names, key_type, blob = fields[:3]
    try:
        key = paramiko.PKey.from_type_string(key_type, base64.b64decode(blob, validate=True))
    except Exception:  # paramiko's key parsers raise whatever a bad blob trips: ValueError, OverflowError, ...
        return None
    return KnownKey(tuple(names.split(",")), key, marker, number)


@dataclass
class _Parsed:
    """A known_hosts file as parsed, and the file's identity then (None: it did not exist)."""

    stamp: tuple[int, ...] | None
    hosts: KnownHosts


# Parsed known_hosts files, by path: each is parsed once per process and again only when it changes.
_parsed: dict[Path, _Parsed] = {}


def _stamp(stat: os.stat_result) -> tuple[int, ...]:
    return (stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns)


class HostKeyChecker:
    """Checks servers' keys against one known_hosts file under one policy.

    The file is parsed once per process and looked up by host name; it is read again only
    when it changed on disk. Only recording a new key (`accept-new`) takes a lock.

    Args:
        path: The known_hosts file (`~` is expanded); a missing file knows no host.
        policy: `strict` refuses unknown keys; `accept-new` appends them to the file.
    """

    def __init__(self, path: str, policy: HostKeyPolicy) -> None:
        self.path = Path(os.path.expanduser(path))
        self.shown_path = path
        self.policy = policy

    def known(self, label: str) -> KnownHosts:
        """The file's lines as they are on disk now (parsed again only if it changed).

        Args:
            label: The host being connected to, for the error.

        Raises:
            ConnectError: the file exists but cannot be read.
        """
        try:
            stamp: tuple[int, ...] | None = _stamp(self.path.stat())
        except FileNotFoundError:
            stamp = None
        cached = _parsed.get(self.path)
        if cached is not None and cached.stamp == stamp:
            return cached.hosts
        with _known_hosts_lock:  # the first threads to get here would otherwise all parse it
            return self._reparse(label)

    def _reparse(self, label: str, handle: BinaryIO | None = None) -> KnownHosts:
        """Parse the file (or the open `handle` on it) unless the cached parse is still current.

        Raises:
            ConnectError: the file exists but cannot be read, so no host key can be checked.
        """
        try:
            with contextlib.nullcontext(handle) if handle else open(self.path, "rb") as src:
                stamp: tuple[int, ...] | None = _stamp(os.fstat(src.fileno()))  # before reading: a later change shows
                cached = _parsed.get(self.path)
                if cached is not None and cached.stamp == stamp:
                    return cached.hosts
                src.seek(0)
                text = src.read().decode()
        except FileNotFoundError:
            stamp, text = None, ""
        except (OSError, UnicodeDecodeError) as exc:
            raise ConnectError(f"{label}: cannot check its host key: cannot read {self.shown_path}: {_reason(exc)}",
                               ConnectFailure.UNKNOWN_HOST_KEY) from exc
        _parsed[self.path] = _Parsed(stamp, KnownHosts.parse(text))
        return _parsed[self.path].hosts

    def known_types(self, label: str, endpoint: Endpoint) -> list[str]:
        """The key types recorded for the server, to ask it for one of those first.

        Raises:
            ConnectError: the file exists but cannot be read.
        """
        entries = self.known(label).lookup(endpoint.known_hosts_name)
        return list(dict.fromkeys(e.key.get_name() for e in entries if e.marker is Marker.HOST_KEY))

    def check(self, label: str, endpoint: Endpoint, key: paramiko.PKey) -> None:
        """Accept the server's key, record it (accept-new), or refuse it.

        Raises:
            ConnectError: the key is unknown under `strict`, differs from the recorded one,
                is marked `@revoked`, or the file trusts only a certificate authority for the host.
        """
        if self._trusts(label, endpoint, key, self.known(label).lookup(endpoint.known_hosts_name)):
            return
        if self.policy is not HostKeyPolicy.ACCEPT_NEW:
            raise ConnectError(
                f"{label}: unknown host key {key_description(key)}; to trust it: "
                f"{self._keyscan(endpoint)}, or set host_key_policy: accept-new",
                ConnectFailure.UNKNOWN_HOST_KEY,
            )
        self._record(label, endpoint, key)

    def _trusts(self, label: str, endpoint: Endpoint, key: paramiko.PKey, entries: list[KnownKey]) -> bool:
        """True when a recorded key is the server's; False when the file knows nothing of the host.

        Raises:
            ConnectError: the key is revoked, another key is recorded, or only a CA is.
        """
        name = endpoint.known_hosts_name
        presented = key.asbytes()
        revoked = next((e for e in entries if e.marker is Marker.REVOKED and e.key.asbytes() == presented), None)
        if revoked is not None:
            raise ConnectError(
                f"{label}: HOST KEY REVOKED: {self.shown_path} line {revoked.line} marks {key_description(key)} "
                f"@revoked for {name}; refusing to connect (the host must be given a new key)",
                ConnectFailure.HOST_KEY_REVOKED,
            )
        recorded = [e for e in entries if e.marker is Marker.HOST_KEY]
        if any(e.key.asbytes() == presented for e in recorded):
            return True
        if recorded:
            listed = ", ".join(dict.fromkeys(key_description(e.key) for e in recorded))
            raise ConnectError(
                f"{label}: HOST KEY CHANGED: {self.shown_path} has {listed} for {name}, "
                f"the host presented {key_description(key)}; refusing to connect (someone may be intercepting; "
                f"if the host was reinstalled: ssh-keygen -R {shlex.quote(name)} -f {self.shown_path})",
                ConnectFailure.HOST_KEY_CHANGED,
            )
        authority = next((e for e in entries if e.marker is Marker.CERT_AUTHORITY), None)
        if authority is not None:
            raise ConnectError(
                f"{label}: {self.shown_path} line {authority.line} trusts {name} through @cert-authority, "
                "and distrun does not check host certificates; refusing to connect (to trust the host's own "
                f"key {key_description(key)} instead: {self._keyscan(endpoint)})",
                ConnectFailure.UNKNOWN_HOST_KEY,
            )
        return False

    def _keyscan(self, endpoint: Endpoint) -> str:
        return f"ssh-keyscan -p {endpoint.port} {endpoint.hostname} >> {self.shown_path}"

    def _record(self, label: str, endpoint: Endpoint, key: paramiko.PKey) -> None:
        """Append the key, unless another thread or process recorded this host meanwhile.

        Raises:
            ConnectError: what was recorded meanwhile is not this key.
        """
        name = endpoint.known_hosts_name
        with _known_hosts_lock:
            self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            with open(self.path, "a+b") as out:
                fcntl.flock(out, fcntl.LOCK_EX)
                known = self._reparse(label, out)
                if self._trusts(label, endpoint, key, known.lookup(name)):
                    return
                end = out.seek(0, os.SEEK_END)
                # A last line without its newline would otherwise run into ours.
                if end and os.pread(out.fileno(), 1, end - 1) != b"\n":
                    out.write(b"\n")
                out.write(f"{name} {key.get_name()} {key.get_base64()}\n".encode())
                out.flush()
                # Our own line joins the parse, so the file need not be read again for it.
                known.lines += 1
                known.add(KnownKey((name,), key, Marker.HOST_KEY, known.lines))
                _parsed[self.path].stamp = _stamp(os.fstat(out.fileno()))


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
        self._sftp: paramiko.SFTPClient | None = None
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
    def _tcp(endpoint: Endpoint, label: str, timeout: float) -> socket.socket:
        try:
            sock = socket.create_connection((endpoint.hostname, endpoint.port), timeout=timeout)
        except TimeoutError as exc:
            raise ConnectError(f"{label}: connection timed out after {timeout:g} s", ConnectFailure.TIMEOUT) from exc
        except socket.gaierror as exc:
            raise ConnectError(f"{label}: unreachable: cannot resolve host name: {exc.strerror}",
                               ConnectFailure.UNREACHABLE) from exc
        except OSError as exc:
            raise ConnectError(f"{label}: unreachable: {_reason(exc)}", ConnectFailure.UNREACHABLE) from exc
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, DEAD_LINK_AFTER_MS)
        return sock

    @staticmethod
    def _tunnel(jump: paramiko.Transport, endpoint: Endpoint, label: str, timeout: float) -> paramiko.Channel:
        try:
            return jump.open_channel(
                "direct-tcpip", (endpoint.hostname, endpoint.port), ("127.0.0.1", 0), timeout=timeout
            )
        except paramiko.ChannelException as exc:
            raise ConnectError(f"{label}: unreachable from the jump host: {exc.text}",
                               ConnectFailure.UNREACHABLE) from exc
        except _SSH_ERRORS as exc:
            raise ConnectError(f"{label}: connection timed out after {timeout:g} s (through the jump host: "
                               f"{_reason(exc)})", ConnectFailure.TIMEOUT) from exc

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
            raise InfraError(f"{self.label}: cannot start {argv[0]}: {_reason(exc)}") from exc
        return SSHProcess(channel)

    def put(self, local: Path, remote: str, mode: int | None = None) -> None:
        """Copy a file over SFTP on the same connection, creating its directory (`~` = home).

        Raises:
            InfraError: the file could not be written on the host.
        """
        try:
            sftp = self._sftp_client()
            path = self._remote_path(sftp, remote)
            _makedirs(sftp, posixpath.dirname(path))
            sftp.put(str(local), path)
            if mode is not None:
                sftp.chmod(path, mode)
        except _SSH_ERRORS as exc:
            raise InfraError(f"{self.label}: cannot copy {local} to {remote}: {_reason(exc)}") from exc

    def _sftp_client(self) -> paramiko.SFTPClient:
        client = self._client()
        with self._lock:
            if self._sftp is None:
                self._sftp = paramiko.SFTPClient.from_transport(client)
                if self._sftp is None:
                    raise InfraError(f"{self.label}: the server refused the sftp subsystem")
            return self._sftp

    def _remote_path(self, sftp: paramiko.SFTPClient, remote: str) -> str:
        if remote != "~" and not remote.startswith("~/"):
            return remote
        if self._home is None:
            self._home = sftp.normalize(".")
        return self._home + remote[1:]

    def connected(self) -> bool:
        """Whether the connection (and each jump host's) is open: a closed or dropped one is not."""
        links = self._links
        return not self._closed and bool(links) and all(link.is_active() for link in links)

    def peer_address(self) -> str:
        """The IP address this connection reached (through jumps: the node's, as resolved here)."""
        self.connect()
        return self._peer

    def close(self) -> None:
        """Close the SFTP session, the connection and its jump hosts'; final."""
        self._closed = True
        with self._lock:
            self._close_links()

    def _close_links(self) -> None:
        if self._sftp is not None:
            with contextlib.suppress(*_SSH_ERRORS):
                self._sftp.close()
            self._sftp = None
        for link in reversed(self._links):
            link.close()
        self._links = []


def _login(sock: socket.socket | paramiko.Channel, endpoint: Endpoint, label: str, checker: HostKeyChecker,
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


def _handshake(link: paramiko.Transport, label: str, timeout: float) -> None:
    done = threading.Event()
    link.start_client(event=done)
    if not done.wait(timeout):
        raise ConnectError(f"{label}: connection timed out after {timeout:g} s (no ssh handshake)",
                           ConnectFailure.TIMEOUT)
    if not link.is_active():
        cause = link.get_exception() or paramiko.SSHException("connection closed")
        raise ConnectError(f"{label}: unreachable: ssh handshake failed: {_reason(cause)}",
                           ConnectFailure.UNREACHABLE) from cause


def _authenticate(link: paramiko.Transport, endpoint: Endpoint, label: str) -> None:
    tried: list[str] = []
    for source, key in _identities(endpoint, label):
        tried.append(source)
        try:
            link.auth_publickey(endpoint.user, key)
        except paramiko.AuthenticationException:
            continue
        except _SSH_ERRORS as exc:
            raise ConnectError(f"{label}: authentication failed as {endpoint.user}: {_reason(exc)}",
                               ConnectFailure.AUTH) from exc
        if link.is_authenticated():
            return
    offered = ", ".join(tried) if tried else "no key (none found, and no ssh-agent)"
    raise ConnectError(
        f"{label}: authentication failed as {endpoint.user} with {offered} (check identity_file / user)",
        ConnectFailure.AUTH,
    )


def _identities(endpoint: Endpoint, label: str) -> Iterator[tuple[str, paramiko.PKey]]:
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
        raise ConnectError(f"{label}: cannot read identity file {path}: {_reason(exc)}",
                           ConnectFailure.AUTH) from exc


@functools.lru_cache(maxsize=32)
def _load_key(path: str, _mtime_ns: int) -> paramiko.PKey:
    return paramiko.PKey.from_path(path)


def _makedirs(sftp: paramiko.SFTPClient, directory: str) -> None:
    """`mkdir -p` over SFTP."""
    missing: list[str] = []
    while directory not in ("", "/"):
        try:
            sftp.stat(directory)
            break
        except FileNotFoundError:
            missing.append(directory)
            directory = posixpath.dirname(directory)
    for path in reversed(missing):
        sftp.mkdir(path)


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


def _reason(exc: BaseException) -> str:
    """The short why of an exception: `connection refused`, not `[Errno 111] Connection refused`."""
    text = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
    return text[:1].lower() + text[1:] if text else type(exc).__name__


__all__ = [
    "Endpoint", "HostKeyChecker", "KnownHosts", "KnownKey", "Marker", "Route", "SSHProcess", "SSHTransport",
    "command_line", "resolve_route",
]
