"""Backends by NAME, imported lazily (torchx's scheduler registry is the model).

This module is the registry and nothing else: it imports no other part of distrun, so the job
loader (spec/job.py) can read the names to accept `backend: NAME` and each backend's section of
a job file, while the backends themselves are imported only when one is used. The contract a
backend fulfils is `orchestrator.backends.base.Backend`; adding one is one module with one class
and one line here.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from orchestrator.backends.base import Backend

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


def get(name: str) -> type[Backend]:
    """The backend class registered under `name`, imported now.

    Raises:
        KeyError: no backend has that name (names come validated from the job file or the CLI).
    """
    module, _, cls = REGISTRY[name].partition(":")
    backend: type[Backend] = getattr(importlib.import_module(module), cls)
    return backend
