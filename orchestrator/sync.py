"""`sync: true`: copy the job's local directory to each host's workdir before launch.

The job's local directory is the controller's current directory (where relative `script`
paths resolve). Each host reports a sha256 manifest of its workdir; only files that differ
travel, as one tar over the command's stdin, so a host costs one round trip either way.
`.distrunignore` (gitignore-style patterns, one per line) and a few defaults are skipped.
"""

from __future__ import annotations

import fnmatch
import hashlib
import io
import json
import os
import tarfile
from pathlib import Path

from orchestrator.group import Group
from orchestrator.plan import LaunchPlan
from orchestrator.transport import Transport, run_remote

IGNORE_FILE = ".distrunignore"
DEFAULT_IGNORES = (".git", ".venv", "venv", "__pycache__", "*.pyc", ".pytest_cache", ".ruff_cache",
                   ".hypothesis", "*.egg-info", ".distrun")
SYNC_TIMEOUT = 600.0


def ignore_patterns(root: Path) -> list[str]:
    patterns = list(DEFAULT_IGNORES)
    path = root / IGNORE_FILE
    if path.exists():
        for line in path.read_text(encoding="utf-8").splitlines():
            line = line.strip()
            if line and not line.startswith("#"):
                patterns.append(line.rstrip("/"))
    return patterns


def ignored(rel: str, patterns: list[str]) -> bool:
    """A path is ignored when any of its parts, or the whole relative path, matches a pattern."""
    parts = rel.split("/")
    return any(fnmatch.fnmatch(rel, p) or any(fnmatch.fnmatch(part, p) for part in parts) for p in patterns)


def local_manifest(root: Path) -> dict[str, str]:
    """{relative path: sha256} of the files under root that are not ignored."""
    patterns = ignore_patterns(root)
    found: dict[str, str] = {}
    for base, dirs, files in os.walk(root):
        rel_base = os.path.relpath(base, root)
        dirs[:] = [d for d in dirs if not ignored(os.path.normpath(os.path.join(rel_base, d)), patterns)]
        for name in files:
            rel = os.path.normpath(os.path.join(rel_base, name))
            path = root / rel
            if not path.is_symlink() and not ignored(rel, patterns):
                found[rel] = hashlib.sha256(path.read_bytes()).hexdigest()
    return found


def tar_of(root: Path, names: list[str]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for name in sorted(names):
            tar.add(root / name, arcname=name, recursive=False)
    return buffer.getvalue()


def sync_host(transport: Transport, root: Path, workdir: str, wanted: dict[str, str]) -> int:
    """Bring one host's workdir up to date; returns how many files were sent."""
    remote = json.loads(run_remote(transport, "unpack", ["unpack"], b"", workdir, "manifest",
                                   timeout=SYNC_TIMEOUT).strip().splitlines()[-1])
    changed = [name for name, digest in wanted.items() if remote.get(name) != digest]
    if not changed:
        return 0
    run_remote(transport, "unpack", ["unpack"], tar_of(root, changed), workdir, "unpack", timeout=SYNC_TIMEOUT)
    return len(changed)


def sync_workdirs(plan: LaunchPlan, group: Group, root: Path) -> dict[str, int]:
    """Sync every host at once.

    Returns:
        {node: files sent}.

    Raises:
        GroupError: a host could not be synced (each one named).
    """
    wanted = local_manifest(root)
    hosts = {h.node: h.workdir for h in plan.hosts}
    return group.run(lambda t: sync_host(t, root, hosts[t.name], wanted)).check("workdir sync failed")
