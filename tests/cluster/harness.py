"""A real multi-host cluster on this machine: one network namespace and one sshd per host.

Hosts `node0..node<n-1>` live in namespaces `<prefix>-n<i>`, each with an `eth0` on the
bridge `<prefix>br` at 10.213.X.(10+i)/24; the controller (this process's namespace)
has 10.213.X.1 on the bridge. Each host's namespaces (net, uts and mount: an empty
~/.bashrc, and with private dirs a tmpfs on /srv/node) are held open by a `sleep` process,
the holder, so sshd can be stopped and started again without the host losing its hostname
or its private /srv/node. sshd and `host_run` enter the holder's namespaces with nsenter.

With `bastion=True` a namespace `<prefix>-bastion` sits on the hosts' bridge (10.213.X.2)
and on a veth of its own to the controller (10.213.Y.2, controller 10.213.Y.1); the
controller has no address on the hosts' bridge, and nothing routes, so hosts are
reachable only through the bastion's sshd (ProxyJump).

On a Docker host, the engine sets iptables' FORWARD policy to DROP, and with br_netfilter
(bridge-nf-call-iptables=1) that drops every frame between hosts on the bridge. The cluster then
inserts `FORWARD -i <prefix>br -o <prefix>br -j ACCEPT`, recorded with the rest it owns, and
deletes it at teardown (registry.forward_rules).
"""

from __future__ import annotations

import atexit
import functools
import ipaddress
import os
import shlex
import shutil
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from types import FrameType, TracebackType
from typing import Any

import yaml

from .procs import Proc, kill_and_wait, ns_id, pids_in_netns, read_proc, start_time
from .registry import (
    CHECKOUT,
    ETC_NETNS,
    NETNS_DIR,
    Record,
    allocate,
    cleanup_stale,
    forward_rules,
    insert_rules,
    ip_batch,
    registry_lock,
    remove_resources,
)

__all__ = ["Cluster", "ClusterError", "Proc", "cleanup_stale", "skip_reason"]

SSHD = "/usr/sbin/sshd"
TOOLS = (SSHD, "ssh", "ssh-keygen", "ip", "nsenter", "unshare")
PRIVATE_DIR = Path("/srv/node")
HOST_OFFSET = 10
MAX_HOSTS = 254 - HOST_OFFSET
READY_TIMEOUT = 20.0

SSHD_SETTINGS = """\
Port 22
PermitRootLogin yes
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
MaxStartups 200
MaxSessions 200
AcceptEnv *
PermitUserEnvironment no
AllowTcpForwarding yes
PrintMotd no
Subsystem sftp internal-sftp
LogLevel ERROR
"""


class ClusterError(RuntimeError):
    """The test cluster could not be brought up."""


@dataclass
class Host:
    """One test host (or the bastion) and the processes that keep it alive."""

    name: str
    ns: str
    veth: str
    ifaces: dict[str, str]
    dir: Path
    private: bool = False
    holder: subprocess.Popen[bytes] | None = None
    sshd: subprocess.Popen[bytes] | None = None

    @property
    def addr(self) -> str:
        return self.ifaces["eth0"]

    @property
    def holder_pid(self) -> int:
        if self.holder is None:
            raise ClusterError(f"{self.name} is not up")
        return self.holder.pid


@functools.cache
def skip_reason() -> str | None:
    """Why cluster tests cannot run here, or None when they can."""
    if os.geteuid() != 0:
        return "cluster tests need root (network namespaces, sshd on port 22)"
    missing = [tool for tool in TOOLS if shutil.which(tool) is None]
    if missing:
        return f"missing {', '.join(missing)} (apt-get install openssh-server openssh-client iproute2)"
    probe = f"drprobe{os.getpid()}"
    added = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if added.returncode != 0:
        return f"`ip netns add` fails here: {added.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


class Cluster:
    """N hosts on this machine, reached with ssh; a context manager.

    Args:
        n: number of hosts (node0..node<n-1>).
        private_dirs: give every host its own tmpfs on /srv/node.
        bastion: make hosts reachable only through a bastion host (ProxyJump).
        sftp: offer the SFTP subsystem (a hardened sshd does not).
    """

    def __init__(self, n: int = 3, *, private_dirs: bool = False, bastion: bool = False, sftp: bool = True) -> None:
        if not 1 <= n <= MAX_HOSTS:
            raise ValueError(f"a test cluster has 1 to {MAX_HOSTS} hosts, not {n}")
        self.n = n
        self.private_dirs = private_dirs
        self.with_bastion = bastion
        self.sftp = sftp
        self.prefix = ""
        self.subnet = ipaddress.IPv4Network("0.0.0.0/32")
        self.state_dir = Path()
        self.bringup_seconds = 0.0
        self._hosts: list[Host] = []
        self._bastion: Host | None = None
        self._front_addr = ""
        self._controller_addr = ""
        self._record: Record | None = None
        self._lock = threading.RLock()  # the SIGTERM handler may tear down mid-teardown

    def __enter__(self) -> Cluster:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.teardown()

    # -- files and addresses ------------------------------------------------------

    @property
    def client_key(self) -> Path:
        return self.state_dir / "id_ed25519"

    @property
    def known_hosts(self) -> Path:
        return self.state_dir / "known_hosts"

    @property
    def ssh_config(self) -> Path:
        """An ssh_config with key, known_hosts, strict checking and BatchMode.

        Use `ssh -F` with it: unlike `-o` and `-i`, `-F` reaches the ProxyJump hop too.
        """
        return self.state_dir / "ssh_config"

    @property
    def bastion_addr(self) -> str | None:
        """The bastion's controller-facing address, or None without a bastion."""
        return self._front_addr or None

    def addr(self, i: int) -> str:
        return self._hosts[i].addr

    def name(self, i: int) -> str:
        return self._hosts[i].name

    def ns(self, i: int) -> str:
        return self._hosts[i].ns

    def ssh_argv(self, i: int) -> list[str]:
        """`ssh` argv that logs into host i as root (through the bastion if there is one)."""
        jump = ["-J", f"root@{self._front_addr}"] if self._front_addr else []
        return ["ssh", "-F", str(self.ssh_config), *jump, f"root@{self.addr(i)}"]

    def write_inventory(self, path: str | Path | None = None, **overrides: Any) -> Path:
        """Write a distrun inventory for this cluster.

        Args:
            path: where to write it; default `<state dir>/inventory.yaml`.
            overrides: `master` and `nodes` replace those top-level keys; any other key
                is set in `defaults`, and a None value removes that default.

        Returns:
            The path written.
        """
        target = Path(path) if path is not None else self.state_dir / "inventory.yaml"
        defaults: dict[str, Any] = {
            "user": "root",
            "port": 22,
            "identity_file": str(self.client_key),
            "known_hosts": str(self.known_hosts),
            "host_key_policy": "strict",
            "python": sys.executable,
            "iface": "eth0",
        }
        if self._front_addr:
            defaults["proxy_jump"] = f"root@{self._front_addr}"
        doc: dict[str, Any] = {"defaults": defaults, "nodes": [{"name": h.name, "host": h.addr} for h in self._hosts]}
        for key, value in overrides.items():
            section = doc if key in ("master", "nodes") else defaults
            if value is None:
                section.pop(key, None)
            else:
                section[key] = value
        target.write_text(yaml.safe_dump(doc, sort_keys=False))
        return target

    # -- bring-up -----------------------------------------------------------------

    def start(self) -> Cluster:
        """Bring every host up; return once each sshd listens.

        Raises:
            ClusterError: a host failed to come up (what was built is torn down).
        """
        if self._record is not None:
            raise ClusterError(f"cluster {self.prefix} is already up")
        began = time.monotonic()
        _install_exit_hooks()
        self._plan()
        _LIVE.add(self)
        try:
            self._write_files()
            self._build_network()
            self._start_holders()
            for host in self._everyone():
                self._spawn_sshd(host)
            self._wait_listening(self._everyone())
        except BaseException:
            self.teardown()
            raise
        self.bringup_seconds = time.monotonic() - began
        return self

    def _everyone(self) -> list[Host]:
        return self._hosts + ([self._bastion] if self._bastion else [])

    def _plan(self) -> None:
        with registry_lock():
            try:
                self.prefix, subnets = allocate(2 if self.with_bastion else 1)
            except RuntimeError as err:
                raise ClusterError(str(err)) from err
            self.subnet = subnets[0]
            self.state_dir = Path(f"/tmp/distrun-cluster-{self.prefix}")
            self._hosts = [
                self._plan_host(f"node{i}", f"n{i}", f"h{i}", subnets[0][HOST_OFFSET + i]) for i in range(self.n)
            ]
            if self.with_bastion:
                self._bastion = self._plan_host("bastion", "bastion", "hb", subnets[0][2])
                self._bastion.ifaces["eth1"] = str(subnets[1][2])
                self._controller_addr, self._front_addr = str(subnets[1][1]), str(subnets[1][2])
            else:
                self._controller_addr = str(subnets[0][1])
            links = [host.veth for host in self._everyone()]
            links += [self._front_veth] if self.with_bastion else []
            self._record = Record(
                prefix=self.prefix,
                checkout=str(CHECKOUT),
                pid=os.getpid(),
                pid_start=start_time(os.getpid()),
                state_dir=str(self.state_dir),
                namespaces=[host.ns for host in self._everyone()],
                links=[*links, self._bridge],
                routes=[self._hosts_blackhole] if self.with_bastion else [],
                subnets=[str(net) for net in subnets],
                iptables=forward_rules(self._bridge),
            )
            self._record.save()

    def _plan_host(self, name: str, ns_suffix: str, veth_suffix: str, addr: ipaddress.IPv4Address) -> Host:
        return Host(
            name=name,
            ns=f"{self.prefix}-{ns_suffix}",
            veth=f"{self.prefix}{veth_suffix}",
            ifaces={"eth0": str(addr)},
            dir=self.state_dir / name,
            private=self.private_dirs and name != "bastion",
        )

    @property
    def _bridge(self) -> str:
        return f"{self.prefix}br"

    @property
    def _front_veth(self) -> str:
        return f"{self.prefix}cb"

    @property
    def _hosts_blackhole(self) -> str:
        # Without it the controller would send packets for the hosts to its default route.
        return f"unreachable {self.subnet}"

    def _write_files(self) -> None:
        self.state_dir.mkdir(mode=0o700)
        for host in self._everyone():
            host.dir.mkdir()
        keys = [self.client_key] + [host.dir / "ssh_host_ed25519_key" for host in self._everyone()]
        with ThreadPoolExecutor(max_workers=8) as pool:
            list(pool.map(_keygen, keys))
        hosts_file = self._hosts_file()
        for host in self._everyone():
            etc = ETC_NETNS / host.ns
            etc.mkdir(parents=True, exist_ok=True)
            (etc / "hosts").write_text(hosts_file)
            # Without a short resolver timeout every reverse lookup by c10d waits 10 s.
            (etc / "resolv.conf").write_text("options timeout:1 attempts:1\n")
            (host.dir / "sshd_config").write_text(self._sshd_config(host))
        self.known_hosts.write_text("".join(_known_hosts_line(host) for host in self._everyone()))
        self.ssh_config.write_text(self._ssh_config_text())
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)
        if self.private_dirs:
            PRIVATE_DIR.mkdir(parents=True, exist_ok=True)

    def _hosts_file(self) -> str:
        lines = ["127.0.0.1 localhost", "::1 localhost ip6-localhost ip6-loopback"]
        lines += [f"{host.addr} {host.name}" for host in self._everyone()]
        return "\n".join(lines) + "\n"

    def _sshd_config(self, host: Host) -> str:
        listen = "".join(f"ListenAddress {addr}\n" for addr in host.ifaces.values())
        return (
            f"{listen}PidFile {host.dir / 'sshd.pid'}\n"
            f"HostKey {host.dir / 'ssh_host_ed25519_key'}\n"
            f"AuthorizedKeysFile {self.client_key}.pub\n"
            f"{SSHD_SETTINGS if self.sftp else SSHD_SETTINGS.replace('Subsystem sftp internal-sftp', '')}"
        )

    def _ssh_config_text(self) -> str:
        return (
            "Host *\n"
            "  User root\n"
            f"  IdentityFile {self.client_key}\n"
            "  IdentitiesOnly yes\n"
            f"  UserKnownHostsFile {self.known_hosts}\n"
            "  GlobalKnownHostsFile /dev/null\n"
            "  StrictHostKeyChecking yes\n"
            "  BatchMode yes\n"
            "  ConnectTimeout 10\n"
            "  ControlMaster no\n"
            "  LogLevel ERROR\n"
        )

    def _build_network(self) -> None:
        bridge = self._bridge
        commands = [f"netns add {host.ns}" for host in self._everyone()]
        commands += [f"link add {bridge} type bridge", f"link set {bridge} up"]
        if not self.with_bastion:
            commands.append(f"addr add {self._controller_addr}/24 dev {bridge}")
        for host in self._everyone():
            commands += [
                f"link add {host.veth} type veth peer name eth0 netns {host.ns}",
                f"link set {host.veth} master {bridge}",
                f"link set {host.veth} up",
            ]
        if self._bastion is not None:
            commands += [
                f"link add {self._front_veth} type veth peer name eth1 netns {self._bastion.ns}",
                f"addr add {self._controller_addr}/24 dev {self._front_veth}",
                f"link set {self._front_veth} up",
                f"route add {self._hosts_blackhole}",
            ]
        try:
            ip_batch(commands)
            insert_rules(self._record.iptables if self._record else [])
        except RuntimeError as err:
            raise ClusterError(str(err)) from err

    def _start_holders(self) -> None:
        for host in self._everyone():
            host.holder = subprocess.Popen(
                _holder_argv(host),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,
            )
        for host in self._everyone():
            _await_holder(host)

    def _spawn_sshd(self, host: Host) -> None:
        argv = ["nsenter", "-t", str(host.holder_pid), "-n", "-u", "-m", "--"]
        argv += [SSHD, "-D", "-f", str(host.dir / "sshd_config"), "-E", str(host.dir / "sshd.log")]
        host.sshd = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
        )

    def _wait_listening(self, hosts: Iterable[Host]) -> None:
        pending = list(hosts)
        deadline = time.monotonic() + READY_TIMEOUT
        while pending:
            for host in pending:
                _raise_if_sshd_died(host)
            pending = [host for host in pending if not _sshd_listening(host)]
            if pending and time.monotonic() > deadline:
                raise ClusterError(f"sshd did not listen within {READY_TIMEOUT:.0f} s on {pending[0].name}")
            time.sleep(0.005)

    # -- inspecting and breaking hosts --------------------------------------------

    def host_run(self, i: int, argv: Sequence[str], timeout: float = 60) -> subprocess.CompletedProcess[str]:
        """Run argv inside host i (its network, hostname and mount namespaces), not over ssh."""
        enter = ["nsenter", "-t", str(self._hosts[i].holder_pid), "-n", "-u", "-m", "--"]
        return subprocess.run([*enter, *argv], capture_output=True, text=True, timeout=timeout, check=False)

    def processes(self, i: int) -> list[Proc]:
        """Every process on host i: its ssh sessions and all they started, daemonised or not.

        The host's sshd listener and the harness's namespace holder are left out.
        """
        host = self._hosts[i]
        own = {host.holder_pid, host.sshd.pid if host.sshd else None}
        pids = pids_in_netns({ns_id(NETNS_DIR / host.ns): host.ns})[host.ns]
        found = (read_proc(pid) for pid in pids if pid not in own)
        return [proc for proc in found if proc is not None]

    def processes_with_env(self, i: int, key: str, value: str) -> list[Proc]:
        """Processes on host i whose environment has KEY=VALUE (a job's processes)."""
        return [proc for proc in self.processes(i) if proc.environ_has(value, key=key)]

    def kill_all(self, i: int) -> list[Proc]:
        """SIGKILL every process of `processes(i)`; sshd keeps listening. Returns the killed."""
        victims = self.processes(i)
        kill_and_wait(proc.pid for proc in victims)
        return victims

    def cut(self, i: int) -> None:
        """Unplug host i: its link to the bridge goes down, packets are dropped silently."""
        subprocess.run(["ip", "link", "set", self._hosts[i].veth, "down"], check=True)

    def restore(self, i: int) -> None:
        """Plug host i back in after `cut(i)`."""
        subprocess.run(["ip", "link", "set", self._hosts[i].veth, "up"], check=True)

    def cut_during(self, proc: subprocess.Popen[Any], i: int, timeout: float, ready: Callable[[], bool],
                   ready_within: float = 180.0, says: Callable[[], str] = lambda: "") -> float:
        """Cut host i once `ready()` holds while `proc` (a launch) runs, then wait up to `timeout` s
        for `proc` to end. Whatever happens, host i is plugged back in and `proc` killed if it runs.

        Returns:
            When the cut was made (time.time()).

        Raises:
            ClusterError: `proc` ended, or `ready_within` s passed, before `ready()` held (`says()`
                appended: what the launch printed).
            subprocess.TimeoutExpired: `proc` did not end within `timeout` s of the cut.
        """
        try:
            deadline = time.monotonic() + ready_within
            while not ready():
                if proc.poll() is not None or time.monotonic() > deadline:
                    ended = "ended" if proc.poll() is not None else f"still ran after {ready_within:g} s"
                    raise ClusterError(f"the launch {ended} before host {i} could be cut\n{says()}")
                time.sleep(0.1)
            self.cut(i)
            cut_at = time.time()
            proc.wait(timeout=timeout)
            return cut_at
        finally:
            self.restore(i)
            if proc.poll() is None:
                proc.kill()
                proc.wait()

    def stop_sshd(self, i: int) -> None:
        """Stop host i's sshd listener; open sessions and their processes live on."""
        host = self._hosts[i]
        if host.sshd is not None:
            host.sshd.terminate()
            host.sshd.wait(timeout=10)
            host.sshd = None

    def start_sshd(self, i: int) -> None:
        """Start host i's sshd again (same host key); return once it listens."""
        host = self._hosts[i]
        if host.sshd is None:
            self._spawn_sshd(host)
            self._wait_listening([host])

    # -- teardown -----------------------------------------------------------------

    def teardown(self) -> None:
        """Kill every process on every host and delete everything the cluster made.

        Idempotent; also run at exit and on SIGTERM/SIGHUP for clusters still up.
        """
        with self._lock:
            record, self._record = self._record, None
        if record is None:
            return
        remove_resources(record)
        for host in self._everyone():
            for child in (host.holder, host.sshd):
                if child is not None:
                    _reap(child)
            host.holder = host.sshd = None
        _LIVE.discard(self)


def _keygen(path: Path) -> None:
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"distrun-test-{path.parent.name}", "-f", str(path)],
        check=True,
        capture_output=True,
    )


def _known_hosts_line(host: Host) -> str:
    key_type, key = Path(f"{host.dir / 'ssh_host_ed25519_key'}.pub").read_text().split()[:2]
    return f"{','.join([*host.ifaces.values(), host.name])} {key_type} {key}\n"


def _holder_argv(host: Host) -> list[str]:
    steps = ["ip link set lo up"]
    for iface, addr in host.ifaces.items():
        steps += [f"ip addr add {addr}/24 dev {iface}", f"ip link set {iface} up"]
    # Test hosts never route; for the bastion this keeps ProxyJump the only way through.
    steps.append("echo 0 > /proc/sys/net/ipv4/ip_forward")
    steps.append(f"hostname {shlex.quote(host.name)}")
    if host.private:
        steps.append(f"mount -t tmpfs -o mode=0755,size=256m distrun-node {PRIVATE_DIR}")
    # A test host gets a clean login shell, as a cluster node has: the controller's own
    # ~/.bashrc (here it runs `pyenv rehash`, which waits on a lock file that a killed
    # session can leave behind) would make every ssh command of every host wait on it.
    steps.append('if [ -f "$HOME/.bashrc" ]; then mount --bind /dev/null "$HOME/.bashrc"; fi')
    steps += ["echo ready", "exec sleep infinity >/dev/null 2>&1"]
    unshare = ["unshare", "--uts", "--mount"]
    return ["ip", "netns", "exec", host.ns, *unshare, "sh", "-c", " && ".join(steps)]


def _await_holder(host: Host) -> None:
    holder = host.holder
    if holder is None or holder.stdout is None or holder.stderr is None:
        raise ClusterError(f"{host.name}: namespace holder not started")
    ready = holder.stdout.readline().strip() == b"ready"
    if not ready:
        holder.wait(timeout=5)
        raise ClusterError(f"{host.name}: namespace setup failed: {holder.stderr.read().decode().strip()}")
    holder.stdout.close()
    holder.stderr.close()


def _raise_if_sshd_died(host: Host) -> None:
    if host.sshd is not None and host.sshd.poll() is not None:
        log = host.dir / "sshd.log"
        tail = log.read_text().strip() if log.exists() else ""
        raise ClusterError(f"{host.name}: sshd exited with {host.sshd.returncode}: {tail}")


def _sshd_listening(host: Host) -> bool:
    """True once the host's sshd listens on port 22 of each of its addresses."""
    try:
        table = Path(f"/proc/{host.holder_pid}/net/tcp").read_text().splitlines()[1:]
    except OSError:
        return False
    listening = {fields[1] for fields in map(str.split, table) if fields[3] == "0A"}
    return all(f"{_proc_net_hex(addr)}:0016" in listening for addr in host.ifaces.values())


def _proc_net_hex(addr: str) -> str:
    """The form /proc/net/tcp prints an IPv4 address in: the raw 32 bits, native order."""
    return f"{struct.unpack('=I', socket.inet_aton(addr))[0]:08X}"


def _reap(child: subprocess.Popen[bytes]) -> None:
    try:
        child.wait(timeout=5)
    except subprocess.TimeoutExpired:
        child.kill()
        child.wait()


_LIVE: set[Cluster] = set()


def _teardown_live() -> None:
    for cluster in list(_LIVE):
        cluster.teardown()


def _teardown_then_die(signum: int, _frame: FrameType | None) -> None:
    _teardown_live()
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


@functools.cache
def _install_exit_hooks() -> None:
    """Tear clusters down at exit, and before SIGTERM/SIGHUP end the process.

    SIGINT needs nothing: it raises KeyboardInterrupt, which unwinds `with` blocks and
    pytest's fixture finalisers, and atexit follows.
    """
    atexit.register(_teardown_live)
    if threading.current_thread() is not threading.main_thread():
        return
    for signum in (signal.SIGTERM, signal.SIGHUP):
        if signal.getsignal(signum) == signal.SIG_DFL:
            signal.signal(signum, _teardown_then_die)
