"""``MODEL_CARD.md``: a short human-readable rendering of ``model_card.json`` (the JSON is authoritative)."""

from __future__ import annotations

import json
from typing import Any

from service.model_card import ModelCard


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    if value is None:
        return "—"
    return str(value)


def _size(n_bytes: Any) -> str:
    return f"{n_bytes / 1e6:.1f} MB" if isinstance(n_bytes, int | float) else "—"


def _metrics_section(metrics: dict[str, Any]) -> list[str]:
    if not metrics:
        return ["No test metrics recorded in the checkpoint card."]
    rows = {k: v for k, v in metrics.items() if isinstance(v, dict)}
    scalars = {k: v for k, v in metrics.items() if not isinstance(v, dict)}
    lines: list[str] = []
    if rows:
        columns = [
            c
            for c in ("offensive_f1", "precision", "recall", "weighted_f1", "pr_auc", "n")
            if any(c in r for r in rows.values())
        ]
        if columns:
            lines += ["| split | " + " | ".join(columns) + " |", "|---" * (len(columns) + 1) + "|"]
            lines += [f"| {name} | " + " | ".join(_fmt(r.get(c)) for c in columns) + " |" for name, r in rows.items()]
        else:
            lines += ["```json", json.dumps(rows, indent=2)[:4000], "```"]
    lines += [f"- {k}: {_fmt(v)}" for k, v in scalars.items()]
    return lines


def render_model_card(card: ModelCard) -> str:
    export = card.export
    enc = card.encoding_config
    lines = [
        f"# {card.name} {card.version}",
        "",
        "Context-aware dialogue safety classifier: is the last message of a conversation offensive, given what",
        "was said before it? Generated from `model_card.json` by `dialogue-safety export`; the JSON is authoritative.",
        "",
        "## Intended use",
        card.intended_use or "Not stated in the checkpoint card.",
        "",
        "## Model",
        f"- base model: `{card.base_model or 'unknown'}`",
        f"- heads (one sigmoid logit each): {', '.join(card.heads)}; "
        f"main score = max over {', '.join(card.score_heads)}",
        f"- temperatures: {card.temperatures or 'none (1.0)'}; decision threshold: {card.threshold:.4g}",
        f"- encoding: history = segment A, utterance = segment B; max_length {enc.max_length}, "
        f"max_utterance_tokens {enc.max_utterance_tokens}, context_mode {enc.context_mode}, "
        f"emoji names {enc.normalise_emoji}, NFKC {enc.normalise_unicode}, speaker markers {enc.speaker_markers}",
    ]
    geometry = export.get("geometry") or {}
    if geometry:
        lines.append(
            f"- geometry: {geometry.get('num_hidden_layers')} layers, hidden {geometry.get('hidden_size')}, "
            f"{geometry.get('num_attention_heads')} heads, {geometry.get('parameters', 0) / 1e6:.1f} M parameters"
        )
    lines += ["", "## Test metrics", *_metrics_section(card.metrics), ""]
    lines += [
        "## ONNX export",
        f"- artifact: `{export.get('artifact', 'model.onnx')}` ({_size(export.get('artifact_bytes'))}, "
        f"weights stored as {export.get('weights_storage', 'fp32')}), opset {export.get('opset')}",
        f"- parity with torch: max |Δlogit| {_fmt(export.get('max_abs_diff'))} "
        f"(tolerance {_fmt(export.get('tolerance'))}) "
        f"on {export.get('parity', {}).get('examples', '?')} dialogues",
    ]
    if "fp16_rounding_max_abs_diff" in export:
        lines.append(
            f"- weights rounded to fp16 before export: max |Δlogit| vs the fp32 checkpoint "
            f"{_fmt(export['fp16_rounding_max_abs_diff'])}"
        )
    lines += [
        f"- onnxruntime {export.get('onnxruntime')}, optimum {export.get('optimum')}, torch {export.get('torch')}",
        f"- CPU default variant: **{card.cpu_variant}** ({export.get('cpu_variant_reason', '')}); "
        f"GPU default: **{card.gpu_variant}**",
        "",
        "| variant | file | size | max abs logit diff vs torch |",
        "|---|---|---|---|",
    ]
    for name, entry in (export.get("variants") or {}).items():
        lines.append(
            f"| {name} | `{entry.get('file')}` | {_size(entry.get('bytes'))} | "
            f"{_fmt(entry.get('max_abs_diff'))}{' (' + entry['note'] + ')' if entry.get('note') else ''} |"
        )
    comparison = export.get("comparison")
    if comparison:
        splits = list(comparison["splits"])
        lines += [
            "",
            f"Variants vs fp32 on labelled test splits (threshold {comparison['threshold']:.4g}): "
            "OFFENSIVE-F1 (ΔF1, changed decisions).",
            "",
            "| variant | " + " | ".join(f"{s} (n={comparison['splits'][s]['n']})" for s in splits) + " |",
            "|---" * (len(splits) + 1) + "|",
        ]
        for variant, per_split in comparison["variants"].items():
            cells = [
                f"{r['offensive_f1']:.2f} ({r['delta_f1']:+.2f}, {100 * r['changed_decisions']:.2f}%)"
                for r in (per_split[s] for s in splits)
            ]
            lines.append(f"| {variant} | " + " | ".join(cells) + " |")
    if card.limitations:
        lines += ["", "## Limitations", *[f"- {item}" for item in card.limitations]]
    if card.licences:
        lines += ["", "## Data licences", *[f"- {k}: {v}" for k, v in card.licences.items()]]
    return "\n".join(lines) + "\n"
