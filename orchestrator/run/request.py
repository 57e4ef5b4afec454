"""What `distrun launch` was asked (the CLI's request), and how to ask it again.

The run loop reads it; a backend sees only what it asks of the backend (`Asked`, backends/base.py),
so the request lives here, above the backend contract.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TextIO

from orchestrator.backends.base import Asked
from orchestrator.console.display import fold_hosts
from orchestrator.spec.select import HostSelection, SelectionGuard


@dataclass
class LaunchRequest:
    """Everything `distrun launch` was asked, before any file is read.

    `job_file` is a job file, or a training script (`train.py`) whose job is built from the
    request's flags; `name`, `nproc_per_node`, `env`, `workdir` and `sync` go over the job's own values either way
    (`spec.overrides.job_for_launch` reads it).
    """

    job_file: str
    inventory: str | None = None
    selection: HostSelection = field(default_factory=HostSelection)
    nnodes: int | None = None
    nnodes_range: tuple[int, int] | None = None  # `--nnodes MIN:MAX`, over the job's nnodes (nnodes is then None)
    dry_run: bool = False
    probe: bool = False  # with dry_run: reach the hosts to fill in what only a probe knows
    skip_preflight: bool = False
    backend: str | None = None
    live: bool = True
    collapse: bool = False  # fold identical lines of several ranks on screen
    metrics_lines: bool = False  # show the ranks' DISTRUN_METRICS/DISTRUN_CHECKSUM lines on screen
    job_id: str | None = None
    quiet: bool = False
    extra_args: list[str] = field(default_factory=list)
    options: list[str] = field(default_factory=list)  # `-o KEY=VALUE` pairs, as given
    name: str | None = None
    nproc_per_node: str | None = None  # a number or "auto", as given
    env: list[str] = field(default_factory=list)  # `--env KEY=VALUE` pairs, as given
    workdir: str | None = None  # `--workdir PATH`: where the ranks start on each host
    sync: bool = False  # `--sync`: copy the current directory to each host's workdir first
    guard: SelectionGuard | None = None  # the rule for an implicit selection of many hosts; None: none
    internal: bool = False  # a run distrun makes for itself: never `last`
    metrics_port: int | None = None  # `--metrics-port`, over the job's `metrics_port`
    metrics_addr: str = "127.0.0.1"  # where the endpoint listens (`--metrics-addr`)

    def asked(self) -> Asked:
        """What this request asks of the backend."""
        return Asked(self.inventory, self.selection, self.nnodes, self.guard, tuple(self.extra_args), self.dry_run,
                     self.probe)

    def reproduce(self, hosts: Sequence[str], inventory: str, spares: Sequence[str] = ()) -> list[str]:
        """The `distrun launch` arguments that start this job again on `hosts` (the report's
        "Launched as"): the job, the inventory, the hosts and spares as one range, and every flag
        that changed the job; `--nnodes` whenever it was given or spares follow the hosts.

        Args:
            hosts: The job's hosts (of its current attempt).
            inventory: The inventory's path as recorded (`<built-in>` for this machine's).
            spares: The hosts kept aside for restarts, not used yet.
        """
        args = [os.path.abspath(self.job_file)]
        if not inventory.startswith("<"):
            args += ["-i", inventory]
        args += ["--nodes", fold_hosts([*hosts, *spares])] if hosts else []
        if self.nnodes_range is not None:
            args += ["--nnodes", f"{self.nnodes_range[0]}:{self.nnodes_range[1]}"]
        elif self.nnodes or spares:
            args += ["--nnodes", str(len(hosts) if hosts else self.nnodes)]
        args += ["--backend", self.backend] if self.backend else []
        for flag, values in (("-o", self.options), ("--env", self.env)):
            for value in values:
                args += [flag, value]
        args += ["--name", self.name] if self.name else []
        args += ["--nproc-per-node", self.nproc_per_node] if self.nproc_per_node else []
        args += ["--workdir", self.workdir] if self.workdir else []
        args += ["--sync"] if self.sync else []
        return args + (["--", *self.extra_args] if self.extra_args else [])


def terminal_for(request: LaunchRequest) -> TextIO | None:
    """Where a launch's lines are shown: stdout, or nowhere for a detached controller."""
    return None if request.quiet else sys.stdout
