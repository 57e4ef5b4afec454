"""The files of a Slurm job: the sbatch script rendered from the plan, and what its nodes read.

Pure: nothing here runs a command. `distrun launch --backend slurm --dry-run` prints the script.

The job directory must be on a filesystem that the controller and every node share (a shared
home or a cluster filesystem, as on most Slurm clusters): the nodes read the supervisor bundle
and their configuration from it, and append their output to `slurm/<node>.stream`, which the
controller follows.

The job gets no more of the controller's environment than it needs: sbatch exports only
`PASSED_ENV` (and Slurm's own SLURM_* variables), never the variables a `${env:X}` secret was
read from nor anything else of the operator's shell; the job's and the inventory's `env` are
exported by the script itself. Secrets never appear in the script: they go to
`slurm/secrets.json` (mode 0600), which the batch script opens and removes before any node
runs, and hand to every node's task on srun's stdin (srun gives each task its stdin): the
file lives on the shared filesystem only while the job waits in the queue.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orchestrator import remote
from orchestrator.plan import DEFAULT_PORT, LaunchPlan, entry_argv
from orchestrator.remote.config import SupervisorConfig
from orchestrator.spec.model import JobSpec

# torchrun options whose values differ per node or are known only inside the allocation; the
# node fills in `$NAME` from its environment (the batch script exports MASTER_ADDR/MASTER_PORT),
# in these options' values only: the job's own arguments reach the script as written.
NODE_VALUES = {
    "--node-rank": "$SLURM_NODEID",
    "--master-addr": "$MASTER_ADDR",
    "--master-port": "$MASTER_PORT",
    "--rdzv-endpoint": "$MASTER_ADDR:$MASTER_PORT",
}
EXPANDED = ["SLURM_NODEID", "MASTER_ADDR", "MASTER_PORT"]
# What the job takes from the controller's environment (sbatch --export): where programs and the
# home directory are, who the user is, the locale. Everything else it needs is in the job's env.
PASSED_ENV = ("PATH", "HOME", "USER", "LOGNAME", "LANG", "LC_ALL", "LC_CTYPE", "TZ")
# Reads the bundle from the file named by the first argument, then runs the usual bootstrap.
BOOTSTRAP = 'import sys\nsys.stdin = open(sys.argv.pop(1), encoding="utf-8")\n' + remote.BOOTSTRAP


@dataclass(frozen=True)
class SlurmFiles:
    """Where a Slurm job's files live in its job directory."""

    root: Path
    attempt: int = 1  # the controller's attempt: a later one has files of its own under slurm/attempt<N>/

    @property
    def dir(self) -> Path:
        return self.root / "slurm" if self.attempt == 1 else self.root / "slurm" / f"attempt{self.attempt}"

    @property
    def script(self) -> Path:
        return self.dir / "job.sbatch"

    @property
    def bootstrap(self) -> Path:
        return self.dir / "bootstrap.py"

    @property
    def bundle(self) -> Path:
        return self.dir / "bundle.json"

    @property
    def node_json(self) -> Path:
        return self.dir / "node.json"

    @property
    def secrets(self) -> Path:
        return self.dir / "secrets.json"

    @property
    def output_pattern(self) -> Path:
        """sbatch's --output: the batch script's own output; %j is the Slurm job id."""
        return self.root / "slurm-%j.out"

    def output(self, slurm_id: str) -> Path:
        return self.root / f"slurm-{slurm_id}.out"

    def stream(self, node: str) -> Path:
        return self.dir / f"{node}.stream"


@dataclass(frozen=True)
class SlurmOptions:
    """The Slurm backend's options (declared in SlurmBackend.OPTIONS)."""

    partition: str | None = None
    time: str | None = None
    account: str | None = None
    gpus_per_node: int | None = None
    extra: tuple[str, ...] = ()


@dataclass(frozen=True)
class BatchJob:
    """Everything the sbatch script says."""

    plan: LaunchPlan
    options: SlurmOptions
    gpus_per_node: int | None
    port: int | None
    bundle_size: int
    files: SlurmFiles
    options_end: int
    exclude: tuple[str, ...] = ()  # nodes an earlier attempt's failure quarantined (sbatch --exclude)

    @property
    def python(self) -> str:
        return self.plan.hosts[0].python

    @property
    def filled(self) -> list[int]:
        """Positions in the torchrun argv whose `$NAME`s each node fills in."""
        return node_value_positions(self.plan.hosts[0].argv, self.options_end)


def torchrun_options_end(job: JobSpec, argv: list[str], extra_args: list[str]) -> int:
    """How many leading items of a host's argv are torchrun and its options; the entry point
    (distrun's worker entry and `script`, or `-m module`) and the arguments follow."""
    return len(argv) - len(entry_argv(job, "")) - len(job.args) - len(extra_args)


def node_value_positions(argv: list[str], options_end: int) -> list[int]:
    """Where in a torchrun argv the values of the per-node options (NODE_VALUES) are.

    Args:
        argv: a host's torchrun argv from the plan.
        options_end: how many leading items are torchrun's own options (the script follows).
    """
    return [i + 1 for i in range(options_end - 1) if argv[i] in NODE_VALUES]


def node_argv(argv: list[str], options_end: int) -> list[str]:
    """torchrun's argv with the per-node values replaced by `$NAME` references.

    Args:
        argv: a host's torchrun argv from the plan.
        options_end: how many leading items are torchrun's own options (the script follows).
    """
    out = list(argv)
    for i in node_value_positions(argv, options_end):
        out[i] = NODE_VALUES[argv[i - 1]]
    return out


def node_config(batch: BatchJob) -> dict[str, Any]:
    """What each node's task reads from slurm/node.json (no secrets)."""
    plan, files = batch.plan, batch.files
    # Slurm owns the job's lifetime: no controller heartbeat. Each node fills in its own name,
    # argv, secrets and first rank (remote/slurm_node.py).
    supervisor = SupervisorConfig(job_id=plan.job_id, node="", cwd=plan.hosts[0].workdir, heartbeat_timeout=None,
                                  stop_grace=plan.stop_grace, telemetry_interval=plan.telemetry_interval,
                                  make_dirs=[plan.checkpoint_dir] if plan.checkpoint_dir else [],
                                  programs=remote.program_sources())
    return {"supervisor": supervisor.to_dict(), "stream_dir": str(files.dir), "secrets_on_stdin": bool(plan.secrets),
            "expand": EXPANDED, "expand_at": batch.filled}


def render_script(batch: BatchJob) -> str:
    """The sbatch script: directives, the job's environment, the master, then one srun."""
    return "\n".join(["#!/bin/bash", *_directives(batch), *_preamble(batch), "set -euo pipefail", "",
                      *_exports(batch.plan), "", *_body(batch)]) + "\n"


def _directives(batch: BatchJob) -> list[str]:
    opts = batch.options
    lines = [f"--job-name={batch.plan.job_name}", f"--nodes={batch.plan.nnodes}", "--ntasks-per-node=1",
             f"--output={batch.files.output_pattern}", f"--export={','.join(PASSED_ENV)}"]
    lines += [f"--{key}={value}" for key, value in
              (("partition", opts.partition), ("time", opts.time), ("account", opts.account)) if value]
    if batch.gpus_per_node:
        lines.append(f"--gpus-per-node={batch.gpus_per_node}")
    if batch.exclude:
        lines.append(f"--exclude={','.join(batch.exclude)}")
    return [f"#SBATCH {line}" for line in [*lines, *opts.extra]]


def _preamble(batch: BatchJob) -> list[str]:
    lines = [
        "#",
        f"# distrun job {batch.plan.job_id}, written by `distrun launch --backend slurm`, which follows it.",
        f"# Every node must see {batch.files.root} (a shared filesystem): each node's supervisor",
        f"# reads slurm/{batch.files.node_json.name} there and appends its output to slurm/<node>.stream.",
    ]
    if batch.plan.secrets:
        names = ", ".join(sorted(batch.plan.secrets))
        lines.append(f"# Secrets ({names}) are not in this file: this script opens and removes "
                     f"slurm/{batch.files.secrets.name} (mode 0600),")
        lines.append("# then gives it to every node's task on srun's stdin.")
    return [*lines, ""]


def _exports(plan: LaunchPlan) -> list[str]:
    env = plan.hosts[0].env
    return [f"export {name}={shlex.quote(value)}" for name, value in sorted(env.items())]


def _body(batch: BatchJob) -> list[str]:
    files = batch.files
    launcher = shlex.join([batch.python, str(files.bootstrap), str(files.bundle), str(batch.bundle_size)])
    port = f"{batch.port} exact" if batch.port else str(DEFAULT_PORT)
    argv = batch.plan.hosts[0].argv
    # The steps get the script's environment (its exports, MASTER_ADDR), not sbatch's --export list.
    return [
        f"DISTRUN=({launcher})",
        *_take_secrets(files, batch.plan),
        "# The master is node 0 of the allocation (node rank 0); its port is chosen free there.",
        f'master=$(srun --nodes=1 --ntasks=1 --relative=0 --export=ALL "${{DISTRUN[@]}}" port {port})',
        'read -r MASTER_ADDR MASTER_PORT <<<"$master"',
        "export MASTER_ADDR MASTER_PORT",
        'echo "distrun: master $MASTER_ADDR:$MASTER_PORT"',
        "",
        "# One supervisor per node starts torchrun; each node fills in the '$NAME' arguments itself.",
        "# --kill-on-bad-exit: when one node fails, Slurm ends the step on every node.",
        f"srun --nodes={batch.plan.nnodes} --ntasks-per-node=1 --kill-on-bad-exit=1 --export=ALL \\",
        f'    "${{DISTRUN[@]}}" {shlex.quote(str(files.node_json))} -- \\',
        f"    {shlex.join(argv)}" + (" <&3" if batch.plan.secrets else ""),
    ]


def _take_secrets(files: SlurmFiles, plan: LaunchPlan) -> list[str]:
    """Open the secrets file on descriptor 3 and remove it; srun hands it to every task."""
    if not plan.secrets:
        return []
    path = shlex.quote(str(files.secrets))
    return [
        "# The secrets leave the shared filesystem before anything runs; the last srun reads them from fd 3.",
        f"[ -r {path} ] || {{ echo 'distrun: {files.secrets.name} is gone: secrets are read once, when the job "
        "first starts (launch it again)' >&2; exit 1; }",
        f"exec 3<{path}",
        f"rm -f {path}",
    ]
