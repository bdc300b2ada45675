"""JSON from outside (a request body, a line or a cell of a scored file): checked before it is parsed.

Python's ``json`` parser recurses once per nesting level, so a text nested a few thousand brackets
deep raises ``RecursionError`` (not a ``ValueError``) from the parser itself: the depth is checked
first, by a cheap scan (:func:`too_deep`), and text deeper than :data:`MAX_JSON_DEPTH` is refused
without being parsed. :func:`loads` also refuses an object that holds a key twice: which value
counts would depend on the reader (Python keeps the last, a proxy may check the first), so such
input is ambiguous and refused rather than guessed.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

#: nesting levels (objects and arrays) a JSON text may have: every input of the project needs a few
#: (a batch item's history turn is at depth 4); far below the parser's recursion limit
MAX_JSON_DEPTH = 64
_ESCAPE = re.compile(rb"\\.", re.DOTALL)  # inside a string: an escaped quote does not close it
_STRING = re.compile(rb'"[^"]*"')  # once escapes are gone (brackets inside a string do not nest)
_NOT_BRACKET = re.compile(rb"[^\[\]{}]+")


class JsonInputError(ValueError):
    """JSON refused before or while parsing: nested too deeply, or a key twice in one object."""


class TooDeep(JsonInputError):
    """Nested deeper than the limit (found before parsing)."""


class DuplicateKey(JsonInputError):
    """An object holds one key twice."""


def too_deep(text: str | bytes, max_depth: int = MAX_JSON_DEPTH) -> bool:
    """Whether ``text`` nests objects and arrays deeper than ``max_depth``, without parsing it (and in
    time linear in its length: regular expressions without backtracking do the scanning). Text with
    no more opening brackets than that cannot, and is answered from two counts. Text that is not
    JSON may be judged on its part before the first error, which is as far as a parser gets."""
    data = text.encode("utf-8", "surrogatepass") if isinstance(text, str) else text
    if data.count(b"[") + data.count(b"{") <= max_depth:
        return False
    brackets = _NOT_BRACKET.sub(b"", _STRING.sub(b"", _ESCAPE.sub(b"", data)))
    depth = 0
    for byte in brackets:
        depth += 1 if byte in _OPENING else -1
        if depth > max_depth:
            return True
    return False


_OPENING = frozenset(b"[{")


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj = dict(pairs)
    if len(obj) != len(pairs):
        seen: set[str] = set()
        twice = next(k for k, _ in pairs if k in seen or seen.add(k))  # type: ignore[func-returns-value]
        raise DuplicateKey(f"the key {json.dumps(twice)[:80]} appears twice in one object")
    return obj


def loads(
    text: str | bytes,
    max_depth: int = MAX_JSON_DEPTH,
    *,
    parse_float: Callable[[str], Any] | None = None,
    parse_constant: Callable[[str], Any] | None = None,
) -> Any:
    """``json.loads`` for input from outside: raises :class:`JsonInputError` for text nested deeper
    than ``max_depth`` (checked before parsing) or an object with a duplicate key, and
    ``json.JSONDecodeError`` / ``UnicodeDecodeError`` (both ``ValueError``) for text that is not JSON.
    ``parse_float`` and ``parse_constant``: as ``json.loads`` takes them."""
    if too_deep(text, max_depth):
        raise TooDeep(f"nested deeper than {max_depth} levels of objects and arrays")
    return json.loads(text, object_pairs_hook=_unique_keys, parse_float=parse_float, parse_constant=parse_constant)
