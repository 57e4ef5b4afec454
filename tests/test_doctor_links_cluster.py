"""`distrun doctor --links` on the lab: a host whose link is limited (tc tbf on its interface, as a
link that came up at a lower speed) is named with its figure against the median, and only it; the
same check on healthy hosts names nobody; nothing of the check is left on a host (issue 49, part 1)."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from orchestrator.remote import LEAN_BOOTSTRAP
from tests.cluster.harness import Cluster
from tests.cluster.procs import ns_id, pids_in_netns
from tests.cluster.registry import NETNS_DIR
from tests.helpers import distrun

SLOW = 2  # node2
LIMIT = ["tbf", "rate", "50mbit", "burst", "32kbit", "latency", "400ms"]


@pytest.fixture(scope="module")
def cluster4() -> Iterator[Cluster]:
    with Cluster(4) as cluster:
        yield cluster


def links(cluster: Cluster, tmp_path: Path) -> tuple[int, dict[str, Any]]:
    """`doctor --links --json` on the cluster: its exit code and its document."""
    inventory = cluster.write_inventory(tmp_path / "inventory.yaml")
    env = {"DISTRUN_SSH_CONFIG": str(tmp_path / "no-ssh-config"), "DISTRUN_SSH_TIMEOUT": "3"}
    ran = distrun("doctor", "-i", str(inventory), "--links", "--json", home=tmp_path / "home", env=env)
    assert "Traceback" not in ran.stderr, ran.stderr
    return ran.returncode, json.loads(ran.stdout)


def tc(cluster: Cluster, host: int, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", "netns", "exec", cluster.ns(host), "tc", "qdisc", *args], capture_output=True,
                          text=True, timeout=30)


def linkcheck_processes(cluster: Cluster) -> list[int]:
    """The hosts' processes that run a program of distrun's shipped on stdin (the link check's is one)."""
    namespaces = {ns_id(NETNS_DIR / cluster.ns(i)): cluster.ns(i) for i in range(cluster.n)}
    pids = [pid for found in pids_in_netns(namespaces).values() for pid in found]
    return [pid for pid in pids if LEAN_BOOTSTRAP.encode() in read_cmdline(pid)]


def read_cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


@pytest.mark.parametrize("run", range(2))
def test_healthy_hosts_name_no_slow_link(cluster4: Cluster, tmp_path: Path, run: int) -> None:
    _, report = links(cluster4, tmp_path)
    check = next(c for c in report["checks"] if c["name"] == "links")
    assert check["status"] == "ok", check
    assert report["links"]["slow"] == {} and len(report["links"]["pairs"]) == 4 * 2  # 4 hosts, shifts 1 and 2
    assert not linkcheck_processes(cluster4)


def test_the_host_whose_link_is_limited_is_named_with_its_figure_and_the_median(cluster4: Cluster,
                                                                                 tmp_path: Path) -> None:
    added = tc(cluster4, SLOW, "add", "dev", "eth0", "root", *LIMIT)
    assert added.returncode == 0, added.stderr
    try:
        code, report = links(cluster4, tmp_path)
    finally:
        tc(cluster4, SLOW, "del", "dev", "eth0", "root")
    check = next(c for c in report["checks"] if c["name"] == "links")
    slow = report["links"]["slow"]
    assert code == 1 and check["status"] == "error" and check["hosts"] == ["node2"], check
    assert list(slow) == ["node2"] and "sends" in slow["node2"] and "against the median" in slow["node2"]
    node2 = next(h for h in report["links"]["hosts"] if h["host"] == "node2")
    assert node2["send_mbytes_per_s"] < 8 < report["links"]["median_send_mbytes_per_s"]  # 50 Mbit/s is 6.25 MB/s
    assert "tbf" not in tc(cluster4, SLOW, "show", "dev", "eth0").stdout
    assert not linkcheck_processes(cluster4)


def test_a_host_that_cannot_be_reached_is_one_line_not_a_hang(cluster4: Cluster, tmp_path: Path) -> None:
    nodes = [{"name": cluster4.name(i), "host": cluster4.addr(i), **({"port": 1} if i == 3 else {})}
             for i in range(cluster4.n)]
    inventory = cluster4.write_inventory(tmp_path / "inventory.yaml", nodes=nodes)
    env = {"DISTRUN_SSH_CONFIG": str(tmp_path / "no-ssh-config"), "DISTRUN_SSH_TIMEOUT": "3"}
    ran = distrun("doctor", "-i", str(inventory), "--links", "--json", home=tmp_path / "home", env=env, timeout=120)
    report = json.loads(ran.stdout)
    check = next(c for c in report["checks"] if c["name"] == "links")
    assert ran.returncode == 3 and list(report["links"]["failed"]) == ["node3"], report["links"]
    assert check["hosts"] == ["node3"] and "Traceback" not in ran.stderr
    assert report["links"]["slow"] == {} and not linkcheck_processes(cluster4)
