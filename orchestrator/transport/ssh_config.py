"""Where to connect for a node: the inventory first, then ~/.ssh/config (Host aliases, HostName,
User, Port, IdentityFile, ProxyJump), then OpenSSH's defaults; and the connect timeout.

Importing this module imports paramiko (see `_defer_invoke_import`); the SSH modules import it first.
"""

from __future__ import annotations

import functools
import getpass
import importlib.util
import os
import re
import sys
import types
from dataclasses import dataclass
from pathlib import Path

from orchestrator.errors import UsageError
from orchestrator.spec.model import NodeSpec


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
_JUMP = re.compile(r"^(?:ssh://)?(?:(?P<user>[^@]+)@)?(?:\[(?P<ip6>[^\]]+)\]|(?P<host>[^:]+))(?::(?P<port>\d+))?$")


@dataclass(frozen=True)
class SshTarget:
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

    hops: tuple[SshTarget, ...]

    @property
    def target(self) -> SshTarget:
        return self.hops[-1]

    @property
    def jumps(self) -> tuple[SshTarget, ...]:
        return self.hops[:-1]



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
    target = SshTarget(
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


def _jump_endpoint(spec: str, config: paramiko.SSHConfig, target: SshTarget) -> SshTarget:
    match = _JUMP.match(spec)
    if match is None:
        raise UsageError(f"proxy_jump {spec!r}: expected [user@]host[:port]")
    host = match["ip6"] or match["host"]
    entry = config.lookup(host)
    own = tuple(entry.get("identityfile", ()))
    return SshTarget(
        hostname=entry.get("hostname", host),
        port=int(match["port"] or entry.get("port", DEFAULT_PORT)),
        user=match["user"] or entry.get("user") or getpass.getuser(),
        identity_files=own or target.identity_files,
        use_default_keys=not (own or target.identity_files),
        identities_from_config=bool(own) or target.identities_from_config,
    )



def error_reason(exc: BaseException) -> str:
    """The short why of an exception: `connection refused`, not `[Errno 111] Connection refused`."""
    text = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
    return text[:1].lower() + text[1:] if text else type(exc).__name__
