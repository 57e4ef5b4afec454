"""A job from the command line: `distrun launch train.py`, flags over a job file, and the job as YAML.

`job_from_script` builds the job of a script launch (torchrun's and torchx's habit: no file to
write first); `apply_overrides` puts `--name`, `--nproc-per-node` and `--env` over a job's own
values, `job_for_launch` also `--workdir` and `--sync` (the job keys `workdir` and `sync`);
`job_to_yaml` writes a job back as a job file (`--dry-run` prints it, ready to save).
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import yaml

from orchestrator.errors import UsageError
from orchestrator.spec.fields import ENV_NAME, ENV_NAME_HINT, near_file
from orchestrator.spec.job import JOB_NAME, SECRET_REF, check_workdir, load_job, missing_file
from orchestrator.spec.model import JobSpec, Rendezvous, Restarts, Select, Telemetry
from orchestrator.spec.yamlsrc import Map, Node, Scalar, Seq

SHELL_REF = re.compile(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?")  # ${NAME} or $NAME, as a shell would expand it

SCRIPT_SUFFIX = ".py"
_DEFAULTS = JobSpec(path="", name="")


def is_script(target: str) -> bool:
    """Whether `distrun launch TARGET` names a training script rather than a job file."""
    return target.endswith(SCRIPT_SUFFIX)


def job_from_script(script: str) -> JobSpec:
    """The job of `distrun launch SCRIPT.py`: the script, named after its file, every other key default.

    Raises:
        UsageError: the script is not a file.
    """
    problem = missing_file(script)
    if problem is not None:
        raise UsageError(f"{script}: {problem} (the path is relative to the current directory {Path.cwd()})"
                         f"{near_file(script)}")
    stem = re.sub(r"[^A-Za-z0-9._-]", "-", Path(script).stem).lstrip("._-") or "job"
    return JobSpec(path=script, name=stem, script=script)


def job_for_launch(target: str, name: str | None = None, nproc_per_node: str | None = None,
                   env: Sequence[str] = (), nnodes_range: tuple[int, int] | None = None,
                   workdir: str | None = None, sync: bool = False) -> JobSpec:
    """The job `distrun launch TARGET` runs: the job file read, or the training script's job built,
    with the command line's `--name`, `--nproc-per-node`, `--env`, `--nnodes MIN:MAX`, `--workdir`
    and `--sync` over it.

    Raises:
        UsageError: the script or a flag's value is wrong.
        SpecError: the job file is wrong.
    """
    job = job_from_script(target) if is_script(target) else load_job(target)
    if nnodes_range is not None:
        job = replace(job, min_nnodes=nnodes_range[0], nnodes=nnodes_range[1])
    if workdir is not None:
        problem = check_workdir(workdir)
        if problem:
            raise UsageError(f"--workdir {workdir!r}: {problem}")
        job = replace(job, workdir=workdir)
    if sync:
        job = replace(job, sync=True)
    return apply_overrides(job, name, nproc_per_node, env)


def apply_overrides(job: JobSpec, name: str | None = None, nproc_per_node: str | None = None,
                    env: Sequence[str] = ()) -> JobSpec:
    """The job with the command line's `--name`, `--nproc-per-node` and `--env` over its own values.

    Args:
        job: The job as read.
        name: `--name`.
        nproc_per_node: `--nproc-per-node`: a number, or `auto`.
        env: `--env KEY=VALUE` values; `KEY='${env:NAME}'` is a secret read from this shell.

    Raises:
        UsageError: a value is not valid (the flag named).
    """
    if name is not None:
        if not JOB_NAME.fullmatch(name):
            raise UsageError(f"--name {name!r}: not a job name (the name is part of job ids and file names: "
                             "use letters, digits, '.', '_' and '-')")
        job = replace(job, name=name)
    if nproc_per_node is not None:
        job = replace(job, nproc_per_node=parse_nproc(nproc_per_node))
    plain, secrets = dict(job.env), dict(job.secrets)
    for pair in env:
        key, value = parse_env(pair)
        plain.pop(key, None)
        secrets.pop(key, None)
        match = SECRET_REF.fullmatch(value)
        if match is not None:
            secrets[key] = match.group(1)
        else:
            plain[key] = value
    return replace(job, env=plain, secrets=secrets) if env else job


def parse_nproc(value: str) -> int | None:
    """`auto` -> None (one process per GPU, else 2); a number from 1 -> that number.

    Raises:
        UsageError: anything else.
    """
    if value == "auto":
        return None
    if value.isdigit() and int(value) >= 1:
        return int(value)
    raise UsageError(f"--nproc-per-node {value!r}: give a number from 1, or auto (one process per GPU)")


def parse_env(pair: str) -> tuple[str, str]:
    """`KEY=VALUE` -> (KEY, VALUE).

    Raises:
        UsageError: no `=`, KEY is not a variable name, or VALUE names a shell variable (`${NAME}`,
            `$NAME`) that is not set: the shell did not expand it, so it would arrive as written.
    """
    key, equals, value = pair.partition("=")
    if not equals:
        raise UsageError(f"--env {pair!r}: expected KEY=VALUE")
    if not ENV_NAME.fullmatch(key):
        raise UsageError(f"--env {pair!r}: {key!r} is not a variable name ({ENV_NAME_HINT})")
    if "${env:" in value and SECRET_REF.fullmatch(value) is None:
        raise UsageError(f"--env {pair!r}: ${{env:...}} must be the whole value")
    named = SHELL_REF.findall(value) if SECRET_REF.fullmatch(value) is None else []
    unset = next((name for name in named if name not in os.environ), None)
    if unset is not None:
        raise UsageError(f"--env {pair!r}: ${unset} is not set in this shell, and distrun passes values as written "
                         f"(export {unset}=... and write {key}='${{env:{unset}}}' to pass it as a secret)")
    return key, value


def job_to_yaml(job: JobSpec) -> str:
    """The job as a job file: every key that differs from its default, in the documented order.

    `job_from_text(job_to_yaml(job), path)` gives the same job back (its `path` aside).
    """
    return yaml.safe_dump(job_to_dict(job), sort_keys=False, default_flow_style=None, width=100)


def job_to_dict(job: JobSpec) -> dict[str, Any]:
    """The job file's keys and values for `job`, defaults left out (name, entry point and
    nproc_per_node always kept)."""
    data: dict[str, Any] = {"name": job.name}
    data.update({"module": job.module} if job.module else {"script": job.script})
    optional: dict[str, Any] = {
        "args": list(job.args),
        "nnodes": f"{job.min_nnodes}:{job.nnodes}" if job.min_nnodes else job.nnodes,
        "nproc_per_node": "auto" if job.nproc_per_node is None else job.nproc_per_node,
        "workdir": job.workdir,
        "env": {**job.env, **{k: f"${{env:{v}}}" for k, v in job.secrets.items()}},
        "rendezvous": _section(job.rendezvous, Rendezvous()),
        "max_restarts": job.max_restarts,
        "select": _section(job.select, Select()),
        "telemetry": _section(job.telemetry, Telemetry()),
        "sync": job.sync,
        "backend": job.backend,
        **{name: _plain(section) for name, section in job.backend_sections.items()},
        "heartbeat_timeout": job.heartbeat_timeout,
        "stop_grace": job.stop_grace,
        "hang_timeout": job.hang_timeout,
        "flight_recorder": job.flight_recorder,
        "stall_after": "off" if job.stall_after is None else job.stall_after,
        "restarts": _section(job.restarts, Restarts()),
        "checkpoint_dir": job.checkpoint_dir,
        "spares": job.spares,
        "fault_tolerance": vars(job.fault_tolerance) if job.fault_tolerance else None,
        "metrics_port": job.metrics_port,
    }
    for key, value in optional.items():
        default = getattr(_DEFAULTS, key, None)
        if key == "nproc_per_node" or (value not in (None, {}, []) and value != default):
            data[key] = value
    return data


Section = Rendezvous | Select | Telemetry | Restarts


def _section(value: Section, default: Section) -> dict[str, Any]:
    """A section's keys that differ from their defaults (tuples written as lists)."""
    fields = vars(value)
    return {k: list(v) if isinstance(v, tuple) else v for k, v in fields.items() if v != vars(default)[k]}


def _plain(node: Node) -> Any:
    """A backend's section as plain data (scalars as YAML read them)."""
    if isinstance(node, Map):
        return {key: _plain(value) for key, value in node.entries.items()}
    if isinstance(node, Seq):
        return [_plain(item) for item in node.items]
    if isinstance(node, Scalar):
        return node.value
    raise TypeError(node)
