"""A busy port is bad input the operator fixes by choosing another: the rendezvous port as the
metrics port, exit 2 and one line, nothing started. A port the other hosts cannot reach (a firewall,
a route) is infrastructure: exit 3."""

from __future__ import annotations

import pytest

from orchestrator.errors import ExitCode
from orchestrator.facts import Connect, HostFacts, Listen
from orchestrator.hostcheck import preflight as launch_preflight
from tests.test_doctor import MASTER_ADDR, PORT, preflight


def facts(listen: Listen, connect: Connect) -> dict[str, HostFacts]:
    return {"local0": HostFacts("local0", python="3.11.7", torch="2.13.0", listen=listen),
            "local1": HostFacts("local1", python="3.11.7", torch="2.13.0", connect=connect)}


def test_a_busy_rendezvous_port_is_one_line_and_exit_2_as_a_busy_metrics_port_is() -> None:
    busy = facts(Listen(PORT, ok=False, error="address already in use"),
                 Connect(MASTER_ADDR, PORT, skipped="the master's port was not free"))

    with pytest.raises(launch_preflight.PreflightError) as caught:
        preflight(PORT, busy)

    assert caught.value.exit_code == ExitCode.USAGE
    assert str(caught.value).splitlines() == [
        f"rendezvous port: local0: port {PORT} is in use (address already in use); nothing was started "
        f"(fix: stop what holds it (`ss -ltnp 'sport = :{PORT}'` on local0), or set `rendezvous.port: auto`)"]


def test_a_rendezvous_port_the_other_hosts_cannot_reach_stays_infrastructure_exit_3() -> None:
    cut = facts(Listen(PORT, ok=True), Connect(MASTER_ADDR, PORT, ok=False, error="timed out"))

    with pytest.raises(launch_preflight.PreflightError) as caught:
        preflight(PORT, cut)

    assert caught.value.exit_code == ExitCode.INFRA
