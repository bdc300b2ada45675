"""What one item may hold: the per-item limits a request (or a row of a scored file) must keep.

:class:`Limits` holds the item-level rules that the API's single and batch requests, the break-it
game's messages and ``dialogue-safety score``'s rows share: lengths, counts, and texts that are
no text (a lone surrogate, or nothing visible). Breaking one is an :class:`InvalidInput` whose
message says what to change. The values are the service's settings (``SAFETY_MAX_*``,
:class:`dialogue_safety.service.settings.ServiceSettings`); the defaults here are theirs.
"""

from __future__ import annotations

import functools
import json
import re
import unicodedata
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from dialogue_safety.core.errors import InvalidInput
from dialogue_safety.core.schema import Example, Reading

if TYPE_CHECKING:  # the encoding imports tokenizers: `import dialogue_safety` stays light (tests/test_public_api.py)
    from dialogue_safety.core.encoding import EncodingConfig

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
            raise self.too_many_turns(len(turns), f"{prefix}history")
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
            raise self.too_many_items(n_items, "items")

    # -- the count errors (also raised from the raw JSON, before any element is validated:
    #    dialogue_safety.service.limits.check_counts) ---------------------------------------------
    def too_many_items(self, n: int, field: str) -> InvalidInput:
        """More items (or texts) in one request than ``max_batch_items``."""
        return InvalidInput(
            f"{n} items in one request; send at most {self.max_batch_items} per request (SAFETY_MAX_BATCH_ITEMS)",
            code="too_many_items",
            field=field,
        )

    def too_many_turns(self, n: int, field: str, *, messages: bool = False) -> InvalidInput:
        """More history turns than ``max_request_history_turns`` (``messages``: chat messages, the judged
        one included, so one more is accepted)."""
        most = self.max_request_history_turns + messages
        what = "messages" if messages else "turns"
        return InvalidInput(
            f"{field} has {n} {what}; send at most the {most} most recent (or raise SAFETY_MAX_REQUEST_HISTORY_TURNS)",
            code="too_many_history_turns",
            field=field,
        )

    @property
    def max_list_items(self) -> int:
        """The most elements any list in a request may hold (items, turns, messages, content parts...): a
        longer one refuses the whole request before its elements are read."""
        return max(self.max_batch_items, self.max_request_history_turns + 1)

    @property
    def max_string_chars(self) -> int:
        """The most characters any string in a request may hold (the longest text a limit accepts)."""
        return max(self.max_utterance_chars, self.max_turn_chars)


def _not_text(field: str) -> InvalidInput:
    return InvalidInput(NOT_TEXT_MESSAGE, code="invalid_text", field=field)


def texts_in(value: object) -> Iterator[str]:
    """The strings of ``value``: itself, or those inside its lists, tuples and objects (keys too)."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, list | tuple):
        for v in value:
            yield from texts_in(v)
    elif isinstance(value, dict):
        for k, v in value.items():
            yield from texts_in(k)
            yield from texts_in(v)


def is_text(value: object) -> bool:
    """Whether ``value`` (a string, or the strings inside lists and objects) can be written as UTF-8: no lone
    surrogate (what a JSON escape like "\\udc80", or bytes read with surrogateescape, make)."""
    return not any(_SURROGATE.search(t) for t in texts_in(value))


def check_text(value: object, field: str) -> None:
    """Raise the ``invalid_text`` :class:`InvalidInput` naming ``field`` unless :func:`is_text`."""
    if not is_text(value):
        raise _not_text(field)


def too_many_windows(read: Reading, max_windows: int, prefix: str = "") -> InvalidInput:
    """The error of an utterance that needs more than ``max_windows`` windows (``SAFETY_MAX_WINDOWS``)."""
    return InvalidInput(
        f"the utterance needs more than {max_windows} windows of model input (each ~125 tokens, about "
        f"500 characters of prose; its last {read.utterance_chars_unread} characters would go unread); at "
        f"most {max_windows} are read per item (SAFETY_MAX_WINDOWS): send it as shorter messages",
        code="too_many_windows",
        field=f"{prefix}utterance",
    )


# -- what a request can cost, known from its characters ------------------------------------------------
# A WordPiece token covers at least one character of the normalised text that is not whitespace, and
# normalising never turns one character into several, except an emoji (its English name) or a
# compatibility character NFKC expands (U+FDFA: 18 characters): those are the "expanding" characters.


@functools.cache
def _expanding() -> tuple[re.Pattern[str], int]:
    """A pattern matching one expanding character, and the most non-space characters one of them can
    become (an emoji sequence's name over its non-ASCII characters). Built once, from every code point: the service
    builds it while it loads the model."""
    import emoji

    chars: set[int] = set()
    most = 1
    for cp in range(0x80, 0x30000):
        if 0xD800 <= cp <= 0xDFFF:
            continue
        expanded = unicodedata.normalize("NFKC", chr(cp))
        if len(expanded) > 1:
            chars.add(cp)
            most = max(most, len(expanded) - expanded.count(" "))
    for sequence, data in emoji.EMOJI_DATA.items():
        wide = [ord(c) for c in sequence if ord(c) >= 0x80]
        chars.update(wide)
        name = str(data.get("en", "")).strip(":").replace("_", " ")
        ascii_chars = len(sequence) - len(wide)
        most = max(most, -(-(len(name) - name.count(" ") - ascii_chars) // max(1, len(wide))))
    ranges: list[str] = []
    ordered = sorted(chars)
    start = prev = ordered[0]
    for cp in [*ordered[1:], -1]:
        if cp == prev + 1:
            prev = cp
            continue
        ranges.append(f"{re.escape(chr(start))}-{re.escape(chr(prev))}" if prev > start else re.escape(chr(start)))
        start = prev = cp
    return re.compile(f"[{''.join(ranges)}]"), most


def text_tokens_at_most(text: str, words: TokenizerWords | None = None) -> int:
    """The most tokens ``text`` can become once normalised and tokenised, from its characters alone:
    one per character that is not a space, and up to :func:`expansion` per expanding character; with
    ``words`` (the tokenizer's), one for a word of ASCII letters the vocabulary holds whole."""
    nonspace = len(text) - text.count(" ")
    if words is not None and words.whole:
        nonspace -= words.saved(text)
    if text.isascii():
        return nonspace
    pattern, most = _expanding()
    return nonspace + (most - 1) * pattern.subn("", text)[1]


# -- what a text costs at least: a whitespace-separated word that holds two ASCII letters or digits in a row
# is one token at least, whatever the normalisation does: disguises drop only invisible characters and
# marks, shorten only a letter repeated thrice, and join words only through single letters (``i d i o t``),
# so a word that starts with a lone letter (``x1y``) is not counted, lest it was joined to the one before;
# and a CJK ideograph is a token of its own where the tokenizer splits them (BERT's
# ``handle_chinese_chars``), but the third and further of a run of one ideograph (a stretched letter)
_ALNUM_WORD = re.compile(r"(?<!\S)(?![^\W\d_](?![^\W\d_]))\S*?[A-Za-z0-9]{2}")
_CJK = re.compile("[\u4e00-\u9fff]")
_CJK_STRETCHED = re.compile("([\u4e00-\u9fff])(?=\\1\\1)")
# a word of ASCII letters (with punctuation around it that no disguise rule reads) is one piece when the
# vocabulary holds it whole: WordPiece takes the longest piece first
_PLAIN = re.compile(r"(?<!\S)[.,;:?\"'()]*([A-Za-z]{2,})[.,;:?\"'()]*(?!\S)")
_TRIPLE = re.compile(r"(.)\1\1")


@dataclass(frozen=True)
class TokenizerWords:
    """What a WordPiece tokenizer tells of a text's tokens before it is run (read from its JSON once, when
    the model loads): the words its vocabulary holds whole (lower-cased, when it lower-cases), and whether it splits CJK
    ideographs. ``known`` is False for any other tokenizer (another model, pre-tokenizer or normalizer):
    then a text costs at least nothing, as far as these rules know."""

    known: bool
    whole: frozenset[str] = frozenset()
    lowercase: bool = False
    chinese: bool = False

    @classmethod
    def of(cls, tokenizer: Any) -> TokenizerWords:
        """From a ``tokenizers.Tokenizer`` (its JSON: model, normalizer, pre-tokenizer)."""
        spec = json.loads(tokenizer.to_str())
        model, norm, pre = spec.get("model") or {}, spec.get("normalizer") or {}, spec.get("pre_tokenizer") or {}
        bert = norm.get("type") == "BertNormalizer"
        if model.get("type") != "WordPiece" or pre.get("type") != "BertPreTokenizer" or not (bert or not norm):
            return cls(known=False)
        lowercase = bert and bool(norm.get("lowercase"))
        whole = frozenset(  # a word whose letter repeats thrice may be shortened by the disguise rules: left out
            w
            for w in model.get("vocab", {})
            if w.isascii() and w.isalpha() and (w.islower() or not lowercase) and _TRIPLE.search(w) is None
        )
        return cls(
            known=True,
            whole=whole,
            lowercase=lowercase,
            chinese=bert and bool(norm.get("handle_chinese_chars", True)),
        )

    def saved(self, text: str) -> int:
        """Characters :func:`text_tokens_at_most` counts beyond one token for the words held whole."""
        counts = Counter(_PLAIN.findall(text))  # a pass in C, then one look-up per distinct word
        fold = str.lower if self.lowercase else str
        return sum((len(word) - 1) * n for word, n in counts.items() if fold(word) in self.whole)


def text_tokens_at_least(text: str, words: TokenizerWords | None) -> int:
    """The fewest tokens ``text`` becomes once normalised and tokenised (see the rules above); 0 when the
    tokenizer is not one these rules know."""
    if words is None or not words.known:
        return 0
    least = len(_ALNUM_WORD.findall(text))
    if words.chinese and not text.isascii():
        least += len(_CJK.findall(text)) - len(_CJK_STRETCHED.findall(text))
    return least


def expansion() -> int:
    """The most non-space characters one expanding character (emoji, NFKC compatibility) becomes."""
    return _expanding()[1]


class CostBound:
    """What examples cost admission at most and at least (model tokens: tokens x windows x passes, the unit of
    :attr:`dialogue_safety.core.encoding.EncodedExample.tokens`), from their characters, before they are
    tokenised: what the admission rule decides on before tokenising
    (:meth:`dialogue_safety.service.admission.AdmissionGate.refusal`): a request that costs more than
    it may at least is refused untokenised; any other is tokenised and charged its real cost. ``max_windows``:
    windows read per utterance at most (an utterance that needs more is refused, not charged); ``words``:
    the tokenizer's (:class:`TokenizerWords`; None: no lower bound but 0, and a looser upper one)."""

    def __init__(self, config: EncodingConfig, max_windows: int, words: TokenizerWords | None = None) -> None:
        self.config = config
        self.max_windows = max_windows
        self.words = words
        _expanding()  # built now (the service: in the loading thread), not on a request

    def __call__(self, examples: Iterable[Example]) -> int:
        return sum(self.example(example) for example in examples)

    def at_least(self, examples: Iterable[Example], enough: int | None = None) -> int:
        """What ``examples`` cost at least once encoded (never above their real cost); counting stops once
        past ``enough`` (the most a request may cost: it is known to cost too much by then)."""
        total = 0
        for example in examples:
            total += self.example_at_least(example)
            if enough is not None and total > enough:
                break
        return total

    def example_at_least(self, example: Example) -> int:
        """An example's cost at least: its utterance's tokens at least, over the fewest windows they make, each
        row with its [CLS] and two [SEP]. 0 unless its utterance surely needs at most ``max_windows`` windows
        by :meth:`example`'s count (one that needs more is refused and charged nothing)."""
        from dialogue_safety.core.encoding import windows_at_least, windows_at_most

        if self.words is None or not self.words.known:
            return 0
        cfg = self.config
        budget = cfg.max_length - 3
        width = cfg.max_utterance_tokens if example.history else budget
        if windows_at_most(text_tokens_at_most(example.utterance), width) > self.max_windows and (
            windows_at_most(text_tokens_at_most(example.utterance, self.words), width) > self.max_windows
        ):  # the vocabulary's words looked up only when one token per character is not tight enough
            return 0
        u = text_tokens_at_least(example.utterance, self.words)
        return 3 * windows_at_least(u, budget) + u

    def example(self, example: Example) -> int:
        from dialogue_safety.core.encoding import windows_at_most

        cfg = self.config
        budget = cfg.max_length - 3
        u = text_tokens_at_most(example.utterance, self.words)
        turns = example.history if cfg.context_mode != "utterance_only" else ()
        if cfg.max_history_turns is not None:
            turns = turns[len(turns) - cfg.max_history_turns :] if cfg.max_history_turns else ()
        h = 0
        for turn in turns:  # each turn and its [SEP] (the speaker marker: its name, ":" and a space)
            marker = text_tokens_at_most(turn.speaker, self.words) + 1 if cfg.speaker_markers and turn.speaker else 0
            h += text_tokens_at_most(turn.text, self.words) + marker + 1
        width = cfg.max_utterance_tokens if turns else budget
        rows = min(self.max_windows, windows_at_most(u, width))
        cost = rows * min(cfg.max_length, 3 + min(u, width) + h)
        if cfg.context_mode == "decomposed" and h:  # the utterance alone, over what the dialogue rows read
            read = min(u, max(width + (rows - 1) * width, budget))
            cost += windows_at_most(read, budget) * min(cfg.max_length, 3 + min(read, budget))
        return cost
