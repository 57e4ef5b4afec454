"""A rank held off its CPU from outside (a SIGSTOP/SIGCONT duty cycle, a CFS quota) is named from its
process's scheduler figures, which the host's poller sends with its record (orchestrator/diagnose/held.py),
however on time it enters its collectives; a loaded machine, or a host whose ranks are all throttled
alike, names nobody; and a rank that misses reads is not left out (nor named for missing them)."""

from __future__ import annotations

from typing import Any

from orchestrator.diagnose.held import HELD_ROUNDS, HeldDetector
from orchestrator.telemetry.view import Monitor

LOOKS = 50  # looks a round (every 0.1 s for 5 s)


class Ranks:
    """Each rank's counters, grown round by round as a host's poller would send them."""

    def __init__(self, ranks: int) -> None:
        self.counters = {rank: {"cpu_ms": 0, "wait_ms": 0, "throttled_ms": 0, "nr_throttled": 0, "stopped": 0,
                                "looks": 0} for rank in range(ranks)}
        self.at = 1000.0

    def round(self, ranks: list[int], stopped: float = 0.0, throttled: float = 0.0, waiting: float = 0.0,
              held: tuple[int, ...] = ()) -> dict[str, Any]:
        """An event of `ranks` for the next 5 s round, the `held` ranks stopped/throttled those shares, all waiting."""
        for rank in ranks:
            c = self.counters[rank]
            c["looks"] += LOOKS
            c["wait_ms"] += int(waiting * 5000)
            if rank in held:
                c["stopped"] += int(stopped * LOOKS)
                c["throttled_ms"] += int(throttled * 5000)
        return {"at": self.at, "ranks": {str(r): {"done": 1, "entered": 1, "c": [], "sched": dict(self.counters[r])}
                                         for r in ranks}, "skipped": {}}

    def tick(self) -> None:
        self.at += 5.0


def run(ranks: Ranks, rounds: int, **how: Any) -> list[tuple[str, int]]:
    detector = HeldDetector(world_size=4)
    named = []
    for _ in range(rounds):
        for node, on in (("node0", [0, 1]), ("node1", [2, 3])):
            named += [(r.node, r.rank) for r in detector.observe(node, ranks.round(on, **{
                **how, "held": how.get("held", ()) if node == "node1" else ()}))]
        ranks.tick()
    return named


def test_ranks_stopped_three_quarters_of_the_time_are_named_after_three_rounds_with_their_host() -> None:
    assert run(Ranks(4), HELD_ROUNDS, stopped=0.75, held=(2, 3)) == []  # the first round is a baseline
    assert run(Ranks(4), HELD_ROUNDS + 1, stopped=0.75, held=(2, 3)) == [("node1", 2), ("node1", 3)]


def test_ranks_throttled_by_their_cpu_quota_are_named() -> None:
    assert run(Ranks(4), HELD_ROUNDS + 1, throttled=0.6, held=(2, 3)) == [("node1", 2), ("node1", 3)]


def test_a_loaded_machine_where_every_rank_waits_for_a_cpu_names_nobody() -> None:
    assert run(Ranks(4), 10, waiting=0.85) == []


def test_a_job_whose_every_rank_is_throttled_alike_names_nobody() -> None:
    detector = HeldDetector(world_size=2)
    ranks = Ranks(2)
    named = []
    for _ in range(10):
        named += detector.observe("localhost", ranks.round([0, 1], throttled=0.7, held=(0, 1)))
        ranks.tick()
    assert named == []


def test_a_held_rank_that_misses_rounds_is_not_left_out_and_not_answering_names_nobody() -> None:
    detector = HeldDetector(world_size=4)
    ranks = Ranks(4)
    named = []
    for round_ in range(2 * HELD_ROUNDS + 1):
        named += detector.observe("node0", ranks.round([0, 1]))
        event = ranks.round([2, 3], stopped=0.75, held=(2, 3))
        if round_ > 0:  # rank 3 is too held to answer its reads any more: its process's figures still come
            event["sched"] = {"3": event["ranks"].pop("3")["sched"]}
            event["skipped"] = {"3": "no answer within 1 s"}
        named += detector.observe("node1", event)
        ranks.tick()
    assert sorted((r.node, r.rank) for r in named) == [("node1", 2), ("node1", 3)]
    assert {r.rounds for r in named} == {HELD_ROUNDS}  # rank 3 as soon as rank 2: no round of it lost
    quiet = HeldDetector(world_size=2)  # at load 60 a healthy rank 0 missed three reads in a row: no sign
    for round_ in range(6):
        assert quiet.observe("node0", {"at": 100.0 + 5 * round_, "ranks": {"1": {"done": 1}},
                                       "skipped": {"0": "no answer within 1 s"}}) == []


def test_the_monitor_alerts_a_held_rank_with_its_figures_and_the_hosts_evidence() -> None:
    fired: list[Any] = []
    monitor = Monitor(["node0", "node1"], 1.0, fired.extend, lambda node: True, "job", world_size=4)
    ranks = Ranks(4)
    for _ in range(HELD_ROUNDS + 1):
        monitor.flight("node0", ranks.round([0, 1], waiting=0.3))
        monitor.flight("node1", ranks.round([2, 3], stopped=0.76, waiting=0.3, held=(2, 3)))
        ranks.tick()
    assert [(a.node, a.rank, a.rule) for a in fired] == [("node1", 2, "straggler"), ("node1", 3, "straggler")]
    assert fired[0].figures == {"held_pct": 76, "stopped_pct": 76, "throttled_pct": 0, "waiting_pct": 30,
                                "others_held_pct": 0, "rounds": 3}
    assert fired[0].message.startswith("straggler: rank 2 on node1 is held off its CPU 76% of the time (stopped 76%")
