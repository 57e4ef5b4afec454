"""Text that is safe to keep and to show: secrets masked, control characters escaped.

Stdlib-only and shipped to the hosts like every remote module, so that the controller and the
hosts mask and escape alike.

- `Masker` replaces each resolved `${env:X}` value with `***` wherever it appears in a text.
  It sees only the literal value (and each line of a value of several lines): a secret printed
  encoded (base64, a repr with escapes) is not found.
- `escape_line` / `escape_text` make text from a host safe for a terminal: every C0 control
  character but tab (ESC included), DEL, and every C1 control character (U+0080-U+009F, which
  some terminals read as ESC sequences too) becomes a visible `\\xNN`. An OSC title change or a
  clear-screen printed on a host then shows as text instead of acting on the operator's terminal.
  Files keep the bytes as they came; escaping is for what is shown.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

MASK = "***"

_CONTROLS = [*(c for c in range(0x20) if c != 0x09), 0x7F, *range(0x80, 0xA0)]
_LINE_TABLE = {c: f"\\x{c:02x}" for c in _CONTROLS}
# json.dumps escapes C0 itself (its newlines between items are structure); DEL and C1 it leaves raw,
# and those can only stand inside a JSON string, where \\u00NN means the same character.
_JSON_TABLE = {c: f"\\u{c:04x}" for c in _CONTROLS if c >= 0x7F}


class Masker:
    """Replaces secret values with `***`.

    Args:
        secrets: The resolved secret values. Empty values are ignored (there is nothing to find);
            a value of several lines is also looked for line by line, since logs are kept by line.
    """

    def __init__(self, secrets: Iterable[str]) -> None:
        values = {v for secret in secrets for v in (secret, *secret.splitlines()) if v.strip()}
        # Longest first: a secret that contains another is masked whole.
        ordered = sorted(values, key=len, reverse=True)
        self._pattern = re.compile("|".join(map(re.escape, ordered))) if ordered else None

    def __bool__(self) -> bool:
        return self._pattern is not None

    def __call__(self, text: str) -> str:
        """`text` with every secret value replaced by `***`."""
        return self._pattern.sub(MASK, text) if self._pattern is not None else text


def escape_line(line: str) -> str:
    """One line made safe for a terminal: C0 (tab excepted, line breaks included), DEL and C1
    control characters as `\\xNN`."""
    return line.translate(_LINE_TABLE)


def escape_text(text: str) -> str:
    """Text of several lines made safe for a terminal: each line escaped, the newlines kept."""
    return "\n".join(escape_line(line) for line in text.split("\n"))


def escape_json(text: str) -> str:
    """JSON text with the DEL and C1 characters of its strings written as the `\\u00NN` escapes that
    mean the same characters: the data is unchanged, the terminal safe.

    Args:
        text: JSON as `json.dumps(..., ensure_ascii=False)` writes it.
    """
    return text.translate(_JSON_TABLE)
