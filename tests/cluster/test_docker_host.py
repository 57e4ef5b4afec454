"""The lab on a Docker host: Docker's engine sets iptables' FORWARD policy to DROP, which, with
br_netfilter's bridge-nf-call-iptables=1, drops every frame between the hosts on the lab's bridge.
The harness then accepts its own bridge's traffic, and takes the rule away at teardown."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers import distrun

from .fixtures import requires_cluster
from .registry import BRIDGE_NF

pytestmark = requires_cluster


def forward_lines() -> list[str]:
    return subprocess.run(["iptables", "-S", "FORWARD"], capture_output=True, text=True, check=True).stdout.splitlines()


@pytest.fixture
def docker_forward() -> Iterator[bool]:
    """FORWARD's policy DROP, and bridged frames through iptables where br_netfilter loads, as on a Docker
    host; the machine's own policy and setting come back whatever happens. Yields whether frames are filtered."""
    if shutil.which("iptables") is None:
        pytest.skip("no iptables (tests/install-system-deps.sh installs it)")
    nf = Path(BRIDGE_NF)
    if not nf.exists() and shutil.which("modprobe"):
        subprocess.run(["modprobe", "br_netfilter"], capture_output=True)
    policy = next(line.split()[2] for line in forward_lines() if line.startswith("-P FORWARD"))
    before = nf.read_text().strip() if nf.exists() else None  # None: bridged frames never reach iptables
    try:
        if before not in (None, "1"):
            nf.write_text("1\n")
        subprocess.run(["iptables", "-P", "FORWARD", "DROP"], check=True)
        yield before is not None
    finally:
        subprocess.run(["iptables", "-P", "FORWARD", policy], check=True)
        if before not in (None, "1"):
            nf.write_text(f"{before}\n")


def test_the_lab_works_with_forward_dropping_and_its_rule_goes_at_teardown(docker_forward, make_cluster, tmp_path):
    cluster = make_cluster(2)
    bridge = f"{cluster.prefix}br"
    accept = ["-i", bridge, "-o", bridge, "-j", "ACCEPT"]
    inventory = str(cluster.write_inventory(tmp_path / "lab.yaml"))
    env = {"DISTRUN_SSH_CONFIG": str(tmp_path / "no-ssh-config"), "DISTRUN_SSH_TIMEOUT": "3"}
    healthy = distrun("doctor", "-i", inventory, home=tmp_path / "home", env=env)
    assert healthy.returncode == 0, healthy.stdout + healthy.stderr
    assert "✓ port-reachable" in healthy.stdout
    if docker_forward:
        assert f"-A FORWARD {' '.join(accept)}" in forward_lines()

    if docker_forward:
        # Without the harness's rule the hosts cannot reach each other: doctor says why, launch stops with 3.
        subprocess.run(["iptables", "-D", "FORWARD", *accept], check=True)
        try:
            cut = distrun("doctor", "-i", inventory, home=tmp_path / "home", env=env)
            launch = distrun("launch", "jobs/tiny.yaml", "-i", inventory, "--no-live", home=tmp_path / "home", env=env)
        finally:
            subprocess.run(["iptables", "-I", "FORWARD", "1", *accept], check=True)
        assert cut.returncode == 1, cut.stdout + cut.stderr
        assert "✗ port-reachable" in cut.stdout
        assert "this controller's iptables FORWARD policy is DROP" in cut.stdout
        assert launch.returncode == 3, launch.stdout + launch.stderr
        assert "preflight failed" in launch.stderr and "FORWARD policy is DROP" in launch.stderr

    cluster.teardown()
    assert not [line for line in forward_lines() if bridge in line]
