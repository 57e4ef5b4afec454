"""Doctor's probe round on real sshd hosts of the namespace test cluster, some of them held back by
the test's transport: the master listens until every other host has tried, and a host whose probe
could not try is skipped, never failed."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from orchestrator.doctor.command import exit_code
from orchestrator.fanout.group import Group
from orchestrator.hostcheck import probe
from orchestrator.hostcheck.checks import Check, Context, Status, run_checks
from orchestrator.hostcheck.probe import LATE, Round, probe_round
from orchestrator.spec import NodeSpec, load_inventory
from orchestrator.transport import Transport
from orchestrator.transport.ssh import SSHTransport
from tests.cluster.harness import Cluster, skip_reason
from tests.held import HeldTransport

pytestmark = [pytest.mark.cluster, pytest.mark.skipif(skip_reason() is not None, reason=str(skip_reason()))]


@pytest.fixture(autouse=True)
def no_user_ssh_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DISTRUN_SSH_CONFIG", str(tmp_path / "no-ssh-config"))
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)


def ssh_nodes(cluster: Cluster, tmp_path: Path) -> list[NodeSpec]:
    return list(load_inventory(cluster.write_inventory(tmp_path / f"inventory-{time.monotonic_ns()}.yaml")).nodes)


def doctor_round(nodes: list[NodeSpec], held: dict[str, HeldTransport]) -> tuple[Round, Check, int]:
    """Doctor's full round over SSH with `held` in place of those nodes' transports: the round,
    its port-reachable row and doctor's exit status."""
    def make(node: NodeSpec) -> Transport:
        return held.get(node.name) or SSHTransport(node)

    with Group(nodes, make=make) as group:
        outcome = probe_round(group, nodes[0], {"full": True}, None, None)
    ctx = Context(tuple(nodes), nodes[0].name, outcome.master_addr, outcome.master_addr_error,
                  outcome.master_hostname)
    checks = run_checks(outcome.results, ctx)
    return outcome, {c.name: c for c in checks}["port-reachable"], exit_code(checks, outcome.results, strict=False)


def test_a_host_reached_early_connects_before_the_fan_out_reaches_the_last_host(cluster3, tmp_path):
    nodes = ssh_nodes(cluster3, tmp_path)
    early = HeldTransport(SSHTransport(nodes[1]))
    last = HeldTransport(SSHTransport(nodes[2]), reach_after=early.exited)
    _, found, code = doctor_round(nodes, {"node1": early, "node2": last})
    assert last.released, "node1's probe waited for node2 to be reached before it was told where to connect"
    assert found.status is Status.OK and found.hosts == ["node1", "node2"], found
    assert code == 0


def test_a_host_reached_after_the_others_reported_gets_its_own_time_to_connect(cluster3, tmp_path, monkeypatch):
    monkeypatch.setattr(probe, "PROBE_TIMEOUT", 8.0)
    nodes = ssh_nodes(cluster3, tmp_path)
    early = HeldTransport(SSHTransport(nodes[1]))
    release = threading.Event()
    last = HeldTransport(SSHTransport(nodes[2]), reach_after=release)
    threading.Thread(target=lambda: (early.exited.wait(), time.sleep(probe.PROBE_TIMEOUT + 1), release.set()),
                     daemon=True).start()  # reached later than PROBE_TIMEOUT after node1 reported
    _, found, code = doctor_round(nodes, {"node1": early, "node2": last})
    assert last.released
    assert found.status is Status.OK and found.hosts == ["node1", "node2"], found
    assert code == 0


def test_a_host_whose_probe_ran_after_the_master_stopped_listening_is_skipped_not_failed(
        cluster3, tmp_path, monkeypatch):
    monkeypatch.setattr(probe, "PROBE_TIMEOUT", 8.0)
    nodes = ssh_nodes(cluster3, tmp_path)
    master = HeldTransport(SSHTransport(nodes[0]))
    # node2 is told where to connect only once the master's probe has ended: over the bridge, to a closed port.
    late = HeldTransport(SSHTransport(nodes[2]), tell_after=master.exited)
    outcome, found, code = doctor_round(nodes, {"node0": master, "node2": late})
    facts = outcome.check()
    assert facts["node1"].connect is not None and facts["node1"].connect.ok
    connect = facts["node2"].connect
    assert connect is not None and connect.skipped == LATE and connect.error == "connection refused"
    assert found.status is Status.SKIP and found.hosts == ["node2"]
    assert found.detail.startswith(f"node2: skipped: {LATE}; node1: connect to node0 at {cluster3.addr(0)}:")
    assert code == 0
