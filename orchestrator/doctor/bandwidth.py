"""`distrun doctor --bandwidth`: a short all-reduce across the selected hosts through torchrun.

The all-reduce runs as an ordinary job through the launch machinery (plan, supervisor,
teardown), recorded as `doctor-bandwidth-...`, so `distrun logs` shows it when it fails.
NCCL with one process per GPU when every host has GPUs, else gloo with one process per host.
Bandwidths are defined as nccl-tests defines them: algbw = bytes / time, and
busbw = algbw * 2(n-1)/n for n ranks, the traffic each rank's link carried.

The script runs from a directory of its own on each host (`mktemp -d`: mode 0700, a fresh name),
which is also the job's workdir: nothing another user put in /tmp is on the job's sys.path.
"""

from __future__ import annotations

import io
import math
from dataclasses import dataclass, field, replace
from importlib import resources
from typing import Any

from orchestrator.backends.ssh import SshBackend
from orchestrator.errors import InfraError
from orchestrator.fanout.group import GroupError
from orchestrator.plan import LaunchPlan
from orchestrator.run.launch import run_attempts
from orchestrator.run.recording import Launching
from orchestrator.run.request import LaunchRequest
from orchestrator.spec.model import Inventory, JobSpec, NodeSpec, Select, Telemetry
from orchestrator.store import Store, new_job_id
from orchestrator.transport import Transport

# Package data, found as installed (a wheel has no jobs/ beside it): the script, and what it imports
# from beside it, the bundled examples' quick_exit.py (its exit without interpreter teardown).
SCRIPT = resources.files(__package__) / "allreduce_bench.py"
SHIPPED = (SCRIPT, resources.files("orchestrator") / "examples" / "quick_exit.py")
MIB = 1 << 20
GLOO_SIZES = (1 * MIB, 16 * MIB, 64 * MIB)
NCCL_SIZES = (1 * MIB, 64 * MIB, 256 * MIB)
GLOO_ITERS = 5
NCCL_ITERS = 20
# Defaults for the busbw warning, GB/s: gloo under gigabit Ethernet's ~0.12 GB/s, NCCL under
# ~10 GB/s (a 100 Gb/s link), are far below what hosts kept for training should reach.
DEFAULT_MIN_BUSBW = {"gloo": 0.1, "nccl": 10.0}
FAILURE_LINES = 8


@dataclass(frozen=True)
class SizeResult:
    """One message size: the slowest rank's mean time per all-reduce."""

    bytes: int
    time_s: float
    ranks: int

    @property
    def algbw(self) -> float:
        """GB/s (10^9 bytes), as nccl-tests reports it."""
        return self.bytes / self.time_s / 1e9 if self.time_s > 0 else math.inf

    @property
    def busbw(self) -> float:
        """algbw scaled by 2(n-1)/n: what each rank's link carried for a ring all-reduce."""
        return self.algbw * 2 * (self.ranks - 1) / self.ranks if self.ranks > 1 else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {"bytes": self.bytes, "time_s": self.time_s, "algbw_gbps": self.algbw, "busbw_gbps": self.busbw}


@dataclass(frozen=True)
class BandwidthReport:
    """What the all-reduce job measured, or why it did not."""

    backend: str
    nnodes: int
    job_id: str
    world_size: int = 0
    results: list[SizeResult] = field(default_factory=list)
    error: str | None = None

    def best_busbw(self) -> float | None:
        """The highest busbw over the sizes (the largest messages come closest to the link's peak)."""
        return max((r.busbw for r in self.results), default=None)

    def to_dict(self) -> dict[str, Any]:
        return {"backend": self.backend, "nnodes": self.nnodes, "world_size": self.world_size,
                "job_id": self.job_id, "results": [r.to_dict() for r in self.results], "error": self.error}


def parse_results(metrics: dict[str, Any] | None) -> tuple[int, list[SizeResult]]:
    """(world size, per-size results) from rank 0's final metrics line; (0, []) when absent."""
    data = (metrics or {}).get("allreduce")
    if not isinstance(data, dict):
        return 0, []
    ranks = int(data.get("world_size") or 0)
    results = [SizeResult(int(r["bytes"]), float(r["time_s"]), ranks) for r in data.get("results", [])]
    return ranks, results


def bench_job(base: JobSpec | None, backend: str) -> JobSpec:
    """The all-reduce job: the user's job's env and rendezvous when given, our script and sizes.

    The script is named relative to the workdir, which each host's plan sets to its private directory.
    """
    gpu = backend == "nccl"
    sizes = NCCL_SIZES if gpu else GLOO_SIZES
    args = ("--backend", backend, "--sizes", ",".join(map(str, sizes)),
            "--iters", str(NCCL_ITERS if gpu else GLOO_ITERS))
    job = base or JobSpec(path="<doctor --bandwidth>", name="doctor-bandwidth")
    return replace(job, name="doctor-bandwidth", script=SCRIPT.name, module=None, args=args, nnodes=None,
                   nproc_per_node=None if gpu else 1, workdir=None, max_restarts=0, select=Select(),
                   telemetry=Telemetry(enabled=False), sync=False, backend=SshBackend.NAME)


def measure(base: JobSpec | None, inventory: Inventory, nodes: list[NodeSpec], backend: str,
            store: Store | None = None) -> BandwidthReport:
    """Run the all-reduce job on `nodes` and collect its timings.

    Args:
        base: The job whose env and rendezvous port to use, or None for defaults.
        inventory: The inventory the nodes come from.
        nodes: The hosts, every one taking part.
        backend: "nccl" (one process per GPU) or "gloo" (one process per host).
        store: Where the job is recorded; default: DISTRUN_HOME.

    Returns:
        The report; its `error` says why there are no results when the job failed.

    Raises:
        GroupError: a host could not be reached or its probe failed before the job started.
    """
    job_id = new_job_id("doctor-bandwidth")
    job = bench_job(base, backend)
    report = BandwidthReport(backend, len(nodes), job_id)
    store = store or Store()
    with SshBackend(store.job_dir) as ssh:
        plan = ssh.plan_on(job, inventory, nodes, job_id)
        shipped = ssh.group.run(_ship)
        try:
            if shipped.failed:
                return replace(report, error=GroupError(shipped).render())
            plan = replace(plan, hosts=[replace(h, workdir=shipped.succeeded[h.node]) for h in plan.hosts])
            launching = Launching.of(LaunchRequest(job.path, live=False, internal=True), job, job_id, store, None)
            return _run(ssh, launching, plan, report)
        finally:
            # Best effort: the measurement is what was asked for; a host that is gone keeps the directory.
            ssh.group.run(lambda t: t.run(["rm", "-rf", "--", shipped.succeeded[t.name]], timeout=30),
                          only=shipped.succeeded)


def _ship(transport: Transport) -> str:
    """Make a private directory on the host (`mktemp -d`: mode 0700, a name no other user could
    have made first, one per host even where hosts share /tmp) and write the script (and what it
    imports) into it over the command's stdin, as every program of distrun reaches a host: no
    SFTP, which a hardened sshd does not offer.

    Returns:
        The directory's absolute path.

    Raises:
        InfraError: the directory could not be made or the file not copied.
    """
    made = transport.run(["mktemp", "-d", "-t", "distrun-bandwidth.XXXXXXXXXX"], timeout=30)
    directory = made.stdout.strip()
    if made.returncode != 0 or not directory.startswith("/") or "\n" in directory:
        raise InfraError(f"{transport.name}: cannot make a private directory (mktemp -d): "
                         f"{made.stderr.strip() or directory or 'no output'}")
    try:
        for item in SHIPPED:
            target = f"{directory}/{item.name}"
            wrote = transport.run(["sh", "-c", 'cat > "$1"', "sh", target], stdin=item.read_bytes(), timeout=30)
            if wrote.returncode != 0:
                raise InfraError(f"{transport.name}: cannot write {target}: "
                                 f"{wrote.stderr.strip() or f'exit code {wrote.returncode}'}")
    except BaseException:
        transport.run(["rm", "-rf", "--", directory], timeout=30)
        raise
    return directory


def _run(ssh: SshBackend, launching: Launching, plan: LaunchPlan, report: BandwidthReport) -> BandwidthReport:
    captured = io.StringIO()
    launching.ctx.terminal = captured
    finished = run_attempts(ssh, launching, plan)
    # Rank 0 prints only after every size was timed: with its line, the measurement is whole,
    # whatever became of the job's teardown.
    ranks, results = parse_results(finished.final_metrics)
    if not results:
        tail = " | ".join(captured.getvalue().strip().splitlines()[-FAILURE_LINES:])
        return replace(report, error=f"all-reduce job {report.job_id} failed (distrun logs {report.job_id}): {tail}")
    return replace(report, world_size=ranks, results=results)
