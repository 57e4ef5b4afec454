"""The example jobs that ship with distrun (package data: `orchestrator/examples`, a link to the
checkout's jobs/), and `distrun examples`, which copies them out of an install to run or edit."""

from __future__ import annotations

from importlib import resources
from importlib.abc import Traversable
from pathlib import Path

from orchestrator.errors import UsageError

SKIPPED = ("__pycache__",)


def examples() -> Traversable:
    """The bundled example jobs, found as installed (a wheel, an editable install or a checkout)."""
    return resources.files("orchestrator") / "examples"


def _files(root: Traversable, prefix: Path = Path()) -> list[tuple[Path, Traversable]]:
    """(relative path, file) of every file under `root`, caches left out, in name order."""
    found: list[tuple[Path, Traversable]] = []
    for item in sorted(root.iterdir(), key=lambda t: t.name):
        if item.name in SKIPPED:
            continue
        if item.is_dir():
            found += _files(item, prefix / item.name)
        else:
            found.append((prefix / item.name, item))
    return found


def copy_examples(dest: Path) -> list[Path]:
    """Copy the example jobs into `dest` (made when missing); never over a file already there.

    Returns:
        The paths written, under `dest`.

    Raises:
        UsageError: a file of the examples exists in `dest` already, or `dest` is not a directory.
    """
    files = _files(examples())
    if dest.exists() and not dest.is_dir():
        raise UsageError(f"examples: {dest} is not a directory (name a new or an empty directory)")
    clashes = [str(dest / rel) for rel, _ in files if (dest / rel).exists()]
    if clashes:
        raise UsageError(f"examples: {clashes[0]} exists, and {len(clashes) - 1} more "
                         f"(name a new or an empty directory: distrun examples DIR)")
    written = []
    for rel, item in files:
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(item.read_bytes())
        written.append(target)
    return written
