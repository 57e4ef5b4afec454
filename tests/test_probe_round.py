"""A probe round's timing, on local "hosts" held back by the test: the master listens until every
other host has tried, and a host whose probe could not try is skipped, never failed."""

from __future__ import annotations

import sys
import threading

import pytest

from orchestrator.doctor.command import exit_code
from orchestrator.facts import Connect, HostFacts, Listen
from orchestrator.fanout.group import Group
from orchestrator.hostcheck import preflight as doctor_preflight
from orchestrator.hostcheck import probe
from orchestrator.hostcheck.checks import Check, Context, Status, run_checks
from orchestrator.hostcheck.probe import LATE, ProbeRun, Round, probe_round, round_backstop
from orchestrator.plan import HostPlan, LaunchPlan
from orchestrator.spec.model import NodeSpec, TransportKind
from orchestrator.transport import Transport
from orchestrator.transport.local import LocalTransport
from tests.held import HeldTransport
from tests.test_doctor import free_port


def local_nodes(n: int = 3) -> list[NodeSpec]:
    return [NodeSpec(name=f"local{i}", host="localhost", python=sys.executable, transport=TransportKind.LOCAL)
            for i in range(n)]


def held_round(nodes: list[NodeSpec], held: dict[str, HeldTransport]) -> Round:
    """A launch's probe round with `held` in place of those nodes' transports; the first node is the master."""
    def make(node: NodeSpec) -> Transport:
        return held.get(node.name) or LocalTransport(node)

    with Group(nodes, make=make) as group:
        return probe_round(group, nodes[0], {}, free_port(), "127.0.0.1", resolve=False)


def port_check(nodes: list[NodeSpec], outcome: Round) -> Check:
    ctx = Context(tuple(nodes), nodes[0].name, outcome.master_addr, outcome.master_addr_error)
    return {c.name: c for c in run_checks(outcome.results, ctx)}["port-reachable"]


def test_a_host_reached_early_tests_the_port_before_the_fan_out_reaches_the_last_host():
    nodes = local_nodes()
    early = HeldTransport(LocalTransport(nodes[1]))
    last = HeldTransport(LocalTransport(nodes[2]), reach_after=early.exited)
    outcome = held_round(nodes, {"local1": early, "local2": last})
    assert last.released, "local1's probe waited for local2 to be reached before it was told where to connect"
    found = port_check(nodes, outcome)
    assert found.status is Status.OK and found.hosts == ["local1", "local2"]


def test_a_host_reached_after_the_others_reported_gets_its_own_time_to_connect(monkeypatch):
    monkeypatch.setattr(probe, "PROBE_TIMEOUT", 3.0)
    nodes = local_nodes()
    early = HeldTransport(LocalTransport(nodes[1]))
    release = threading.Event()
    last = HeldTransport(LocalTransport(nodes[2]), reach_after=release)
    threading.Timer(4.0, release.set).start()  # past PROBE_TIMEOUT after local1 was told
    outcome = held_round(nodes, {"local1": early, "local2": last})
    found = port_check(nodes, outcome)
    assert found.status is Status.OK and found.hosts == ["local1", "local2"]


def test_a_host_whose_probe_ran_after_the_master_stopped_listening_is_skipped_not_failed(monkeypatch):
    monkeypatch.setattr(probe, "PROBE_TIMEOUT", 5.0)
    nodes = local_nodes()
    master = HeldTransport(LocalTransport(nodes[0]))
    # local2 is told where to connect only once the master's probe has ended: its port is closed.
    late = HeldTransport(LocalTransport(nodes[2]), tell_after=master.exited)
    outcome = held_round(nodes, {"local0": master, "local2": late})
    facts = outcome.check()
    assert facts["local1"].connect is not None and facts["local1"].connect.ok
    assert facts["local2"].connect is not None and facts["local2"].connect.skipped == LATE
    found = port_check(nodes, outcome)
    assert found.status is Status.SKIP and found.hosts == ["local2"]
    assert found.detail.startswith(f"local2: skipped: {LATE}; local1: connect to local0 at 127.0.0.1:")
    ctx = Context(tuple(nodes), "local0", outcome.master_addr)
    assert exit_code(run_checks(outcome.results, ctx), outcome.results, strict=False) == 0


def test_the_launch_preflight_starts_a_job_when_a_host_could_not_try():
    nodes = local_nodes(2)
    facts = {"local0": doctor_facts("local0", listen=True), "local1": doctor_facts("local1", skipped=LATE)}
    hosts = [HostPlan(node=n.name, host=n.host, node_rank=i, nproc=1, python=n.python, workdir="/tmp", argv=[],
                      env={}, secret_names=[], iface=None) for i, n in enumerate(nodes)]
    plan = LaunchPlan(job_id="j", job_name="j", spec_path="j.yaml", inventory_path="inv.yaml", backend="ssh",
                      master_node="local0", master_addr="127.0.0.1", master_port=29500, nnodes=2, hosts=hosts,
                      secrets={})
    doctor_preflight.launch_preflight(plan, {n.name: n for n in nodes}, facts)


def doctor_facts(node: str, listen: bool = False, skipped: str | None = None) -> HostFacts:
    return HostFacts(node, python="3.11.7", torch="2.13.0", listen=Listen(29500, ok=True) if listen else None,
                     connect=None if listen else Connect("127.0.0.1", 29500, error="connection refused",
                                                         skipped=skipped))


@pytest.mark.parametrize("hosts", [2, 244, 1000])
def test_the_probes_own_backstop_outlasts_the_controllers_wait_and_grows_with_the_hosts(hosts):
    assert round_backstop(hosts) > probe.PROBE_TIMEOUT * 2
    assert round_backstop(hosts + 100) > round_backstop(hosts)


def test_a_hosts_time_to_report_counts_from_when_it_was_told():
    run = ProbeRun(LocalTransport(local_nodes(1)[0]), {})
    run.tell({"connect_to": None})
    assert probe.PROBE_TIMEOUT - 1 < run.time_left() <= probe.PROBE_TIMEOUT
