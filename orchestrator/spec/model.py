"""Plain dataclasses for the two file formats. The loaders in inventory.py and job.py build them."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import Enum

from orchestrator.spec.yamlsrc import Map

# Seconds a host may be silent before it counts as lost, and between SIGTERM and SIGKILL when a
# job is stopped (a job file's `heartbeat_timeout` and `stop_grace`; bench/results/faults.md
# has the measurements behind them).
DEFAULT_HEARTBEAT_TIMEOUT = 6.0
DEFAULT_STOP_GRACE = 5.0
DEFAULT_STALL_AFTER = 300.0  # no progress for this long: every rank's stack is taken, the job goes on
# `sync_max_size`: more than a project's code and configuration, less than a dataset or a
# checkpoint sent by mistake to every host.
DEFAULT_SYNC_MAX_SIZE = 512 << 20


class HostKeyPolicy(str, Enum):
    STRICT = "strict"
    ACCEPT_NEW = "accept-new"


class TransportKind(str, Enum):
    SSH = "ssh"
    LOCAL = "local"


@dataclass(frozen=True)
class NodeSpec:
    """One host of an inventory, with the inventory `defaults` already applied."""

    name: str
    host: str
    user: str | None = None
    port: int | None = None
    identity_file: str | None = None
    known_hosts: str = "~/.ssh/known_hosts"
    host_key_policy: HostKeyPolicy = HostKeyPolicy.STRICT
    python: str = "python3"
    iface: str | None = None
    env: dict[str, str] = field(default_factory=dict)
    gpus: int | None = None
    labels: tuple[str, ...] = ()
    proxy_jump: str | None = None
    transport: TransportKind = TransportKind.SSH
    slots: int | None = None  # processes on this host for nproc_per_node: auto (a DeepSpeed hostfile's slots=N)
    line: int = 0


@dataclass(frozen=True)
class Inventory:
    path: str
    nodes: tuple[NodeSpec, ...]
    master: str | None = None
    # Key path -> line in the file ("master", "nodes[1].port"), for errors found later.
    lines: dict[str, int] = field(default_factory=dict, compare=False, repr=False)

    def node(self, name: str) -> NodeSpec:
        for node in self.nodes:
            if node.name == name:
                return node
        raise KeyError(name)

    def master_of(self, selected: Sequence[NodeSpec]) -> NodeSpec:
        """The rendezvous host of a selection: the inventory's `master` when selected, else the first."""
        return next((n for n in selected if n.name == self.master), selected[0])


@dataclass(frozen=True)
class Rendezvous:
    backend: str = "static"  # static | c10d
    port: int | None = None  # None = auto
    report_after: float = 60.0  # seconds before the hosts that never joined it are named (telemetry/rendezvous.py)


@dataclass(frozen=True)
class Select:
    names: tuple[str, ...] = ()
    labels: tuple[str, ...] = ()


@dataclass(frozen=True)
class Telemetry:
    interval: float = 2.0
    enabled: bool = True


# What `restarts.on` may list: the failures after which the controller starts the job again.
RESTART_TRIGGERS = ("host-lost", "rank-failed", "hang")
DEFAULT_RESTART_ON = ("host-lost", "rank-failed")


@dataclass(frozen=True)
class Restarts:
    """The controller's restarts of a whole job (`restarts:`), apart from torchrun's `max_restarts`.

    Attributes:
        max: Attempts after the first (0: none).
        backoff: Seconds between an attempt's end and the next one's start.
        on: The failures that start another attempt (RESTART_TRIGGERS).
    """

    max: int = 0
    backoff: float = 0.0
    on: tuple[str, ...] = DEFAULT_RESTART_ON


DEFAULT_LIGHTHOUSE_PORT = 29510


@dataclass(frozen=True)
class FaultTolerance:
    """Per-step fault tolerance with torchft (`fault_tolerance:`): the job's hosts split into replica
    groups, each its own torchrun, kept in step by a lighthouse distrun runs on a host of the job.

    Attributes:
        min_replicas: Replica groups needed for a step (the lighthouse's `--min_replicas`).
        hosts_per_group: Hosts of each replica group (default: one group per host).
        lighthouse_port: The lighthouse's port on its host.
    """

    min_replicas: int = 1
    hosts_per_group: int = 1
    lighthouse_port: int = DEFAULT_LIGHTHOUSE_PORT


@dataclass(frozen=True)
class JobSpec:
    """A job file. `env` holds plain values; `secrets` maps a variable to the controller's
    environment variable it reads at launch (`${env:NAME}`), never stored in clear."""

    path: str
    name: str
    script: str | None = None
    module: str | None = None
    args: tuple[str, ...] = ()
    nnodes: int | None = None
    # `nnodes: MIN:MAX`: the job may go on with as few as MIN hosts once no spare is left (None: nnodes).
    min_nnodes: int | None = None
    nproc_per_node: int | None = None  # None = auto
    workdir: str | None = None
    env: dict[str, str] = field(default_factory=dict)
    secrets: dict[str, str] = field(default_factory=dict)
    rendezvous: Rendezvous = field(default_factory=Rendezvous)
    max_restarts: int = 0
    select: Select = field(default_factory=Select)
    telemetry: Telemetry = field(default_factory=Telemetry)
    sync: bool = False
    sync_max_size: int = DEFAULT_SYNC_MAX_SIZE
    backend: str | None = None  # None = the default backend
    # The job file's section for each backend that has one (`slurm: {...}`), as read: each
    # backend checks its own section against the options it declares (backends/options.py).
    backend_sections: dict[str, Map] = field(default_factory=dict, compare=False, repr=False)
    heartbeat_timeout: float = DEFAULT_HEARTBEAT_TIMEOUT
    stop_grace: float = DEFAULT_STOP_GRACE
    hang_timeout: float | None = None  # None: off (a silent but healthy phase must not be killed)
    # Every rank serves its Flight Recorder (distrun's worker entry, remote/distrun_worker.py); False: off.
    flight_recorder: bool = True
    stall_after: float | None = DEFAULT_STALL_AFTER  # None: off; a stall is explained, never killed
    restarts: Restarts = field(default_factory=Restarts)
    checkpoint_dir: str | None = None  # -> DISTRUN_CHECKPOINT_DIR on every rank, created on every host
    spares: int | None = None  # hosts kept aside for restarts (None: every host selected beyond nnodes)
    fault_tolerance: FaultTolerance | None = None  # None: one torchrun world, as without torchft
    metrics_port: int | None = None  # the controller's Prometheus endpoint while the job runs (None: none)
    # Key path -> line in the file ("nnodes", "select.names[0]"), for errors found later.
    lines: dict[str, int] = field(default_factory=dict, compare=False, repr=False)
