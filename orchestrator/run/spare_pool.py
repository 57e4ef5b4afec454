"""Spares that several controllers share, each handed to one of them only: a fault-tolerant job's
replica groups (run/ft/replicas.py) all may take the job's spares, and two groups that lose a host at
the same time must not both take the first.

The pool is a JSON file of claims (spare -> the job that took it), read and written under an
exclusive lock (flock), so a controller picks its spares and claims them in one step. A claim is
never given back: a spare a group took and lost stays out of the others' reach, as a quarantined
host stays out of a job's. The parent controller names the file in `POOL_ENV` for its children.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

POOL_ENV = "DISTRUN_SPARE_POOL"


@dataclass(frozen=True)
class SparePool:
    """The claims file, and the job that claims through this handle."""

    path: Path
    owner: str

    @classmethod
    def from_env(cls, owner: str) -> SparePool | None:
        """The pool the parent controller named in `POOL_ENV`, else None (a job on its own)."""
        path = os.environ.get(POOL_ENV)
        return cls(Path(path), owner) if path else None

    @contextlib.contextmanager
    def claims(self) -> Iterator[dict[str, str]]:
        """The claims, locked against every other controller until the block ends; what the block
        adds is written back."""
        with self.path.open("a+", encoding="utf-8") as held:
            fcntl.flock(held, fcntl.LOCK_EX)
            held.seek(0)
            text = held.read()
            claims: dict[str, str] = json.loads(text) if text.strip() else {}
            before = dict(claims)
            yield claims
            if claims != before:
                held.seek(0)
                held.truncate()
                held.write(json.dumps(claims, indent=1, sort_keys=True))
                held.flush()

    def free(self, spares: tuple[str, ...], claims: dict[str, str]) -> tuple[str, ...]:
        """The spares no other job claimed."""
        return tuple(s for s in spares if claims.get(s, self.owner) == self.owner)

    def take(self, hosts: tuple[str, ...], spares: tuple[str, ...], claims: dict[str, str]) -> None:
        """Claim the spares among `hosts`."""
        claims.update({host: self.owner for host in hosts if host in spares})
