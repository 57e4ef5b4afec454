"""A rank that crashed at interpreter exit, after its work was done (issue 32).

Some programs (torch's gloo teardown race, bench/results/teardown.md) finish their work on every
rank and then one rank dies of a signal while the interpreter shuts down. distrun still calls the
job FAILED (exit code 1): a crash is never turned into a success. But the verdict says so at the
top, and the record's root cause gets `when: "at exit"` (failures.AT_EXIT) so wrappers can decide.

The rule, from evidence only: the rank was killed by a signal that is not a teardown's, its own
last lines hold no traceback (the signal came after its last line), every rank of every other
host exited 0 (the host exited 0, or its torchrun waited in its exit barrier with every worker
gone), and every other rank of its own host exited 0 (it is alone there, or torchrun's records of
its failed workers, remote/workerfail.py, name no other rank: torchrun records each worker that
failed and each it had to stop, so a rank it does not name had exited 0).

A rank that raised and then died of a signal while its interpreter exited (gloo's thread: "terminate
called without an active exception", SIGABRT) is the other case: torchrun records only the signal,
and the exception is in the rank's output. failures.py's `own_error` reads it from there, so the
failure says "raised RuntimeError: ..., then SIGABRT at exit".
"""

from __future__ import annotations

from collections.abc import Sequence

from orchestrator.diagnose.failures import AT_EXIT, TEARDOWN_SIGNALS, Failure, FailureKind
from orchestrator.remote.workerfail import TRACEBACK, WorkerRecord


def neighbours_finished(nproc: int, rank: int | None, workers: Sequence[WorkerRecord]) -> bool:
    """Whether the other ranks on the crashed rank's host had all exited 0, as its torchrun's records tell.

    Args:
        nproc: The host's ranks.
        rank: The crashed rank.
        workers: torchrun's records of the host's failed workers ([]: none arrived, no evidence).
    """
    if nproc == 1:
        return True
    return bool(workers) and all(worker.rank == rank for worker in workers)


def when_failed(root: Failure, others_finished: bool) -> str:
    """The root cause's `when`: AT_EXIT for a rank's crash at exit after the work was done on every rank, else "".

    Args:
        root: The root cause, its last lines those of its rank.
        others_finished: Every other rank (other hosts' and its own host's) exited 0.
    """
    if root.kind is not FailureKind.SIGNAL or root.signal in TEARDOWN_SIGNALS or root.rank is None:
        return ""
    return AT_EXIT if others_finished and not any(TRACEBACK in line for line in root.last_lines) else ""
