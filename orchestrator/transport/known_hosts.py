"""Host keys: known_hosts files parsed once per process and read as ssh(1) reads them, and the
check made before any credential is offered (`strict` refuses an unknown key, `accept-new`
records it; a changed or `@revoked` key, or one trusted only through `@cert-authority`, is refused).
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import fcntl
import functools
import hashlib
import hmac
import os
import re
import shlex
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import BinaryIO

from orchestrator.spec.model import HostKeyPolicy
from orchestrator.transport.base import ConnectError, ConnectFailure
from orchestrator.transport.ssh_config import SshTarget, error_reason, paramiko

_known_hosts_lock = threading.Lock()


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
            why = error_reason(exc)
            raise ConnectError(f"{label}: cannot check its host key: cannot read {self.shown_path}: {why}",
                               ConnectFailure.UNKNOWN_HOST_KEY) from exc
        _parsed[self.path] = _Parsed(stamp, KnownHosts.parse(text))
        return _parsed[self.path].hosts

    def known_types(self, label: str, endpoint: SshTarget) -> list[str]:
        """The key types recorded for the server, to ask it for one of those first.

        Raises:
            ConnectError: the file exists but cannot be read.
        """
        entries = self.known(label).lookup(endpoint.known_hosts_name)
        return list(dict.fromkeys(e.key.get_name() for e in entries if e.marker is Marker.HOST_KEY))

    def check(self, label: str, endpoint: SshTarget, key: paramiko.PKey) -> None:
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

    def _trusts(self, label: str, endpoint: SshTarget, key: paramiko.PKey, entries: list[KnownKey]) -> bool:
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

    def _keyscan(self, endpoint: SshTarget) -> str:
        return f"ssh-keyscan -p {endpoint.port} {endpoint.hostname} >> {self.shown_path}"

    def _record(self, label: str, endpoint: SshTarget, key: paramiko.PKey) -> None:
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
