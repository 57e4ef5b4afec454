"""Signal handlers installed for a block and restored after it: one way for every command."""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
_taken: list[int] = []  # the signals a block has taken so far in this process


def taken(signum: int) -> bool:
    """Whether a block of `on_signals` has taken `signum` in this process (the command handles it now)."""
    return signum in _taken


@contextmanager
def on_signals(handler: Callable[[int], None], signums: tuple[int, ...] = STOP_SIGNALS) -> Iterator[None]:
    """Within the block, call `handler(signum)` on each of `signums`; restore the previous handlers after.

    Python lets only the main thread install handlers: elsewhere nothing is installed and the
    block runs as it is.

    Args:
        handler: Called in the main thread with the signal's number; it may raise to unwind the block.
        signums: The signals to catch (default: SIGINT and SIGTERM).
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: signal.signal(sig, lambda signum, _frame: handler(signum)) for sig in signums}
    _taken.extend(signums)
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
