"""Training checkpoints: a Hugging Face model directory plus ``tokenizer.json`` and the model card.

Layout of a checkpoint directory::

    config.json, model.safetensors   BertForSequenceClassification (one logit per head)
    tokenizer.json                   the tokenizer (truncation/padding off: encoding owns that)
    model_card.json                  dialogue_safety.core.model_card.ModelCard
    training_state.pt                optimizer/scheduler/step state, only while resumable
"""

from __future__ import annotations

from pathlib import Path

from tokenizers import Tokenizer
from transformers import BertForSequenceClassification

from dialogue_safety.core.encoding import DialogueEncoder
from dialogue_safety.core.model_card import ModelCard
from dialogue_safety.core.model_dir import CHECKPOINT_CONFIG_FILE, CHECKPOINT_FILES, TOKENIZER_FILE, is_checkpoint


def save_checkpoint(
    directory: str | Path, model: BertForSequenceClassification, tokenizer: Tokenizer, card: ModelCard
) -> Path:
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.no_truncation()
    tokenizer.no_padding()
    tokenizer.save(str(out / TOKENIZER_FILE))
    card.save(out)
    return out


def load_checkpoint(directory: str | Path) -> tuple[BertForSequenceClassification, DialogueEncoder, ModelCard]:
    src = Path(directory)
    if not (src / CHECKPOINT_CONFIG_FILE).is_file():
        raise FileNotFoundError(f"{src}: not a checkpoint directory (no {CHECKPOINT_CONFIG_FILE})")
    card = ModelCard.load(src)
    model = BertForSequenceClassification.from_pretrained(str(src))
    model.eval()
    encoder = DialogueEncoder.from_file(src / TOKENIZER_FILE, card.encoding_config)
    return model, encoder, card


def initial_weights(path: str | Path, heads: list[str]) -> BertForSequenceClassification:
    """The weights of a training checkpoint to continue from (``recipe.init_from``); its heads must
    be the recipe's."""
    if not is_checkpoint(path):
        raise ValueError(f"init_from: {path} is not a training checkpoint (needs {', '.join(CHECKPOINT_FILES)})")
    model = BertForSequenceClassification.from_pretrained(str(path))
    found = [model.config.id2label[i] for i in range(model.config.num_labels)]
    if found != heads:
        raise ValueError(f"init_from: {path} has heads {found}, but the recipe trains {heads}")
    return model
