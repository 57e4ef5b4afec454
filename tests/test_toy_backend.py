"""A fourth backend in one file against the contract (tests/toy_backend.py): what it imports, and the run
loop's verdict when one of its two hosts (each a local torchrun) fails. Its job running to success, as
a package installed on its own, is tests/test_backend_package.py."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from orchestrator import registry
from orchestrator.backends.base import LaunchRequest
from orchestrator.diagnose.failures import Failure, FailureKind
from orchestrator.run import launch
from orchestrator.store import JobState, Store
from tests.helpers import REPO, job_lines

WORKER = REPO / "tests" / "cluster" / "jobs" / "worker.py"
TOY = REPO / "tests" / "toy_backend.py"
# What a backend is written against (ARCHITECTURE.md, "Extension points"): the contract, and the plain
# data it passes on (the plan, the inventory's nodes, a failure, a record, the supervisor's framing).
CONTRACT = {"orchestrator.backends.base", "orchestrator.backends.run", "orchestrator.plan", "orchestrator.spec.model",
            "orchestrator.store", "orchestrator.diagnose.failures", "orchestrator.remote.stream",
            # A backend that runs the plan's argv without distrun's supervisor writes the programs it names.
            "orchestrator.remote", "orchestrator.remote.programs"}


@pytest.fixture
def toy(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setitem(registry.REGISTRY, "toy", "tests.toy_backend:ToyBackend")
    monkeypatch.setenv("DISTRUN_HOME", str(tmp_path / "home"))


def run_toy(tmp_path: Path, job_id: str, *args: str) -> int:
    job = tmp_path / "job.yaml"
    job.write_text(f"name: toy\nscript: {WORKER}\nnproc_per_node: 1\nenv: {{OMP_NUM_THREADS: '1'}}\n"
                   "telemetry: {enabled: false}\n")
    return launch.launch(LaunchRequest(str(job), backend="toy", job_id=job_id, live=False, quiet=True,
                                       skip_preflight=True, extra_args=list(args)))


def test_adding_the_toy_backend_takes_its_own_file_written_against_the_contract_and_one_registration(toy) -> None:
    tree = ast.parse(TOY.read_text(encoding="utf-8"))
    imported = {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
                and (node.module or "").startswith("orchestrator")}
    imported |= {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names
                 if alias.name.startswith("orchestrator")}

    assert imported and imported <= CONTRACT, imported - CONTRACT
    assert registry.names()[-1] == "toy", "one registration makes it a backend like the others"


def test_the_run_loop_blames_the_toy_host_that_failed_and_has_the_backend_stop_the_other(toy, tmp_path: Path) -> None:
    assert run_toy(tmp_path, "toy-2", "--fail-rank", "1", "--sleep", "30") == 1

    record = Store().get("toy-2")
    root = Failure.from_dict(record.failures[0])
    # The failing rank exits 1, or gloo aborts it while it unwinds (SIGABRT): either way its own failure.
    assert (record.state, root.host, root.kind in (FailureKind.EXIT, FailureKind.SIGNAL)) == (JobState.FAILED,
                                                                                              "toy1", True)
    assert "RuntimeError: deliberate failure on rank 1" in job_lines(Store().job_dir("toy-2").root)
    assert "toy0: stopped by distrun" in record.detail
