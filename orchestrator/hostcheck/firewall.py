"""The controller's iptables FORWARD policy, named in port-reachable's hint when it is DROP.

Docker's engine sets that policy; with br_netfilter (bridge-nf-call-iptables=1) it also drops
the traffic between hosts bridged on this machine (VMs, containers, network namespaces), so
their probes cannot connect to the master although nothing on the hosts blocks the port.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import replace

from orchestrator.hostcheck.checks import Check, Status

DOCKER_JUMP = "-A FORWARD -j DOCKER-USER"


def forward_note(rules: Sequence[str]) -> str:
    """What to add to port-reachable's hint, from `iptables -S FORWARD`'s lines; "" when the policy accepts."""
    if "-P FORWARD DROP" not in rules:
        return ""
    docker = DOCKER_JUMP in rules
    who, chain = (", as Docker's engine sets it", "DOCKER-USER") if docker else ("", "FORWARD")
    return (f"; this controller's iptables FORWARD policy is DROP{who}: for hosts bridged on this machine, "
            f"accept their traffic (`iptables -I {chain} -i BRIDGE -o BRIDGE -j ACCEPT`)")


def forward_rules() -> list[str]:
    """This controller's `iptables -S FORWARD` lines; none where iptables is missing or refuses (not root)."""
    if shutil.which("iptables") is None:
        return []
    try:
        listed = subprocess.run(["iptables", "-S", "FORWARD"], capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return []
    return listed.stdout.splitlines() if listed.returncode == 0 else []


def with_forward_note(checks: list[Check]) -> list[Check]:
    """The checks, port-reachable's hint naming the FORWARD policy when it failed and the policy is DROP."""
    if not any(c.name == "port-reachable" and c.status is Status.ERROR for c in checks):
        return checks
    note = forward_note(forward_rules())
    return [replace(c, hint=c.hint + note) if c.name == "port-reachable" and note else c for c in checks]
