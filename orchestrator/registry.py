"""Backends by NAME: the one list of them (torchx's scheduler registry is the model).

It imports nothing, so the job loader (spec/job.py) reads the names to accept `backend: NAME` and each
backend's section of a job file, the CLI offers them, and `orchestrator.backends.get` imports a backend
only when one is used. Adding a backend is one module under orchestrator/backends/ with one class that
fulfils `orchestrator.backends.base.Backend`, and one line here (ARCHITECTURE.md, "Extension points").
"""

from __future__ import annotations

# NAME -> "module:Class". The first is the default.
REGISTRY: dict[str, str] = {
    "ssh": "orchestrator.backends.ssh:SshBackend",
    "local": "orchestrator.backends.local:LocalBackend",
    "slurm": "orchestrator.backends.slurm:SlurmBackend",
}
DEFAULT = next(iter(REGISTRY))


def names() -> tuple[str, ...]:
    """Every backend's NAME, the default first."""
    return tuple(REGISTRY)
