"""The one judge of every fault cell: the five invariants of tests/faults/README.md.

`check(cell, seen, job_id)` returns every violation (an empty list when the cell holds), so a
failing cell reports all it broke at once.
"""

from __future__ import annotations

import itertools
import re
import signal

from tests.faults.matrix import FT_GROUP, GRACE, HEARTBEAT, LIGHTHOUSE_NEXT, Cell, Fault, Outcome, Phase
from tests.faults.scene import HOSTS, IMPOSTOR_RANK, Observed

TERMINAL_LINE = re.compile(r"^\[(node\d) r(\d+)\] (tick \d+ \d+)$")
TICK = re.compile(r"^tick (\d+) (\d+)$")
FT_LINE = re.compile(r"^\[g(\d+)\] \[(node\d) r0\] ft step (\d+) group \d+ participants \d+ t ([\d.]+)$", re.M)
FT_RELAUNCH = "restarting: attempt 2"
LIGHTHOUSE_MOVED = re.compile(r"^\[lighthouse\] restarting: attempt 2 on (\S+?):", re.M)
MAX_PAUSE = 20.0  # the longest a surviving replica group may go without a step (issue 27)
SPARE = "node2"
CUT_HOST_BOUND = HEARTBEAT + GRACE + 3  # a cut host ends the job itself, from its link's return
EXIT_CODES = {Outcome.FAILED: 1, Outcome.SUCCEEDED: 0, Outcome.REFUSED: 3, Outcome.ABANDONED: -signal.SIGKILL,
              Outcome.LOST: -signal.SIGKILL}
UNRECORDED = (Outcome.REFUSED, Outcome.ABANDONED)


def check(cell: Cell, seen: Observed, job_id: str) -> list[str]:
    """Every invariant `seen` breaks for `cell`."""
    return [*hosts_clean(cell, seen), *controller_back(cell, seen), *cause_named(cell, seen),
            *lines_kept(cell, seen), *bystander_untouched(cell, seen), *other_groups_untouched(cell, seen)]


def hosts_clean(cell: Cell, seen: Observed) -> list[str]:
    """a) Within the bound no process of the job is left on a reachable host; a cut host ends the
    job itself within heartbeat + grace of its link's return."""
    problems = []
    if seen.clean is None or seen.clean > cell.bound:
        when = "never" if seen.clean is None else f"{seen.clean:.1f} s"
        problems.append(f"a) reachable hosts clean after {when} (bound {cell.bound:g} s): {seen.leftovers}")
    elif seen.leftovers:
        problems.append(f"a) processes of the job came back or stayed: {seen.leftovers}")
    if seen.cut_clean is not None and seen.cut_clean > CUT_HOST_BOUND:
        problems.append(f"a) the cut host was clean {seen.cut_clean:.1f} s after its link returned "
                        f"(bound {CUT_HOST_BOUND:g} s)")
    return problems


def controller_back(cell: Cell, seen: Observed) -> list[str]:
    """b) The controller returns within the bound with the right exit code and recorded state."""
    problems = []
    if seen.returned is None or seen.returned > cell.bound:
        when = "never" if seen.returned is None else f"after {seen.returned:.1f} s"
        problems.append(f"b) the controller returned {when} (bound {cell.bound:g} s)")
    expected = EXIT_CODES[cell.outcome]
    if seen.rc != expected:
        problems.append(f"b) exit code {seen.rc}, expected {expected}: {seen.terminal[-1500:]}")
    state = None if seen.record is None else seen.record["state"]
    wanted = None if cell.outcome in UNRECORDED else cell.outcome.value
    if state != wanted:
        problems.append(f"b) recorded state {state}, expected {wanted}")
    if cell.outcome is Outcome.REFUSED and "Traceback" in seen.terminal:
        problems.append(f"b) a traceback instead of one line: {seen.terminal[-1500:]}")
    return problems


def cause_named(cell: Cell, seen: Observed) -> list[str]:
    """c) The record names the right host, rank and reason (its failure data, not its text); a
    refused launch names the host in its one-line error; a process that is not provably the job's
    is never signalled, attached to or believed."""
    return [*impostor_ignored(seen), *_cause_named(cell, seen)]


def impostor_ignored(seen: Observed) -> list[str]:
    """c) Another user's process carrying the job's markers and RANK=7 (scene.Scene.pose_as_rank)
    is alive after the cell and no failure names rank 7."""
    problems = []
    if seen.impostor_alive is False:
        problems.append("c) another user's process with the job's markers was ended")
    named = [f for f in (seen.record or {}).get("failures", []) if f.get("rank") == IMPOSTOR_RANK]
    if named:
        problems.append(f"c) a failure names rank {IMPOSTOR_RANK}, another user's process: {named[0]}")
    return problems


def _cause_named(cell: Cell, seen: Observed) -> list[str]:
    cause = cell.cause
    if cell.outcome in UNRECORDED:
        if cause is not None and not (cause.host in seen.terminal and cause.said_in(seen.terminal)):
            return [f"c) the error does not name {cause.host} and {cause.shown()}: {seen.terminal[-800:]}"]
        return []
    failures = (seen.record or {}).get("failures", [])
    if cause is None:
        return [f"c) failures recorded for a job that did not fail: {failures}"] if failures else []
    if not failures:
        return [f"c) no failure recorded; expected {cause}"]
    root = failures[0]
    problems = []
    if root["host"] != cause.host and not (cause.host is None and root["host"] in HOSTS):
        problems.append(f"c) root cause host {root['host']}, expected {cause.host or 'one of the job'}")
    if root["rank"] != cause.rank:
        problems.append(f"c) root cause rank {root['rank']}, expected {cause.rank}")
    if root["kind"] != cause.kind:
        problems.append(f"c) root cause kind {root['kind']}, expected {cause.kind}")
    if cause.signal is not None and root["signal"] != cause.signal:
        problems.append(f"c) root cause signal {root['signal']}, expected {cause.signal}")
    described = describe(root) + (f"; error: {root['message']}" if root.get("message") else "")
    if not cause.said_in(described):
        problems.append(f"c) root cause says {described!r}, expected {cause.shown()}")
    return problems


def describe(failure: dict) -> str:
    from orchestrator.diagnose.failures import Failure

    return Failure.from_dict(failure).describe()


def lines_kept(cell: Cell, seen: Observed) -> list[str]:
    """d) Every line that reached the controller is in the job directory: each rank line the
    terminal showed is in the job's lines, and each rank's file holds its ticks 0..n without a gap."""
    if cell.phase is Phase.PREFLIGHT or not cell.lines_kept:
        return []
    combined = set(seen.files.get("combined", "").splitlines())
    problems = []
    shown = [line for line in seen.terminal.splitlines() if TERMINAL_LINE.match(line) or FT_LINE.match(line)]
    missing = [line for line in shown if line not in combined]
    if missing:
        problems.append(f"d) {len(missing)} line(s) shown but not in the job's lines, e.g. {missing[:3]}")
    for name, text in seen.files.items():
        if not name.startswith("rank"):
            continue
        ticks = [int(m.group(2)) for m in map(TICK.match, text.splitlines()) if m]
        if ticks != list(range(len(ticks))):
            gaps = sorted(set(range(max(ticks, default=0) + 1)) - set(ticks))[:5]
            problems.append(f"d) {name}.out: ticks out of order or missing (e.g. {gaps})")
    return problems


def bystander_untouched(cell: Cell, seen: Observed) -> list[str]:
    """e) Another job on the same hosts keeps every process and goes on printing."""
    if not cell.bystander or not seen.bystander_before:
        return []
    problems = []
    for host, pids in seen.bystander_before.items():
        gone = pids - seen.bystander_after.get(host, set())
        if gone:
            problems.append(f"e) the other job lost processes {sorted(gone)} on {HOSTS[host]}")
    before, after = seen.bystander_lines
    if after <= before:
        problems.append("e) the other job printed nothing after the fault")
    return problems


def other_groups_untouched(cell: Cell, seen: Observed) -> list[str]:
    """e) In a fault-tolerant job that must succeed, the other group steps on (no step repeated or
    skipped, no pause over MAX_PAUSE), and the faulted group is relaunched (on the spare when its host
    was cut) and heals from its peer: its first step after the relaunch is above its last before."""
    if cell.phase is not Phase.FT or cell.outcome is not Outcome.SUCCEEDED:
        return []
    if cell.fault is Fault.LIGHTHOUSE_KILLED:
        return lighthouse_back(cell, seen)
    problems = []
    if re.search(rf"^\[g(?!{FT_GROUP}\])\d+\] restarting", seen.terminal, re.M):
        # torchft 0.2.0 may crash the other group too when its peer dies mid-allreduce (its DDP
        # comm hook's `assert fut._fut`, seen once in CI); `restarts` relaunches it and the job
        # succeeds, but then no group holds the state to heal from: only the relaunches are held.
        if not re.search(rf"^\[g{FT_GROUP}\] restarting", seen.terminal, re.M):
            problems.append(f"e) group {FT_GROUP} was not relaunched")
        print(f"{cell.id}: the other group crashed and was relaunched too (torchft's hazard)")
        return problems
    survivor = [(int(step), float(when)) for group, _, step, when in FT_LINE.findall(seen.terminal)
                if int(group) != FT_GROUP]
    steps = [step for step, _ in survivor]
    if not steps or steps != list(range(steps[0], steps[0] + len(steps))):
        problems.append(f"e) the other group repeated or skipped a step: {steps}")
    pause = max((b - a for (_, a), (_, b) in itertools.pairwise(survivor)), default=0.0)
    if pause > MAX_PAUSE:
        problems.append(f"e) the other group paused {pause:.1f} s (bound {MAX_PAUSE:g} s)")
    before, relaunched, after = seen.terminal.partition(FT_RELAUNCH)
    old = [int(step) for group, _, step, _ in FT_LINE.findall(before) if int(group) == FT_GROUP]
    new = [(node, int(step)) for group, node, step, _ in FT_LINE.findall(after) if int(group) == FT_GROUP]
    if not relaunched or not new:
        problems.append(f"e) group {FT_GROUP} was not relaunched, or never stepped after it")
    elif new[0][1] <= max(old, default=0):
        problems.append(f"e) group {FT_GROUP} did not heal from its peer: step {new[0][1]} after {max(old)}")
    if new and cell.fault is Fault.LINK_CUT and new[0][0] != SPARE:
        problems.append(f"e) group {FT_GROUP} came back on {new[0][0]}, not the spare {SPARE}")
    print(f"{cell.id}: other group's longest pause {pause:.1f} s; group {FT_GROUP} back at step "
          f"{new[0][1] if new else None} (last before: {max(old, default=None)})")
    return problems


def lighthouse_back(cell: Cell, seen: Observed) -> list[str]:
    """e) The SIGKILLed lighthouse is started again on the next host, and group FT_GROUP steps after
    it. A group torchft 0.2.0 crashes meanwhile may be relaunched (docs/fault-tolerance.md),
    so neither "no relaunch" nor the other group's pause is demanded; the pauses are printed."""
    moved = LIGHTHOUSE_MOVED.search(seen.terminal)
    if moved is None:
        return ["e) the lighthouse was not started again"]
    problems = []
    if moved.group(1) != LIGHTHOUSE_NEXT:
        problems.append(f"e) the lighthouse came back on {moved.group(1)}, not {LIGHTHOUSE_NEXT}")
    after = seen.terminal[moved.end():]
    if not any(int(group) == FT_GROUP for group, *_ in FT_LINE.findall(after)):
        problems.append(f"e) group {FT_GROUP} never stepped after the lighthouse was started again")
    for group in ("0", "1"):
        times = [float(when) for g, _, _, when in FT_LINE.findall(seen.terminal) if g == group]
        pause = max((b - a for a, b in itertools.pairwise(times)), default=0.0)
        print(f"{cell.id}: group {group}'s longest pause {pause:.1f} s")
    relaunched = [line for line in seen.terminal.splitlines()
                  if FT_RELAUNCH in line and not line.startswith("[lighthouse]")]
    print(f"{cell.id}: lighthouse back on {moved.group(1)}; group relaunches: {relaunched}")
    return problems
