"""`distrun doctor --links`: each host's own link, measured against the other hosts', so that one slow
link is named instead of hiding in the bus figure of `--bandwidth`.

Every host runs remote/linkcheck.py at once. In each round every host sends to the host `shift`
places after it (in the selection's order) and receives from the one `shift` places before it, all
at the same time, for ROUND_S seconds; the shifts are 1, 2, 4, ... (fewer than the hosts), so
64 hosts take 6 rounds. A pair's rate is measured where it arrives. A host's send rate is the best
of its rounds (a slow partner in one round does not make it slow), as is its receive rate; a host
whose best is below SLOW_FRACTION of the hosts' median is a ✗. A link limited in one direction (a
`tc ... tbf` on a host's interface shapes what it sends) shows on that side only.
"""

from __future__ import annotations

import json
import queue
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from orchestrator import remote
from orchestrator.errors import one_line
from orchestrator.fanout.group import Group
from orchestrator.hostcheck.checks import Check, Status, listing
from orchestrator.spec.model import NodeSpec
from orchestrator.transport import Transport
from orchestrator.transport.base import RemoteProcess

ROUND_S = 1.0
SLOW_FRACTION = 0.25
START_S = 30.0  # a host's program must say its port within this
ROUND_WAIT_S = ROUND_S + 20.0  # and each round's result within this


@dataclass(frozen=True)
class Pair:
    """What `receiver` got from `sender` in one round (bytes over the seconds from first to last byte)."""

    sender: str
    receiver: str
    round: int
    bytes: int
    seconds: float
    error: str | None = None

    @property
    def rate(self) -> float:
        """Bytes per second (0 for a pair that carried nothing)."""
        return self.bytes / self.seconds if self.seconds > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {"sender": self.sender, "receiver": self.receiver, "round": self.round, "bytes": self.bytes,
                "seconds": round(self.seconds, 4), "mbytes_per_s": round(self.rate / 1e6, 3), "error": self.error}


@dataclass(frozen=True)
class HostLink:
    """One host's best send and receive rates over the rounds, bytes per second."""

    host: str
    send: float
    recv: float


@dataclass(frozen=True)
class LinkReport:
    """Every pair of every round, and the hosts that could not take part (host -> why)."""

    hosts: tuple[str, ...]
    shifts: tuple[int, ...]
    pairs: list[Pair] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)
    seconds: float = 0.0

    def links(self) -> list[HostLink]:
        """Each host's best rates (hosts that took part)."""
        return [HostLink(h, best(p.rate for p in self.pairs if p.sender == h),
                         best(p.rate for p in self.pairs if p.receiver == h))
                for h in self.hosts if h not in self.failed]

    def medians(self) -> tuple[float, float]:
        """The median over the hosts of their best send and receive rates."""
        links = self.links()
        return (statistics.median(x.send for x in links) if links else 0.0,
                statistics.median(x.recv for x in links) if links else 0.0)

    def slow(self, fraction: float = SLOW_FRACTION) -> dict[str, str]:
        """host -> why its link is slow: its figure against the median."""
        send_median, recv_median = self.medians()
        found: dict[str, str] = {}
        for link in self.links():
            said = [f"{what} {mb(rate)} against the median {mb(median)}"
                    for what, rate, median in (("sends", link.send, send_median), ("receives", link.recv, recv_median))
                    if median > 0 and rate < fraction * median]
            if said:
                found[link.host] = "; ".join(said)
        return found

    def to_dict(self) -> dict[str, Any]:
        send_median, recv_median = self.medians()
        return {"shifts": list(self.shifts), "round_s": ROUND_S, "seconds": round(self.seconds, 2),
                "median_send_mbytes_per_s": round(send_median / 1e6, 3),
                "median_recv_mbytes_per_s": round(recv_median / 1e6, 3),
                "hosts": [{"host": x.host, "send_mbytes_per_s": round(x.send / 1e6, 3),
                           "recv_mbytes_per_s": round(x.recv / 1e6, 3)} for x in self.links()],
                "slow": self.slow(), "failed": self.failed, "pairs": [p.to_dict() for p in self.pairs]}


def best(rates: Any) -> float:
    return max(rates, default=0.0)


def mb(rate: float) -> str:
    """`6.1 MB/s` (10^6 bytes)."""
    return f"{rate / 1e6:.1f} MB/s"


def shifts(n: int) -> tuple[int, ...]:
    """The rounds' shifts for n hosts: 1, 2, 4, ... below n (none for one host)."""
    found, step = [], 1
    while step < n:
        found.append(step)
        step *= 2
    return tuple(found)


class Silent(Exception):
    """A host's program said nothing in time."""

    def __init__(self, host: str, message: str) -> None:
        super().__init__(message)
        self.host = host


class Prog:
    """One host's linkcheck program: its stdout's lines in a queue, its port, its address."""

    def __init__(self, transport: Transport) -> None:
        self.name = transport.name
        self.lines: queue.Queue[str] = queue.Queue()
        self.address = transport.peer_address()
        program = remote.module_source("linkcheck").encode()
        self.proc: RemoteProcess = transport.start(remote.lean_argv(transport.node.python, program, f"{ROUND_S:g}"))
        self.errors: list[str] = []
        self.proc.stream(self.lines.put, self.errors.append)
        self.proc.write(program)
        self.port = int(self.next(START_S)["port"])

    def next(self, timeout: float) -> dict[str, Any]:
        """Its next JSON line, within `timeout` seconds."""
        try:
            return dict(json.loads(self.lines.get(timeout=timeout)))
        except queue.Empty:
            said = f": {self.errors[-1]}" if self.errors else ""
            raise Silent(self.name, f"the link check said nothing for {timeout:g} s{said}") from None

    def end(self) -> None:
        """Close its stdin (it ends), and stop it if it does not within a few seconds."""
        self.proc.close_stdin()
        if self.proc.wait(5) is None:
            self.proc.terminate()


def measure_links(nodes: Sequence[NodeSpec]) -> LinkReport:
    """Reach every host, start its program, and run the rounds; a host that fails is one entry of `failed`."""
    began = time.monotonic()
    with Group(nodes) as group:
        started = group.run(Prog)
        progs = list(started.succeeded.values())
        failed = {host: one_line(exc) for host, exc in started.failed.items()}
        try:
            pairs = run_rounds(progs, failed)
        finally:
            for prog in progs:
                prog.end()
    return LinkReport(tuple(n.name for n in nodes), shifts(len(progs)), pairs, failed, time.monotonic() - began)


def run_rounds(progs: list[Prog], failed: dict[str, str]) -> list[Pair]:
    """Every round at once on every host; a host that stops answering is failed and the rounds end."""
    pairs: list[Pair] = []
    for number, shift in enumerate(shifts(len(progs))):
        for i, prog in enumerate(progs):
            target = progs[(i + shift) % len(progs)]
            prog.proc.write((json.dumps({"to": target.address, "port": target.port}) + "\n").encode())
        try:
            said = [prog.next(ROUND_WAIT_S) for prog in progs]
        except Silent as exc:
            failed[exc.host] = str(exc)
            return pairs
        for i, got in enumerate(said):
            sender = (i - shift) % len(progs)
            error = said[sender].get("send_error") or got.get("error")
            pairs.append(Pair(progs[sender].name, progs[i].name, number, int(got.get("recv") or 0),
                              float(got.get("recv_s") or 0.0), str(error) if error else None))
    return pairs


def links_check(report: LinkReport) -> Check:
    """✗ for a host that could not take part or whose link is slow against the others'; else ✓ with the medians."""
    hosts = list(report.hosts)
    if len(report.hosts) - len(report.failed) < 2:
        problems = report.failed or {h: "one host has no peer to measure a link against" for h in hosts}
        status = Status.ERROR if report.failed else Status.OK
        return Check("links", status, hosts, listing(problems), "fix the host's reach first" if report.failed else "")
    problems = {**report.failed, **report.slow(), **errors_of(report)}
    send, recv = report.medians()
    if problems:
        return Check("links", Status.ERROR, sorted(problems, key=hosts.index), listing(problems),
                     "check that host's link: its speed (ethtool), errors and drops (ip -s link), a qdisc "
                     "shaping it (tc qdisc show), its cable or switch port")
    return Check("links", Status.OK, hosts, f"every host sends {mb(send)} and receives {mb(recv)} (medians over "
                 f"{len(report.shifts)} round(s) of {ROUND_S:g} s), none under {SLOW_FRACTION:.0%} of that")


def errors_of(report: LinkReport) -> dict[str, str]:
    """host -> the first error of a pair it sent (a peer it could not reach)."""
    found: dict[str, str] = {}
    for pair in report.pairs:
        if pair.error:
            found.setdefault(pair.sender, f"to {pair.receiver}: {pair.error}")
    return found


def render_links(report: LinkReport) -> str:
    """Each host's best send and receive rate, the medians last."""
    if not report.pairs:
        return ""
    send, recv = report.medians()
    slow = report.slow()
    lines = [f"links ({len(report.shifts)} round(s) of {ROUND_S:g} s, best of the rounds):",
             f"{'host':<16} {'sends':>12} {'receives':>12}"]
    lines += [f"{x.host:<16} {mb(x.send):>12} {mb(x.recv):>12}{'  ✗ slow' if x.host in slow else ''}"
              for x in report.links()]
    lines.append(f"{'median':<16} {mb(send):>12} {mb(recv):>12}")
    return "\n".join(lines)
