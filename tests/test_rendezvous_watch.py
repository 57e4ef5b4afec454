"""The launch's word while no host is past the rendezvous (telemetry/rendezvous.py), on handmade samples."""

from __future__ import annotations

from orchestrator.telemetry.rendezvous import RendezvousWatch

NODES = ["node0", "node1", "node2"]


def watch(report_after: float = 60) -> RendezvousWatch:
    return RendezvousWatch(NODES, "node0", "10.0.0.1", 29500, report_after, began=0.0)


def sample(procs: int, rdzv: str | None) -> dict:
    return {"kind": "host", "job_procs": procs, **({"rdzv": rdzv} if rdzv else {})}


def stuck(w: RendezvousWatch) -> None:
    """node0-1 connected, node2's SYNs unanswered; nobody has workers."""
    for node in NODES:
        w.started(node)
    w.sample("node0", sample(1, "established"))
    w.sample("node1", sample(1, "established"))
    w.sample("node2", sample(1, "connecting"))


def test_a_stuck_rendezvous_is_said_at_30_s_then_at_each_doubling_not_every_second() -> None:
    w = watch()
    stuck(w)
    said = {t: w.check(float(t)).lines for t in range(0, 200)}
    assert [t for t, lines in said.items() if lines] == [30, 60, 120]
    assert said[30] == ["waiting for the rendezvous at node0 10.0.0.1:29500 for 30 s (3 of 3 hosts started torchrun, "
                        "2 connected to it, no rank past it yet)"]


def test_after_the_bound_the_host_whose_syns_go_unanswered_is_named_once_with_what_to_check() -> None:
    w = watch(report_after=60)
    stuck(w)
    assert not w.check(59).alerts
    said = w.check(60)
    assert [(a.node, a.rule) for a in said.alerts] == [("node2", "rendezvous")]
    assert said.alerts[0].message == ("never joined the rendezvous at node0 10.0.0.1:29500 in 60 s: its torchrun's "
                                      "connection to it gets no answer (a firewall drops its SYNs, or no route)")
    assert said.advice[0].startswith("node2 never joined within 60 s: check that they reach node0's port 29500")
    assert "`distrun doctor` checks port-reachable" in said.advice[0]
    assert not w.check(200).alerts, "named once"


def test_a_short_bound_says_the_wait_with_the_named_hosts() -> None:
    w = watch(report_after=10)
    stuck(w)
    said = w.check(10)
    assert said.lines and said.lines[0].startswith("waiting for the rendezvous") and said.alerts


def test_a_host_whose_torchrun_never_started_or_holds_no_connection_is_named_with_that() -> None:
    w = watch(report_after=5)
    w.started("node0")
    w.sample("node0", sample(1, "established"))
    w.sample("node1", sample(1, "none"))
    why = {a.node: a.message.split(": ", 1)[1] for a in w.check(5).alerts}
    assert why == {"node1": "its torchrun holds no connection to it (refused or reset, or not tried yet)",
                   "node2": "its torchrun has not started (its supervisor has not said it started it)"}


def test_nothing_is_said_once_any_host_has_workers_or_a_rank_printed() -> None:
    w = watch(report_after=5)
    stuck(w)
    w.sample("node1", sample(3, None))
    said = w.check(500)
    assert not said.lines and not said.alerts
    other = watch(report_after=5)
    stuck(other)
    other.past()
    assert not other.check(500).lines and not other.check(500).alerts


def test_a_sample_without_the_connection_field_is_past_it() -> None:
    """The sampler drops `rdzv` once the workers started (or where it cannot read the endpoint)."""
    w = watch(report_after=5)
    stuck(w)
    w.sample("node2", sample(1, None))
    assert w.done and not w.check(100).alerts
