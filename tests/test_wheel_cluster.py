"""distrun installed from its wheel, not from this checkout: the README's quick start, as printed,
from an empty directory, against the namespace lab.

The wheel is built from this checkout and installed with its dependencies in a fresh virtualenv
outside it (pip's cache keeps that quick after the first run); nothing of the checkout is on the
controller's path, so a file looked for beside the package (jobs/, the supervisor) shows as missing."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.cluster.harness import Cluster
from tests.helpers import REPO

pytestmark = pytest.mark.cluster

FENCE = re.compile(r"^```sh\n(.*?)^```", re.S | re.M)
INSTALL_TIMEOUT = 600
LINE_TIMEOUT = 300


def quick_start() -> list[str]:
    """The lines of the README install section's block that starts with `distrun examples`."""
    text = (REPO / "README.md").read_text(encoding="utf-8")
    start = text.index("\n## Install on a controller\n")
    section = text[start:text.index("\n## ", start + 1)]
    block = next(body for body in FENCE.findall(section) if body.startswith("distrun examples"))
    return [line for line in block.splitlines() if line.strip()]


def installed(tmp_path: Path) -> Path:
    """A fresh virtualenv with distrun installed from a wheel of this checkout; returns its bin/."""
    wheels, venv = tmp_path / "dist", tmp_path / "venv"
    source = source_tree(tmp_path / "src")
    run(sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(wheels), str(source), cwd=tmp_path)
    run(sys.executable, "-m", "venv", str(venv), cwd=tmp_path)
    run(str(venv / "bin" / "pip"), "install", "-q", *map(str, wheels.glob("distrun-*.whl")), cwd=tmp_path)
    return venv / "bin"


def source_tree(dest: Path) -> Path:
    """The checkout's files as git sees them (tracked, and untracked but not ignored), links kept as links:
    a build in the checkout itself would reuse its build/ directory, which keeps files deleted since."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                            capture_output=True, text=True, check=True).stdout.split("\0")
    for rel in filter(None, listed):
        src, target = REPO / rel, dest / rel
        if src.is_symlink() or src.is_file():
            target.parent.mkdir(parents=True, exist_ok=True)
            if src.is_symlink():
                target.symlink_to(os.readlink(src))
            else:
                shutil.copy2(src, target)
    return dest


def run(*argv: str, cwd: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=INSTALL_TIMEOUT)
    assert done.returncode == 0, f"{argv}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"


def test_the_readme_quick_start_runs_from_a_wheel_in_an_empty_directory(cluster3: Cluster, tmp_path: Path) -> None:
    bin_dir = installed(tmp_path)
    cluster3.write_inventory(tmp_path / "lab.yaml")
    here = tmp_path / "quickstart"
    here.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "DISTRUN_INVENTORY", "VIRTUAL_ENV")}
    env |= {"PATH": f"{bin_dir}:/usr/local/bin:/usr/bin:/bin", "DISTRUN_HOME": str(tmp_path / "home"),
            "XDG_CONFIG_HOME": str(tmp_path / "config"), "DISTRUN_SSH_CONFIG": str(tmp_path / "no-ssh-config")}
    package = subprocess.run(["python", "-c", "import orchestrator; print(orchestrator.__file__)"], cwd=here,
                             env=env, capture_output=True, text=True, check=True).stdout
    assert package.startswith(str(bin_dir.parent)), package

    outputs = {}
    for line in quick_start():
        command = line.replace("/tmp/", f"{tmp_path}/")
        result = subprocess.run(["bash", "-c", command], cwd=here, env=env, capture_output=True, text=True,
                                timeout=LINE_TIMEOUT, check=False)
        assert result.returncode == 0, f"{line}\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
        assert "Traceback" not in result.stderr, line
        outputs[line.split()[1]] = result.stdout

    assert (here / "jobs" / "train_resnet50.py").is_file()
    assert re.search(r"^✓ bandwidth .*busbw", outputs["doctor"], re.M), outputs["doctor"]
    assert re.search(r"^quick-\S+ +succeeded ", outputs["ps"], re.M), outputs["ps"]
    assert "[node1 r1] DISTRUN_METRICS" in outputs["logs"], outputs["logs"]
