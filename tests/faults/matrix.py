"""The fault matrix as data: every cell (fault x phase), what must happen, and within what bound.

tests/faults/README.md shows this table (`render_table`); test_readme_table keeps the two equal.
The cells run in tests/faults/test_matrix.py, each checked by `invariants.check` against the
same five invariants (README.md says what each means).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

# The timing every cell's job runs with (a job file's heartbeat_timeout and stop_grace): short,
# so that a cell takes seconds; test_defaults.py measures the defaults.
HEARTBEAT = 4.0
GRACE = 3.0
# How long the controller is frozen (SIGSTOP) before SIGCONT: longer than the heartbeat timeout.
FREEZE = HEARTBEAT + 3.0
# How long the controller's stdout is not read.
STALL = 60.0
# How long another process holds the job database's lock.
LOCK = 5.0
# Hosts: node1 runs rank 3 (the rank that fails or is killed); node2 takes the host faults.
FAULTY_HOST = "node2"
MASTER = "node0"
RANK = 3
RANK_HOST = "node1"
# Fault-tolerant cells: replica group 1 (node1) takes the fault; node2 is the spare, where the
# lighthouse runs first (LIGHTHOUSE_NEXT: where it moves when it is SIGKILLed).
FT_GROUP = 1
LIGHTHOUSE_NEXT = "node0"


class Phase(str, Enum):
    PREFLIGHT = "preflight"  # the controller probes the hosts (node2's probe held at a gate)
    RENDEZVOUS = "rendezvous"  # node0 and node1 wait in torchrun's rendezvous (node2's torchrun held at a gate)
    TRAINING = "training"  # every rank prints its ticks
    STOPPING = "stopping"  # rank 3 failed; the others are being stopped and take their time (SIGTERM ignored)
    FT = "fault-tolerant"  # training: 2 replica groups (node0, node1) + spare node2 step under torchft


class Fault(str, Enum):
    LINK_CUT = "link cut"
    SSHD_KILLED = "sshd killed with its sessions"
    REBOOT = "every process of the host killed (reboot)"
    SUPERVISOR_KILLED = "SIGKILL of the supervisor"
    TORCHRUN_KILLED = "SIGKILL of torchrun"
    WORKER_KILLED = "SIGKILL of one worker"
    WORKER_SEGV = "SIGSEGV of one worker"
    CONTROLLER_KILLED = "controller SIGKILLed"
    CONTROLLER_FROZEN = "controller SIGSTOPped, then SIGCONT"
    CONTROLLER_FROZEN_CHATTY = "controller SIGSTOPped, then SIGCONT, a chatty job (36,000 lines/s)"
    STDOUT_STALLED = "controller's stdout not read"
    HOST_DISK_FULL = "host's disk full"
    CONTROLLER_DISK_FULL = "controller's disk full (DISTRUN_HOME)"
    DATABASE_LOCKED = "job database locked by another process"
    MASTER_LOST = "master host lost"
    GROUPS_BELOW_MIN = "SIGKILL of one worker, fewer than min_replicas groups left"
    LIGHTHOUSE_KILLED = "SIGKILL of the lighthouse"
    ERROR_FILE_MALFORMED = "one worker writes a truncated error file and exits 1"
    RAISED_NO_RECORD = "one worker raises (no @record)"
    CHILDREN_LEFT = "every rank has children with their own environment (one in a session of its own, one detached)"


class Outcome(str, Enum):
    """What the controller records in the end."""

    FAILED = "failed"  # exit 1, state failed, the root cause as given
    SUCCEEDED = "succeeded"  # exit 0, state succeeded, no failure
    REFUSED = "refused"  # exit 3 before the job was recorded: no record, nothing started
    ABANDONED = "abandoned"  # the controller was killed before the job was recorded: nothing started
    LOST = "lost"  # the controller was killed: `ps` shows lost, the hosts end the job themselves


@dataclass(frozen=True)
class Cause:
    """The root cause a cell's record must name (failures[0]): host, rank, kind, and words of its description."""

    host: str | None  # None: any of the job's hosts (each ended the job alike)
    kind: str
    words: str
    rank: int | None = None
    signal: str | None = None
    or_words: str | None = None  # the same fault said another way (a cut link: silence, or the neighbour's ARP failing)

    def said_in(self, text: str) -> bool:
        return self.words in text or (self.or_words is not None and self.or_words in text)

    def shown(self) -> str:
        return f'"{self.words}"' + (f' or "{self.or_words}"' if self.or_words else "")


@dataclass(frozen=True)
class Cell:
    """One fault in one phase, and what must hold after it.

    Attributes:
        fault: What is done.
        phase: When.
        bound: Seconds from the fault within which every reachable host is clean and the
            controller has returned (a cut host: heartbeat + grace after its link returns).
        outcome: How the job must end.
        cause: The root cause the record must name (outcome FAILED, or REFUSED: the host named).
        bystander: Whether another job on the same hosts must be untouched (host-wide faults
            take every job of the host with them).
        lines_kept: Whether every line that reached the controller must be in its files (not
            while the controller's own disk is full).
    """

    fault: Fault
    phase: Phase
    bound: float
    outcome: Outcome
    cause: Cause | None = None
    bystander: bool = True
    lines_kept: bool = True

    @property
    def id(self) -> str:
        return f"{self.phase.value}-{self.fault.name.lower().replace('_', '-')}"

    def checked(self) -> str:
        """What the cell checks, in the README's words."""
        parts = ["a", "b"]
        if self.cause is not None:
            parts.append("c")
        if self.phase is not Phase.PREFLIGHT and self.lines_kept:
            parts.append("d")
        if self.bystander:
            parts.append("e")
        what = {
            Outcome.FAILED: "exit 1, failed",
            Outcome.SUCCEEDED: "exit 0, succeeded",
            Outcome.REFUSED: "exit 3, not recorded",
            Outcome.ABANDONED: "killed, not recorded",
            Outcome.LOST: "killed, `ps`: lost",
        }[self.outcome]
        named = ""
        if self.cause is not None:
            rank = f" r{self.cause.rank}" if self.cause.rank is not None else ""
            kind = f"{self.cause.kind} " if self.cause.kind else ""
            named = f"; {self.cause.host or 'any host'}{rank}: {kind}{self.cause.shown()}"
        return f"{','.join(parts)}: {what}{named}"


LOST_SILENT = Cause(FAULTY_HOST, "lost", "nothing heard for 4 s")
LOST_CLOSED = Cause(FAULTY_HOST, "lost", "connection to the host closed")
SUPERVISOR_GONE = Cause(FAULTY_HOST, "lost", "its supervisor ended without reporting an exit")
FROZEN = Cause(None, "infra", "its supervisor ended the job: controller heartbeat silent for more than 4 s")
RANK_FAILED = Cause(RANK_HOST, "exit", "exit code 1", rank=RANK)
TORCHRUN_SIGKILL = Cause(FAULTY_HOST, "signal", "killed by SIGKILL (not the kernel's OOM killer", signal="SIGKILL")

# Silence: lost after HEARTBEAT, then the others stop within GRACE. A closed channel is seen at once.
SILENT_BOUND = HEARTBEAT + GRACE + 4
CLOSED_BOUND = GRACE + 5
# A failure reported by a host: torchrun notices, the controller waits 1.5 s for its echoes, stops the rest.
REPORTED_BOUND = GRACE + 7
# A supervisor killed while it stops the job: the other hosts' stop grace runs first, then the
# controller's cleanup of the dead supervisor's processes takes a grace of its own (6-7 s measured).
ORPHANS_BOUND = 2 * GRACE + 4

CELLS: tuple[Cell, ...] = (
    # ---------------------------------------------------------------- preflight
    Cell(Fault.LINK_CUT, Phase.PREFLIGHT, 15, Outcome.REFUSED,
         Cause(FAULTY_HOST, "", "timed out", or_words="no route to host"), bystander=False),
    Cell(Fault.SSHD_KILLED, Phase.PREFLIGHT, 10, Outcome.REFUSED, Cause(FAULTY_HOST, "", "probe failed"),
         bystander=False),
    Cell(Fault.REBOOT, Phase.PREFLIGHT, 10, Outcome.REFUSED, Cause(FAULTY_HOST, "", "probe failed"),
         bystander=False),
    Cell(Fault.CONTROLLER_KILLED, Phase.PREFLIGHT, 5, Outcome.ABANDONED),
    Cell(Fault.CONTROLLER_FROZEN, Phase.PREFLIGHT, FREEZE + 25, Outcome.SUCCEEDED),
    Cell(Fault.CONTROLLER_DISK_FULL, Phase.PREFLIGHT, 10, Outcome.REFUSED),
    Cell(Fault.DATABASE_LOCKED, Phase.PREFLIGHT, LOCK + 25, Outcome.SUCCEEDED),
    # ---------------------------------------------------------------- rendezvous
    Cell(Fault.LINK_CUT, Phase.RENDEZVOUS, SILENT_BOUND, Outcome.FAILED, LOST_SILENT, bystander=False),
    Cell(Fault.SSHD_KILLED, Phase.RENDEZVOUS, CLOSED_BOUND, Outcome.FAILED, LOST_CLOSED, bystander=False),
    Cell(Fault.REBOOT, Phase.RENDEZVOUS, CLOSED_BOUND, Outcome.FAILED, LOST_CLOSED, bystander=False),
    Cell(Fault.SUPERVISOR_KILLED, Phase.RENDEZVOUS, CLOSED_BOUND, Outcome.FAILED, SUPERVISOR_GONE),
    Cell(Fault.TORCHRUN_KILLED, Phase.RENDEZVOUS, REPORTED_BOUND, Outcome.FAILED,
         Cause(RANK_HOST, "signal", TORCHRUN_SIGKILL.words, signal="SIGKILL")),
    Cell(Fault.CONTROLLER_KILLED, Phase.RENDEZVOUS, GRACE + 4, Outcome.LOST),
    Cell(Fault.CONTROLLER_FROZEN, Phase.RENDEZVOUS, FREEZE + 8, Outcome.FAILED, FROZEN),
    Cell(Fault.MASTER_LOST, Phase.RENDEZVOUS, SILENT_BOUND, Outcome.FAILED,
         Cause(MASTER, "lost", "nothing heard for 4 s"), bystander=False),
    # ---------------------------------------------------------------- training
    Cell(Fault.LINK_CUT, Phase.TRAINING, SILENT_BOUND, Outcome.FAILED, LOST_SILENT, bystander=False),
    Cell(Fault.SSHD_KILLED, Phase.TRAINING, CLOSED_BOUND, Outcome.FAILED, LOST_CLOSED, bystander=False),
    Cell(Fault.REBOOT, Phase.TRAINING, CLOSED_BOUND, Outcome.FAILED, LOST_CLOSED, bystander=False),
    Cell(Fault.SUPERVISOR_KILLED, Phase.TRAINING, CLOSED_BOUND, Outcome.FAILED, SUPERVISOR_GONE),
    Cell(Fault.TORCHRUN_KILLED, Phase.TRAINING, REPORTED_BOUND, Outcome.FAILED, TORCHRUN_SIGKILL),
    Cell(Fault.WORKER_KILLED, Phase.TRAINING, REPORTED_BOUND, Outcome.FAILED,
         Cause(RANK_HOST, "signal", "killed by SIGKILL (not the kernel's OOM killer", rank=RANK, signal="SIGKILL")),
    Cell(Fault.WORKER_SEGV, Phase.TRAINING, REPORTED_BOUND, Outcome.FAILED,
         Cause(RANK_HOST, "signal", "killed by SIGSEGV", rank=RANK, signal="SIGSEGV")),
    Cell(Fault.CONTROLLER_KILLED, Phase.TRAINING, GRACE + 4, Outcome.LOST),
    Cell(Fault.CONTROLLER_FROZEN, Phase.TRAINING, FREEZE + 8, Outcome.FAILED, FROZEN),
    Cell(Fault.CONTROLLER_FROZEN_CHATTY, Phase.TRAINING, FREEZE + 8, Outcome.FAILED, FROZEN),
    Cell(Fault.STDOUT_STALLED, Phase.TRAINING, STALL + 15, Outcome.SUCCEEDED),
    Cell(Fault.HOST_DISK_FULL, Phase.TRAINING, 30, Outcome.SUCCEEDED),
    Cell(Fault.CONTROLLER_DISK_FULL, Phase.TRAINING, 30, Outcome.SUCCEEDED, lines_kept=False),
    # torchrun itself crashed reading such a file, and the rank's record was lost (issue 46.5).
    Cell(Fault.ERROR_FILE_MALFORMED, Phase.TRAINING, REPORTED_BOUND, Outcome.FAILED, RANK_FAILED),
    # The error line comes from the rank's own traceback (issue 46.18).
    Cell(Fault.RAISED_NO_RECORD, Phase.TRAINING, REPORTED_BOUND, Outcome.FAILED,
         Cause(RANK_HOST, "exit", "exit code 1; error: RuntimeError: rank 3 raised on purpose", rank=RANK)),
    # No fault is injected: the ranks' children (no distrun markers) must end with a job that succeeds.
    Cell(Fault.CHILDREN_LEFT, Phase.TRAINING, 30, Outcome.SUCCEEDED),
    # ---------------------------------------------------------------- stopping
    Cell(Fault.LINK_CUT, Phase.STOPPING, SILENT_BOUND, Outcome.FAILED, RANK_FAILED, bystander=False),
    Cell(Fault.SSHD_KILLED, Phase.STOPPING, CLOSED_BOUND, Outcome.FAILED, RANK_FAILED, bystander=False),
    Cell(Fault.REBOOT, Phase.STOPPING, CLOSED_BOUND, Outcome.FAILED, RANK_FAILED, bystander=False),
    Cell(Fault.SUPERVISOR_KILLED, Phase.STOPPING, ORPHANS_BOUND, Outcome.FAILED, RANK_FAILED),
    Cell(Fault.TORCHRUN_KILLED, Phase.STOPPING, CLOSED_BOUND, Outcome.FAILED, RANK_FAILED),
    Cell(Fault.WORKER_KILLED, Phase.STOPPING, CLOSED_BOUND, Outcome.FAILED, RANK_FAILED),
    Cell(Fault.CONTROLLER_KILLED, Phase.STOPPING, GRACE + 4, Outcome.LOST),
    Cell(Fault.CONTROLLER_FROZEN, Phase.STOPPING, FREEZE + 8, Outcome.FAILED, RANK_FAILED),
    Cell(Fault.DATABASE_LOCKED, Phase.STOPPING, LOCK + CLOSED_BOUND, Outcome.FAILED, RANK_FAILED),
    # The failure is rank 3's own (reported), not injected: its bound, as a reported failure's.
    Cell(Fault.CHILDREN_LEFT, Phase.STOPPING, REPORTED_BOUND, Outcome.FAILED, RANK_FAILED),
    # ---------------------------------------------------------------- fault-tolerant (FT_GROUP's host or rank)
    # Success bounds: the lost group back on a spare or relaunched (torch imports), healed, then every group ends.
    Cell(Fault.LINK_CUT, Phase.FT, 60, Outcome.SUCCEEDED, bystander=False),
    Cell(Fault.WORKER_KILLED, Phase.FT, 50, Outcome.SUCCEEDED),
    Cell(Fault.GROUPS_BELOW_MIN, Phase.FT, REPORTED_BOUND + GRACE + 5, Outcome.FAILED,
         Cause(RANK_HOST, "signal", TORCHRUN_SIGKILL.words, rank=0, signal="SIGKILL")),
    # The child controllers die with the parent; each host's supervisor ends its group, and the
    # lighthouse's host the lighthouse, once the heartbeat is silent (then the stop grace).
    Cell(Fault.CONTROLLER_KILLED, Phase.FT, SILENT_BOUND, Outcome.LOST),
    # The lighthouse (on the spare, node2) is started again on the next host (node0). A restarted
    # lighthouse numbers quorums from 1 again and torchft 0.2.0 may then crash a group, which is
    # relaunched (docs/fault-tolerance.md): no "no relaunch" demanded here, and the bound
    # leaves room for 3 relaunches of a group (each ~20 s: torch imports, a quorum; 67 s measured with 2).
    Cell(Fault.LIGHTHOUSE_KILLED, Phase.FT, 120, Outcome.SUCCEEDED),
)


def render_table(cells: tuple[Cell, ...] = CELLS) -> str:
    """The README's table: one row per cell."""
    rows = ["| fault | phase | bound (s) | what is checked |", "|---|---|---:|---|"]
    rows += [f"| {c.fault.value} | {c.phase.value} | {c.bound:g} | {c.checked()} |"
             for c in cells]
    return "\n".join(rows) + "\n"
