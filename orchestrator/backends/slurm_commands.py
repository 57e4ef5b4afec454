"""Slurm's own commands, wrapped: sbatch, scontrol, squeue, scancel, sinfo and srun, each run on
this machine with a timeout, and Slurm's job states read as distrun's."""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass

from orchestrator.errors import InfraError, UsageError
from orchestrator.store import JobState

SLURM_TIMEOUT = 30.0
SLURM_STATES = {
    "PENDING": JobState.PENDING, "CONFIGURING": JobState.PENDING, "REQUEUED": JobState.PENDING,
    "REQUEUE_HOLD": JobState.PENDING, "REQUEUE_FED": JobState.PENDING, "RESV_DEL_HOLD": JobState.PENDING,
    "RUNNING": JobState.RUNNING, "COMPLETING": JobState.RUNNING, "SUSPENDED": JobState.RUNNING,
    "STOPPED": JobState.RUNNING, "RESIZING": JobState.RUNNING, "SIGNALING": JobState.RUNNING,
    "STAGE_OUT": JobState.RUNNING,
    "COMPLETED": JobState.SUCCEEDED,
    "FAILED": JobState.FAILED, "TIMEOUT": JobState.FAILED, "OUT_OF_MEMORY": JobState.FAILED,
    "BOOT_FAIL": JobState.FAILED, "DEADLINE": JobState.FAILED, "SPECIAL_EXIT": JobState.FAILED,
    "CANCELLED": JobState.STOPPED, "PREEMPTED": JobState.STOPPED, "REVOKED": JobState.STOPPED,
    "NODE_FAIL": JobState.LOST,
}
UNREACHABLE = re.compile(r"Unable to contact slurm controller|Socket timed out|Connection refused|Zero Bytes")


def distrun_state(slurm_state: str) -> JobState:
    """distrun's state for one of Slurm's (`CANCELLED by 0` and `COMPLETING+` forms included).

    A state this table does not know is taken as still running: Slurm holds the job.
    """
    base = slurm_state.split(" ")[0].rstrip("+").upper()
    return SLURM_STATES.get(base, JobState.RUNNING)


@dataclass(frozen=True)
class SlurmJob:
    """One reading of `scontrol show job`."""

    id: str
    state: str
    reason: str
    nodelist: str
    batch_host: str

    @property
    def distrun_state(self) -> JobState:
        return distrun_state(self.state)

    @property
    def allocated(self) -> bool:
        """Nodes are allocated and the batch script runs (or ran)."""
        return self.distrun_state is not JobState.PENDING and self.nodelist not in ("", "(null)")


def parse_job(text: str) -> SlurmJob:
    """Parse `scontrol show job -o ID` (key=value pairs on one line)."""
    def field(key: str) -> str:
        match = re.search(rf"(?:^|\s){key}=(\S*)", text)
        return match.group(1) if match else ""

    return SlurmJob(id=field("JobId"), state=field("JobState"), reason=field("Reason"),
                    nodelist=field("NodeList"), batch_host=field("BatchHost"))


def run_slurm(argv: list[str]) -> subprocess.CompletedProcess[str]:
    """Run one of Slurm's commands.

    Raises:
        InfraError: the command is missing, or did not answer in SLURM_TIMEOUT.
    """
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=SLURM_TIMEOUT, check=False)
    except FileNotFoundError:
        raise InfraError(f"{argv[0]} not found: the Slurm backend runs Slurm's commands (sbatch, scontrol, "
                         "squeue, scancel, sinfo) on this machine") from None
    except subprocess.TimeoutExpired:
        raise InfraError(f"{argv[0]} did not answer within {SLURM_TIMEOUT:g} s (is slurmctld up?)") from None


def srun_on(slurm_id: str, node: str, argv: list[str], timeout: float) -> str:
    """Run one task of `argv` on `node` inside a running Slurm job (beside its steps); its stdout.

    Raises:
        InfraError: srun is missing, failed, or did not finish within `timeout`.
    """
    command = ["srun", f"--jobid={slurm_id}", "--overlap", f"--nodelist={node}", "--nodes=1", "--ntasks=1",
               "--quiet", *argv]
    try:
        result = subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=False,
                                stdin=subprocess.DEVNULL)
    except FileNotFoundError:
        raise InfraError("srun not found: the Slurm backend runs Slurm's commands on this machine") from None
    except subprocess.TimeoutExpired:
        raise InfraError(f"srun on {node} did not finish within {timeout:g} s") from None
    if result.returncode != 0:
        raise InfraError(f"srun on {node}: {_error_text(result)}")
    return result.stdout


def _error_text(result: subprocess.CompletedProcess[str]) -> str:
    lines = [ln.strip() for ln in result.stderr.splitlines() if ln.strip()]
    return lines[-1] if lines else f"exit code {result.returncode}"


def _checked(argv: list[str]) -> str:
    """stdout of a Slurm command that must succeed.

    Raises:
        InfraError: it failed.
    """
    result = run_slurm(argv)
    if result.returncode != 0:
        raise InfraError(f"{argv[0]}: {_error_text(result)}")
    return result.stdout


def query_job(slurm_id: str) -> SlurmJob | None:
    """The job as slurmctld knows it now; None once it has forgotten the job."""
    result = run_slurm(["scontrol", "show", "job", "-o", slurm_id])
    if result.returncode != 0:
        if "Invalid job id" in result.stderr:
            return None
        raise InfraError(f"scontrol: {_error_text(result)}")
    return parse_job(result.stdout)


def in_queue(slurm_id: str) -> bool:
    """Whether squeue still lists the job (pending, running or completing)."""
    return bool(run_slurm(["squeue", "-h", "-j", slurm_id, "-o", "%i"]).stdout.strip())


def hostnames(nodelist: str) -> list[str]:
    return _checked(["scontrol", "show", "hostnames", nodelist]).split()


def node_addresses(names: list[str]) -> dict[str, str]:
    """Each node's NodeAddr, as Slurm reaches it."""
    addrs = {}
    for line in _checked(["scontrol", "show", "node", "-o", ",".join(names)]).splitlines():
        name, addr = re.search(r"NodeName=(\S+)", line), re.search(r"NodeAddr=(\S+)", line)
        if name and addr:
            addrs[name.group(1)] = addr.group(1)
    return addrs


def partition_nodes(partition: str | None) -> tuple[str, list[str]]:
    """The partition a job goes to (the given one, else Slurm's default) and its nodes."""
    pairs = [line.split() for line in _checked(["sinfo", "-h", "-N", "-o", "%N %P"]).splitlines() if line.strip()]
    default = next((p.rstrip("*") for _, p in pairs if p.endswith("*")), None)
    name = partition or default
    if name is None:
        return "(all)", sorted({n for n, _ in pairs})
    return name, sorted({n for n, p in pairs if p.rstrip("*") == name})


def sbatch(script: str) -> str:
    """sbatch the script; returns the Slurm job id.

    Raises:
        UsageError: Slurm refused the request (e.g. more nodes than the partition has).
        InfraError: slurmctld could not be reached.
    """
    result = run_slurm(["sbatch", "--parsable", script])
    if result.returncode != 0:
        why = _error_text(result).removeprefix("sbatch: error: ")
        error = InfraError if UNREACHABLE.search(result.stderr) else UsageError
        raise error(f"Slurm refused the job: {why}")
    return result.stdout.strip().split(";")[0]


def cancel(slurm_id: str) -> None:
    _checked(["scancel", slurm_id])


def check_node_count(nnodes: int, partition: str | None) -> None:
    """Refuse a job that asks for more nodes than its partition has: it would pend forever.

    Raises:
        UsageError: the partition is unknown or too small.
    """
    name, nodes = partition_nodes(partition)
    if not nodes:
        raise UsageError(f"--partition {partition}: Slurm has no such partition (see `sinfo`)")
    if nnodes > len(nodes):
        raise UsageError(f"the job asks for {nnodes} nodes but Slurm partition {name} has {len(nodes)} "
                         f"({', '.join(nodes)}) (lower nnodes or --nnodes, or choose another --partition)")
