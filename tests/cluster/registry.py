"""Who owns which test cluster, and removing what a cluster left behind.

Every cluster writes /tmp/distrun-cluster-registry/<prefix>.json BEFORE it creates
anything: the checkout it belongs to, the pid (and start time) of the process that
created it, and the names of every namespace, link, route and directory it will create. A
record whose creator is dead is stale; `cleanup_stale()` removes what it names, for
this checkout only, and never touches a cluster whose creator is alive.
"""

from __future__ import annotations

import fcntl
import hashlib
import ipaddress
import json
import secrets
import shutil
import subprocess
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path

from .procs import kill_and_wait, ns_id, pids_in_netns, start_time

REGISTRY = Path("/tmp/distrun-cluster-registry")
CHECKOUT = Path(__file__).resolve().parents[2]
NETNS_DIR = Path("/run/netns")
ETC_NETNS = Path("/etc/netns")
SUBNETS = ipaddress.IPv4Network("10.213.0.0/16")
BRIDGE_NF = "/proc/sys/net/bridge/bridge-nf-call-iptables"


@dataclass
class Record:
    """What one cluster owns; enough to remove it without the process that made it."""

    prefix: str
    checkout: str
    pid: int
    pid_start: str | None
    state_dir: str
    namespaces: list[str]
    links: list[str]
    routes: list[str]
    subnets: list[str]
    # iptables rules (`FORWARD -i BR -o BR -j ACCEPT`) inserted for the hosts' bridge: see forward_rules().
    iptables: list[str] = field(default_factory=list)

    @property
    def path(self) -> Path:
        return REGISTRY / f"{self.prefix}.json"

    def save(self) -> None:
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(self), indent=1))
        tmp.replace(self.path)

    def owner_alive(self) -> bool:
        return self.pid_start is not None and start_time(self.pid) == self.pid_start


def records() -> list[Record]:
    """Every registered cluster, of any checkout; unreadable entries are skipped."""
    found = []
    for path in sorted(REGISTRY.glob("*.json")):
        try:
            found.append(Record(**json.loads(path.read_text())))
        except (OSError, ValueError, TypeError):
            continue
    return found


@contextmanager
def registry_lock() -> Iterator[None]:
    """Serialises name/subnet allocation and cleanup between processes."""
    REGISTRY.mkdir(parents=True, exist_ok=True)
    with open(REGISTRY / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def ip_batch(commands: Sequence[str], force: bool = False) -> None:
    """Run `ip` commands in one process; with `force`, go on past errors and ignore them.

    Raises:
        RuntimeError: a command failed (without `force`).
    """
    argv = ["ip", *(["-force"] if force else []), "-batch", "-"]
    result = subprocess.run(argv, input="\n".join(commands) + "\n", capture_output=True, text=True)
    if result.returncode != 0 and not force:
        raise RuntimeError(f"ip -batch failed: {result.stderr.strip()}")


def forward_rules(bridge: str) -> list[str]:
    """The iptables rules the hosts' bridge needs to carry traffic between hosts: none, unless
    bridged frames go through iptables (br_netfilter's bridge-nf-call-iptables=1) and the FORWARD
    policy drops them, as Docker's engine sets it. Then one ACCEPT for frames from the bridge to itself.
    """
    try:
        if Path(BRIDGE_NF).read_text().strip() != "1" or shutil.which("iptables") is None:
            return []
    except OSError:
        return []
    chain = subprocess.run(["iptables", "-S", "FORWARD"], capture_output=True, text=True)
    if "-P FORWARD ACCEPT" in chain.stdout.splitlines():
        return []
    return [f"FORWARD -i {bridge} -o {bridge} -j ACCEPT"]


def insert_rules(rules: Sequence[str]) -> None:
    """Insert each iptables rule at the head of its chain.

    Raises:
        RuntimeError: iptables refused one.
    """
    for rule in rules:
        chain, *spec = rule.split()
        result = subprocess.run(["iptables", "-I", chain, "1", *spec], capture_output=True, text=True)
        if result.returncode != 0:
            raise RuntimeError(f"iptables -I {rule} failed: {result.stderr.strip()}")


def _host_networks() -> list[ipaddress.IPv4Network]:
    out = subprocess.run(["ip", "-o", "-4", "addr", "show"], capture_output=True, text=True, check=True)
    return [ipaddress.IPv4Interface(line.split()[3]).network for line in out.stdout.splitlines()]


def _new_prefix(taken: set[str]) -> str:
    while True:
        digest = hashlib.sha256(f"{CHECKOUT}\0{secrets.token_hex(8)}".encode()).hexdigest()
        prefix = f"dr{digest[:4]}"
        clash = (NETNS_DIR / f"{prefix}-n0").exists() or Path(f"/sys/class/net/{prefix}br").exists()
        if prefix not in taken and not clash:
            return prefix


def allocate(count: int) -> tuple[str, list[ipaddress.IPv4Network]]:
    """A fresh prefix and `count` /24 subnets of 10.213.0.0/16 that nobody uses.

    Call with `registry_lock()` held, and save the record before releasing it.

    Raises:
        RuntimeError: not enough free subnets.
    """
    known = records()
    claimed = {net for record in known for net in record.subnets}
    prefix = _new_prefix({record.prefix for record in known})
    in_use = _host_networks()
    candidates = list(SUBNETS.subnets(new_prefix=24))[1:-1]
    start = int(prefix[2:], 16) % len(candidates)
    free = [
        net
        for net in candidates[start:] + candidates[:start]
        if str(net) not in claimed and not any(net.overlaps(used) for used in in_use)
    ]
    if len(free) < count:
        raise RuntimeError(f"no free /24 left in {SUBNETS} for a test cluster")
    return prefix, free[:count]


def remove_resources(record: Record) -> None:
    """Kill the record's processes and delete its namespaces, links, files and entry.

    Idempotent: whatever is already gone is skipped.
    """
    namespaces = {}
    for name in record.namespaces:
        try:
            namespaces[ns_id(NETNS_DIR / name)] = name
        except OSError:
            continue
    kill_and_wait(pid for pids in pids_in_netns(namespaces).values() for pid in pids)
    for rule in record.iptables:
        subprocess.run(["iptables", "-D", *rule.split()], capture_output=True)
    deletions = [f"route del {route}" for route in record.routes]
    deletions += [f"link del {link}" for link in record.links]
    ip_batch(deletions + [f"netns del {name}" for name in record.namespaces], force=True)
    for name in record.namespaces:
        shutil.rmtree(ETC_NETNS / name, ignore_errors=True)
    shutil.rmtree(record.state_dir, ignore_errors=True)
    record.path.unlink(missing_ok=True)


def cleanup_stale(include_live: bool = False) -> list[str]:
    """Remove this checkout's clusters whose creating process is dead.

    Args:
        include_live: also remove this checkout's clusters whose creator still runs.

    Returns:
        The prefixes of the clusters removed.
    """
    removed = []
    with registry_lock():
        for record in records():
            if record.checkout != str(CHECKOUT) or (record.owner_alive() and not include_live):
                continue
            remove_resources(record)
            removed.append(record.prefix)
    return removed


def describe(record: Record) -> str:
    """One status line for `python -m tests.cluster status`."""
    owner = "live" if record.owner_alive() else "stale"
    mine = "" if record.checkout == str(CHECKOUT) else f" (checkout {record.checkout})"
    hosts = len(record.namespaces)
    return f"{record.prefix}  pid {record.pid} {owner}  {hosts} namespaces  {' '.join(record.subnets)}{mine}"
