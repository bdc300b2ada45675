"""``MODEL_CARD.md``: a short human-readable rendering of ``model_card.json`` (the JSON is authoritative)."""

from __future__ import annotations

from typing import Any

from dialogue_safety.core.model_card import ModelCard
from dialogue_safety.core.model_dir import ARTIFACT_FILE, CARD_FILE, CARD_MARKDOWN_FILE
from dialogue_safety.core.runtime import fastest_recorded
from dialogue_safety.export.quantization import PORTABLE_MARGIN
from dialogue_safety.training.curve import curve_table


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    if value is None:
        return "—"
    return str(value)


def _cpu_families(card: ModelCard) -> list[str]:
    """The variants that pass the gate and, per CPU family, the figures the runtime picks the CPU default from."""
    if not card.cpu_candidates:
        return []
    lines = [f"- variants that pass the gate (the runtime may serve any): {', '.join(card.cpu_candidates)}"]
    for family, entry in sorted(card.cpu_speed.items()):
        figures = entry.get("variants") or {}
        measured = [v for v in card.cpu_candidates if v in figures]
        served = fastest_recorded(card, family) or "—"
        speeds = "; ".join(
            f"{v} {figures[v]['dialogues_per_s']} dialogues/s"
            + (f", single {figures[v]['single_p50_ms']} ms" if figures[v].get("single_p50_ms") else "")
            for v in measured
        )
        lines.append(f"- on {family}: **{served}** ({speeds}; {entry.get('measured', '')})")
    return lines


def _size(n_bytes: Any) -> str:
    return f"{n_bytes / 1e6:.1f} MB" if isinstance(n_bytes, int | float) else "—"


METRIC_COLUMNS = (
    ("offensive_f1", "OFFENSIVE-F1"),
    ("precision", "precision"),
    ("recall", "recall"),
    ("weighted_f1", "weighted F1"),
    ("pr_auc", "PR-AUC"),
)


def _metric_cell(row: dict[str, Any], key: str) -> str:
    value = row.get(key)
    if not isinstance(value, int | float):
        return "—"
    return f"{value:.3f}" if key == "pr_auc" else f"{value:.1f}"


def _split_table(per_source: dict[str, Any]) -> list[str]:
    """One row per source (its ``all`` entry) and one per adversarial round under it."""
    head = "| set | n | positives | " + " | ".join(label for _, label in METRIC_COLUMNS) + " |"
    lines = [head, "|---" * (len(METRIC_COLUMNS) + 3) + "|"]
    for name, entry in per_source.items():
        rows = [(f"**{name}**", entry.get("all", entry))]
        rows += [(f"{name} / {r}", sub) for r, sub in (entry.get("rounds") or {}).items()]
        for label, row in rows:
            cells = [_metric_cell(row, key) for key, _ in METRIC_COLUMNS]
            counts = f"{_fmt(row.get('n'))} | {_fmt(row.get('positives'))}"
            lines.append(f"| {label} | {counts} | " + " | ".join(cells) + " |")
    return lines


def _served(card: ModelCard) -> str:
    if len(card.score_heads) == 1:
        return f"the `{card.score_heads[0]}` head"
    return "the max over " + ", ".join(f"`{h}`" for h in card.score_heads)


def _heads_section(heads: dict[str, Any]) -> list[str]:
    """Each head (a ``categories`` entry) on its own label family's test sets, at its own threshold."""
    if not heads:
        return []
    lines = [
        "",
        "### Categories: each head on the test sets of its own label family",
        "",
        "Each head judged against its family's own labels at the head's validation-tuned threshold "
        "(the served decision above uses the served head and the card's threshold).",
        "",
        "| head | set | n | threshold | OFFENSIVE-F1 | accuracy |",
        "|---|---|---|---|---|---|",
    ]
    for head, entry in heads.items():
        for name, row in (entry.get("test") or {}).items():
            lines.append(
                f"| {head} | {name} | {_fmt(row.get('n'))} | {entry.get('threshold', 0):.4g} | "
                f"{_metric_cell(row, 'offensive_f1')} | {_metric_cell(row, 'accuracy')} |"
            )
    return [*lines, ""]


def _categories_section(categories: dict[str, Any]) -> list[str]:
    """Each category's own threshold and whether it decides, from its validation figures
    (:mod:`dialogue_safety.export.categories`)."""
    if not categories:
        return []
    lines = [
        "",
        "### Categories: thresholds tuned on validation",
        "",
        "Each head's own threshold (macro OFFENSIVE-F1 over the validation splits of the sources labelling it; "
        "never a test split). A head whose macro F1 there is below the bar of "
        "`dialogue_safety/export/categories.py` is a score only: never a true category "
        "(`/v1/moderations` reports it in `scores_only`).",
        "",
        "| head | threshold | valid macro F1 | decides | validation splits |",
        "|---|---|---|---|---|",
    ]
    for head, entry in categories.items():
        splits = ", ".join(f"{name} ({row.get('n')})" for name, row in (entry.get("valid") or {}).items())
        lines.append(
            f"| {head} | {entry.get('threshold', 0):.4g} | {_fmt(entry.get('valid_macro_f1'))} | "
            f"{'score only' if entry.get('score_only') else 'yes'} | {splits} |"
        )
    return [*lines, ""]


def _metrics_section(metrics: dict[str, Any], threshold: float) -> list[str]:
    """Test (then valid) metrics at the card's threshold; HateCheck's F1 columns are its accuracy rows."""
    if not metrics:
        return ["No metrics recorded in the checkpoint card."]
    lines: list[str] = []
    for split in ("test", "valid"):
        per_source = metrics.get(split) or {}
        if not per_source:
            continue
        lines += [f"### {split} splits (threshold {threshold:.4g})", "", *_split_table(per_source), ""]
        accuracy = {
            name: (entry.get("all") or {}).get("accuracy")
            for name, entry in per_source.items()
            if name == "hatecheck" and isinstance((entry.get("all") or {}).get("accuracy"), int | float)
        }
        for name, acc in accuracy.items():
            lines += [f"{name} accuracy (the suite's headline metric): {acc:.1f}", ""]
    return lines or ["No metrics recorded in the checkpoint card."]


def _calibration_section(card: ModelCard) -> list[str]:
    """How the card's temperatures (printed here, once) and threshold (printed under Model) were chosen;
    the numbers come from the card's own fields (``calibration`` holds what was measured around them)."""
    calibration = card.calibration
    if not calibration:
        return []
    lines = ["## Calibration", ""]
    before, after = calibration.get("ece_before") or {}, calibration.get("ece_after") or {}
    for head, temperature in card.temperatures.items():
        lines.append(
            f"- head `{head}`: temperature {_fmt(temperature)}; expected calibration error on valid "
            f"{_fmt(before.get(head))} → {_fmt(after.get(head))}"
        )
    if "threshold_objective" in calibration:
        penalty = calibration.get("false_alarm_penalty")
        objective = (
            f"the mean OFFENSIVE-F1 over sources less {penalty:g} points per point flagged of the SAFE-only sets"
            if penalty
            else f"{calibration['threshold_objective']} OFFENSIVE-F1 over sources"
        )
        lines.append(f"- the decision threshold was chosen on the validation sets ({objective})")
    best = calibration.get("per_source_best_threshold") or {}
    if best:
        lines.append(
            "- per-source best thresholds on valid (not used: a service does not know the source): "
            + ", ".join(f"{k} {v:.2f}" for k, v in best.items())
        )
    return [*lines, ""]


def _training_section(training: dict[str, Any], licences: dict[str, str]) -> list[str]:
    examples = training.get("examples") or {}
    if not examples:
        return []
    recipe = training.get("recipe") or {}
    lines = ["## Training data", "", "| task | train | valid | test | licence |", "|---|---:|---:|---:|---|"]
    for name, n in examples.items():
        licence = licences.get(name.split("/")[0], "—")
        lines.append(f"| {name} | {n.get('train', 0):,} | {n.get('valid', 0):,} | {n.get('test', 0):,} | {licence} |")
    lines.append("")
    facts = [
        f"recipe `{recipe.get('name', '?')}`",
        f"{_fmt(recipe.get('epochs'))} epochs",
        f"learning rate {_fmt(recipe.get('learning_rate'))}",
        f"{training.get('steps', '?')} steps",
    ]
    if training.get("selected_step") not in (None, training.get("steps")):
        facts.append(f"weights of step {training['selected_step']} (best validation check)")
    if training.get("train_seconds"):
        legs = training.get("legs") or 1
        facts.append(
            f"{training['train_seconds'] / 60:.1f} min on {training.get('device', '?')}"
            + (f" in {legs} resumed legs" if legs > 1 else "")
        )
    lines.append("- " + ", ".join(facts))
    skipped = training.get("skipped_tasks") or []
    if skipped:
        lines.append(f"- optional tasks skipped: {'; '.join(skipped)}")
    curve = training.get("curve") or {}
    if curve.get("valid"):
        lines += [
            "",
            "### Validation curve",
            "",
            "Every validation check of the run: OFFENSIVE-F1 per task on the valid splits at the check's "
            "threshold (the recipe's objective, uncalibrated), and the training loss at that step.",
            "",
            *curve_table(curve),
        ]
    return [*lines, ""]


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
        f"- heads (one sigmoid logit each, reported as `categories`): {', '.join(card.heads)}; "
        f"the served OFFENSIVE score is {_served(card)}",
        f"- decision threshold: {card.threshold:.4g}"
        + ("" if card.temperatures else "; temperatures: none (1.0)")
        + ("; per-head temperatures: see Calibration" if card.temperatures else ""),
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
    lines += ["", "## Metrics", "", *_metrics_section(card.metrics, card.threshold)]
    lines += _heads_section(card.metrics.get("heads") or {})
    lines += _categories_section(card.categories)
    lines += _calibration_section(card)
    lines += _training_section(card.training, card.licences)
    lines += [
        "## ONNX export",
        f"- artifact: `{export.get('artifact', ARTIFACT_FILE)}` ({_size(export.get('artifact_bytes'))}, "
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
        *_cpu_families(card),
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
            "OFFENSIVE-F1 (ΔF1 [paired bootstrap 95 % interval], decisions changed = 100 % − agreement); "
            "the gate: agreement ≥ 99 % on every split, mean ΔF1 ≥ −0.3, no interval entirely below −0.5.",
            "",
            "| variant | " + " | ".join(f"{s} (n={comparison['splits'][s]['n']})" for s in splits) + " | gate |",
            "|---" * (len(splits) + 2) + "|",
        ]
        for variant, per_split in comparison["variants"].items():
            cells = []
            for r in (per_split[s] for s in splits):
                ci = r.get("delta_f1_ci")
                interval = f" [{ci[0]:+.2f}, {ci[1]:+.2f}]" if ci else ""
                cells.append(
                    f"{r['offensive_f1']:.2f} ({r['delta_f1']:+.2f}{interval}, {100 * r['changed_decisions']:.2f}%)"
                )
            verdict = (comparison.get("gate") or {}).get(variant, {}).get("why", "")
            lines.append(f"| {variant} | " + " | ".join(cells) + f" | {verdict} |")
    lines += _int8_selection_section(export)
    if card.limitations:
        lines += ["", "## Limitations", *[f"- {item}" for item in card.limitations]]
    if card.licences:
        lines += ["", "## Data licences", *[f"- {k}: {v}" for k, v in card.licences.items()]]
    return "\n".join(lines) + "\n"


def int8_candidate_verdict(entry: dict[str, Any], *, chosen: bool = False, strong: str = "**") -> str:
    """One int8 candidate of ``export.int8_selection`` in words: the gate alone, with the fp32 check
    near the threshold, refused for scores that move with the batch (the card and the export's report)."""
    if "error" in entry:
        return f"cannot be derived here: {entry['error']}"
    verdict = str(entry["gate"]["why"])
    if "portable" in entry:
        verdict = (
            "7-bit weights, served on every CPU; " if entry["portable"] else "8-bit weights, VNNI or ARM; "
        ) + verdict
    check = entry.get("check") or {}
    if check.get("band"):
        verdict += (
            f"; with the fp32 check within {check['band']:g} of the threshold "
            f"({100 * check['checked_fraction']:.1f} % of the dialogues): agreement ≥ "
            f"{100 * check['gate']['min_agreement']:.2f} %"
        )
    batch = entry.get("batch_dependence") or {}
    if check.get("band") is not None and entry.get("served_seconds") is not None and batch.get("steady", True):
        verdict += f"; served in {entry['served_seconds']:.1f} s"
    if entry.get("judged_without_vnni"):
        verdict += (
            f"; {strong}not kept{strong}: judged on a CPU without VNNI, where its 8-bit products saturate (a VNNI CPU "
            "computes it exactly, a CPU without VNNI does not serve it)"
        )
    elif batch and not batch.get("steady", True):
        verdict += (
            f"; {strong}refused{strong}: a dialogue's score moves by up to {batch['max_abs_score_diff']:.2g} with "
            f"the batch it is computed in ({batch['changed_decisions']} of {batch['dialogues']} labels changed)"
        )
    elif chosen:
        verdict += f"; {strong}chosen{strong}"
    return verdict


def _int8_selection_section(export: dict[str, Any]) -> list[str]:
    """The int8 recipes tried on the validation splits (in the order tried) and the calibration set."""
    selection = export.get("int8_selection")
    if not selection:
        return []
    if selection.get("fp32_seconds") is not None:  # every candidate judged, the cheapest to serve chosen
        lines = [
            "",
            "int8 recipes judged on the validation splits (held out from the calibration set); of those that pass, "
            "the cheapest to serve is chosen (its seconds on these dialogues, plus fp32's for the share it checks; "
            f"fp32 alone: {selection['fp32_seconds']:.1f} s):",
        ]
    else:  # an export before the cheapest-to-serve rule: the first that passed
        lines = ["", "int8 recipes tried on the validation splits (held out from the calibration set), in order:"]
    calibration = export.get("calibration")
    if calibration:
        lines[-1] += (
            f" static ones calibrated on `{calibration['file']}` ({calibration['rows']} encoded rows from "
            f"{sum(calibration['dialogues'].values())} validation dialogues, {calibration['bytes'] / 1e3:.1f} KB)."
        )
    candidates = selection.get("candidates") or {}
    if candidates:
        splits = list(selection.get("splits") or {})
        lines += [
            "",
            "| int8 recipe | " + " | ".join(f"{s} (n={selection['splits'][s]})" for s in splits) + " | gate |",
            "|---" * (len(splits) + 2) + "|",
        ]
        for name, entry in candidates.items():
            cells = [
                f"{entry['splits'][s]['delta_f1']:+.2f}, {100 * (1 - entry['splits'][s]['changed_decisions']):.2f}%"
                if s in entry.get("splits", {})
                else "—"
                for s in splits
            ]
            verdict = int8_candidate_verdict(entry, chosen=name == selection.get("chosen") and selection.get("passed"))
            lines.append(f"| {name} | " + " | ".join(cells) + f" | {verdict} |")
        lines += ["", "(cells: int8 alone, ΔF1 and agreement with fp32)"]
    lines.append(
        f"- int8 recipe: **{selection['chosen']}**"
        + ("" if selection.get("passed") else " (none passed on validation: int8 is not the CPU default)")
    )
    if any("portable" in entry for entry in candidates.values()):
        lines.append(
            "- of the candidates that pass, the cheapest to serve; a portable one (7-bit weights) unless an 8-bit one "
            f"is at least {100 * PORTABLE_MARGIN:g} % cheaper: 8-bit weights saturate on x86 CPUs without VNNI, "
            "where fp32 is served instead"
            + (
                ""
                if selection.get("export_cpu_vnni") is not False
                else " (this export ran on such a CPU: its 8-bit candidates, judged on saturating products, are "
                "not kept)"
            )
        )
    verify = export.get("int8_verify")
    if verify:
        lines.append(
            f"- int8 check: a dialogue whose int8 score lies within {verify['band']:g} of the threshold is scored "
            f"again with {verify.get('against', 'fp32')}, whose score is the answer "
            f"({100 * verify.get('validation_checked_fraction', 0):.1f} % of the validation dialogues)"
        )
    lines += [f"- {note}" for note in selection.get("notes", [])]
    return lines


def main(argv: list[str] | None = None) -> int:
    """``python -m dialogue_safety.export.card_markdown MODEL_DIR``: rewrite MODEL_CARD.md from model_card.json,
    and model_card.json itself in the current form (an older card's duplicated numbers dropped)."""
    import argparse
    from pathlib import Path

    parser = argparse.ArgumentParser(prog="python -m dialogue_safety.export.card_markdown", description=main.__doc__)
    parser.add_argument("model_dir", type=Path)
    args = parser.parse_args(argv)
    card_path = args.model_dir / CARD_FILE
    if not card_path.is_file():
        parser.error(f"{card_path} does not exist")
    card = ModelCard.model_validate_json(card_path.read_text(encoding="utf-8"))
    card.save(args.model_dir)
    (args.model_dir / CARD_MARKDOWN_FILE).write_text(render_model_card(card), encoding="utf-8")
    print(f"wrote {card_path} and {args.model_dir / CARD_MARKDOWN_FILE}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
