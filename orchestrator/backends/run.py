"""What a backend sees of a running job: the types its run hooks (`start`, `failures`, `conclude`,
`stop`, `finish`) are given, and nothing of the run loop that implements them.

ClusterShell's Worker/EventHandler split is the model: a backend reports each host's events to
`RunView.events` (keyed by the host's node name) and asks the run what it needs through
`RunView`'s few methods; it never holds the run loop's objects nor writes their fields.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from orchestrator.diagnose.failures import Failure, FailureKind
from orchestrator.plan import LaunchPlan

EXIT_WAIT = 10.0  # beyond the stop grace, how long stopped hosts get to report their exit

class LineSink(Protocol):
    """Where a host's own lines go (the job's files and the terminal)."""

    def line(self, node: str, text: str) -> None:
        """A line of the host's own (not a rank's), e.g. what a scheduler printed for it."""

    def note(self, node: str, text: str) -> None:
        """distrun's own note about the host."""


class Channel(Protocol):
    """A host's supervisor channel, where the backend has one (the SSH backend's): the run loop
    heartbeats the supervisor and reads its state through it."""

    def write(self, data: bytes) -> None:
        """Bytes to the supervisor's stdin (a control message: `{"op": "hb"}`)."""

    def closed(self) -> bool:
        """Whether the supervisor's process ended (with or without reporting an exit)."""

    def link_up(self) -> bool:
        """Whether the connection to the host still works."""

    def behind(self) -> bool:
        """Whether output of the host reached this controller and waits to be read or handled: the
        controller is behind, and the host's silence is not the host's."""


class HostEvents(Protocol):
    """A host's events, reported by the backend as they happen (from any thread)."""

    def attach(self, node: str, channel: Channel) -> None:
        """The host's supervisor channel is open: heartbeats go to it from now on."""

    def data(self, node: str, chunk: bytes) -> None:
        """The next bytes of the host's supervisor output (remote/stream.py framing: line batches,
        heartbeat, telemetry, note and exit events), in chunks of any size."""

    def alive(self, node: str) -> None:
        """A heartbeat: the host is not silent, though nothing came from it (not started yet)."""

    def stderr(self, node: str, line: str) -> None:
        """A line the supervisor wrote to its stderr (outside the framed stream)."""

    def end(self, node: str) -> None:
        """The host's output ended; what is left of it is delivered."""

    def lost(self, node: str, reason: str, kind: FailureKind = FailureKind.LOST) -> Failure:
        """A failure of the host that it did not report itself (it could not start, or vanished)."""


class RunView(Protocol):
    """One attempt of a job as its backend sees it while it runs.

    Attributes:
        plan: The attempt's plan: its hosts (`plan.hosts`), stop grace, heartbeat timeout.
        sink: Where the hosts' own lines go.
        events: Where the backend reports each host's events.
    """

    plan: LaunchPlan
    sink: LineSink
    events: HostEvents

    @property
    def interrupted(self) -> int | None:
        """The signal that asked distrun to stop (SIGINT, SIGTERM), or None."""

    def failures(self) -> list[Failure]:
        """Every host's failure as seen now (a non-zero exit, a closed channel, silence), in host order."""

    def exited(self, node: str) -> bool:
        """Whether the host reported its exit."""

    def await_exits(self, nodes: Sequence[str], timeout: float) -> None:
        """Wait until none of `nodes` may still report its exit (each reported it, or its channel
        closed, or it went silent), or `timeout` seconds passed."""

    def orphaned(self, nodes: Sequence[str]) -> list[str]:
        """Those of `nodes` whose supervisor channel closed without an exit (its supervisor died)."""
