"""Load and validate a job file: what to run, on how many nodes, with which environment.

A relative `script` is resolved against the job file's directory (`cd /tmp && distrun launch
/proj/jobs/tiny.yaml` finds /proj/jobs/train_resnet50.py), or, where no such file is there, against
the current directory (the rule of job files written before); it must exist. The JobSpec keeps
the path the hosts run in the workdir: relative to the current directory where the script lies
under it (`jobs/train_resnet50.py` from the project root), else absolute.

An `env` value that is exactly `${env:NAME}` is a secret: it goes to `JobSpec.secrets` and is
read from the controller's environment at launch, never stored.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from pathlib import Path, PurePosixPath
from typing import TypeVar

from orchestrator import registry
from orchestrator.errors import UsageError
from orchestrator.spec.fields import ENV_NAME, ENV_NAME_HINT, Reader, Source, describe, near_file
from orchestrator.spec.model import (
    RESTART_TRIGGERS,
    FaultTolerance,
    JobSpec,
    Rendezvous,
    Restarts,
    Select,
    Telemetry,
)
from orchestrator.spec.yamlsrc import Map, Node, Scalar, Seq, collect_lines, join_path, load_yaml, shown

T = TypeVar("T")

JOB_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
MODULE_NAME = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*")
SECRET_REF = re.compile(r"\$\{env:([^}]*)\}")
RENDEZVOUS_BACKENDS = ("static", "c10d")
# Timing bounds, in seconds. Heartbeats go once a second each way, so a host is declared lost
# only after several are missed; past the upper bounds a value is a typo (and 1e300 overflows a wait).
HEARTBEAT_TIMEOUT_BOUNDS = (3.0, 86400.0)
STOP_GRACE_BOUNDS = (0.0, 3600.0)
TELEMETRY_INTERVAL_BOUNDS = (0.25, 3600.0)
HANG_TIMEOUT_BOUNDS = (1.0, 7 * 86400.0)
STALL_AFTER_BOUNDS = HANG_TIMEOUT_BOUNDS
STALL_OFF = ("off", "false")  # `stall_after: off` (YAML reads it as false) or `false`
BACKOFF_BOUNDS = (0.0, 3600.0)
NNODES_RANGE = re.compile(r"(\d+):(\d+)")
SIZE = re.compile(r"(\d+(?:\.\d+)?)\s*([KMGT]?)(?:i?B)?", re.IGNORECASE)
SIZE_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
_NEEDS = "a job needs at least 'name' and 'script' or 'module'"
_ENTRY_KEYS = ("script", "module")


def load_job(path: str | Path) -> JobSpec:
    """Read and validate a job file.

    Args:
        path: The job file; shown in errors as given.

    Returns:
        The job.

    Raises:
        UsageError: The file cannot be read.
        SpecError: The file is not a valid job, or its `script` does not exist.
    """
    try:
        data = Path(path).read_bytes()
    except OSError as err:
        raise UsageError(f"cannot read job file {path}: {err.strerror or err}{near_file(str(path))}") from None
    return _job(load_yaml(data, str(path)), str(path))


def job_from_text(text: str, path: str) -> JobSpec:
    """Validate job text.

    Args:
        text: The YAML text.
        path: The file name shown in errors.

    Returns:
        The job.

    Raises:
        SpecError: The text is not a valid job, or its `script` does not exist.
    """
    return _job(load_yaml(text, path), path)


def _job(root: Node | None, file: str) -> JobSpec:
    src = Source(file)
    readers = _job_readers(src)
    top = src.mapping(src.document(root, _NEEDS), "", readers, required=("name",))
    _check_entry_point(src, top)
    values = src.fields(top, "", readers)
    if "env" in values:
        values["env"], values["secrets"] = values["env"]
    if isinstance(values.get("nnodes"), tuple):
        values["min_nnodes"], values["nnodes"] = values["nnodes"]
    sections = {name: values.pop(name) for name in registry.names() if name in values}
    if "fault_tolerance" in values:
        _check_groups(src, top, values)
    return JobSpec(path=file, **values, backend_sections=sections, lines=collect_lines(top))


def _job_readers(src: Source) -> dict[str, Reader]:
    return {
        "name": lambda node, path: _name(src, node, path),
        "script": lambda node, path: _script(src, node, path, Path(src.file).parent),
        "module": lambda node, path: _module(src, node, path),
        "args": src.strings,
        "nnodes": lambda node, path: _nnodes(src, node, path),
        "nproc_per_node": lambda node, path: src.auto_or_integer(node, path, 1),
        "workdir": lambda node, path: _workdir(src, node, path),
        "env": lambda node, path: _env(src, node, path),
        "rendezvous": lambda node, path: _section(src, node, path, Rendezvous, _rendezvous_readers(src)),
        "max_restarts": lambda node, path: src.integer(node, path, 0),
        "select": lambda node, path: _section(src, node, path, Select, {"names": src.strings, "labels": src.strings}),
        "telemetry": lambda node, path: _section(src, node, path, Telemetry, _telemetry_readers(src)),
        "sync": src.boolean,
        "sync_max_size": lambda node, path: _size(src, node, path),
        "backend": lambda node, path: src.choice(node, path, registry.names()),
        **{name: lambda node, path: _backend_section(src, node, path) for name in registry.names()},
        "heartbeat_timeout": lambda node, path: src.number(
            node, path, *HEARTBEAT_TIMEOUT_BOUNDS,
            hint="seconds of silence after which a host counts as lost; heartbeats go once a second, so a "
                 "shorter timeout would call a busy host lost"),
        "stop_grace": lambda node, path: src.number(
            node, path, *STOP_GRACE_BOUNDS, hint="seconds between SIGTERM and SIGKILL when a job is stopped"),
        "hang_timeout": lambda node, path: src.number(
            node, path, *HANG_TIMEOUT_BOUNDS, hint="seconds without progress from any rank before the job is a hang"),
        "flight_recorder": src.boolean,
        "stall_after": lambda node, path: _stall_after(src, node, path),
        "restarts": lambda node, path: _restarts(src, node, path),
        "checkpoint_dir": src.text,
        "spares": lambda node, path: src.integer(node, path, 0),
        "metrics_port": lambda node, path: src.integer(node, path, 1, 65535),
        "fault_tolerance": lambda node, path: _section(src, node, path, FaultTolerance, {
            "min_replicas": lambda value, key: src.integer(value, key, 1),
            "hosts_per_group": lambda value, key: src.integer(value, key, 1),
            "lighthouse_port": lambda value, key: src.integer(value, key, 1, 65535)}),
    }


def _check_groups(src: Source, top: Map, values: dict[str, object]) -> None:
    """`fault_tolerance` against `nnodes`: whole replica groups, at least `min_replicas` of them."""
    ft = values["fault_tolerance"]
    assert isinstance(ft, FaultTolerance)
    line = top.entries["fault_tolerance"].line
    if values.get("min_nnodes") is not None:
        raise src.error(line, "fault_tolerance", "does not combine with nnodes: MIN:MAX",
                        "give nnodes as a number: a lost replica group leaves the quorum instead")
    nnodes = values.get("nnodes")
    if not isinstance(nnodes, int):
        return
    if nnodes % ft.hosts_per_group:
        raise src.error(line, "fault_tolerance.hosts_per_group",
                        f"{ft.hosts_per_group} does not divide nnodes {nnodes}",
                        "make nnodes a multiple of hosts_per_group: every replica group has as many hosts")
    groups = nnodes // ft.hosts_per_group
    if ft.min_replicas > groups:
        raise src.error(line, "fault_tolerance.min_replicas",
                        f"{ft.min_replicas} is above the {groups} replica group(s) of nnodes {nnodes}",
                        "at most nnodes / hosts_per_group; fewer lets the job go on while a group is lost")


def _nnodes(src: Source, node: Node, path: str) -> int | tuple[int, int]:
    """`nnodes`: a number of hosts, or `MIN:MAX` as torchrun writes it (the job may go on with MIN).
    The text is read as written: YAML 1.1 takes an unquoted 1:2 for the number 62 (base 60)."""
    text = node.text.strip() if isinstance(node, Scalar) and isinstance(node.value, (str, int)) else ""
    if ":" not in text:
        return src.integer(node, path, 1)
    match = NNODES_RANGE.fullmatch(text)
    low, high = (int(match.group(1)), int(match.group(2))) if match else (0, 0)
    if not 1 <= low <= high:
        hint = "a number of hosts, or MIN:MAX with 1 <= MIN <= MAX (the job may go on with MIN hosts)"
        raise src.error(node.line, path, f"must be an integer >= 1 or MIN:MAX, got {shown(text)}", hint)
    return low, high


def _stall_after(src: Source, node: Node, path: str) -> float | None:
    """`stall_after`: seconds without progress before distrun explains a stall, or `off` (None)."""
    off = isinstance(node, Scalar) and (node.value is False or node.value == "off")
    if off and node.text.strip("'\"") in STALL_OFF:
        return None
    value = node.value if isinstance(node, Scalar) else None
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        raise src.error(node.line, path, f"must be a number or off, got {describe(node)}",
                        "seconds without progress from any rank, or off")
    return src.number(node, path, *STALL_AFTER_BOUNDS,
                      hint="seconds without progress from any rank before distrun dumps every rank's stack "
                           "(the job goes on), or off")


def _restarts(src: Source, node: Node, path: str) -> Restarts:
    """`restarts: {max: N, backoff: SECONDS, on: [host-lost, rank-failed, hang]}`."""
    readers: dict[str, Reader] = {
        "max": lambda value, key: src.integer(value, key, 0, 1000),
        "backoff": lambda value, key: src.number(value, key, *BACKOFF_BOUNDS,
                                                 hint="seconds between a failed attempt and the next"),
        "on": lambda value, key: _triggers(src, value, key),
    }
    return Restarts(**src.fields(node, path, readers))  # type: ignore[arg-type]


def _triggers(src: Source, node: Node, path: str) -> tuple[str, ...]:
    """`restarts.on`: a non-empty list of RESTART_TRIGGERS."""
    if not isinstance(node, Seq) or not node.items:
        hint = f"list the failures that restart the job: any of {', '.join(RESTART_TRIGGERS)}"
        raise src.error(node.line, path, f"must be a non-empty list, got {describe(node)}", hint)
    return tuple(dict.fromkeys(src.choice(item, f"{path}[{index}]", RESTART_TRIGGERS)
                               for index, item in enumerate(node.items)))


def _rendezvous_readers(src: Source) -> dict[str, Reader]:
    return {
        "backend": lambda node, path: src.choice(node, path, RENDEZVOUS_BACKENDS),
        "port": lambda node, path: src.auto_or_integer(node, path, 1, 65535),
        "report_after": lambda node, path: src.number(node, path, 1, 86400, hint=(
            "seconds the hosts may wait at the rendezvous before distrun names those that never joined")),
    }


def _telemetry_readers(src: Source) -> dict[str, Reader]:
    return {"interval": lambda node, path: src.number(node, path, *TELEMETRY_INTERVAL_BOUNDS,
                                                      hint="seconds between two samples of each host"),
            "enabled": src.boolean}


def _backend_section(src: Source, node: Node, path: str) -> Map:
    """A backend's section: a mapping, whose keys and values that backend checks when it is used."""
    if not isinstance(node, Map):
        raise src.error(node.line, path, f"must be a mapping, got {describe(node)}",
                        f"the {path} backend's options, e.g. {path}: {{key: value}}")
    return node


def _size(src: Source, node: Node, path: str) -> int:
    """A size in bytes: an integer, or a number with K, M, G or T (powers of 1024; `512MiB`, `2G`)."""
    text = src.string(node, path).strip()
    match = SIZE.fullmatch(text)
    size = int(float(match.group(1)) * SIZE_UNITS[match.group(2).upper()]) if match else 0
    if size < 1:
        hint = "write bytes, or a number with K, M, G or T, powers of 1024: 512MiB, 2G"
        raise src.error(node.line, path, f"must be a size of at least 1 byte, got {describe(node)}", hint)
    return size


def _section(src: Source, node: Node, path: str, kind: Callable[..., T], readers: dict[str, Reader]) -> T:
    return kind(**src.fields(node, path, readers))


def _check_entry_point(src: Source, top: Map) -> None:
    present = [key for key in _ENTRY_KEYS if key in top.entries]
    if not present:
        hint = "'script: path/to/train.py' runs a file, 'module: package.module' runs python -m"
        raise src.error(top.line, "", "missing required key 'script' or 'module'", hint)
    if len(present) > 1:
        later = max(present, key=lambda key: top.key_lines[key])
        raise src.error(top.key_lines[later], later, "set either 'script' or 'module', not both")


def _name(src: Source, node: Node, path: str) -> str:
    name = src.string(node, path)
    if not JOB_NAME.fullmatch(name):
        hint = "the name is part of job ids and file names: use letters, digits, '.', '_' and '-'"
        raise src.error(node.line, path, f"invalid job name {name!r}", hint)
    return name


def _script(src: Source, node: Node, path: str, base: Path) -> str:
    """`script`: a file, a relative path read from `base` (the job file's directory) first, then
    from the current directory; as the hosts run it from the workdir (see the module's docstring)."""
    script = src.string(node, path)
    near = script if script.startswith(("/", "~")) else os.path.join(base, script)
    for candidate in dict.fromkeys((near, script)):
        if missing_file(candidate) is None:
            return script if candidate == script else from_here(candidate)
    problem = missing_file(near)
    if problem == "file not found" and near != script:
        problem = missing_file(script)
    if script.startswith(("/", "~")):
        hint = "check the path"
    else:
        hint = (f"a relative path is read from the job file's directory {base.resolve()}, then from the "
                f"current directory {Path.cwd()}; give it from the job file's directory, or an absolute path")
    raise src.error(node.line, path, f"{problem}: {shown(script)}", hint)


def from_here(path: str) -> str:
    """`path` relative to the current directory where it lies under it, else absolute."""
    absolute = os.path.abspath(path)
    relative = os.path.relpath(absolute)
    return absolute if relative == ".." or relative.startswith("../") else relative


def missing_file(script: str) -> str | None:
    """Why `script` does not name a file, or None when it does."""
    try:
        resolved = Path(os.path.expanduser(script))
        if resolved.is_file():
            return None
        return "is a directory, not a file" if resolved.is_dir() else "file not found"
    except (OSError, ValueError) as err:
        # A name too long, a directory we may not search, a NUL character.
        return f"cannot check the file ({err})"


def _module(src: Source, node: Node, path: str) -> str:
    module = src.string(node, path)
    if not MODULE_NAME.fullmatch(module):
        raise src.error(node.line, path, f"not a Python module name: {module!r}", "write it like package.module")
    return module


WORKDIR_HINT = "the job runs in this directory on every host: write /path or ~/path"


def _workdir(src: Source, node: Node, path: str) -> str:
    workdir = src.string(node, path)
    if check_workdir(workdir):
        raise src.error(node.line, path, f"must be an absolute path, got {workdir!r}", WORKDIR_HINT)
    return workdir


def check_workdir(workdir: str) -> str:
    """Why `workdir` cannot be the hosts' workdir ("" when it can: an absolute path or ~/path)."""
    if PurePosixPath(workdir).is_absolute() or workdir.startswith("~"):
        return ""
    return f"must be an absolute path ({WORKDIR_HINT})"


def _env(src: Source, node: Node, path: str) -> tuple[dict[str, str], dict[str, str]]:
    """Plain variables, and secrets: variable -> the controller's variable it is read from."""
    env: dict[str, str] = {}
    secrets: dict[str, str] = {}
    for name, value in src.env(node, path).items():
        var_path = join_path(path, name)
        text = src.string(value, var_path)
        if "${env:" not in text:
            env[name] = text
            continue
        match = SECRET_REF.fullmatch(text)
        if match is None:
            hint = f'give the secret a variable of its own, e.g. {name}_SECRET: "${{env:NAME}}"'
            raise src.error(value.line, var_path, "${env:...} must be the whole value", hint)
        if not ENV_NAME.fullmatch(match.group(1)):
            raise src.error(value.line, var_path, f"{match.group(1)!r} is not a valid variable name", ENV_NAME_HINT)
        secrets[name] = match.group(1)
    return env, secrets
