"""Where a job runs: one module per backend (ssh, local, slurm) behind the contract in base.py.

The backends are named in orchestrator/registry.py (distrun's own and installed packages' entry points);
`get` imports one only when it is used.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from orchestrator import registry

if TYPE_CHECKING:
    from orchestrator.backends.base import Backend


def get(name: str) -> type[Backend]:
    """The backend class registered under `name`, imported now.

    Raises:
        KeyError: no backend has that name (names come validated from the job file or the CLI).
    """
    registered = registry.target(name)
    if registered is None:
        raise KeyError(name)
    module, _, cls = registered.partition(":")
    backend: type[Backend] = getattr(importlib.import_module(module), cls)
    return backend
