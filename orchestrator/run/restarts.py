"""The controller's restarts of a whole job: which failures start another attempt, which host is set
aside, and on which hosts the next attempt runs.

torchrun's own `max_restarts` re-forms the group on the same hosts only (and with gloo on torch
2.13 it cannot once a group was formed), so the controller restarts the job itself: it stops
every host as after any failure, quarantines the host the failure points at, and starts the
next attempt with a spare in that host's place (`spares`, the hosts selected beyond `nnodes`),
or on fewer hosts when no spare is left and `nnodes: MIN:MAX` allows it.

Everything here is pure but the claims of a spare pool shared with other controllers
(spare_pool.py): the restart loop (launch.py) asks, and does what the answer says.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from orchestrator.console.display import fold_hosts
from orchestrator.diagnose.failures import TEARDOWN_SIGNALS, Failure, FailureKind
from orchestrator.run.spare_pool import SparePool
from orchestrator.spec.model import Restarts

HOST_LOST = "host-lost"
RANK_FAILED = "rank-failed"
HANG = "hang"
# What each kind of failure is, as `restarts.on` names it. A supervisor that could not start
# or ended the job alone (infra) is the host's doing, as a lost host is.
TRIGGERS = {FailureKind.LOST: HOST_LOST, FailureKind.INFRA: HOST_LOST, FailureKind.EXIT: RANK_FAILED,
            FailureKind.SIGNAL: RANK_FAILED, FailureKind.HANG: HANG}
Take = Callable[[Sequence[str]], None]  # claims the spares among the hosts given


def trigger(failure: Failure) -> str:
    """The `restarts.on` name of a failure: host-lost, rank-failed or hang."""
    return TRIGGERS[failure.kind]


def blames_host(failure: Failure) -> bool:
    """Whether a failure points at its host, which the next attempt then leaves out: the host was
    lost (silent, its channel closed, its supervisor gone), or a rank was killed by a signal that
    is not a teardown's (a crash, the OOM killer). An exit code or a hang is the job's own."""
    if failure.kind in (FailureKind.LOST, FailureKind.INFRA):
        return True
    return failure.kind is FailureKind.SIGNAL and failure.signal not in TEARDOWN_SIGNALS


@dataclass(frozen=True)
class AttemptRecord:
    """One attempt of a job, as its record keeps it.

    Attributes:
        number: 1, 2, ... (the ranks' DISTRUN_ATTEMPT).
        hosts: The hosts it ran on, in node-rank order.
        started: When it started (seconds since the epoch).
        ended: When it ended; None while it runs.
        failure: Its root cause; None when it succeeded or is running.
        quarantined: The host it set aside for the rest of the job, if any.
        port: Its rendezvous port (each attempt gets a fresh one); 0 when unknown.
        state: The job's state when it ended: "succeeded", "failed" or "stopped"; "" while it runs.
    """

    number: int
    hosts: tuple[str, ...]
    started: float = field(default_factory=time.time)
    ended: float | None = None
    failure: Failure | None = None
    quarantined: str | None = None
    port: int = 0
    state: str = ""

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready data (the record's `attempts`); `from_dict` reads it back."""
        return {"number": self.number, "hosts": list(self.hosts), "started": self.started, "ended": self.ended,
                "failure": self.failure.to_dict() if self.failure else None, "quarantined": self.quarantined,
                "port": self.port, "state": self.state}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> AttemptRecord:
        failure = data.get("failure")
        return cls(number=int(data["number"]), hosts=tuple(data.get("hosts") or ()),
                   started=float(data.get("started") or 0.0), ended=data.get("ended"),
                   failure=Failure.from_dict(failure) if failure else None, quarantined=data.get("quarantined"),
                   port=int(data.get("port") or 0), state=str(data.get("state") or ""))

    def line(self) -> str:
        """`attempt 1 on node[0-1], 14:02:01-14:02:20: node1 lost: nothing heard for 6 s; node1 quarantined`."""
        end = time.strftime("%H:%M:%S", time.localtime(self.ended)) if self.ended else "running"
        what = self.failure.brief() if self.failure else ((self.state or "succeeded") if self.ended else "running")
        aside = f"; {self.quarantined} quarantined" if self.quarantined else ""
        return (f"attempt {self.number} on {fold_hosts(self.hosts)}, "
                f"{time.strftime('%H:%M:%S', time.localtime(self.started))}-{end}: {what}{aside}")


@dataclass(frozen=True)
class Verdict:
    """What follows a failed attempt.

    Attributes:
        hosts: The next attempt's hosts; None: there is none, the job fails.
        spares: The spares left for later attempts.
        quarantined: The host set aside after this failure, if any.
        why: In words: what the next attempt does, or why there is none.
    """

    hosts: tuple[str, ...] | None
    spares: tuple[str, ...]
    quarantined: str | None
    why: str


def after_failure(policy: Restarts, attempt: int, failure: Failure, hosts: Sequence[str], spares: Sequence[str],
                  min_hosts: int) -> Verdict:
    """Whether, and on which hosts, attempt `attempt + 1` runs after `failure` ended attempt `attempt`.

    Args:
        policy: The job's `restarts`.
        attempt: The attempt that failed (1 for the first).
        failure: Its root cause.
        hosts: The hosts it ran on.
        spares: The spares not used yet.
        min_hosts: The fewest hosts the job may run on (`nnodes: MIN:MAX`'s MIN, else its hosts).

    Returns:
        The verdict: the next hosts are the same, less the quarantined host, with spares in its
        place (in their order); fewer when no spare is left and `min_hosts` allows it.
    """
    aside = failure.host if blames_host(failure) and failure.host in hosts else None
    kind = trigger(failure)
    if kind not in policy.on:
        return Verdict(None, tuple(spares), aside, f"no restart: {kind} is not in restarts.on "
                                                  f"({', '.join(policy.on)})")
    if attempt > policy.max:
        return Verdict(None, tuple(spares), aside, f"no restart left: restarts.max is {policy.max}")
    refilled = refill(hosts, {aside} if aside else set(), spares, min_hosts)
    if refilled is None:
        return Verdict(None, tuple(spares), aside, f"no spare host left to take {aside}'s place, and the job needs "
                                                   f"{min_hosts} host(s) (nnodes: MIN:MAX lets it go on with fewer)")
    nxt, left = refilled
    taken = [host for host in nxt if host not in hosts]
    if aside is None:
        why = f"attempt {attempt + 1} on the same hosts, {fold_hosts(nxt)}"
    elif taken:
        why = f"attempt {attempt + 1} on {fold_hosts(nxt)}: {fold_hosts(taken)} in place of {aside}"
    else:
        why = f"attempt {attempt + 1} on {fold_hosts(nxt)}, without {aside} (no spare left; fewer hosts allowed)"
    return Verdict(nxt, left, aside, why)


def refill(hosts: Sequence[str], bad: set[str], spares: Sequence[str],
           min_hosts: int) -> tuple[tuple[str, ...], tuple[str, ...]] | None:
    """`hosts` less `bad`, the first spares in their place (fewer when no spare is left).

    Returns:
        The hosts and the spares left; None when fewer than `min_hosts` hosts would be left.
    """
    kept = [host for host in hosts if host not in bad]
    free = [spare for spare in spares if spare not in bad]
    taken = free[:len(hosts) - len(kept)]
    if len(kept) + len(taken) < min_hosts:
        return None
    return (*kept, *taken), tuple(free[len(taken):])


def attempts_lines(attempts: Sequence[AttemptRecord], policy: Restarts) -> list[str]:
    """The summary's list of every attempt (nothing for a job that ran once and allowed no restart)."""
    if len(attempts) < 2 and not policy.max:
        return []
    return [f"Attempts ({len(attempts)} of at most {policy.max + 1}):", *(f"  {a.line()}" for a in attempts)]


@dataclass
class AttemptHistory:
    """A job's attempts so far, across the `Attempt`s (run/attempt.py) that run them one after another.

    Attributes:
        policy: The job's `restarts`.
        min_hosts: The fewest hosts an attempt may run on.
        spares: The spares not used yet.
        attempts: Every attempt begun, in order.
    """

    policy: Restarts
    min_hosts: int
    spares: tuple[str, ...] = ()
    attempts: list[AttemptRecord] = field(default_factory=list)
    unreachable: list[str] = field(default_factory=list)  # spares set aside when the next attempt could not reach them
    pool: SparePool | None = None  # spares shared with other controllers (a fault-tolerant job's groups)

    @property
    def number(self) -> int:
        """The current attempt's number (0 before the first)."""
        return len(self.attempts)

    @property
    def quarantined(self) -> list[str]:
        return [*(a.quarantined for a in self.attempts if a.quarantined), *self.unreachable]

    def begin(self, hosts: Sequence[str], port: int = 0) -> None:
        self.attempts.append(AttemptRecord(len(self.attempts) + 1, tuple(hosts), port=port))

    def end(self, failure: Failure | None, quarantined: str | None = None, state: str = "") -> None:
        """The current attempt ended, the job then in `state` (default: failed with a failure, else
        succeeded); a second call keeps the first end."""
        current = self.attempts[-1]
        if current.ended is None:
            state = state or ("failed" if failure else "succeeded")
            self.attempts[-1] = replace(current, ended=time.time(), failure=failure, quarantined=quarantined,
                                        state=state)

    def verdict(self, failure: Failure) -> Verdict | None:
        """What follows the current attempt's failure; None when the job allows no restart."""
        if not self.policy.max:
            return None
        with self._claims() as (free, take):
            verdict = after_failure(self.policy, self.number, failure, self.attempts[-1].hosts, free, self.min_hosts)
            take(verdict.hosts or ())
        return verdict

    def refill(self, hosts: Sequence[str], bad: set[str],
               spares: Sequence[str]) -> tuple[tuple[str, ...], tuple[str, ...]] | None:
        """`refill` of the next attempt's hosts, from the spares no other controller took."""
        with self._claims(tuple(spares)) as (free, take):
            refilled = refill(hosts, bad, free, self.min_hosts)
            take(refilled[0] if refilled else ())
        return refilled

    @contextlib.contextmanager
    def _claims(self, spares: tuple[str, ...] | None = None) -> Iterator[tuple[tuple[str, ...], Take]]:
        """The spares free to take (of `spares`, default this job's) and a `take(hosts)` that claims
        those among `hosts`; with a shared pool, both under its lock (the choice and the claim are one step)."""
        spares = self.spares if spares is None else spares
        if self.pool is None:
            yield spares, lambda _hosts: None
            return
        pool = self.pool
        with pool.claims() as claims:
            yield pool.free(spares, claims), lambda hosts: pool.take(tuple(hosts), spares, claims)

    def records(self) -> list[dict[str, Any]]:
        return [attempt.to_dict() for attempt in self.attempts]

    def lines(self) -> list[str]:
        return attempts_lines(self.attempts, self.policy)
