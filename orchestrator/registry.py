"""Backends by NAME: distrun's own and those of installed packages (torchx loads its schedulers the same way).

A backend is a class that fulfils `orchestrator.backends.base.Backend`, registered as an entry point
of the group `distrun.backends` (`NAME = "module:Class"`): distrun's own three in its pyproject.toml,
a team's in the package that ships it (ARCHITECTURE.md, "Extension points"). The entry points are
read once, when a name is first asked for, and no backend is imported here: the job loader
(spec/job.py) reads the names to accept `backend: NAME` and each backend's section of a job file, the
CLI offers them, and `orchestrator.backends.get` imports a backend only when one is used.
"""

from __future__ import annotations

import functools

GROUP = "distrun.backends"
# distrun's own, as its pyproject.toml registers them (the first is the default); also what a checkout
# that is not installed (no entry points) has. A package's entry point with one of these names is
# not taken: the names are distrun's.
BUILT_IN: dict[str, str] = {
    "ssh": "orchestrator.backends.ssh:SshBackend",
    "local": "orchestrator.backends.local:LocalBackend",
    "slurm": "orchestrator.backends.slurm:SlurmBackend",
}
DEFAULT = next(iter(BUILT_IN))
# NAME -> "module:Class": distrun's own, then the installed packages' by name (filled at first use).
REGISTRY: dict[str, str] = dict(BUILT_IN)


@functools.cache
def _installed() -> None:
    """Add the installed packages' backends to REGISTRY, once."""
    from importlib import metadata

    found = {ep.name: ep.value for ep in metadata.entry_points(group=GROUP) if ep.name not in BUILT_IN}
    REGISTRY.update(sorted(found.items()))


def names() -> tuple[str, ...]:
    """Every backend's NAME, the default first."""
    _installed()
    return tuple(REGISTRY)


def target(name: str) -> str | None:
    """The `module:Class` registered under `name`, or None."""
    _installed()
    return REGISTRY.get(name)
