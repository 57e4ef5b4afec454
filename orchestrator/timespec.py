"""Times on the command line: a duration (`90s`, `30m`, `2h`, `7d`, `2w`) or a moment (`2026-11-21`,
`2026-11-21 14:30`, `2026-11-21T14:30:00`, local time), for `ps --since` and `prune --older-than`."""

from __future__ import annotations

import re
import time
from datetime import datetime

from orchestrator.errors import UsageError

UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_DURATION = re.compile(r"(\d+(?:\.\d+)?)([smhdw])")
_MOMENTS = ("%Y-%m-%d", "%Y-%m-%d %H:%M", "%Y-%m-%dT%H:%M", "%Y-%m-%d %H:%M:%S", "%Y-%m-%dT%H:%M:%S")
EXAMPLES = "e.g. 30m, 2h, 7d, or 2026-11-21 14:30"


def parse_duration(text: str, option: str) -> float:
    """Seconds in `30m`, `2h`, `7d` ... (s, m, h, d, w).

    Raises:
        UsageError: not a duration (the option named).
    """
    match = _DURATION.fullmatch(text.strip())
    if match is None:
        raise UsageError(f"{option} {text!r}: not a duration (a number and one of s, m, h, d, w: 30m, 2h, 7d)")
    return float(match.group(1)) * UNITS[match.group(2)]


def parse_since(text: str, option: str, now: float | None = None) -> float:
    """The moment (seconds since the epoch) that `text` names: a duration ago, or a local date and time.

    Raises:
        UsageError: neither a duration nor a date (the option named).
    """
    now = time.time() if now is None else now
    if _DURATION.fullmatch(text.strip()):
        return now - parse_duration(text, option)
    for layout in _MOMENTS:
        try:
            return datetime.strptime(text.strip(), layout).timestamp()
        except ValueError:
            continue
    raise UsageError(f"{option} {text!r}: not a duration or a date ({EXAMPLES})")
