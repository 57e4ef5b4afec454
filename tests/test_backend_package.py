"""A backend shipped as a package of its own: installed with pip, found by its `distrun.backends` entry
point, and run by `distrun launch --backend NAME` with no change to distrun (issue 47, part 6)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib

from orchestrator import registry
from tests.helpers import REPO, job_lines

WORKER = REPO / "tests" / "cluster" / "jobs" / "worker.py"
PACKAGE = """\
[build-system]
requires = ["setuptools"]
build-backend = "setuptools.build_meta"

[project]
name = "distrun-toy"
version = "0.1"

[project.entry-points."distrun.backends"]
toy = "distrun_toy:ToyBackend"
"""


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The toy backend (tests/toy_backend.py) as the package `distrun-toy`, pip-installed into a folder."""
    source, target = tmp_path_factory.mktemp("toy-src"), tmp_path_factory.mktemp("toy-site")
    (source / "pyproject.toml").write_text(PACKAGE)
    shutil.copy(REPO / "tests" / "toy_backend.py", source / "distrun_toy.py")
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
                    "--target", str(target), str(source)], check=True, capture_output=True, timeout=300)
    return target


def distrun(site: Path, home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "DISTRUN_HOME": str(home), "PYTHONPATH": os.pathsep.join([str(site), str(REPO)])}
    return subprocess.run([sys.executable, "-m", "orchestrator", *args], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=300)


def test_distruns_own_backends_are_registered_as_entry_points_too() -> None:
    declared = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["entry-points"][registry.GROUP]
    assert declared == registry.BUILT_IN and registry.names()[0] == registry.DEFAULT == "ssh"


def test_a_backend_installed_as_a_package_runs_a_two_host_job(installed: Path, tmp_path: Path) -> None:
    job = tmp_path / "job.yaml"
    job.write_text(f"name: toy\nscript: {WORKER}\nnproc_per_node: 1\nenv: {{OMP_NUM_THREADS: '1'}}\n"
                   "telemetry: {enabled: false}\n")
    listed = distrun(installed, tmp_path / "home", "launch", "--help")
    assert "toy" in listed.stdout, listed.stdout
    ran = distrun(installed, tmp_path / "home", "launch", str(job), "--backend", "toy", "--skip-preflight",
                  "--no-live", "--job-id", "toy-pkg-1")
    assert ran.returncode == 0, ran.stdout + ran.stderr
    record = json.loads(distrun(installed, tmp_path / "home", "ps", "--json").stdout)[0]
    assert (record["state"], record["backend"], record["hosts"]) == ("succeeded", "toy", ["toy0", "toy1"])
    log = job_lines(tmp_path / "home" / "jobs" / "toy-pkg-1")
    assert log.count("ALLREDUCE 3") == 2  # 1 + 2 summed across the two hosts
    assert "DONE 0/2" in log and "DONE 1/2" in log


def test_without_the_package_the_name_is_refused_in_one_line(tmp_path: Path) -> None:
    job = tmp_path / "job.yaml"
    job.write_text(f"name: toy\nscript: {WORKER}\nbackend: toy\n")
    ran = distrun(tmp_path, tmp_path / "home", "launch", str(job), "--skip-preflight", "--no-live")
    assert ran.returncode == 2 and "Traceback" not in ran.stderr
    assert "toy" in ran.stderr and "ssh" in ran.stderr, ran.stderr
