"""The live view of a fault-tolerant job: the parent controller's table, a row per replica group
(state, hosts, relaunches, last step, whether it is in the quorum), the lighthouse and the
quorum under it. The groups' own controllers draw nothing (their output is the parent's pipe).

`group_row` is pure; `LiveGroups` keeps the table under the scrolling `[gK]` lines on a terminal.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TextIO

from rich import box
from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from orchestrator.console.display import fold_hosts
from orchestrator.console.terminal import colour
from orchestrator.errors import ExitCode
from orchestrator.run.ft.timeline import Stint, Timeline
from orchestrator.run.restarts import AttemptRecord
from orchestrator.telemetry.view import ConsoleWriter

STOPPED = (int(ExitCode.INTERRUPTED), int(ExitCode.TERMINATED))  # a controller's exit when it was stopped
STYLES = {"running": "", "relaunching": "yellow", "healed": "green", "failed": "red", "done": "", "stopped": "yellow"}


@dataclass(frozen=True)
class GroupRow:
    """One group as the live view shows it.

    Attributes:
        state: running, relaunching (between two attempts, or back but not yet in a quorum),
            healed (relaunched and back in the quorum), failed, stopped or done.
        hosts: Its hosts now (a relaunch on a spare changes them).
        relaunches: How often its controller relaunched it.
        step: Its step in the latest quorum it was in; None before its first.
        in_quorum: Whether it is in the latest quorum.
    """

    index: int
    state: str
    hosts: tuple[str, ...]
    relaunches: int
    step: int | None
    in_quorum: bool


def group_state(rc: int | None, attempts: Sequence[AttemptRecord], stints: Sequence[Stint]) -> str:
    """A group's state from its controller's exit code (None while it runs) and its record's
    attempts (a running attempt is recorded once it ended)."""
    if rc is not None:
        return "done" if rc == 0 else "stopped" if rc in STOPPED else "failed"
    if not attempts:
        return "running"
    ended = attempts[-1].ended
    if ended is None:
        return "running"
    return "healed" if any(s.began >= ended for s in stints) else "relaunching"


def group_row(index: int, rc: int | None, hosts: Sequence[str], attempts: Sequence[AttemptRecord],
              timeline: Timeline) -> GroupRow:
    """The row of group `index`; `hosts` and `attempts` from its record (its first hosts until then)."""
    stints = timeline.of(index)
    failed = sum(a.failure is not None for a in attempts)
    last_failed = rc not in (None, 0) and bool(attempts) and attempts[-1].failure is not None
    return GroupRow(index, group_state(rc, attempts, stints), tuple(hosts), failed - int(last_failed),
                    timeline.last_step(index), index in timeline.latest)


def quorum_line(timeline: Timeline) -> str:
    if not timeline.latest:
        return "quorum: none yet"
    names = ", ".join(f"group{i}" for i in timeline.latest)
    return f"quorum: {len(timeline.latest)} group(s) ({names}) at step {timeline.top_step}"


def render(rows: Sequence[GroupRow], title: str, lighthouse: str, timeline: Timeline) -> Group:
    """The table: a row per group, then the lighthouse's line and the quorum's (as wide as the
    screen, not the table)."""
    table = Table(title=title, box=box.SIMPLE_HEAD, title_justify="left", pad_edge=False)
    for name in ("group", "state", "hosts", "relaunches", "step", "quorum"):
        table.add_column(name, justify="right" if name in ("relaunches", "step") else "left", no_wrap=True)
    for row in rows:
        table.add_row(str(row.index), Text(row.state, style=STYLES.get(row.state, "")), fold_hosts(row.hosts),
                      str(row.relaunches), "-" if row.step is None else str(row.step), "in" if row.in_quorum else "out")
    return Group(table, Text(f"{lighthouse}\n{quorum_line(timeline)}", style="dim"))


class LiveGroups:
    """The table under the parent's scrolling lines, on a terminal only."""

    def __init__(self, frame: Callable[[], Group]) -> None:
        self.frame = frame
        self.live: Live | None = None
        self.writer: ConsoleWriter | None = None

    def terminal(self, stream: TextIO, live: bool) -> TextIO:
        """Where the parent's lines go: through the live view when `live` and `stream` is a TTY."""
        if not live or not stream.isatty():
            return stream
        console = Console(file=stream, no_color=not colour(stream))
        self.live = Live(console=console, get_renderable=self.frame, refresh_per_second=2)
        self.writer = ConsoleWriter(console)
        self.live.start()
        return self.writer

    def stop(self) -> None:
        """Leave the last frame on screen, the last lines above it; safe to call twice."""
        if self.writer is not None:
            self.writer.drain()
        if self.live is not None:
            self.live.stop()
            self.live = None
