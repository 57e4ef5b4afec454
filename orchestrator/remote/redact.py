"""Secrets masked and control characters escaped: the same rules on the hosts and on the controller.

Stdlib-only, so the supervisor ships it (it masks the host-side copy) and the controller imports
it (job files, terminal, summary, database). Two rules:

- Every resolved `${env:X}` secret value becomes `***` wherever a job's output is kept or shown.
- Text shown on an operator's terminal from a host has its C0 and C1 control characters (tab
  and the line feed that ends a line excepted, DEL included) written as `\\xNN`, so that no host
  can move the cursor, clear the screen or retitle the window. Files keep the bytes as they came.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

MASK = "***"
# C0 without tab (0x09) and line feed (0x0a), DEL, and C1 (U+0080..U+009F).
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")
_C0_BYTES = bytes([*range(0x00, 0x09), *range(0x0b, 0x20), 0x7f])
_C1_LEAD = b"\xc2"  # U+0080..U+009F are \xc2\x80..\xc2\x9f in UTF-8


class Masker:
    """Replaces each secret value by `***`, in bytes or in text; longest secrets first, so that a
    secret that contains another is masked whole.

    Args:
        secrets: The secret values; empty ones are ignored.
    """

    def __init__(self, secrets: Iterable[str]) -> None:
        values = sorted({s for s in secrets if s}, key=len, reverse=True)
        self.texts = values
        self.raw = [s.encode("utf-8", "surrogateescape") for s in values]

    def __bool__(self) -> bool:
        return bool(self.texts)

    def bytes(self, data: bytes) -> bytes:
        """`data` with every secret replaced (C-speed search; a copy only when one is found)."""
        for secret in self.raw:
            if secret in data:
                data = data.replace(secret, MASK.encode())
        return data

    def text(self, text: str) -> str:
        """`text` with every secret replaced."""
        for secret in self.texts:
            if secret in text:
                text = text.replace(secret, MASK)
        return text


def mask(text: str, secrets: Iterable[str]) -> str:
    """`text` with every value of `secrets` replaced by `***`."""
    return Masker(secrets).text(text)


def _escaped(match: re.Match[str]) -> str:
    return f"\\x{ord(match.group()):02x}"


def shown_text(data: bytes) -> str:
    """Bytes from a host as text for a terminal: decoded (a bad byte becomes U+FFFD) and escaped
    as `escape_controls` does. A batch with no control character (the common case: one byte
    table pass, one byte search) costs no regex at all."""
    text = data.decode("utf-8", "replace")
    if len(data.translate(None, _C0_BYTES)) == len(data) and _C1_LEAD not in data:
        return text
    return escape_controls(text)


def escape_controls(text: str) -> str:
    """`text` safe for a terminal: C0/C1 control characters and DEL written as `\\xNN`; tab and
    newline kept. Cheap when there is nothing to escape (one regex search)."""
    if _CONTROL.search(text) is None:
        return text
    return _CONTROL.sub(_escaped, text)


# json.dumps escapes C0 itself (its newlines between items are structure); DEL and C1 it leaves raw,
# and those can only stand inside a JSON string, where \\u00NN means the same character.
_JSON_TABLE = {c: f"\\u{c:04x}" for c in range(0x7F, 0xA0)}


def escape_json(text: str) -> str:
    """JSON text safe for a terminal with the same data: the DEL and C1 characters of its strings
    written as the `\\u00NN` escapes that mean the same characters.

    Args:
        text: JSON as `json.dumps(..., ensure_ascii=False)` writes it.

    Returns:
        The JSON text, equal to `text` once parsed.
    """
    return text.translate(_JSON_TABLE)
