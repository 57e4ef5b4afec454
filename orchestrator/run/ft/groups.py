"""Replica groups of a fault-tolerant job: which hosts each has, and the job each one launches.

Pure: the parent controller (replicas.py) asks, and starts what the answer says.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from orchestrator.errors import UsageError
from orchestrator.remote.ftforward import UPSTREAMS
from orchestrator.spec.model import FaultTolerance, JobSpec, Rendezvous

# What distrun sets for every rank of a replica group (jobs/README.md's contract).
GROUP_ID = "REPLICA_GROUP_ID"
GROUP_COUNT = "NUM_REPLICA_GROUPS"
# TORCHFT_LIGHTHOUSE is set on each host by the supervisor's forwarder to the lighthouse's hosts
# (remote/ftforward.py), which the group's env names in UPSTREAMS.
# A quorum that fails (the lighthouse is being restarted) is tried again this often before the
# rank raises (torchft's default is 0: the first failed quorum ends the group); the job's env wins.
QUORUM_RETRIES = {"TORCHFT_QUORUM_RETRIES": "10"}


@dataclass(frozen=True)
class ReplicaGroup:
    """One replica group: its index, its hosts (in node-rank order) and the spares it may take.

    Attributes:
        index: 0, 1, ... (the ranks' REPLICA_GROUP_ID).
        hosts: Its hosts.
        spares: The spares its relaunch may use in place of a lost host (shared by every group).
    """

    index: int
    hosts: tuple[str, ...]
    spares: tuple[str, ...] = ()

    @property
    def job_id_suffix(self) -> str:
        return f"-g{self.index}"


def split(hosts: Sequence[str], spares: Sequence[str], ft: FaultTolerance) -> list[ReplicaGroup]:
    """The job's hosts as replica groups of `ft.hosts_per_group`, in order.

    Raises:
        UsageError: the hosts do not make whole groups, or fewer than `min_replicas` of them.
    """
    size = ft.hosts_per_group
    if len(hosts) % size:
        raise UsageError(f"fault_tolerance: hosts_per_group {size} does not divide the {len(hosts)} selected "
                         f"host(s) (select a multiple of {size} with --nodes/--nnodes)")
    count = len(hosts) // size
    if ft.min_replicas > count:
        raise UsageError(f"fault_tolerance: min_replicas {ft.min_replicas} is above the {count} replica group(s) "
                         f"of the {len(hosts)} selected host(s) (select more hosts or lower min_replicas)")
    return [ReplicaGroup(i, tuple(hosts[i * size:(i + 1) * size]), tuple(spares)) for i in range(count)]


def group_env(index: int, count: int, upstreams: str) -> dict[str, str]:
    """The variables every rank of group `index` gets beside torchrun's own (`upstreams`: the
    lighthouse's hosts, `host:port,...`, for the forwarder that sets TORCHFT_LIGHTHOUSE)."""
    return {GROUP_ID: str(index), GROUP_COUNT: str(count), UPSTREAMS: upstreams}


def group_job(job: JobSpec, group: ReplicaGroup, count: int, upstreams: str) -> JobSpec:
    """The job one replica group launches: its hosts only, torchft's variables set, no
    `fault_tolerance` (a group is a plain job), and with a fixed rendezvous port one port per group
    (groups may share a host)."""
    port = job.rendezvous.port + group.index if job.rendezvous.port else None
    return replace(job, name=f"{job.name}{group.job_id_suffix}", nnodes=len(group.hosts), fault_tolerance=None,
                   env={**QUORUM_RETRIES, **job.env, **group_env(group.index, count, upstreams)},
                   rendezvous=Rendezvous(job.rendezvous.backend, port), spares=None)
