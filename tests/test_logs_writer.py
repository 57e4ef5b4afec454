"""The terminal's writer thread: batches offered in quick succession go out together, the writer
woken by its tick, not once per batch (a wake per batch cost the controller as much as the batch:
bench/results/scale.md)."""

from __future__ import annotations

import io
import time

from orchestrator.logs.writer import TICK, TerminalWriter


class CountedTerminal(io.StringIO):
    """A terminal that counts the writes it gets."""

    def __init__(self) -> None:
        super().__init__()
        self.writes = 0

    def write(self, text: str) -> int:
        self.writes += 1
        return super().write(text)


def test_batches_offered_over_a_tick_reach_the_terminal_in_a_write_or_two_each_within_a_tick():
    terminal = CountedTerminal()
    writer = TerminalWriter(terminal)
    time.sleep(TICK / 2)  # the writer waits for lines
    for n in range(20):  # a batch every 5 ms for one tick
        writer.offer(f"[node1] line {n}\n", 1)
        time.sleep(TICK / 20)
    time.sleep(2 * TICK)
    shown = terminal.getvalue().count("\n")
    writer.close()
    assert shown == 20
    assert terminal.writes <= 3  # a write per tick at most (the span may cross two tick boundaries)
