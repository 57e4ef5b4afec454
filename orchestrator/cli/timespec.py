"""Times on the command line, one grammar for `ps --since`, `logs --since` and `prune --older-than`
(docs/commands.md, "Times"): a duration ago (`90s`, `30m`, `2h`, `7d`, `2w`; a space before the unit is
fine), a time today (`14:30`, `14:30:05`), or a date with an optional time (`2026-11-21`,
`2026-11-21 14:30`, `2026-11-21T14:30:05`); local time throughout."""

from __future__ import annotations

import re
import time
from datetime import datetime

from orchestrator.errors import UsageError

UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_DURATION = re.compile(r"(\d+(?:\.\d+)?)\s*([smhdw])")
_CLOCKS = ("%H:%M", "%H:%M:%S")
_MOMENTS = ("%Y-%m-%d", "%Y-%m-%d %H:%M", "%Y-%m-%dT%H:%M", "%Y-%m-%d %H:%M:%S", "%Y-%m-%dT%H:%M:%S")
EXAMPLES = "a duration ago: 90s, 30m, 2h, 7d, 2w; a time today: 14:30; a date: 2026-11-21 or '2026-11-21 14:30'"


def parse_duration(text: str, option: str) -> float:
    """Seconds in `30m`, `2h`, `7d` ... (s, m, h, d, w).

    Raises:
        UsageError: not a duration (the option named).
    """
    match = _DURATION.fullmatch(text.strip())
    if match is None:
        raise UsageError(f"{option} {text!r}: not a duration (a number and one of s, m, h, d, w: 30m, 2h, 7d)")
    return float(match.group(1)) * UNITS[match.group(2)]


def parse_since(text: str, option: str = "--since", now: float | None = None) -> float:
    """The moment (seconds since the epoch) that `text` names: a duration ago, a time today, or a
    local date and time.

    Raises:
        UsageError: none of these (the option named, with examples).
    """
    now = time.time() if now is None else now
    value = text.strip()
    if _DURATION.fullmatch(value):
        return now - parse_duration(value, option)
    for layout in _CLOCKS:
        try:
            clock = datetime.strptime(value, layout).time()
        except ValueError:
            continue
        return datetime.combine(datetime.fromtimestamp(now).date(), clock).timestamp()
    for layout in _MOMENTS:
        try:
            return datetime.strptime(value, layout).timestamp()
        except ValueError:
            continue
    raise UsageError(f"{option} {text!r}: not a time ({EXAMPLES})")
