"""A job's progress from its ranks' Flight Recorders (orchestrator/diagnose/progress.py), issue 45 item 1:
ranks in lock-step never show apart because their hosts were read at different moments, a finished
job's positions are what every rank left as it ended and its rate is the whole run's, and the step
shows where the collectives repeat."""

from __future__ import annotations

from typing import Any

from orchestrator.diagnose.progress import FlightProgress, progress_line, progress_lines, step_period
from tests.test_flight_stragglers import events


def event(at: float, done: dict[int, int], final: bool = False, c: dict[int, list[Any]] | None = None
          ) -> dict[str, Any]:
    ranks = {str(rank): {"done": seq, "entered": seq, "c": (c or {}).get(rank, [])} for rank, seq in done.items()}
    return {"at": at, "ranks": ranks, "skipped": {}, **({"final": sorted(done)} if final else {})}


def test_lock_step_ranks_read_in_one_round_never_show_apart_whatever_order_their_hosts_events_come_in() -> None:
    progress = FlightProgress(world_size=4)
    progress.observe(event(100.02, {0: 500, 1: 500}), now=100.1)
    progress.observe(event(100.03, {2: 500, 3: 501}), now=101.9)  # the other host's round, delayed
    progress.observe(event(105.01, {0: 540, 1: 540}), now=105.1)  # the first host's next round, ahead of the other's
    shown = progress.to_dict()
    assert shown["ranks"] == {"0": 500, "1": 500, "2": 500, "3": 501}  # one round's positions, not 540 beside 500
    progress.observe(event(105.04, {2: 540, 3: 540}), now=107.0)
    assert progress.to_dict()["ranks"] == {str(r): 540 for r in range(4)}
    assert abs(progress.to_dict()["collectives_per_s"] - 8.0) < 0.1  # (540 - 500) over the 5 s between rounds


def test_a_finished_jobs_positions_are_what_every_rank_left_as_it_ended_and_its_rate_the_whole_runs() -> None:
    progress = FlightProgress(world_size=4)
    first = [[1, "all_reduce", 1_000_000], [2, "all_reduce", 1_100_000]]  # the first collective at t = 1 s
    progress.observe(event(5.0, {0: 40, 1: 40}, c={0: first}), now=5.0)
    progress.observe(event(5.0, {2: 40, 3: 40}), now=5.0)
    progress.observe(event(60.0, {0: 1000, 1: 1000}), now=60.0)
    progress.observe(event(58.0, {2: 1700, 3: 1701}, final=True), now=58.2)  # node1's ranks ended
    progress.observe(event(58.1, {0: 1701, 1: 1701}, final=True), now=58.3)
    ended = progress.to_dict(ended=True)
    assert ended["ranks"] == {"0": 1701, "1": 1701, "2": 1700, "3": 1701}
    assert ended["collectives_per_s"] == ended["mean_collectives_per_s"] == round(1700 / 57.1, 2)
    assert ended["seconds"] == 57.1
    (line,) = progress_lines(ended, None)
    assert line == ("  progress: 29.8 collectives/s, ranks at #1700 (2), #1701 (0-1,3) "
                    "(1700 collectives completed in 57 s)")


def test_a_job_that_ran_never_ends_at_zero_collectives_a_second() -> None:
    progress = FlightProgress(world_size=2)
    progress.observe(event(10.0, {0: 5, 1: 5}, c={0: [[1, "all_reduce", 9_000_000]]}), now=10.0)
    progress.observe(event(12.0, {0: 9, 1: 9}, final=True), now=12.0)
    assert progress.to_dict(ended=True)["collectives_per_s"] == 3.0  # 9 collectives from 9 s to 12 s


def test_the_step_is_the_period_of_the_ops_and_of_the_long_gap_between_steps() -> None:
    four = [("all_reduce", step * 0.150 + i * 0.004) for step in range(40) for i in range(4)]
    assert step_period(four) == 4
    even = [("all_reduce", i * 0.1) for i in range(100)]
    assert step_period(even) is None  # every gap alike: one a step, or several evenly, cannot be told
    mixed = [(op, i * 0.1) for i in range(30) for op in ("broadcast", "all_reduce", "all_reduce")]
    assert step_period(mixed) == 3  # every gap alike, but the ops repeat exactly
    epochs = []  # 2 all_reduces a step (DDP's two buckets), and a broadcast after each 10 steps
    for step in range(60):
        epochs += [("all_reduce", step * 0.2 + 0.05), ("all_reduce", step * 0.2 + 0.07)]
        if step % 10 == 9:
            epochs.append(("broadcast", step * 0.2 + 0.08))
    assert step_period(epochs) == 2


def test_a_real_runs_step_of_two_all_reduces_shows_in_the_summary() -> None:
    # tests/data/flight: 90 steps of two all_reduces, each rank sleeping before a step's first.
    progress = FlightProgress(world_size=3)
    for _, fr in events("late2", polls=5):
        progress.observe(fr, now=max(c[2] for c in fr["ranks"][next(iter(fr["ranks"]))]["c"]) / 1e6)
    ended = progress.to_dict(ended=True)
    assert ended["step"]["collectives"] == 2
    assert progress_line(ended).startswith(f"{ended['collectives_per_s']:.1f} collectives/s (2 a step, ")


def test_a_rank_that_runs_again_after_it_ended_is_read_again() -> None:
    progress = FlightProgress(world_size=2)
    progress.observe(event(10.0, {0: 50, 1: 50}, final=True), now=10.0)
    assert progress.to_dict()["ranks"] == {"0": 50, "1": 50}
    progress.observe(event(20.0, {0: 7, 1: 7}), now=20.0)  # torchrun restarted the workers
    assert progress.to_dict()["ranks"] == {"0": 7, "1": 7}
