"""The supervisor's configuration: one typed record, its defaults, and its one wire form.

The controller builds it (the SSH and local paths send it as the first line of the supervisor's
stdin; the Slurm path writes it, less what each node fills in, into the job directory) and the
supervisor reads it back. The defaults are the job spec's (a test pins them to spec/model.py).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from typing import Any

DEFAULT_HEARTBEAT_TIMEOUT = 6.0  # = spec.model.DEFAULT_HEARTBEAT_TIMEOUT
DEFAULT_STOP_GRACE = 5.0  # = spec.model.DEFAULT_STOP_GRACE


@dataclass(frozen=True)
class SupervisorConfig:
    """What one host's supervisor runs and how.

    Attributes:
        job_id: The job's id (its processes carry it in their environment).
        node: The host's name in the plan.
        argv: torchrun's command line.
        env: Variables set over the host's own (the job's secrets included).
        cwd: The job's working directory (`~` is the host's home); None: the supervisor's own.
        heartbeat_timeout: Seconds without the controller's heartbeat before the job is ended;
            None: a scheduler owns the job's lifetime (no heartbeat on stdin).
        stop_grace: Seconds between SIGTERM and SIGKILL when the job is stopped.
        telemetry_interval: Seconds between telemetry samples; None: no sampling.
        secret_names: The variables of `env` whose values are masked in the job's lines.
        first_rank: The host's first global rank.
        exact_ranks: Whether ranks follow from `first_rank` (static rendezvous; not under c10d).
        attempt: The controller's attempt (DISTRUN_ATTEMPT) the lines belong to.
        make_dirs: Directories created before torchrun starts (the checkpoint directory).
        host_dir: Where the host keeps its copy of the job's lines.
        programs: The programs `argv` runs by name ({file name: source}), written to the job's
            `bin/` under host_dir before torchrun starts (remote/programs.py).
    """

    job_id: str
    node: str
    argv: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    cwd: str | None = None
    heartbeat_timeout: float | None = DEFAULT_HEARTBEAT_TIMEOUT
    stop_grace: float = DEFAULT_STOP_GRACE
    telemetry_interval: float | None = None
    secret_names: list[str] = field(default_factory=list)
    first_rank: int = 0
    exact_ranks: bool = True
    attempt: int = 1
    make_dirs: list[str] = field(default_factory=list)
    host_dir: str = "~/.distrun"
    programs: dict[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def to_line(self) -> bytes:
        """The wire form: one JSON object and a newline."""
        return json.dumps(self.to_dict()).encode() + b"\n"

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SupervisorConfig:
        """The configuration from its JSON object; absent keys take their defaults.

        Raises:
            ValueError: a key this supervisor does not know, or job_id/node missing.
        """
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown configuration key(s): {', '.join(unknown)}")
        if "job_id" not in data or "node" not in data:
            raise ValueError("the configuration needs job_id and node")
        return cls(**data)

    @classmethod
    def from_line(cls, line: bytes) -> SupervisorConfig:
        """The configuration from its wire form.

        Raises:
            ValueError: not a JSON object, or not a configuration (`from_dict`).
        """
        data = json.loads(line)
        if not isinstance(data, dict):
            raise ValueError("the configuration is not a JSON object")
        return cls.from_dict(data)
