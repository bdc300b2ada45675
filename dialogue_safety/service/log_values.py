"""Values from requests as they may appear in a log line: escaped, never raw.

A value a client sent (a model directory, a path, a text) may hold a newline, a carriage return, an
escape sequence or a lone surrogate: written raw, it forges log lines, moves a terminal's cursor, or
fails the log handler's encoding. Every log call that carries a request value passes it through
:func:`printable` (texts logged with ``SAFETY_LOG_TEXTS`` are logged with ``%r``, which escapes the
same characters).
"""

from __future__ import annotations

import re

#: C0 and C1 controls, DEL, the Unicode line and paragraph separators, the bidirectional overrides and
#: isolates (they reorder what a reader sees), and lone surrogates (not text; unencodable)
UNSAFE_CHARACTERS = re.compile("[\\x00-\\x1f\\x7f-\\x9f\\u2028\\u2029\\u202a-\\u202e\\u2066-\\u2069\\ud800-\\udfff]")
MAX_LOGGED_CHARS = 500  # a value is cut here (a log line is not the place for a whole body)


def _escape(match: re.Match[str]) -> str:
    char = match.group()
    return f"\\x{ord(char):02x}" if ord(char) < 0x100 else f"\\u{ord(char):04x}"


def printable(value: object, max_chars: int = MAX_LOGGED_CHARS) -> str:
    """``str(value)`` with every character that could forge or hide a log line escaped (``\\x0a``,
    ``\\ud800``...), cut to ``max_chars`` characters."""
    text = str(value)
    if len(text) > max_chars:
        text = f"{text[:max_chars]}... ({len(text)} characters)"
    return UNSAFE_CHARACTERS.sub(_escape, text)
