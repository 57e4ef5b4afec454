"""Shared test helpers: run the real `distrun` command in a subprocess."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def distrun(*args: str, home: Path, env: dict[str, str] | None = None, timeout: float = 300,
            cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
    """Run `python -m orchestrator ARGS` with DISTRUN_HOME=home; stdout/stderr captured."""
    # No user config file either (a test that wants one sets XDG_CONFIG_HOME).
    full_env = {**os.environ, "DISTRUN_HOME": str(home), "OMP_NUM_THREADS": "1",
                "XDG_CONFIG_HOME": str(home / "no-config"), **(env or {})}
    full_env.pop("DISTRUN_INVENTORY", None)
    return subprocess.run(
        [sys.executable, "-m", "orchestrator", *args], cwd=cwd, env=full_env, capture_output=True,
        text=True, timeout=timeout, check=False,
    )
