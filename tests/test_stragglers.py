"""The straggler detector fed with every rank's metrics records, interval by interval."""

from __future__ import annotations

import time

from orchestrator.diagnose.stragglers import Detector, Straggler

FAST, SLOW = 0.10, 0.40


def interval(detector: Detector, step: int, times: dict[int, float], node_of: int = 2) -> list[Straggler]:
    """Each rank's record of the interval ending at `step` (rank r on node r // node_of)."""
    named = []
    for rank, busy in times.items():
        record = {"step": step, "rank": rank, "step_time_s": SLOW, "busy_s": busy}
        named += detector.observe(f"node{rank // node_of}", record)
    return named


def run(detector: Detector, slow_steps: range, ranks: int = 6, slow_rank: int = 3,
        last: int = 12) -> list[Straggler]:
    named = []
    for step in range(1, last + 1):
        times = {r: SLOW if r == slow_rank and step in slow_steps else FAST for r in range(ranks)}
        named += interval(detector, step, times)
    return named


def test_a_rank_slow_for_four_intervals_is_not_named():
    assert run(Detector(world_size=6), range(3, 7)) == []


def test_a_rank_slow_for_five_intervals_is_named_once_with_its_host():
    (named,) = run(Detector(world_size=6), range(3, 12))
    assert (named.node, named.rank, named.step, named.intervals) == ("node1", 3, 7, 5)
    assert named.median_s == FAST
    assert "rank 3" in named.message() and "4.0x the median" in named.message()


def test_a_rank_that_recovered_and_slowed_again_is_named_again():
    detector = Detector(world_size=6)
    named = run(detector, range(1, 6), last=6) + run(detector, range(7, 12), last=12)
    assert [(n.rank, n.step) for n in named] == [(3, 5), (3, 11)]


def test_an_interval_is_judged_when_a_later_one_begins_without_a_world_size():
    detector = Detector()
    named = run(detector, range(1, 6), last=5)
    assert named == []  # interval 5 is still open: nothing says every rank reported it
    assert [n.step for n in interval(detector, 6, {0: FAST})] == [5]


def test_with_two_ranks_the_median_is_their_mean_so_only_a_rank_over_3x_the_other_is_named():
    # median(a, b) = (a + b) / 2, and b > 1.5 * (a + b) / 2 only when b > 3a.
    def named(slow: float) -> list[int]:
        detector = Detector(world_size=2)
        return [n.rank for step in range(1, 7) for n in interval(detector, step, {0: FAST, 1: slow})]

    assert named(2.9 * FAST) == []
    assert named(4 * FAST) == [1]


def test_one_rank_is_never_its_own_straggler():
    assert run(Detector(world_size=1), range(1, 13), ranks=1, slow_rank=0) == []


def test_a_missing_interval_breaks_the_run_of_slow_ones():
    detector = Detector(world_size=3)
    named = []
    for step in range(1, 10):
        times = {0: FAST, 1: FAST, 2: SLOW}
        if step == 4:
            del times[2]  # rank 2's line for interval 4 never came
        named += interval(detector, step, times)
    assert [n.step for n in named] == [9]  # 5 slow intervals counted again from interval 5


def test_a_late_record_of_a_judged_interval_is_ignored_and_other_records_are_skipped():
    detector = Detector(world_size=2)
    interval(detector, 1, {0: FAST})
    interval(detector, 2, {0: FAST, 1: FAST})  # interval 1 judged when interval 2 began
    assert detector.observe("node0", {"step": 1, "rank": 1, "busy_s": SLOW}) == []
    assert detector.observe("node0", {"final": True, "step": 2, "rank": 0, "busy_s": SLOW}) == []
    assert detector.observe("node0", {"step": 3, "samples_per_s": 10.0}) == []
    assert detector.pending == {}



def test_metrics_lines_with_twenty_thousand_rank_values_cost_the_detector_linear_time_and_name_no_foreign_rank():
    # A script printing 20,000 DISTRUN_METRICS lines, each of its own step and "rank" (issue 46 item 7: 133 s).
    for detector in (Detector(world_size=2), Detector()):
        started = time.process_time()
        found = [s for n in range(1, 20_001) for s in detector.observe("node0", {"step": n, "rank": n, "busy_s": 9.0})]
        assert found == [] and time.process_time() - started < 3.0
        assert len(detector.streaks) <= 1 and len(detector.pending) <= 1
