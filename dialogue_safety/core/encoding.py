"""The one input contract shared by training and serving.

Layout (``context_mode="segments"``, the default, BBF's "dialogue segments" model)::

    [CLS] turn_1 [SEP] turn_2 [SEP] ... turn_n [SEP] utterance [SEP]
    |<------------- segment A: token_type 0 ------------>|<-- B: 1 -->|

* History turns (oldest first) go into segment A, each followed by ``[SEP]``.
* The utterance being judged is always segment B, followed by ``[SEP]``.
* An example without history is encoded as ``[CLS] [SEP] utterance [SEP]``: an *empty*
  segment A, so single-turn and multi-turn data teach the same layout (the utterance is
  always segment B, what precedes it is always segment A).
* Optional speaker markers prefix each history turn as ``"<speaker>: <text>"``.

Truncation never fails: the utterance keeps its first ``max_utterance_tokens`` tokens (all of
``max_length - 3`` when there is no history); the remaining budget is filled with history
from the newest turn backwards, so the **oldest** turns are dropped first. The oldest turn
that only partly fits keeps its last tokens (the words nearest the utterance).
``max_history_turns`` (default: no limit) keeps only the newest N turns before any of that.

Only what the model reads is normalised and tokenised: the utterance is cut to a window of
its first characters and each history turn to a window of its last characters (at a
whitespace, ``WINDOW_CHARS_PER_TOKEN`` characters per token it may contribute), and a window
that yields too few tokens is widened and encoded again. The result is the same as encoding
the whole text whenever the cut falls on whitespace (the normalisation and BERT's
pre-tokenisation never join words across whitespace); a text with no whitespace near the cut
is cut where the window ends, which can only change the pieces of the word cut in two, never
within the tokens the model reads (the head window asks for ``WINDOW_MARGIN_TOKENS`` extra).
A 4,000-character turn costs what its last ~128 tokens cost, not what 4,000 characters cost.

**Windows over long utterances** (``encode_batch(..., max_windows=N)``, what scoring asks for):
an utterance longer than its token budget (``max_length - 3``, or ``max_utterance_tokens`` in a
row with history) is read in overlapping windows of that budget, each a row of its own with the
*same* segment A (the history kept for the first window). Consecutive windows overlap by
``WINDOW_OVERLAP`` of the budget (a quarter: 31 tokens alone, 24 with history) so that a phrase
cut by one window boundary is whole in the next; a window starts at a word (never inside a
word's ``##`` pieces) where one starts nearby, and the last window ends at the utterance's last
token. The first window is exactly the row an encoding without windows makes, so short
utterances (one window) are encoded as before. At most ``max_windows`` windows are made; what the
cap leaves unread is reported in :attr:`EncodedExample.read` (with the history turns the budget
dropped), and the scorer (:func:`dialogue_safety.core.scoring.decomposed_logits`) takes each
head's maximum over the windows it reads. Training encodes with ``max_windows=1`` (a label is
about the whole utterance; the first window is what it was trained on).

Normalisation (switchable, recorded in the model card) runs identically in training and
serving, in this order: emoji → their English names (``🐍`` → ``snake``), Unicode NFKC,
whitespace collapsed. BERT's uncased vocabulary maps most emoji to ``[UNK]``, which would
make emoji-based hate invisible.

Ablation modes: ``"concat"`` puts history and utterance in one segment (all token types 0,
same separators); ``"utterance_only"`` drops the history.

``"decomposed"`` (model 0.4.0): the dialogue row is encoded as in ``"segments"`` and an example
whose history is kept gets a second row, the utterance alone (``[CLS] [SEP] utterance [SEP]``,
its whole budget), in :attr:`EncodedExample.alone`. The card's ``context_heads`` read the
dialogue row, every other head reads the utterance alone, so the history can neither taint nor
launder what the utterance says (:func:`dialogue_safety.core.scoring.decomposed_logits` combines the rows).
"""

from __future__ import annotations

import functools
import re
import unicodedata
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import emoji
import numpy as np
from tokenizers import Tokenizer

from dialogue_safety.core.obfuscation import deobfuscate
from dialogue_safety.core.schema import Example, Reading, Turn

CONTEXT_MODES: tuple[str, ...] = ("segments", "concat", "utterance_only", "decomposed")


@dataclass(frozen=True)
class EncodingConfig:
    max_length: int = 128
    max_utterance_tokens: int = 96
    normalise_emoji: bool = True
    normalise_unicode: bool = True
    normalise_obfuscation: bool = False  # undo leetspeak, look-alike and letter-emoji disguises (core/obfuscation.py)
    speaker_markers: bool = False
    context_mode: str = "segments"
    max_history_turns: int | None = None  # keep only the newest N history turns (None: as many as fit)

    def __post_init__(self) -> None:
        if self.context_mode not in CONTEXT_MODES:
            raise ValueError(f"context_mode must be one of {CONTEXT_MODES}, got {self.context_mode!r}")
        if self.max_history_turns is not None and self.max_history_turns < 0:
            raise ValueError(f"max_history_turns must be >= 0 or None, got {self.max_history_turns}")
        if self.max_length < 8:
            raise ValueError(f"max_length must be at least 8, got {self.max_length}")
        if not 1 <= self.max_utterance_tokens <= self.max_length - 3:
            raise ValueError(
                f"max_utterance_tokens must be in [1, max_length - 3 = {self.max_length - 3}], "
                f"got {self.max_utterance_tokens}"
            )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> EncodingConfig:
        known = {f for f in cls.__dataclass_fields__}
        unknown = set(data) - known
        if unknown:
            raise ValueError(f"unknown encoding settings: {sorted(unknown)}")
        return cls(**data)


WINDOW_OVERLAP = 0.25  # consecutive windows over a long utterance share this fraction of the budget
WINDOW_ALIGN = 0.5  # a window start moves at most this fraction of the overlap to reach a word start
WINDOW_CHARS_PER_TOKEN = 6  # the first window: characters per token the model may read from a text
WINDOW_MARGIN_TOKENS = 16  # extra tokens a window cut inside a word must yield


def _cut(text: str, chars: int, head: bool) -> tuple[str, bool]:
    """The first (``head``) or last ``chars`` characters of ``text``, cut at whitespace when there
    is some in the outer half of the window; also whether the cut was at whitespace."""
    n = len(text)
    if head:
        lo, hi = chars // 2, chars
        at = max(text.rfind(" ", lo, hi), text.rfind("\n", lo, hi), text.rfind("\t", lo, hi))
        return (text[:at], True) if at > 0 else (text[:chars], False)
    lo, hi = n - chars, n - chars // 2
    found = [i for i in (text.find(" ", lo, hi), text.find("\n", lo, hi), text.find("\t", lo, hi)) if i >= 0]
    return (text[min(found) + 1 :], True) if found else (text[n - chars :], False)


def _room_for_another_turn(room: int, kept: int) -> bool:
    """Whether a further (older) history turn can still add tokens (see ``_assemble``)."""
    return room > 0 if kept == 0 else room > 1


def _room_after(room: int, kept: int, turn_tokens: int) -> int:
    """Token room left once a turn of ``turn_tokens`` is kept (the first shares segment A's [SEP])."""
    if kept == 0:
        return room - min(turn_tokens, room)
    return room - min(turn_tokens, room - 1) - 1


def _emoji_name(chars: str, data: dict[str, Any]) -> str:
    name = str(data.get("en", "")).strip(":").replace("_", " ")
    return f" {name} " if name else " "


@functools.cache
def _emoji_chars() -> re.Pattern[str]:
    """The non-ASCII characters of the Basic Multilingual Plane that the library's emoji hold, and every
    character beyond it (where most emoji lie: one range scans faster than a list of them). A text with none
    holds no emoji (each has a non-ASCII character), and the pure-Python emoji pass is skipped."""
    chars = {c for e in emoji.EMOJI_DATA for c in e if not c.isascii() and c <= "\uffff"}
    return re.compile("[" + re.escape("".join(sorted(chars))) + "\U00010000-\U0010ffff]")


def normalise_text(text: str, config: EncodingConfig) -> str:
    """Apply the model's text normalisation (disguises undone, emoji names, NFKC, whitespace)."""
    if config.normalise_obfuscation:
        text = deobfuscate(text)
    if config.normalise_emoji and not text.isascii() and _emoji_chars().search(text):
        text = emoji.replace_emoji(text, replace=_emoji_name)  # pure Python per character: ~8 % of batched time
    if config.normalise_unicode:
        text = unicodedata.normalize("NFKC", text)
    return " ".join(text.split())


@dataclass(frozen=True, slots=True)
class EncodedExample:
    """One model input row; ``alone`` is the utterance-alone row of a ``"decomposed"`` encoding
    (None without history or in the other modes); ``more``: the further windows of a long
    utterance in this row's layout (same segment A); ``read``: what the example's rows read."""

    input_ids: tuple[int, ...]
    token_type_ids: tuple[int, ...]
    attention_mask: tuple[int, ...] = field(default=())
    alone: EncodedExample | None = None
    more: tuple[EncodedExample, ...] = ()
    read: Reading = field(default=Reading())

    def __len__(self) -> int:
        return len(self.input_ids)

    @property
    def rows(self) -> tuple[EncodedExample, ...]:
        """This row's windows: itself, then ``more``."""
        return (self, *self.more)

    @property
    def width(self) -> int:
        """The longest of this row's windows (what a batch holding it is padded to)."""
        return max(len(self), *(len(w) for w in self.more)) if self.more else len(self)

    @property
    def model_rows(self) -> tuple[EncodedExample, ...]:
        """Every row the model reads for this example: its windows, then those of its utterance-alone row
        (what the micro-batcher schedules, one row at a time; the scorer combines them)."""
        return self.rows if self.alone is None else (*self.rows, *self.alone.rows)

    @property
    def tokens(self) -> int:
        """Tokens the model reads for this example: every window of both rows of a decomposed encoding."""
        return sum(len(w) for w in self.model_rows)


class DialogueEncoder:
    """Turns :class:`Example` objects into model inputs; the only place that does."""

    def __init__(self, tokenizer: Tokenizer, config: EncodingConfig | None = None) -> None:
        self.config = config or EncodingConfig()
        tokenizer.no_truncation()
        tokenizer.no_padding()
        self.tokenizer = tokenizer
        self.cls_id = self._special_id("[CLS]")
        self.sep_id = self._special_id("[SEP]")
        self.pad_id = self._special_id("[PAD]")
        vocab = tokenizer.get_vocab()
        self._continuation = np.zeros(max(vocab.values(), default=0) + 1, dtype=bool)  # "##" pieces
        self._continuation[[i for t, i in vocab.items() if t.startswith("##")]] = True

    @classmethod
    def from_file(cls, path: str | Path, config: EncodingConfig | None = None) -> DialogueEncoder:
        return cls(Tokenizer.from_file(str(path)), config)

    def _special_id(self, token: str) -> int:
        token_id = self.tokenizer.token_to_id(token)
        if token_id is None:
            raise ValueError(f"tokenizer has no {token} token: the encoding needs a BERT-style vocabulary")
        return int(token_id)

    def _turn_text(self, text: str, speaker: str | None) -> str:
        if self.config.speaker_markers and speaker:
            text = f"{speaker}: {text}"
        return normalise_text(text, self.config)

    def encode(self, example: Example) -> EncodedExample:
        return self.encode_batch([example])[0]

    def encode_batch(self, examples: Sequence[Example], max_windows: int | None = 1) -> list[EncodedExample]:
        """Encode many examples, a few calls into the Rust tokenizer for the whole batch: the
        utterances and newest turns first, then older turns (2, 4, 8... at a time) only for the
        examples whose token budget is not full yet (see the module docstring). ``max_windows``:
        windows over a long utterance at most (None: as many as it needs; 1: its first window
        only, as training reads it)."""
        cfg = self.config
        if max_windows is not None and max_windows < 1:
            raise ValueError(f"max_windows must be >= 1 or None, got {max_windows}")
        use_history = cfg.context_mode != "utterance_only"
        budget = cfg.max_length - 3
        histories: list[tuple[Turn, ...]] = []
        for ex in examples:
            turns = ex.history if use_history else ()
            keep = cfg.max_history_turns
            if keep is not None:
                turns = turns[-keep:] if keep else ()
            histories.append(turns)
        decomposed = cfg.context_mode == "decomposed"
        # the windows of the dialogue row (the utterance's budget there) and the tokens that show
        # whether the utterance needs more than max_windows of them (a decomposed model's utterance
        # is also read alone, its whole budget at least)
        widths = [cfg.max_utterance_tokens if turns else budget for turns in histories]
        utt_need = [
            max(budget if decomposed or not turns else w, _tokens_to_see_past(w, max_windows, len(ex.utterance)))
            for ex, turns, w in zip(examples, histories, widths, strict=True)
        ]
        utt_encodings = self._tokenize_windows(
            [(ex.utterance, None, True, n) for ex, n in zip(examples, utt_need, strict=True)]
        )
        utterances = [list(e.ids) for e in utt_encodings]
        room = [budget - min(len(u), w) for u, w in zip(utterances, widths, strict=True)]
        newest_first: list[list[list[int]]] = [[] for _ in examples]
        step = 2
        while True:
            asks: list[tuple[int, Turn]] = []
            for i, turns in enumerate(histories):
                done = len(newest_first[i])
                if done < len(turns) and _room_for_another_turn(room[i], done):
                    asks += [(i, t) for t in reversed(turns[max(0, len(turns) - done - step) : len(turns) - done])]
            if not asks:
                break
            pieces = self._tokenize_windows([(t.text, t.speaker, False, max(1, room[i])) for i, t in asks])
            for (i, _), piece in zip(asks, pieces, strict=True):
                if _room_for_another_turn(room[i], len(newest_first[i])):
                    room[i] = _room_after(room[i], len(newest_first[i]), len(piece.ids))
                newest_first[i].append(list(piece.ids))
            step *= 2
        out: list[EncodedExample] = []
        for i, ex in enumerate(examples):
            utt, width = utterances[i], widths[i]
            spans, needed = window_spans(self._continuation[utt] if utt else np.zeros(0, bool), width, max_windows)
            read_end = spans[-1][1]
            row, kept = self._assemble(list(reversed(newest_first[i])), utt[: spans[0][1]])
            more = tuple(self._window_row(row, spans[0][1], utt[a:b]) for a, b in spans[1:])
            unread = 0
            if read_end < len(utt):
                offsets = utt_encodings[i].offsets
                unread = len(ex.utterance) - self._raw_chars_read(ex.utterance, offsets[read_end - 1][1])
            read = Reading(len(spans), needed, unread, len(ex.history) - kept)
            alone: EncodedExample | None = None
            if decomposed and newest_first[i]:
                alone_end = max(read_end, min(len(utt), budget))
                alone_spans, _ = window_spans(self._continuation[utt[:alone_end]], budget, None)
                first, _ = self._assemble([], utt[: alone_spans[0][1]])
                alone_more = tuple(self._window_row(first, alone_spans[0][1], utt[a:b]) for a, b in alone_spans[1:])
                alone = replace(first, more=alone_more)
            out.append(replace(row, alone=alone, more=more, read=read))
        return out

    def _raw_chars_read(self, raw: str, normalised_chars: int) -> int:
        """The length of the longest prefix of ``raw`` whose normalised text has at most
        ``normalised_chars`` characters (where reading stopped, in the caller's characters)."""
        lo, hi = 0, len(raw)
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if len(normalise_text(raw[:mid], self.config)) <= normalised_chars:
                lo = mid
            else:
                hi = mid - 1
        return lo

    def _tokenize_windows(self, texts: Sequence[tuple[str, str | None, bool, int]]) -> list[Any]:
        """The tokenizer's encodings (ids and offsets) of the windows of ``texts`` that yield their
        needed tokens."""
        chars = [WINDOW_CHARS_PER_TOKEN * (need + WINDOW_MARGIN_TOKENS) for *_, need in texts]
        pieces: list[Any] = [None] * len(texts)
        todo = list(range(len(texts)))
        while todo:
            windows: list[str] = []
            checks: list[int | None] = []  # tokens the window must yield (None: the whole text)
            for i in todo:
                text, speaker, head, need = texts[i]
                if len(text) <= chars[i]:
                    windows.append(self._turn_text(text, speaker) if not head else normalise_text(text, self.config))
                    checks.append(None)
                    continue
                window, at_space = _cut(text, chars[i], head)
                windows.append(normalise_text(window, self.config))  # a cut turn's speaker marker is never read
                checks.append(need + (0 if at_space else WINDOW_MARGIN_TOKENS))
            encoded = self.tokenizer.encode_batch(windows, add_special_tokens=False)
            again = []
            for i, enc, check in zip(todo, encoded, checks, strict=True):
                if check is not None and len(enc.ids) < check:
                    chars[i] *= 4  # too few tokens in the window (spaces, zero-width...): widen it
                    again.append(i)
                else:
                    pieces[i] = enc
            todo = again
        return pieces

    def _window_row(self, first: EncodedExample, first_utterance_tokens: int, window: list[int]) -> EncodedExample:
        """A further window of ``first``'s row: its segment A, then ``window`` as segment B."""
        a = len(first) - first_utterance_tokens - 1
        ids = (*first.input_ids[:a], *window, self.sep_id)
        b_type = 0 if self.config.context_mode == "concat" else 1
        types = (*first.token_type_ids[:a], *((b_type,) * (len(window) + 1)))
        return EncodedExample(ids, types, (1,) * len(ids))

    def _assemble(self, history: list[list[int]], utterance: list[int]) -> tuple[EncodedExample, int]:
        """The row of ``utterance`` (cut to its budget) after as much ``history`` as fits, and how many
        history turns it holds."""
        cfg = self.config
        budget = cfg.max_length - 3  # [CLS], the [SEP] closing segment A, the final [SEP]
        cap = cfg.max_utterance_tokens if history else budget
        utt = utterance[:cap]
        remaining = budget - len(utt)
        kept: list[list[int]] = []  # newest first
        for turn in reversed(history):
            if remaining <= 0:
                break
            if not kept:
                # the first kept turn shares the [SEP] already budgeted for segment A
                piece = turn[-remaining:] if len(turn) > remaining else turn
                remaining -= len(piece)
            else:
                room = remaining - 1  # each further turn adds its own [SEP]
                if room <= 0:
                    break
                piece = turn[-room:] if len(turn) > room else turn
                remaining -= len(piece) + 1
            kept.append(piece)
        segment_a: list[int] = [self.cls_id]
        for i, piece in enumerate(reversed(kept)):
            if i:
                segment_a.append(self.sep_id)
            segment_a.extend(piece)
        segment_a.append(self.sep_id)
        segment_b = [*utt, self.sep_id]
        ids = (*segment_a, *segment_b)
        b_type = 0 if cfg.context_mode == "concat" else 1
        types = (0,) * len(segment_a) + (b_type,) * len(segment_b)
        return EncodedExample(ids, types, (1,) * len(ids)), len(kept)


def _tokens_to_see_past(width: int, max_windows: int | None, text_chars: int) -> int:
    """Utterance tokens to tokenise so that ``max_windows`` windows of ``width`` are filled and one
    token more shows whether the utterance needs further windows (None: the whole text)."""
    if max_windows is None:
        return max(width, text_chars)  # WINDOW_CHARS_PER_TOKEN x this >= the text: all of it
    return width + (max_windows - 1) * _stride(width) + 1


def _stride(width: int) -> int:
    return max(1, width - int(width * WINDOW_OVERLAP))


def windows_at_most(n_tokens: int, width: int) -> int:
    """The most windows :func:`window_spans` makes over an utterance of ``n_tokens`` tokens (before any
    cap): a start moves on at least a stride less its word alignment."""
    if n_tokens <= width:
        return 1
    stride = _stride(width)
    advance = max(1, stride - int((width - stride) * WINDOW_ALIGN))
    return 1 + -(-(n_tokens - width) // advance)


def windows_at_least(n_tokens: int, width: int) -> int:
    """The fewest windows :func:`window_spans` makes over an utterance of ``n_tokens`` tokens (before any
    cap): a start moves on at most a stride, and the last window ends at the last token."""
    if n_tokens <= width:
        return 1
    return 1 + -(-(n_tokens - width) // _stride(width))


def window_spans(continuation: np.ndarray, width: int, max_windows: int | None) -> tuple[list[tuple[int, int]], int]:
    """``[(start, end), ...]`` token spans of the windows over an utterance of ``len(continuation)``
    tokens (``continuation[k]``: token k continues a word, a ``##`` piece), at most ``max_windows``
    of them, and how many the utterance needs (at least; more than ``max_windows`` when cut).

    Windows are ``width`` tokens and consecutive ones overlap by ``WINDOW_OVERLAP`` x ``width``; a
    start moves back (at most ``WINDOW_ALIGN`` x the overlap) to the start of its word, and the
    last window ends at the last token (its start moves forward to a word start instead).
    """
    n = len(continuation)
    if n <= width:
        return [(0, n)], 1
    stride = _stride(width)
    shift = int((width - stride) * WINDOW_ALIGN)
    starts = [0]
    while starts[-1] + width < n:
        s = starts[-1] + stride
        if s + width >= n:  # the last window: full width, ending at the last token
            s = max(n - width, starts[-1] + 1)
            t = s
            while t < min(n - 1, s + shift) and continuation[t]:
                t += 1
            s = t if not continuation[t] else s
        else:
            t = s
            while t > max(starts[-1] + 1, s - shift) and continuation[t]:
                t -= 1
            s = t if not continuation[t] else s
        starts.append(s)
    needed = len(starts)
    if max_windows is not None:
        starts = starts[:max_windows]
    return [(s, min(s + width, n)) for s in starts], needed


def wordpiece_tokenizer(vocab_file: str | Path, lowercase: bool = True) -> Tokenizer:
    """A BERT WordPiece tokenizer from a ``vocab.txt`` (for bases without a tokenizer.json)."""
    from tokenizers import decoders, models, normalizers, pre_tokenizers

    vocab = models.WordPiece.read_file(str(vocab_file))
    tok = Tokenizer(models.WordPiece(vocab, unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=lowercase)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece()
    return tok


def pad_batch(encoded: Sequence[EncodedExample], pad_id: int = 0) -> dict[str, np.ndarray]:
    """Pad to the longest example of this batch (never to ``max_length``): int64 arrays."""
    if not encoded:
        raise ValueError("cannot pad an empty batch")
    width = max(len(e) for e in encoded)
    n = len(encoded)
    input_ids = np.full((n, width), pad_id, dtype=np.int64)
    token_type_ids = np.zeros((n, width), dtype=np.int64)
    attention_mask = np.zeros((n, width), dtype=np.int64)
    for row, e in enumerate(encoded):
        k = len(e)
        input_ids[row, :k] = e.input_ids
        token_type_ids[row, :k] = e.token_type_ids
        attention_mask[row, :k] = 1
    return {"input_ids": input_ids, "attention_mask": attention_mask, "token_type_ids": token_type_ids}
