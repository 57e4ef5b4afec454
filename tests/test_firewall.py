"""port-reachable's hint names this controller's iptables FORWARD policy when it drops (Docker's engine sets it)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from orchestrator.hostcheck.checks import Check, Status
from orchestrator.hostcheck.firewall import forward_note, with_forward_note
from tests.helpers import REPO

DOCKER = ["-P FORWARD DROP", "-A FORWARD -j DOCKER-USER", "-A FORWARD -j DOCKER-FORWARD"]


def test_a_drop_policy_with_dockers_chain_names_docker_and_its_user_chain():
    note = forward_note(DOCKER)
    assert "FORWARD policy is DROP, as Docker's engine sets it" in note
    assert "`iptables -I DOCKER-USER -i BRIDGE -o BRIDGE -j ACCEPT`" in note


def test_a_drop_policy_without_docker_names_the_forward_chain_and_an_accepting_one_nothing():
    assert "Docker" not in forward_note(["-P FORWARD DROP"])
    assert "`iptables -I FORWARD -i BRIDGE" in forward_note(["-P FORWARD DROP"])
    assert forward_note(["-P FORWARD ACCEPT", "-A FORWARD -j DOCKER-USER"]) == ""
    assert forward_note([]) == ""


def test_only_a_failed_port_reachable_check_is_given_the_note_and_nothing_is_asked_otherwise(monkeypatch):
    monkeypatch.setattr("orchestrator.hostcheck.firewall.forward_rules", lambda: DOCKER)
    ok = [Check("port-reachable", Status.OK, ["n1"], "connect"), Check("torch", Status.ERROR, ["n1"], "x", "h")]
    assert with_forward_note(ok) == ok
    failed = with_forward_note([Check("port-reachable", Status.ERROR, ["n1"], "cannot connect", "allow TCP port 1")])
    assert failed[0].hint.startswith("allow TCP port 1; this controller's iptables FORWARD policy is DROP")


PROBE = "from orchestrator.hostcheck.firewall import forward_rules, forward_note; print(forward_note(forward_rules()))"


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("iptables") is None or shutil.which("unshare") is None,
                    reason="needs root, iptables and unshare (a network namespace of its own)")
def test_the_policy_is_read_from_the_real_iptables_of_a_network_namespace_set_up_as_docker_does():
    # A fresh network namespace has its own iptables: the machine's own policy is not touched.
    script = ("iptables -P FORWARD DROP && iptables -N DOCKER-USER && iptables -A FORWARD -j DOCKER-USER && "
              'exec "$0" -c "$1"')
    result = subprocess.run(["unshare", "--net", "sh", "-c", script, sys.executable, PROBE],
                            capture_output=True, text=True, timeout=60, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert result.returncode == 0, result.stderr
    assert "FORWARD policy is DROP, as Docker's engine sets it" in result.stdout
