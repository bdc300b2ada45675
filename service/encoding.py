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

Normalisation (switchable, recorded in the model card) runs identically in training and
serving, in this order: emoji → their English names (``🐍`` → ``snake``), Unicode NFKC,
whitespace collapsed. BERT's uncased vocabulary maps most emoji to ``[UNK]``, which would
make emoji-based hate invisible.

Ablation modes: ``"concat"`` puts history and utterance in one segment (all token types 0,
same separators); ``"utterance_only"`` drops the history.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

import emoji
import numpy as np
from tokenizers import Tokenizer

from service.schema import Example

ContextMode = Literal["segments", "concat", "utterance_only"]
CONTEXT_MODES: tuple[str, ...] = ("segments", "concat", "utterance_only")


@dataclass(frozen=True)
class EncodingConfig:
    max_length: int = 128
    max_utterance_tokens: int = 96
    normalise_emoji: bool = True
    normalise_unicode: bool = True
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


def _emoji_name(chars: str, data: dict[str, Any]) -> str:
    name = str(data.get("en", "")).strip(":").replace("_", " ")
    return f" {name} " if name else " "


def normalise_text(text: str, config: EncodingConfig) -> str:
    """Apply the model's text normalisation (emoji names, NFKC, whitespace)."""
    if config.normalise_emoji:
        text = emoji.replace_emoji(text, replace=_emoji_name)
    if config.normalise_unicode:
        text = unicodedata.normalize("NFKC", text)
    return " ".join(text.split())


@dataclass(frozen=True, slots=True)
class EncodedExample:
    input_ids: tuple[int, ...]
    token_type_ids: tuple[int, ...]
    attention_mask: tuple[int, ...] = field(default=())

    def __len__(self) -> int:
        return len(self.input_ids)


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

    def encode_batch(self, examples: Sequence[Example]) -> list[EncodedExample]:
        """Encode many examples with one call into the Rust tokenizer."""
        use_history = self.config.context_mode != "utterance_only"
        texts: list[str] = []
        spans: list[tuple[int, int]] = []  # (start, number of history turns) per example
        for ex in examples:
            start = len(texts)
            turns = ex.history if use_history else ()
            keep = self.config.max_history_turns
            if keep is not None:
                turns = turns[-keep:] if keep else ()
            texts.extend(self._turn_text(t.text, t.speaker) for t in turns)
            texts.append(normalise_text(ex.utterance, self.config))
            spans.append((start, len(turns)))
        pieces = [e.ids for e in self.tokenizer.encode_batch(texts, add_special_tokens=False)]
        return [self._assemble(pieces[s : s + n], pieces[s + n]) for s, n in spans]

    def _assemble(self, history: list[list[int]], utterance: list[int]) -> EncodedExample:
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
        return EncodedExample(ids, types, (1,) * len(ids))


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
