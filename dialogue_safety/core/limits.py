"""What one item may hold: the per-item limits a request (or a row of a scored file) must keep.

:class:`Limits` holds the item-level rules that the API's single and batch requests, the break-it
game's messages and ``dialogue-safety score``'s rows share: lengths, counts, and texts that are
no text (a lone surrogate, or nothing visible). Breaking one is an :class:`InvalidInput` whose
message says what to change. The values are the service's settings (``SAFETY_MAX_*``,
:class:`dialogue_safety.service.settings.ServiceSettings`); the defaults here are theirs.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from dialogue_safety.core.errors import InvalidInput
from dialogue_safety.core.schema import Example, Reading

NOT_TEXT_MESSAGE = (
    "the text holds a lone UTF-16 surrogate (a \\ud800-\\udfff escape without its pair), which is not "
    "Unicode text; send valid UTF-8 / complete surrogate pairs"
)

# Characters that show nothing: whitespace, C0/C1 controls, soft hyphen, zero-width and
# bidirectional marks, word joiners, variation selectors, BOM. An utterance needs one other
# character. The same class is the OpenAPI ``pattern`` of the utterance (one owner).
INVISIBLE_CLASS = (
    "\\s\\u0000-\\u001f\\u007f-\\u009f\\u00ad\\u034f\\u061c\\u115f\\u1160\\u17b4\\u17b5"
    "\\u180b-\\u180f\\u200b-\\u200f\\u2028-\\u202e\\u2060-\\u206f\\u3164\\ufe00-\\ufe0f\\ufeff\\uffa0"
)
VISIBLE_PATTERN = f"[^{INVISIBLE_CLASS}]"
_VISIBLE = re.compile(VISIBLE_PATTERN)
_SURROGATE = re.compile("[\\ud800-\\udfff]")

#: windows over one utterance at most (``SAFETY_MAX_WINDOWS``): 4,000 characters of prose need ~10
#: (docs/runtime.md, "Long messages"); a text that tokenises into far more pieces per character
#: (emoji read as their names, digits, scripts outside the vocabulary) needs up to ~40x that
MAX_WINDOWS = 32


@dataclass(frozen=True, slots=True)
class Limits:
    max_request_history_turns: int = 32
    max_turn_chars: int = 4000
    max_utterance_chars: int = 4000
    max_batch_items: int = 256
    max_body_bytes: int = 2 * 1024 * 1024
    max_windows: int = MAX_WINDOWS

    def check_example(self, example: Example, prefix: str = "") -> None:
        """Raise :class:`InvalidInput` for the first rule this item breaks (single and batch requests,
        and each item of a batch, go through here; ``prefix`` is e.g. ``items[3].``)."""
        self.check_item(example.utterance, [t.text for t in example.history], prefix)
        for i, turn in enumerate(example.history):
            if turn.speaker is not None and _SURROGATE.search(turn.speaker):
                raise _not_text(f"{prefix}history[{i}].speaker")

    def check_item(self, utterance: str, turns: Sequence[str], prefix: str = "") -> None:
        """Raise :class:`InvalidInput` for the first limit this item breaks."""
        if _VISIBLE.search(utterance) is None:
            raise InvalidInput(
                "the utterance is empty or shows nothing (only whitespace, zero-width or control characters); "
                "send the text to classify",
                code="empty_utterance",
                field=f"{prefix}utterance",
            )
        if len(utterance) > self.max_utterance_chars:
            raise InvalidInput(
                f"the utterance has {len(utterance)} characters; at most {self.max_utterance_chars} are "
                "accepted (SAFETY_MAX_UTTERANCE_CHARS)",
                code="utterance_too_long",
                field=f"{prefix}utterance",
            )
        if len(turns) > self.max_request_history_turns:
            raise InvalidInput(
                f"the history has {len(turns)} turns; send at most the {self.max_request_history_turns} most recent "
                "(or raise SAFETY_MAX_REQUEST_HISTORY_TURNS)",
                code="too_many_history_turns",
                field=f"{prefix}history",
            )
        for i, text in enumerate(turns):
            if len(text) > self.max_turn_chars:
                raise InvalidInput(
                    f"history turn {i} has {len(text)} characters; at most {self.max_turn_chars} are accepted "
                    "(SAFETY_MAX_TURN_CHARS)",
                    code="turn_too_long",
                    field=f"{prefix}history[{i}]",
                )
        if _SURROGATE.search(utterance):
            raise _not_text(f"{prefix}utterance")
        for i, text in enumerate(turns):
            if _SURROGATE.search(text):
                raise _not_text(f"{prefix}history[{i}]")

    def check_read(self, read: Reading, prefix: str = "") -> None:
        """Raise :class:`InvalidInput` when the utterance needs more windows than ``max_windows`` (the
        encoding made at most that many: :attr:`Reading.windows_needed` says more were needed)."""
        if read.windows_needed > self.max_windows:
            raise too_many_windows(read, self.max_windows, prefix)

    def check_batch(self, n_items: int) -> None:
        if n_items == 0:
            raise InvalidInput("items is empty; send at least one item", code="empty_batch", field="items")
        if n_items > self.max_batch_items:
            raise InvalidInput(
                f"{n_items} items in one request; send at most {self.max_batch_items} per request "
                "(SAFETY_MAX_BATCH_ITEMS)",
                code="too_many_items",
                field="items",
            )


def _not_text(field: str) -> InvalidInput:
    return InvalidInput(NOT_TEXT_MESSAGE, code="invalid_text", field=field)


def too_many_windows(read: Reading, max_windows: int, prefix: str = "") -> InvalidInput:
    """The error of an utterance that needs more than ``max_windows`` windows (``SAFETY_MAX_WINDOWS``)."""
    return InvalidInput(
        f"the utterance needs more than {max_windows} windows of model input (each ~125 tokens, about "
        f"500 characters of prose; its last {read.utterance_chars_unread} characters would go unread); at "
        f"most {max_windows} are read per item (SAFETY_MAX_WINDOWS): send it as shorter messages",
        code="too_many_windows",
        field=f"{prefix}utterance",
    )
