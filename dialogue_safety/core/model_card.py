"""The JSON card that makes a model directory (or a training checkpoint) describe itself.

Everything downstream (runtime, service, evaluation, benchmarks) reads labels, heads,
threshold, temperatures and encoding settings from here; nothing re-derives them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from dialogue_safety.core.encoding import EncodingConfig
from dialogue_safety.core.model_dir import (  # noqa: F401 - TOKENIZER_FILE re-exported: callers import it here
    CARD_FILE,
    CARD_MARKDOWN_FILE,
    TOKENIZER_FILE,
)


class ModelCard(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = "dialogue-safety"
    version: str = "0.0.0"
    labels: list[str] = Field(default_factory=lambda: ["SAFE", "OFFENSIVE"])
    heads: list[str] = Field(
        default_factory=lambda: ["offensive"],
        description="one binary logit per head (label family), in the order of the logits output",
    )
    score_heads: list[str] = Field(
        default_factory=lambda: ["offensive"],
        description="the main OFFENSIVE score is the max of these heads' calibrated probabilities",
    )
    context_heads: list[str] = Field(
        default_factory=list,
        description="with the 'decomposed' encoding: the heads read from the dialogue row; the others read "
        "the utterance alone (see dialogue_safety.core.scoring.decomposed_logits)",
    )
    temperatures: dict[str, float] = Field(default_factory=dict, description="per head; 1.0 if absent")
    threshold: float = 0.5
    categories: dict[str, dict[str, Any]] = Field(
        default_factory=dict,
        description="per head: its own decision threshold ('threshold', tuned on the validation splits), whether "
        "it is too weak to decide ('score_only') and the validation figures behind both "
        "(dialogue_safety.export.categories); empty on cards written before them",
    )
    encoding: dict[str, Any] = Field(default_factory=lambda: EncodingConfig().to_dict())
    base_model: str = ""
    training: dict[str, Any] = Field(default_factory=dict)
    metrics: dict[str, Any] = Field(default_factory=dict)
    calibration: dict[str, Any] = Field(default_factory=dict)
    variants: dict[str, str] = Field(
        default_factory=dict, description="variant name (fp32, optimized, int8, fp16) -> ONNX file"
    )
    cpu_variant: str = "fp32"
    gpu_variant: str = "fp16"
    cpu_candidates: list[str] = Field(
        default_factory=list,
        description="the CPU variants that pass the decision gate (export.comparison.gate; fp32, the reference, "
        "always), any of which may be served; empty on cards written before it (cpu_variant alone)",
    )
    cpu_speed: dict[str, dict[str, Any]] = Field(
        default_factory=dict,
        description="per CPU family (dialogue_safety.core.cpu.CPU_FAMILIES): 'variants' {variant: "
        "{'dialogues_per_s': batched, 'single_p50_ms': one dialogue}}, measured side by side in one run on such "
        "a CPU, and 'measured' (machine, date, command); the runtime serves the candidate with the most "
        "dialogues/s on the family it runs on (dialogue_safety.core.runtime.cpu_default)",
    )
    export: dict[str, Any] = Field(default_factory=dict)
    intended_use: str = ""
    limitations: list[str] = Field(default_factory=list)
    licences: dict[str, str] = Field(default_factory=dict)

    @model_validator(mode="before")
    @classmethod
    def _each_number_once(cls, data: Any) -> Any:
        """Older cards also kept ``threshold`` and ``temperatures`` inside ``calibration``: read, those
        copies are dropped (the top-level fields are the ones in force; a card with only the copy
        gets it moved up)."""
        if isinstance(data, dict) and isinstance(data.get("calibration"), dict):
            calibration = dict(data["calibration"])
            data = dict(data)
            for key in ("threshold", "temperatures"):
                if key in calibration:
                    copy = calibration.pop(key)
                    data.setdefault(key, copy)
            data["calibration"] = calibration
        return data

    @property
    def encoding_config(self) -> EncodingConfig:
        return EncodingConfig.from_dict(self.encoding)

    @property
    def model_id(self) -> str:
        return f"{self.name}@{self.version}"

    def temperature(self, head: str) -> float:
        return float(self.temperatures.get(head, 1.0))

    def category_threshold(self, head: str) -> float | None:
        """The threshold at which ``head``'s category is true; None: a score only, never true (a head too
        weak to decide, or one the card has no validation figures for). A card written before per-category
        thresholds judges every head at the card's threshold."""
        if not self.categories:
            return float(self.threshold)
        entry = self.categories.get(head)
        if entry is None or entry.get("score_only", True):
            return None
        return float(entry["threshold"])

    @property
    def int8_check_band(self) -> float:
        """The int8 check: dialogues whose int8 score lies within this distance of the threshold are
        scored again with fp32, and that score is the answer (0: int8 answers alone).

        ``dialogue-safety export`` sets it (``export.int8_verify.band``) to the narrowest band at which
        the int8 variant keeps fp32's decisions on the validation splits
        (:mod:`dialogue_safety.export.quantization`): int8's score error is small for most dialogues but
        not for all, and only a dialogue scored near the threshold can change its label."""
        check = self.export.get("int8_verify") or {}
        return max(0.0, float(check.get("band", 0.0)))

    def serving_variants(self, variant: str) -> list[str]:
        """The variants serving ``variant`` loads: int8 with its check also needs fp32."""
        return [variant, "fp32"] if variant == "int8" and self.int8_check_band > 0 else [variant]

    @classmethod
    def load(cls, directory: str | Path) -> ModelCard:
        path = Path(directory) / CARD_FILE
        try:
            return cls.model_validate_json(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise FileNotFoundError(f"{path}: no model card; is {directory} a model directory?") from None
        except ValueError as exc:
            raise ValueError(f"{path}: invalid model card: {exc}") from exc

    def save(self, directory: str | Path) -> Path:
        path = Path(directory) / CARD_FILE
        path.write_text(json.dumps(self.model_dump(), indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
        return path


#: the test-split figures ``GET /v1/model`` shows per dataset, with the decimals they are read to (the rest
#: stays in the model directory's card)
PUBLIC_METRICS = {"n": 0, "offensive_f1": 1, "pr_auc": 3, "roc_auc": 3}


def public_card(card: ModelCard) -> dict[str, Any]:
    """What ``GET /v1/model`` shows of ``card``: a few KB of facts about the served model that the
    answers depend on (id, labels, heads, threshold, each category's threshold (null: a score only),
    temperatures, encoding, variants in use, test
    F1 per dataset, data licences). Left out, so that nothing leaks or goes stale: the export and
    training records (paths of the machine that trained or exported it, such as ``init_from`` or
    ``source_checkpoint``), the free text (intended use, limitations: they live in ``MODEL_CARD.md``,
    which is rendered from the same card and shipped with the model), and the per-round metrics.
    The full card stays in the model directory (``model_card.json``, ``MODEL_CARD.md``)."""
    found = card.metrics.get("test")
    test: dict[str, Any] = found if isinstance(found, dict) else {}
    metrics = {
        dataset: {k: round(v, PUBLIC_METRICS[k]) for k, v in split["all"].items() if k in PUBLIC_METRICS}
        for dataset, split in sorted(test.items())
        if isinstance(split, dict) and isinstance(split.get("all"), dict)
    }
    sources = card.training.get("sources")
    return {
        "name": card.name,
        "version": card.version,
        "labels": list(card.labels),
        "heads": list(card.heads),
        "score_heads": list(card.score_heads),
        "context_heads": list(card.context_heads),
        "threshold": card.threshold,
        "category_thresholds": {head: card.category_threshold(head) for head in card.heads},
        "temperatures": {head: round(t, 4) for head, t in card.temperatures.items()},
        "encoding": dict(card.encoding),
        # a named base ("minilm"); a local directory is shown by its last part only
        "base_model": Path(card.base_model).name if card.base_model else "",
        "variants": sorted(card.variants),
        "cpu_variant": card.cpu_variant,
        "gpu_variant": card.gpu_variant,
        "training_sources": sorted(str(s) for s in sources) if isinstance(sources, list) else [],
        "test_metrics": metrics,
        "licences": dict(card.licences),
        "full_card": f"{CARD_FILE} and {CARD_MARKDOWN_FILE} in the model directory",
    }
