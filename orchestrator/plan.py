"""Pure planning: (job, selected nodes, host facts) -> LaunchPlan, every host's exact argv and env.

Nothing here touches the network or the clock; `--dry-run` prints a plan, tests assert on
it, the launcher runs it.
"""

from __future__ import annotations

import ipaddress
import shlex
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from orchestrator import remote
from orchestrator.errors import UsageError
from orchestrator.facts import HostFacts
from orchestrator.spec.model import (
    DEFAULT_HEARTBEAT_TIMEOUT,
    DEFAULT_STOP_GRACE,
    DEFAULT_SYNC_MAX_SIZE,
    JobSpec,
    NodeSpec,
)

DEFAULT_PORT = 29500
CPU_NPROC = 2
MASK = "***"
JOB_ID_MARK = "{job_id}"  # in checkpoint_dir: the job's id (each job its own directory)
PROBE_MARK = "<probe>"  # in a dry run made without reaching the hosts: a value only their probe gives
# What a probe fills in -> the torchrun option that carries it.
PROBED_OPTIONS = {"master_addr": "--master-addr", "master_port": "--master-port", "nproc": "--nproc-per-node"}
# Flight Recorder entries each rank keeps (every job unless `flight_recorder: false`). torch from 2.7 reads
# TORCH_FR_BUFFER_SIZE (and warns on every rank that the older name is deprecated when it is set);
# older torch reads TORCH_NCCL_TRACE_BUFFER_SIZE only. A host whose torch is not known gets both.
FLIGHT_RECORDER_VARS = ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE")
FLIGHT_RECORDER_SINCE = (2, 7)
FLIGHT_RECORDER_ENTRIES = "2000"


@dataclass(frozen=True)
class HostPlan:
    node: str
    host: str
    node_rank: int
    nproc: int
    python: str
    workdir: str
    argv: list[str]
    env: dict[str, str]
    secret_names: list[str]
    iface: str | None


@dataclass(frozen=True)
class LaunchPlan:
    job_id: str
    job_name: str
    spec_path: str
    inventory_path: str
    backend: str
    master_node: str
    master_addr: str
    master_port: int
    nnodes: int
    hosts: list[HostPlan]
    secrets: dict[str, str] = field(repr=False, compare=False)
    heartbeat_timeout: float = DEFAULT_HEARTBEAT_TIMEOUT
    stop_grace: float = DEFAULT_STOP_GRACE
    hang_timeout: float | None = None  # no progress from any rank for this long: a hang (None: off)
    stall_after: float | None = None  # no progress for this long: every rank's stack taken, job goes on (None: off)
    rdzv_report_after: float = 60.0  # no host past the rendezvous for this long: those that never joined are named
    telemetry_interval: float | None = 2.0
    sync: bool = False
    sync_max_size: int = DEFAULT_SYNC_MAX_SIZE
    # Values left to the hosts' probe (an offline dry run): master_addr, master_port, nproc, iface.
    unprobed: tuple[str, ...] = ()
    attempt: int = 1  # the controller's attempt (DISTRUN_ATTEMPT): 1, then 2, ... after each restart
    spares: tuple[str, ...] = ()  # hosts kept aside to take a failed host's place (restarts)
    checkpoint_dir: str | None = None  # created on every host before the job starts (DISTRUN_CHECKPOINT_DIR)

    @property
    def world_size(self) -> int:
        return sum(h.nproc for h in self.hosts)

    def first_rank(self, node: str) -> int:
        """Global rank of a host's local rank 0 (static rendezvous assigns them in node order)."""
        first = 0
        for host in self.hosts:
            if host.node == node:
                return first
            first += host.nproc
        raise KeyError(node)

    def host_env(self, host: HostPlan) -> dict[str, str]:
        """The full environment for a host, secrets included: only ever sent over stdin."""
        return {**host.env, **{k: self.secrets[k] for k in host.secret_names}}

    def to_dict(self) -> dict[str, Any]:
        """The plan as JSON-ready data, secret values shown as ***."""
        data = asdict(self)
        data["secrets"] = {k: MASK for k in self.secrets}
        data["world_size"] = self.world_size
        for host in data["hosts"]:
            host["env"].update({k: MASK for k in host["secret_names"]})
        return data

    def render(self) -> str:
        """Human-readable dry run: per host, the exact environment and argv; values only a probe
        of the hosts gives are shown as <probe>."""
        world = PROBE_MARK if "nproc" in self.unprobed else str(self.world_size)
        lines = [
            f"job {self.job_id}: {self.nnodes} node(s), world size {world}, "
            f"master {self.master_node} at {self._shown('master_addr', self.master_addr)}:"
            f"{self._shown('master_port', str(self.master_port))}"
        ]
        if self.spares:
            lines.append(f"spares: {', '.join(self.spares)} (take a failed host's place when the job restarts)")
        for host in self.hosts:
            env = {**host.env, **{k: MASK for k in host.secret_names}}
            iface = f"  iface {PROBE_MARK}" if "iface" in self.unprobed and host.iface is None else ""
            lines.append(f"\n[{host.node}] {host.host}  node-rank {host.node_rank}  cwd {host.workdir}{iface}")
            lines += [f"  {k}={shlex.quote(v) if v != MASK else v}" for k, v in sorted(env.items())]
            lines.append("  " + " ".join(self._marked(host.argv)))
        if self.unprobed:
            lines.append(f"\n{PROBE_MARK}: found by probing the hosts when the job starts "
                         "(add --probe to the dry run to reach them now)")
        return "\n".join(lines)

    def _shown(self, key: str, value: str) -> str:
        return PROBE_MARK if key in self.unprobed else value

    def _marked(self, argv: list[str]) -> list[str]:
        """argv shell-quoted, each value a probe gives replaced by <probe>."""
        marked = {PROBED_OPTIONS[key] for key in self.unprobed if key in PROBED_OPTIONS}
        if {"master_addr", "master_port"} & set(self.unprobed):
            marked.add("--rdzv-endpoint")
        words = []
        for index, word in enumerate(argv):
            words.append(PROBE_MARK if index and argv[index - 1] in marked else self._quoted(word))
        return words

    def _quoted(self, word: str) -> str:
        return shell_word(word, self.job_id)


def shell_word(word: str, job_id: str) -> str:
    """A word of a host's argv as a shell takes it; a path in the job's directory on the host keeps
    its `~` bare, which a shell expands as the supervisor does (remote/programs.py)."""
    if word.startswith(remote.host_job_dir(job_id) + "/") and shlex.quote(word[1:]) == word[1:]:
        return word
    return shlex.quote(word)


def resolve_nproc(job: JobSpec, node: NodeSpec, facts: HostFacts | None) -> int:
    """`nproc_per_node: auto` = the node's `slots` (a DeepSpeed hostfile's), else the host's GPUs, else the
    inventory's `gpus`, else 2 CPU processes."""
    if job.nproc_per_node is not None:
        return job.nproc_per_node
    if node.slots:
        return node.slots
    if facts is not None and facts.gpus:
        return facts.gpus
    return node.gpus or CPU_NPROC


def choose_iface(node: NodeSpec, facts: HostFacts | None, master_addr: str) -> str | None:
    """The inventory's `iface`, else the host's interface on the master's subnet, else its route."""
    if node.iface:
        return node.iface
    if facts is None:
        return None
    target = ipaddress.ip_address(master_addr)
    for name, addrs in facts.interfaces.items():
        for addr in addrs:
            if target in ipaddress.ip_interface(addr).network and name != "lo":
                return name
    return facts.route_iface


def choose_master_addr(master: NodeSpec, facts: HostFacts | None, peer_address: str, nnodes: int) -> str:
    """An address of the master that the other hosts can reach.

    Raises:
        UsageError: only a loopback address is known while more than one host takes part.
    """
    addr = peer_address
    if master.iface and facts is not None and facts.interfaces.get(master.iface):
        addr = facts.interfaces[master.iface][0].split("/")[0]
    if nnodes > 1 and ipaddress.ip_address(addr).is_loopback:
        raise UsageError(
            f"{master.name}: master address {addr} is a loopback address, which the other "
            f"{nnodes - 1} host(s) cannot reach (give the master a routable `host` or `iface`)"
        )
    return addr


def takes_dash_p(facts: HostFacts | None) -> bool:
    """Whether the host's python is known to be 3.11 or newer, and so takes `-P` (safe paths)."""
    try:
        major, minor = (int(part) for part in (facts.python or "").split(".")[:2]) if facts else (0, 0)
    except ValueError:
        return False
    return (major, minor) >= (3, 11)


def torchrun_argv(job: JobSpec, host_python: str, *, nnodes: int, nproc: int, node_rank: int,
                  master_addr: str, master_port: int, job_id: str, extra_args: list[str],
                  dash_p: bool = False, log_dir: str | None = None) -> list[str]:
    """The exact torchrun command line for one host, as the host runs it.

    torchrun runs as distrun's program (remote/distrun_torchrun.py, `python -m torch.distributed.run`
    that keeps torchrun's failure records), by name in the job's `bin/` on the host, which its
    supervisor writes; `-P` (safe paths) where the host's python is 3.11 or newer, else the program
    drops its own directory from sys.path itself, so the workdir is never searched for torchrun's
    imports. `log_dir`: torchrun's `--log-dir`, the host's directory that the supervisor reads the
    ranks' files from (None where the plan cannot name it: Slurm's node). The workers run the job
    as Python runs any script or module (the script's own directory, or for `module:` the workdir,
    first on sys.path), through distrun's worker entry unless the job turns the Flight Recorder off.
    """
    argv = [host_python, *(["-P"] if dash_p else []), remote.program_path(job_id, remote.TORCHRUN_PROGRAM)]
    # Each rank's stdout and stderr to files of its own, which the supervisor tails: no rank can
    # splice another's half line, as --tee can.
    argv += ["--log-dir", log_dir] if log_dir else []
    argv += ["--nnodes", str(nnodes), "--nproc-per-node", str(nproc)]
    if job.rendezvous.backend == "c10d":
        argv += ["--rdzv-backend", "c10d", "--rdzv-endpoint", f"{master_addr}:{master_port}", "--rdzv-id", job_id]
    else:
        argv += ["--node-rank", str(node_rank), "--master-addr", master_addr, "--master-port", str(master_port)]
    argv += ["--max-restarts", str(job.max_restarts), "--redirects", "3"]
    return argv + entry_argv(job, job_id) + list(job.args) + list(extra_args)


def entry_argv(job: JobSpec, job_id: str) -> list[str]:
    """What torchrun runs in each worker, its arguments left out: distrun's worker entry and the
    script (or `-m module`), or, with `flight_recorder: false`, the script (`-m module`) alone."""
    target = ["-m", job.module] if job.module else [job.script or ""]
    return [remote.program_path(job_id, remote.WORKER_PROGRAM), *target] if job.flight_recorder else target


def host_log_dir(job_id: str, node: str) -> str:
    """torchrun's --log-dir on a host: where the supervisor reads each rank's files (remote/relay.py)."""
    return f"{remote.host_job_dir(job_id)}/{node}/torchrun"


def host_env(job: JobSpec, node: NodeSpec, iface: str | None, attempt: int = 1) -> dict[str, str]:
    """Inventory env, then job env over it; the socket interfaces unless either sets them; the
    attempt and, with `checkpoint_dir`, where the ranks keep their checkpoints."""
    env = {**node.env, **job.env}
    if iface:
        env.setdefault("NCCL_SOCKET_IFNAME", iface)
        env.setdefault("GLOO_SOCKET_IFNAME", iface)
    env["PYTHONUNBUFFERED"] = "1"
    env["DISTRUN_ATTEMPT"] = str(attempt)
    if job.checkpoint_dir:
        env["DISTRUN_CHECKPOINT_DIR"] = job.checkpoint_dir
    return env


def flight_recorder_vars(torch_version: str | None) -> tuple[str, ...]:
    """The variables that size the Flight Recorder for this torch version (both when not known)."""
    try:
        major, minor = (int(part) for part in (torch_version or "").split("+")[0].split(".")[:2])
    except ValueError:
        return FLIGHT_RECORDER_VARS
    return FLIGHT_RECORDER_VARS[:1] if (major, minor) >= FLIGHT_RECORDER_SINCE else FLIGHT_RECORDER_VARS[1:]


def with_flight_recorder(env: dict[str, str], job: JobSpec, job_id: str,
                         torch_version: str | None = None) -> dict[str, str]:
    """Unless the job turns it off (`flight_recorder: false`): the Flight Recorder on in every rank
    unless the env sizes it (in the variable the host's torch reads), and the directory (host-side
    job dir; the supervisor makes it) where each rank serves it (remote/distrun_worker.py)."""
    if not job.flight_recorder:
        return env
    added = {name: FLIGHT_RECORDER_ENTRIES for name in flight_recorder_vars(torch_version) if name not in env}
    return {**env, **added, "DISTRUN_WORKER_SOCKETS": f"{remote.host_job_dir(job_id)}/sock"}


def resolve_secrets(job: JobSpec, controller_env: dict[str, str]) -> dict[str, str]:
    """Read `${env:NAME}` values from the controller's environment.

    Raises:
        UsageError: a named variable is not set on the controller.
    """
    missing = [name for name in job.secrets.values() if name not in controller_env]
    if missing:
        raise UsageError(
            f"{job.path}: env: ${{env:{missing[0]}}} is not set in this shell "
            f"(export {missing[0]}=... before launching)"
        )
    return {var: controller_env[name] for var, name in job.secrets.items()}


def build_plan(
    job: JobSpec,
    nodes: list[NodeSpec],
    facts: dict[str, HostFacts],
    *,
    job_id: str,
    inventory_path: str,
    master: NodeSpec,
    master_addr: str,
    master_port: int,
    controller_cwd: str,
    controller_env: dict[str, str],
    extra_args: list[str] | None = None,
    backend: str = "ssh",
    attempt: int = 1,
    spares: tuple[str, ...] = (),
) -> LaunchPlan:
    """Build every host's torchrun argv and environment; the master is node rank 0."""
    if job.checkpoint_dir:  # `{job_id}` in it: a directory of this job's own, the same for all its attempts
        job = replace(job, checkpoint_dir=job.checkpoint_dir.replace(JOB_ID_MARK, job_id))
    ordered = [master] + [n for n in nodes if n.name != master.name]
    hosts = []
    for rank, node in enumerate(ordered):
        node_facts = facts.get(node.name)
        nproc = resolve_nproc(job, node, node_facts)
        iface = choose_iface(node, node_facts, master_addr) if len(ordered) > 1 else node.iface
        env = with_flight_recorder(host_env(job, node, iface, attempt), job, job_id,
                                   node_facts.torch_version if node_facts else None)
        argv = torchrun_argv(job, node.python, nnodes=len(ordered), nproc=nproc, node_rank=rank,
                             master_addr=master_addr, master_port=master_port, job_id=job_id,
                             extra_args=extra_args or [], dash_p=takes_dash_p(node_facts),
                             log_dir=None if backend == "slurm" else host_log_dir(job_id, node.name))
        hosts.append(HostPlan(
            node=node.name, host=node.host, node_rank=rank, nproc=nproc, python=node.python,
            workdir=job.workdir or controller_cwd, argv=argv, env=env,
            secret_names=sorted(job.secrets), iface=iface,
        ))
    return LaunchPlan(
        job_id=job_id, job_name=job.name, spec_path=job.path, inventory_path=inventory_path,
        backend=backend, master_node=master.name, master_addr=master_addr, master_port=master_port,
        nnodes=len(ordered), hosts=hosts, secrets=resolve_secrets(job, controller_env),
        heartbeat_timeout=job.heartbeat_timeout, stop_grace=job.stop_grace, hang_timeout=job.hang_timeout,
        stall_after=job.stall_after, rdzv_report_after=job.rendezvous.report_after,
        telemetry_interval=job.telemetry.interval if job.telemetry.enabled else None, sync=job.sync,
        sync_max_size=job.sync_max_size, attempt=attempt, spares=spares, checkpoint_dir=job.checkpoint_dir,
    )
