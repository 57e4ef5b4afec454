"""What distrun shows of a fault-tolerant job's replica groups: their turns in the quorum read from
the lighthouse's lines, the live view's rows, each group's story in the summary, and the spares the
groups' controllers share (each handed to one group only)."""

from __future__ import annotations

import io
import multiprocessing
from pathlib import Path

from rich.console import Console

from orchestrator.diagnose.failures import Failure, FailureKind
from orchestrator.run.ft.story import story
from orchestrator.run.ft.timeline import Member, QuorumTail, Timeline, heal_source, quorum_of
from orchestrator.run.ft.view import group_row, render
from orchestrator.run.restarts import AttemptHistory, AttemptRecord
from orchestrator.run.spare_pool import SparePool
from orchestrator.spec.model import Restarts

UUID = ":1d455fd8-ace2-4114-b761-0d0b491f52c2"


def quorum_line(quorum_id: int, steps: dict[int, int]) -> bytes:
    """A lighthouse line as torchft 0.2's writes it (tests/cluster saw these), one member per group."""
    members = ", ".join(
        f'QuorumMember {{ replica_id: "group{g}{UUID}", address: "http://node{g}:37971", store_address: '
        f'"10.213.223.1{g}:30250", step: {step}, world_size: 1, shrink_only: false, commit_failures: 0, data: "" }}'
        for g, step in sorted(steps.items()))
    return (f"[lighthouse] 2026-11-26T03:32:17.802 [INFO] [torchft::lighthouse] - Quorum! Quorum {{ quorum_id: "
            f"{quorum_id}, participants: [{members}], created: Some(Timestamp {{ seconds: 1795663937, nanos: 1 }}) }}"
            "\n").encode()


def cut_and_heal() -> Timeline:
    """Three groups step together from t=100 to step 12; group 1 drops out (its host lost), the others
    step on to 28, group 1 comes back at t=200 at step 0 and heals; all three step to 30."""
    timeline = Timeline()
    for step in range(1, 13):
        timeline.observe(quorum_of(quorum_line(2, {0: step, 1: step, 2: step})), 100.0 + step)
    for step in range(13, 29):
        timeline.observe(quorum_of(quorum_line(3, {0: step, 2: step})), 150.0 + step)
    timeline.observe(quorum_of(quorum_line(4, {0: 28, 1: 0, 2: 28})), 200.0)
    for step in (29, 30):
        timeline.observe(quorum_of(quorum_line(4, {0: step, 1: step, 2: step})), 200.0 + step)
    return timeline


def lost(host: str) -> Failure:
    return Failure(host, FailureKind.LOST, reason="host lost: nothing heard for 4 s")


def test_a_lighthouse_quorum_line_gives_each_member_its_group_and_step() -> None:
    quorum = quorum_of(quorum_line(4, {0: 28, 1: 0}))
    assert [(m.group, m.step) for m in quorum.members] == [(0, 28), (1, 0)]
    assert (quorum.id, quorum.participants, quorum.step) == (4, ("group0", "group1"), 28)
    assert quorum_of(b"[lighthouse] ... Quorum status: Valid quorum found [1/1 participants healthy]") is None


def test_a_group_behind_heals_from_the_groups_at_the_top_step_in_torchfts_order() -> None:
    members = [Member("group0:a", 28), Member("group1:b", 0), Member("group2:c", 28), Member("group3:d", 5)]
    assert heal_source(members, members[1]) == members[0]
    assert heal_source(members, members[3]) == members[2], "the second behind takes the second at the top"
    assert heal_source(members, members[0]) is None


def test_the_timeline_keeps_the_step_a_group_was_lost_at_and_how_it_came_back() -> None:
    timeline = cut_and_heal()
    first, back = timeline.of(1)
    assert (first.joined_step, first.last_step, first.healed) == (1, 12, False)
    assert (back.began, back.joined_step, back.top_step, back.source, back.healed) == (200.0, 0, 28, 0, True)
    assert timeline.last_step(1) == 30 and timeline.latest == (0, 1, 2) and timeline.top_step == 30
    assert (timeline.last.id, timeline.last.participants) == (4, ("group0", "group1", "group2"))


def test_a_relaunched_group_is_a_new_stint_even_when_no_quorum_formed_without_it() -> None:
    timeline = Timeline()
    timeline.observe(quorum_of(quorum_line(2, {0: 5, 1: 5})), 100.0)
    relaunched = quorum_line(3, {0: 5, 1: 0}).replace(b'"group1' + UUID.encode(), b'"group1:new-process')
    timeline.observe(quorum_of(relaunched), 150.0)
    first, back = timeline.of(1)
    assert (first.last_step, back.began, back.healed, back.source) == (5, 150.0, True, 0)
    assert len(timeline.of(0)) == 1


def test_the_quorum_tail_reads_only_whole_lines_as_the_log_grows(tmp_path: Path) -> None:
    log = tmp_path / "lighthouse.log"
    timeline = Timeline()
    tail = QuorumTail(log, timeline)
    tail.poll()  # no log yet
    whole = quorum_line(2, {0: 3, 1: 3})
    log.write_bytes(whole + whole[:40])
    tail.poll()
    assert timeline.top_step == 3
    with log.open("ab") as more:
        more.write(whole[40:] + quorum_line(3, {0: 4}))
    tail.poll()
    assert timeline.latest == (0,) and timeline.of(1)[-1].last_step == 3


def test_the_story_of_a_group_lost_relaunched_on_a_spare_and_healed_names_its_steps() -> None:
    attempts = [AttemptRecord(1, ("node1",), started=95.0, ended=170.0, failure=lost("node1"), quarantined="node1"),
                AttemptRecord(2, ("node3",), started=190.0, ended=260.0, state="succeeded")]
    assert story(attempts, cut_and_heal().of(1)) == (
        "lost node1 at step 12, relaunched on node3, healed from group 0 at step 28")
    assert story([attempts[0], AttemptRecord(2, ("node3",), started=190.0)], []) == (
        "lost node1, relaunched on node3, not back in the quorum")
    succeeded = AttemptRecord(1, ("node0",), started=95.0, ended=260.0, state="succeeded")
    assert story([succeeded], cut_and_heal().of(0)) == ""


def test_the_story_of_a_rank_failure_relaunched_in_place_that_failed_again() -> None:
    crash = Failure("b", FailureKind.EXIT, rank=0, exit_code=3)
    attempts = [AttemptRecord(1, ("b",), started=95.0, ended=170.0, failure=crash),
                AttemptRecord(2, ("b",), started=190.0, ended=260.0, failure=crash)]
    assert story(attempts, cut_and_heal().of(1)) == (
        "rank 0 on b exited with code 3 at step 12, relaunched on the same host(s), b, healed from group 0 at "
        "step 28, rank 0 on b exited with code 3 at step 30")


def test_a_groups_row_says_relaunching_until_it_is_back_in_a_quorum_then_healed() -> None:
    timeline = cut_and_heal()
    ended = [AttemptRecord(1, ("node1",), started=95.0, ended=195.0, failure=lost("node1"))]
    healed = group_row(1, None, ("node3",), ended, timeline)
    assert (healed.state, healed.hosts, healed.relaunches, healed.step, healed.in_quorum) == (
        "healed", ("node3",), 1, 30, True)
    waiting = [AttemptRecord(1, ("node1",), started=95.0, ended=205.0, failure=lost("node1"))]
    assert group_row(1, None, ("node3",), waiting, timeline).state == "relaunching"
    assert group_row(0, None, ("node0",), [], timeline).state == "running"
    assert group_row(0, 0, ("node0",), [], timeline).state == "done"
    assert group_row(1, 1, ("node3",), ended, timeline).relaunches == 0, "its only attempt failed: never relaunched"
    assert group_row(1, 143, ("node3",), [], timeline).state == "stopped"


def test_the_live_table_has_a_row_per_group_and_the_lighthouse_and_quorum_under_it() -> None:
    timeline = Timeline()
    for step in range(1, 13):
        timeline.observe(quorum_of(quorum_line(2, {0: step, 1: step, 2: step})), 100.0 + step)
    timeline.observe(quorum_of(quorum_line(3, {0: 13, 2: 13})), 170.0)
    ended = [AttemptRecord(1, ("node1",), started=95.0, ended=175.0, failure=lost("node1"))]
    rows = [group_row(0, None, ("node0",), [], timeline), group_row(1, None, ("node3",), ended, timeline),
            group_row(2, None, ("node2",), [], timeline)]
    out = io.StringIO()
    Console(file=out, width=120).print(render(rows, "ft-1 · 3 replica group(s)", "lighthouse http://10.0.0.1:29510 "
                                              "· started 1 time(s)", timeline))
    lines = [line.rstrip() for line in out.getvalue().splitlines()]
    assert lines[0] == "ft-1 · 3 replica group(s)"
    assert [line.split() for line in lines if line.strip()[:1].isdigit()] == [
        ["0", "running", "node0", "0", "13", "in"], ["1", "relaunching", "node3", "1", "12", "out"],
        ["2", "running", "node2", "0", "13", "in"]]
    assert lines[-2:] == ["lighthouse http://10.0.0.1:29510 · started 1 time(s)",
                          "quorum: 2 group(s) (group0, group2) at step 13"]


def _lose_a_host(pool_path: str, owner: str, start: multiprocessing.synchronize.Barrier,
                 taken: multiprocessing.Queue) -> None:
    history = AttemptHistory(Restarts(max=1), 1, ("s1", "s2", "s3"), pool=SparePool(Path(pool_path), owner))
    history.begin([f"host-{owner}"])
    start.wait()
    verdict = history.verdict(lost(f"host-{owner}"))
    taken.put((owner, verdict.hosts))


def test_groups_that_lose_a_host_at_the_same_time_each_take_a_spare_of_their_own(tmp_path: Path) -> None:
    pool = tmp_path / "spares.json"
    context = multiprocessing.get_context("fork")
    start, taken = context.Barrier(3), context.Queue()
    losers = [context.Process(target=_lose_a_host, args=(str(pool), f"g{i}", start, taken)) for i in range(3)]
    for proc in losers:
        proc.start()
    for proc in losers:
        proc.join(30)
    chosen = dict(taken.get(timeout=5) for _ in losers)
    assert sorted(hosts for hosts in chosen.values()) == [("s1",), ("s2",), ("s3",)], chosen


def test_a_group_with_no_spare_left_by_the_others_gets_no_relaunch_and_sets_none_aside(tmp_path: Path) -> None:
    pool = tmp_path / "spares.json"
    first = AttemptHistory(Restarts(max=2), 1, ("s1",), pool=SparePool(pool, "g0"))
    second = AttemptHistory(Restarts(max=2), 1, ("s1",), pool=SparePool(pool, "g1"))
    first.begin(["a"])
    second.begin(["b"])
    assert first.verdict(lost("a")).hosts == ("s1",)
    assert second.verdict(lost("b")).hosts is None, "s1 is group 0's"
    first.begin(["s1"])
    assert first.verdict(Failure("s1", FailureKind.EXIT, rank=0, exit_code=1)).hosts == ("s1",), \
        "a group keeps the spare it took"


def test_a_spare_set_aside_as_unreachable_is_refilled_from_the_spares_no_other_group_took(tmp_path: Path) -> None:
    pool = tmp_path / "spares.json"
    other = AttemptHistory(Restarts(max=1), 1, ("s1", "s2", "s3"), pool=SparePool(pool, "g0"))
    other.begin(["a"])
    assert other.verdict(lost("a")).hosts == ("s1",)
    history = AttemptHistory(Restarts(max=1), 1, ("s2", "s3"), pool=SparePool(pool, "g1"))
    with SparePool(pool, "g2").claims() as claims:
        claims["s3"] = "g2"
    assert history.refill(("s2",), {"s2"}, ("s3",)) is None, "s3 is group 2's"
    history = AttemptHistory(Restarts(max=1), 1, (), pool=SparePool(pool, "g1"))
    assert history.refill(("s9",), {"s9"}, ("s2", "s3")) == (("s2",), ())
