"""While no host is past the rendezvous: what the launch waits for, and, after a bound, the hosts
that never joined it and why distrun thinks so.

A host is past the rendezvous once its torchrun started workers (its samples count more than one
process of the job), a rank of it printed, or it ended. Until then its samples tell how its torchrun
stands with the rendezvous endpoint (`rdzv`, remote/rdzvconn.py): connected, still sending SYNs
that nobody answers, or holding no connection. Without telemetry there is no evidence, and
nothing is said.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from orchestrator.console.display import fold_hosts
from orchestrator.telemetry.alerts import Alert

FIRST_SAY = 30.0  # seconds without any host past the rendezvous before the launch says it waits

WHY = {
    None: "its torchrun has not started (its supervisor has not said it started it)",
    "connecting": "its torchrun's connection to it gets no answer (a firewall drops its SYNs, or no route)",
    "none": "its torchrun holds no connection to it (refused or reset, or not tried yet)",
}


@dataclass(frozen=True)
class Said:
    """What the watch has to say now, in this order: lines of the launch, alerts, and what to check."""

    lines: list[str] = field(default_factory=list)
    alerts: list[Alert] = field(default_factory=list)
    advice: list[str] = field(default_factory=list)


@dataclass
class HostWait:
    """One host as the watch sees it."""

    started: bool = False  # its supervisor started torchrun
    past: bool = False  # its workers run, a rank printed, or it ended
    conn: str | None = None  # its latest sample's `rdzv`; None: no sample told it yet


def never_joined(hosts: dict[str, HostWait]) -> dict[str, str]:
    """The hosts that have not joined the rendezvous, each with why distrun thinks so."""
    return {node: WHY[None if not h.started else h.conn] for node, h in hosts.items()
            if not h.started or h.conn in ("connecting", "none")}


def waiting_line(where: str, hosts: dict[str, HostWait], waited: float) -> str:
    """`waiting for the rendezvous at node0 10.0.0.1:29500 for 30 s (3 of 3 hosts started torchrun, ...)`."""
    started = sum(h.started for h in hosts.values())
    joined = sum(h.conn == "established" for h in hosts.values())
    return (f"waiting for the rendezvous at {where} for {waited:.0f} s ({started} of {len(hosts)} hosts started "
            f"torchrun, {joined} connected to it, no rank past it yet)")


def check_line(master: str, port: int, missing: list[str], report_after: float) -> str:
    """What to check about the hosts that never joined, and what happens meanwhile."""
    return (f"{fold_hosts(missing)} never joined within {report_after:g} s: check that they reach "
            f"{master}'s port {port} (firewall rules between them and it, and that `iface:` names a network "
            "they share; `distrun doctor` checks port-reachable); the job goes on waiting "
            "(Ctrl-C or `distrun stop` ends it)")


class RendezvousWatch:
    """Follows the hosts until one is past the rendezvous; says the wait at FIRST_SAY s (or at
    `report_after`, if sooner), then at each doubling of it, and names the hosts that never joined
    once `report_after` s have passed.

    Args:
        nodes: the job's hosts.
        master: the master's node name; address and port: the rendezvous endpoint.
        report_after: seconds before the hosts that never joined are named.
        began: when the hosts were started (monotonic).
    """

    def __init__(self, nodes: list[str], master: str, address: str, port: int, report_after: float,
                 began: float) -> None:
        self.hosts = {node: HostWait() for node in nodes}
        self.master, self.port = master, port
        self.where = f"{master} {address}:{port}"
        self.report_after = report_after
        self.began = began
        self.next_say = min(FIRST_SAY, report_after)  # the wait is said with the hosts named, at the latest
        self.named = False
        self.done = False

    def started(self, node: str) -> None:
        """The host's supervisor started torchrun."""
        if node in self.hosts:
            self.hosts[node].started = True

    def past(self) -> None:
        """A host is past the rendezvous (a rank printed, or it ended): so is the wait."""
        self.done = True

    def sample(self, node: str, sample: dict[str, Any]) -> None:
        """A host sample: its job's processes and its connection to the rendezvous."""
        host = self.hosts.get(node)
        if host is None or sample.get("kind") != "host":
            return
        if (sample.get("job_procs") or 0) > 1 or (sample.get("job_procs") and "rdzv" not in sample):
            self.done = True
        host.started = host.started or bool(sample.get("job_procs"))
        host.conn = sample.get("rdzv", host.conn)

    def check(self, now: float) -> Said:
        """What to say at `now` (monotonic); nothing once a host is past the rendezvous."""
        waited = now - self.began
        if self.done or waited < self.next_say:
            return Said()
        lines, alerts, advice = [], [], []
        if waited >= self.next_say:
            lines.append(waiting_line(self.where, self.hosts, waited))
            while self.next_say <= waited:
                self.next_say *= 2
        if waited >= self.report_after and not self.named:
            self.named = True
            missing = never_joined(self.hosts)
            alerts = [Alert(node, "rendezvous", f"never joined the rendezvous at {self.where} in "
                            f"{self.report_after:g} s: {why}") for node, why in missing.items()]
            if missing:
                advice.append(check_line(self.master, self.port, list(missing), self.report_after))
        return Said(lines, alerts, advice)
