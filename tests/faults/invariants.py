"""The one judge of every fault cell: the five invariants of tests/faults/README.md.

`check(cell, seen, job_id)` returns every violation (an empty list when the cell holds), so a
failing cell reports all it broke at once.
"""

from __future__ import annotations

import re
import signal

from tests.faults.matrix import GRACE, HEARTBEAT, Cell, Outcome, Phase
from tests.faults.scene import HOSTS, IMPOSTOR_RANK, Observed

TERMINAL_LINE = re.compile(r"^\[(node\d) r(\d+)\] (tick \d+ \d+)$")
TICK = re.compile(r"^tick (\d+) (\d+)$")
CUT_HOST_BOUND = HEARTBEAT + GRACE + 3  # a cut host ends the job itself, from its link's return
EXIT_CODES = {Outcome.FAILED: 1, Outcome.SUCCEEDED: 0, Outcome.REFUSED: 3, Outcome.ABANDONED: -signal.SIGKILL,
              Outcome.LOST: -signal.SIGKILL}
UNRECORDED = (Outcome.REFUSED, Outcome.ABANDONED)


def check(cell: Cell, seen: Observed, job_id: str) -> list[str]:
    """Every invariant `seen` breaks for `cell`."""
    return [*hosts_clean(cell, seen), *controller_back(cell, seen), *cause_named(cell, seen),
            *lines_kept(cell, seen), *bystander_untouched(cell, seen)]


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
    described = describe(root)
    if not cause.said_in(described):
        problems.append(f"c) root cause says {described!r}, expected {cause.shown()}")
    return problems


def describe(failure: dict) -> str:
    from orchestrator.failures import Failure

    return Failure.from_dict(failure).describe()


def lines_kept(cell: Cell, seen: Observed) -> list[str]:
    """d) Every line that reached the controller is in the job directory: each rank line the
    terminal showed is in the job's lines, and each rank's file holds its ticks 0..n without a gap."""
    if cell.phase is Phase.PREFLIGHT or not cell.lines_kept:
        return []
    combined = set(seen.files.get("combined", "").splitlines())
    problems = []
    shown = [line for line in seen.terminal.splitlines() if TERMINAL_LINE.match(line)]
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
