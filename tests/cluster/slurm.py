"""A real Slurm on a namespace test cluster: munged and slurmctld here, one slurmd per host.

Built on `harness.Cluster` (without a bastion). munged (its own key and socket) and slurmctld
run in this process's namespaces; slurmctld listens on a free port and the hosts reach it at
the controller's bridge address. Each host runs `slurmd -N <host>` in its network namespace,
under new uts, mount and pid namespaces:

- uts: the host's name, which the job's processes see;
- mount: a tmpfs on /sys/fs/cgroup with the cgroup v1 controllers freezer, cpuset, memory and
  devices (slurmd's cgroup/v1 plugin needs them, and `ip netns exec` hides the machine's);
- pid: /proc shows only this host's processes, as on a real machine, so what a supervisor
  ends by job id stays on its host. When slurmd ends, the namespace's init (a shell) exits
  and every process of the host's jobs ends with it.

Slurm runs with proctrack/linuxproc and task/none, no accounting database. State lives in
/tmp/distrun-slurm-<cluster prefix>/; its owner.json names the daemons and who started them,
so that `cleanup_stale_slurm()` removes what a killed test run left.
"""

from __future__ import annotations

import atexit
import functools
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

import pytest

from .harness import Cluster, ClusterError, skip_reason
from .procs import kill_and_wait, start_time
from .registry import CHECKOUT

__all__ = ["SlurmCluster", "cleanup_stale_slurm", "slurm_cluster", "slurm_skip_reason"]

TOOLS = ("slurmctld", "slurmd", "munged", "sbatch", "scontrol", "squeue", "sinfo", "scancel", "setpriv")
STATE_ROOT = Path("/tmp")
STATE_PREFIX = "distrun-slurm-"
READY_TIMEOUT = 30.0
STOP_TIMEOUT = 15.0
CGROUP_CONTROLLERS = ("freezer", "cpuset", "memory", "devices")

SLURM_SETTINGS = """\
AuthType=auth/munge
CredType=cred/munge
SlurmUser=root
SlurmdUser=root
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SlurmdParameters=config_overrides
ReturnToService=2
SlurmctldTimeout=10
SlurmdTimeout=30
MessageTimeout=10
InactiveLimit=0
KillWait=5
MinJobAge=300
"""


@functools.cache
def slurm_skip_reason() -> str | None:
    """Why a test Slurm cannot be built here, or None when it can."""
    reason = skip_reason()
    if reason is not None:
        return reason
    missing = [tool for tool in TOOLS if shutil.which(tool) is None]
    if missing:
        return f"missing {', '.join(missing)} (apt-get install slurm-wlm munge)"
    return None


@dataclass
class Daemon:
    """A daemon this cluster started, and the log that explains its death."""

    name: str
    popen: subprocess.Popen[bytes]
    log: Path
    forked: bool = False  # the daemon is the child of `popen` (unshare --fork), not `popen` itself


class SlurmCluster:
    """Slurm on the hosts of a started `Cluster`; a context manager.

    Args:
        cluster: the namespace hosts; each becomes a Slurm node of the same name in the
            default partition `debug`.
    """

    def __init__(self, cluster: Cluster) -> None:
        if cluster.bastion_addr is not None:
            raise ValueError("a test Slurm needs the controller on the hosts' bridge (no bastion)")
        self.cluster = cluster
        self.dir = STATE_ROOT / f"{STATE_PREFIX}{cluster.prefix}"
        self.port = 0
        self.daemons: list[Daemon] = []
        self.bringup_seconds = 0.0

    def __enter__(self) -> SlurmCluster:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.teardown()

    # -- what tests use -------------------------------------------------------------

    @property
    def conf(self) -> Path:
        return self.dir / "slurm.conf"

    @property
    def env(self) -> dict[str, str]:
        """The environment that points Slurm's commands (and distrun) at this cluster."""
        return {"SLURM_CONF": str(self.conf)}

    @property
    def nodes(self) -> list[str]:
        return [self.cluster.name(i) for i in range(self.cluster.n)]

    def run(self, *argv: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
        """Run one of Slurm's commands against this cluster."""
        return subprocess.run(list(argv), env={**os.environ, **self.env}, capture_output=True, text=True,
                              timeout=timeout, check=False)

    def queue(self) -> list[str]:
        """Ids of the jobs squeue lists (pending, running or completing)."""
        return self.run("squeue", "-h", "-o", "%i").stdout.split()

    # -- bring-up -------------------------------------------------------------------

    def start(self) -> SlurmCluster:
        """Start munged, slurmctld and every slurmd; return once every node is idle.

        Raises:
            ClusterError: a daemon failed (what was started is torn down).
        """
        began = time.monotonic()
        _LIVE.add(self)
        _install_exit_hook()
        try:
            self._write_files()
            self._start_munged()
            self._start_slurmctld()
            for i in range(self.cluster.n):
                self._start_slurmd(i)
            self._wait_idle()
        except BaseException:
            self.teardown()
            raise
        self.bringup_seconds = time.monotonic() - began
        return self

    def _write_files(self) -> None:
        self.dir.mkdir(mode=0o755)
        self._save_owner()
        munge = self.dir / "munge"
        # munged refuses a socket directory that others cannot traverse, or a key others can read.
        munge.mkdir(mode=0o711)
        (munge / "munge.key").write_bytes(secrets.token_bytes(1024))
        (munge / "munge.key").chmod(0o400)
        shutil.chown(munge / "munge.key", "munge", "munge")
        shutil.chown(munge, "munge", "munge")
        for name in self.nodes:
            (self.dir / "spool" / name).mkdir(parents=True)
        (self.dir / "state").mkdir()
        self.port = _free_port()
        self.conf.write_text(self._slurm_conf())
        (self.dir / "cgroup.conf").write_text("CgroupPlugin=cgroup/v1\nCgroupAutomount=no\n")

    def _slurm_conf(self) -> str:
        controller = self.cluster.subnet[1]  # the controller's address on the hosts' bridge
        lines = [
            f"ClusterName=dr{self.cluster.prefix}",
            f"SlurmctldHost={socket.gethostname()}({controller})",
            f"SlurmctldPort={self.port}",
            f"AuthInfo=socket={self.dir / 'munge' / 'munge.sock'}",
            f"StateSaveLocation={self.dir / 'state'}",
            f"SlurmdSpoolDir={self.dir / 'spool' / '%n'}",
            f"SlurmctldPidFile={self.dir / 'slurmctld.pid'}",
            f"SlurmdPidFile={self.dir / 'slurmd-%n.pid'}",
            f"SlurmctldLogFile={self.dir / 'slurmctld.log'}",
            f"SlurmdLogFile={self.dir / 'slurmd-%n.log'}",
        ]
        nodes = [f"NodeName={self.cluster.name(i)} NodeAddr={self.cluster.addr(i)} CPUs={os.cpu_count() or 1} "
                 "State=UNKNOWN" for i in range(self.cluster.n)]
        partition = "PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP"
        return "\n".join(lines) + "\n" + SLURM_SETTINGS + "\n".join([*nodes, partition]) + "\n"

    def _spawn(self, name: str, argv: list[str], forked: bool = False) -> Daemon:
        log = self.dir / f"{name}.out"
        with open(log, "wb") as out:
            popen = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                     env={**os.environ, **self.env}, start_new_session=True)
        daemon = Daemon(name, popen, log, forked)
        self.daemons.append(daemon)
        self._save_owner()
        return daemon

    def _start_munged(self) -> None:
        munge = self.dir / "munge"
        daemon = self._spawn("munged", [
            "setpriv", "--reuid=munge", "--regid=munge", "--clear-groups", "--",
            "munged", "--foreground", f"--socket={munge / 'munge.sock'}", f"--key-file={munge / 'munge.key'}",
            f"--pid-file={munge / 'munged.pid'}", f"--log-file={munge / 'munged.log'}",
            f"--seed-file={munge / 'munged.seed'}",
        ])
        self._wait("munged", lambda: (munge / "munge.sock").exists(), [daemon])

    def _start_slurmctld(self) -> None:
        daemon = self._spawn("slurmctld", ["slurmctld", "-D", "-f", str(self.conf)])
        self._wait("slurmctld", lambda: self.run("scontrol", "ping").stdout.count("is UP") > 0, [daemon])

    def _start_slurmd(self, i: int) -> None:
        name = self.cluster.name(i)
        mounts = [f"hostname {name}", "mount -t proc proc /proc",
                  "mount -t tmpfs -o mode=0755 distrun-cgroup /sys/fs/cgroup"]
        mounts += [f"mkdir /sys/fs/cgroup/{c} && mount -t cgroup -o {c} cgroup /sys/fs/cgroup/{c}"
                   for c in CGROUP_CONTROLLERS]
        # sh stays the namespace's init: it reaps the orphans slurmd leaves (slurmstepd) and
        # passes SIGTERM on to slurmd.
        daemon = [f"slurmd -D -N {name} -f {self.conf} &", "daemon=$!", "trap 'kill -TERM $daemon' TERM",
                  "while kill -0 $daemon 2>/dev/null; do wait || true; done"]
        script = "\n".join(["set -e", *mounts, *daemon])
        self._spawn(f"slurmd-{name}", [
            "ip", "netns", "exec", self.cluster.ns(i),
            "unshare", "--uts", "--mount", "--propagation", "private", "--pid", "--fork", "--kill-child=SIGTERM",
            "sh", "-c", script,
        ], forked=True)

    def _wait_idle(self) -> None:
        def idle() -> bool:
            states = dict(line.split() for line in self.run("sinfo", "-h", "-N", "-o", "%N %t").stdout.splitlines())
            return all(states.get(name) == "idle" for name in self.nodes)

        self._wait("every slurmd", idle, self.daemons)

    def _wait(self, what: str, ready: Callable[[], bool], watch: list[Daemon]) -> None:
        """Poll `ready()` until true; raise, with the log, when a watched daemon dies or time runs out."""
        deadline = time.monotonic() + READY_TIMEOUT
        while not ready():
            for daemon in watch:
                if daemon.popen.poll() is not None:
                    raise ClusterError(f"{daemon.name} exited with {daemon.popen.returncode}: {_tail(daemon.log)}")
            if time.monotonic() > deadline:
                logs = " | ".join(f"{d.name}: {_tail(d.log)}" for d in watch)
                raise ClusterError(f"{what} not ready within {READY_TIMEOUT:.0f} s; {logs}")
            time.sleep(0.1)

    def _save_owner(self) -> None:
        owner = {"checkout": str(CHECKOUT), "pid": os.getpid(), "pid_start": start_time(os.getpid()),
                 "daemons": [[d.popen.pid, start_time(d.popen.pid)] for d in self.daemons]}
        (self.dir / "owner.json").write_text(json.dumps(owner))

    # -- teardown -------------------------------------------------------------------

    def teardown(self) -> None:
        """Cancel every job, stop every daemon this cluster started, delete its state. Idempotent."""
        if self not in _LIVE:
            return
        _LIVE.discard(self)
        if self.daemons:
            self._cancel_jobs()
        # In start order (slurmctld, then the slurmds), and munged, which the others use to
        # authenticate while they stop, last.
        for daemon in [*self.daemons[1:], *self.daemons[:1]]:
            _stop(daemon)
        self.daemons.clear()
        shutil.rmtree(self.dir, ignore_errors=True)

    def _cancel_jobs(self) -> None:
        jobs = self.queue()
        if jobs:
            self.run("scancel", *jobs)
        deadline = time.monotonic() + STOP_TIMEOUT
        while self.queue() and time.monotonic() < deadline:
            time.sleep(0.2)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("", 0))
        return int(sock.getsockname()[1])


def _tail(log: Path, lines: int = 5) -> str:
    text = log.read_text(errors="replace").strip() if log.exists() else ""
    return " / ".join(text.splitlines()[-lines:]) or "no output"


def _children(pid: int) -> list[int]:
    try:
        return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def _stop(daemon: Daemon) -> None:
    """SIGTERM the daemon (for slurmd: what unshare forked, the namespace's init); then SIGKILL."""
    popen = daemon.popen
    for pid in _children(popen.pid) if daemon.forked else [popen.pid]:
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            continue
    try:
        popen.wait(timeout=STOP_TIMEOUT)
    except subprocess.TimeoutExpired:
        popen.kill()
        popen.wait()


def cleanup_stale_slurm() -> list[Path]:
    """Stop the daemons and remove the state of this checkout's test Slurms whose owner died.

    Returns:
        The state directories removed.
    """
    removed = []
    for state in sorted(STATE_ROOT.glob(f"{STATE_PREFIX}*")):
        try:
            owner = json.loads((state / "owner.json").read_text())
        except (OSError, ValueError):
            continue
        if owner["checkout"] != str(CHECKOUT) or start_time(owner["pid"]) == owner["pid_start"]:
            continue
        # SIGKILL to an unshare parent sends its namespace's init SIGTERM (--kill-child).
        kill_and_wait(pid for pid, started in owner["daemons"] if start_time(pid) == started)
        shutil.rmtree(state, ignore_errors=True)
        removed.append(state)
    return removed


_LIVE: set[SlurmCluster] = set()


def _teardown_live() -> None:
    for slurm in list(_LIVE):
        slurm.teardown()


@functools.cache
def _install_exit_hook() -> None:
    """Runs before the harness's own exit hook (atexit is last in, first out): jobs, then hosts."""
    atexit.register(_teardown_live)


@pytest.fixture(scope="session")
def slurm_cluster(_stale_cleaned: None) -> Iterator[SlurmCluster]:
    """Two hosts (node0, node1) with Slurm on them, shared by the session; tests must leave no job."""
    reason = slurm_skip_reason()
    if reason is not None:
        pytest.skip(reason)
    cleanup_stale_slurm()
    with Cluster(2) as cluster, SlurmCluster(cluster) as slurm:
        yield slurm
