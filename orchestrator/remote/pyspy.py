"""Where py-spy is on a host, and whether the kernel lets it trace the ranks; shared by the probe
(doctor's `py-spy` check) and remote/stack.py."""

from __future__ import annotations

import os
import shutil
import sys

PTRACE_SCOPE = "/proc/sys/kernel/yama/ptrace_scope"


def find_pyspy() -> str | None:
    """py-spy beside this python (its venv's bin, where `pip install py-spy` puts it), else on PATH."""
    beside = os.path.join(os.path.dirname(sys.executable), "py-spy")
    if os.access(beside, os.X_OK):
        return beside
    return shutil.which("py-spy")


def ptrace_scope() -> int | None:
    """kernel.yama.ptrace_scope (0-3); None where Yama is not built in (classic ptrace rules)."""
    try:
        with open(PTRACE_SCOPE, encoding="ascii") as fh:
            return int(fh.read().strip())
    except (OSError, ValueError):
        return None


def facts() -> dict[str, object]:
    """What the probe reports: py-spy's path (None: missing), ptrace_scope, and this user's uid."""
    return {"path": find_pyspy(), "ptrace_scope": ptrace_scope(), "uid": os.getuid()}
