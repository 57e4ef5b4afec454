"""`distrun doctor` (and launch's preflight) against real sshd hosts of the namespace test cluster."""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.cluster.harness import Cluster, skip_reason
from tests.cluster.ports import port_held
from tests.helpers import REPO, distrun, plant_module

pytestmark = [pytest.mark.cluster, pytest.mark.skipif(skip_reason() is not None, reason=str(skip_reason()))]

TORCH = subprocess.run([sys.executable, "-c", "from importlib.metadata import version; print(version('torch'))"],
                       capture_output=True, text=True, check=True).stdout.strip()
PORT = 29555
# A script that is there on every host: the bandwidth job distrun ships.
BENCH = REPO / "orchestrator" / "doctor" / "allreduce_bench.py"
MARKS = {"✓": "ok", "!": "warn", "✗": "error", "-": "skip"}


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    """No user ssh_config, and a short connect timeout for hosts that are down."""
    return {"DISTRUN_SSH_CONFIG": str(tmp_path / "no-ssh-config"), "DISTRUN_SSH_TIMEOUT": "3"}


def doctor(cluster: Cluster, tmp_path: Path, env: dict[str, str], *args: str,
           **inventory: Any) -> subprocess.CompletedProcess[str]:
    path = cluster.write_inventory(tmp_path / "inventory.yaml", **inventory)
    return distrun("doctor", "-i", str(path), *args, home=tmp_path / "home", env=env)


def nodes_with(cluster: Cluster, index: int, **settings: Any) -> list[dict[str, Any]]:
    """The inventory's node list with `settings` on node `index`."""
    return [{"name": cluster.name(i), "host": cluster.addr(i), **(settings if i == index else {})}
            for i in range(cluster.n)]


def rows(table: str) -> dict[str, tuple[str, str]]:
    """check name -> (status, the rest of its row), from the table's rows."""
    found = {}
    for line in table.splitlines():
        mark, _, rest = line.partition(" ")
        if mark in MARKS:
            name, _, detail = rest.partition(" ")
            found[name] = (MARKS[mark], detail.strip())
    return found


def job_file(tmp_path: Path, extra: str = "") -> Path:
    path = tmp_path / "job.yaml"
    path.write_text(f"name: preflight\nscript: {BENCH}\n"
                    f"args: [--backend, gloo, --sizes, '1024']\nrendezvous: {{port: {PORT}}}\n{extra}")
    return path


@pytest.fixture
def other_torch(tmp_path: Path) -> str:
    """A `python` whose torch is a stand-in reporting 2.0.0, to both import and package metadata."""
    site = tmp_path / "other-env"
    (site / "torch").mkdir(parents=True)
    (site / "torch" / "__init__.py").write_text('__version__ = "2.0.0"\n')
    info = site / "torch-2.0.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: torch\nVersion: 2.0.0\n")
    wrapper = tmp_path / "python"
    wrapper.write_text(f'#!/bin/sh\nPYTHONPATH={site} exec {sys.executable} "$@"\n')
    wrapper.chmod(0o755)
    return str(wrapper)


def test_doctor_on_healthy_hosts_exits_0_with_every_check_ok(cluster3, tmp_path, env):
    result = doctor(cluster3, tmp_path, env)
    assert result.returncode == 0, result.stdout + result.stderr
    found = rows(result.stdout)
    # Every check ok but the job's entry, which is skipped: no --job names one.
    assert {name: status for name, (status, _) in found.items() if status != "ok"} == {"entry": "skip"}
    assert found["torch"][1] == f"node[0-2]: torch {TORCH}"
    assert found["port-reachable"][1] == f"node[1-2]: connect to node0 at {cluster3.addr(0)}:29500"


def test_a_host_with_another_torch_is_named_with_both_versions(cluster3, tmp_path, env, other_torch):
    result = doctor(cluster3, tmp_path, env, nodes=nodes_with(cluster3, 2, python=other_torch))
    assert result.returncode == 1, result.stdout + result.stderr
    status, detail = rows(result.stdout)["torch"]
    assert status == "error"
    assert detail == f"torch differs: node[0-1]: {TORCH}; node2: 2.0.0"
    assert "fix: install the same torch" in result.stdout


STANDIN = "9.9.9+standin"


def standin_torch(where: Path) -> Path:
    """A torch with no version.py and no package metadata, as a source tree on PYTHONPATH has it, and
    with the control plane's file, as a current torch has it (its ranks serve their Flight Recorder)."""
    elastic = where / "torch" / "distributed" / "elastic"
    elastic.mkdir(parents=True)
    (where / "torch" / "__init__.py").write_text(f'__version__ = "{STANDIN}"\n')
    (elastic / "control_plane.py").write_text("")
    return where


def test_a_torch_on_a_nodes_pythonpath_is_the_one_reported_not_the_installed_one(cluster3, tmp_path, env):
    site = standin_torch(tmp_path / "source-tree")
    result = doctor(cluster3, tmp_path, env, nodes=nodes_with(cluster3, 2, env={"PYTHONPATH": str(site)}))
    assert result.returncode == 1, result.stdout + result.stderr
    assert rows(result.stdout)["torch"] == ("error", f"torch differs: node[0-1]: {TORCH}; node2: {STANDIN}")


def test_with_a_job_the_torch_beside_its_script_is_the_one_reported(cluster3, tmp_path, env):
    # The workers put the script's directory first on sys.path; here it is the workdir.
    workdir = standin_torch(tmp_path / "work")
    shutil.copy(BENCH, workdir)
    job = tmp_path / "job.yaml"
    job.write_text(f"name: preflight\nscript: {workdir / 'allreduce_bench.py'}\nworkdir: {workdir}\n"
                   f"args: [--backend, gloo, --sizes, '1024']\nrendezvous: {{port: {PORT}}}\n")
    result = doctor(cluster3, tmp_path, env, "--job", str(job))
    assert rows(result.stdout)["torch"] == ("ok", f"node[0-2]: torch {STANDIN}"), result.stdout + result.stderr


def test_json_round_trips_with_the_tables_statuses(cluster3, tmp_path, env, other_torch):
    nodes = nodes_with(cluster3, 2, python=other_torch)
    table = rows(doctor(cluster3, tmp_path, env, nodes=nodes).stdout)
    result = doctor(cluster3, tmp_path, env, "--json", nodes=nodes)
    data = json.loads(result.stdout)
    assert result.returncode == data["exit_code"] == 1
    assert {c["name"]: c["status"] for c in data["checks"]} == {name: s for name, (s, _) in table.items()}
    torch = next(c for c in data["checks"] if c["name"] == "torch")
    assert torch["hosts"] == ["node2"] and torch["detail"] == table["torch"][1]
    assert data["hosts"]["node2"]["facts"]["torch_info"]["version"] == "2.0.0"
    assert data["master"] == {"node": "node0", "addr": cluster3.addr(0), "port": 29500}


def test_launch_refuses_on_a_version_mismatch_and_starts_nothing(cluster3, tmp_path, env, other_torch):
    inventory = cluster3.write_inventory(tmp_path / "inventory.yaml", nodes=nodes_with(cluster3, 2, python=other_torch))
    home = tmp_path / "home"
    result = distrun("launch", str(job_file(tmp_path)), "-i", str(inventory), "--no-live", home=home, env=env)
    assert result.returncode == 1, result.stdout + result.stderr
    assert f"torch differs: node[0-1]: {TORCH}; node2: 2.0.0" in result.stderr
    assert "nothing was started" in result.stderr
    assert not (home / "jobs").exists() or not any((home / "jobs").iterdir())
    for i in range(cluster3.n):
        assert not [p for p in cluster3.processes(i) if "distrun_torchrun.py" in " ".join(p.cmdline)]


def test_launch_refuses_when_a_nodes_pythonpath_puts_another_torch_first_and_starts_nothing(cluster3, tmp_path, env):
    site = standin_torch(tmp_path / "source-tree")
    nodes = nodes_with(cluster3, 2, env={"PYTHONPATH": str(site)})
    inventory = cluster3.write_inventory(tmp_path / "inventory.yaml", nodes=nodes)
    home = tmp_path / "home"
    result = distrun("launch", str(job_file(tmp_path)), "-i", str(inventory), "--no-live", home=home, env=env)
    assert result.returncode == 1, result.stdout + result.stderr
    assert f"torch differs: node[0-1]: {TORCH}; node2: {STANDIN}" in result.stderr
    assert "nothing was started" in result.stderr
    for i in range(cluster3.n):
        assert not [p for p in cluster3.processes(i) if "distrun_torchrun.py" in " ".join(p.cmdline)]


def test_a_port_already_bound_on_the_master_is_an_error_for_the_jobs_hosts(cluster3, tmp_path, env):
    with port_held(cluster3, 0, PORT):
        result = doctor(cluster3, tmp_path, env, "--job", str(job_file(tmp_path, "nnodes: 2\n")))
    assert result.returncode == 1, result.stdout + result.stderr
    assert result.stdout.startswith("distrun doctor: 2 host(s) node[0-1], master node0")
    found = rows(result.stdout)
    assert found["port-free"] == ("error", f"node0: port {PORT} is in use (address already in use)")
    assert found["port-reachable"][0] == "skip"


def test_a_firewall_dropping_the_port_on_the_master_is_an_error_naming_hosts_and_port(cluster3, tmp_path, env):
    rule = ["INPUT", "-p", "tcp", "--dport", str(PORT), "-j", "DROP"]
    subprocess.run(["ip", "netns", "exec", cluster3.ns(0), "iptables", "-I", *rule], check=True)
    try:
        result = doctor(cluster3, tmp_path, env, "--job", str(job_file(tmp_path)))
    finally:
        subprocess.run(["ip", "netns", "exec", cluster3.ns(0), "iptables", "-D", *rule], check=True)
    assert result.returncode == 1, result.stdout + result.stderr
    status, detail = rows(result.stdout)["port-reachable"]
    assert status == "error"
    assert detail == f"node[1-2]: cannot connect to node0 at {cluster3.addr(0)}:{PORT} (timed out after 2 s)"
    assert f"fix: allow TCP port {PORT} into node0" in result.stdout
    assert rows(result.stdout)["port-free"][0] == "ok"


def test_a_missing_iface_is_an_error(cluster3, tmp_path, env):
    result = doctor(cluster3, tmp_path, env, nodes=nodes_with(cluster3, 1, iface="eth9"))
    assert result.returncode == 1, result.stdout + result.stderr
    assert rows(result.stdout)["iface"] == ("error", "node1: no interface eth9 (the host has eth0, lo)")
    assert "fix: set the node's `iface:`" in result.stdout


def test_a_host_that_is_down_is_reported_and_the_others_are_still_checked(cluster3, tmp_path, env):
    cluster3.cut(2)
    try:
        result = doctor(cluster3, tmp_path, env, "--json")
    finally:
        cluster3.restore(2)
    assert result.returncode == 3, result.stdout + result.stderr
    data = json.loads(result.stdout)
    checks = {c["name"]: c for c in data["checks"]}
    assert checks["reachable"]["status"] == "error" and checks["reachable"]["hosts"] == ["node2"]
    assert "node2" in checks["reachable"]["detail"] and "timed out" in checks["reachable"]["detail"]
    assert data["hosts"]["node2"]["reachable"] is False
    assert checks["python"]["status"] == "ok" and checks["python"]["hosts"] == ["node0", "node1"]
    assert checks["port-reachable"]["status"] == "ok" and checks["port-reachable"]["hosts"] == ["node1"]


@pytest.fixture
def torch_planted_in_tmp(tmp_path: Path) -> Iterator[Path]:
    """A `torch` package in /tmp, as any local user can plant one; it records who imported it.

    Yields:
        The file where importers are recorded.
    """
    planted = Path("/tmp/torch")
    if planted.exists():
        pytest.skip("/tmp/torch exists already (not this test's to replace)")
    marker = tmp_path / "planted-imports.txt"
    plant_module(Path("/tmp"), "torch", marker)
    try:
        yield marker
    finally:
        shutil.rmtree(planted, ignore_errors=True)


def test_bandwidth_on_three_hosts_reports_plausible_numbers_and_imports_nothing_from_tmp(
        cluster3, tmp_path, env, torch_planted_in_tmp):
    result = doctor(cluster3, tmp_path, env, "--bandwidth", "--json")
    assert not torch_planted_in_tmp.exists(), torch_planted_in_tmp.read_text()
    assert result.returncode == 0, result.stdout + result.stderr
    assert not list(Path("/tmp").glob("distrun-bandwidth.*")), "a host kept its private directory"
    report = json.loads(result.stdout)["bandwidth"]
    assert report["backend"] == "gloo" and report["world_size"] == 3 and report["error"] is None
    assert [r["bytes"] for r in report["results"]] == [1 << 20, 16 << 20, 64 << 20]
    for size in report["results"]:
        assert 0 < size["time_s"] < 60
        assert 0 < size["busbw_gbps"] < math.inf
        assert size["busbw_gbps"] == pytest.approx(size["algbw_gbps"] * 4 / 3)


def test_bandwidth_runs_on_hosts_whose_sshd_offers_no_sftp(tmp_path, env):
    with Cluster(2, sftp=False) as cluster:
        result = doctor(cluster, tmp_path, env, "--bandwidth", "--json")
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads(result.stdout)["bandwidth"]
    assert report["error"] is None and report["world_size"] == 2
