"""One markdown page from an evaluation's ``results.json`` (see ``dialogue_safety.evaluation.evaluate``).

Cells show ``model / baseline`` when the baseline suite ran. F1, precision, recall and
accuracy are percentages; ROC-AUC, PR-AUC and AAA scores are in [0, 1].
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from dialogue_safety.evaluation.aaa import ATTACK_TITLES, ATTACKS
from dialogue_safety.evaluation.rounds import ALL_ROUNDS, round_sort_key

METRIC_COLUMNS: tuple[tuple[str, str, int], ...] = (
    ("offensive_f1", "OFF-F1", 1),
    ("weighted_f1", "wF1", 1),
    ("macro_f1", "macro-F1", 1),
    ("precision", "P", 1),
    ("recall", "R", 1),
    ("accuracy", "Acc", 1),
    ("roc_auc", "ROC-AUC", 3),
    ("pr_auc", "PR-AUC", 3),
)
DASH = "—"


def fmt(value: Any, digits: int = 1) -> str:
    if value is None:
        return DASH
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def signed(value: float | None, digits: int = 1) -> str:
    return DASH if value is None else f"{value:+.{digits}f}"


def table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def _roles(results: Mapping[str, Any]) -> list[str]:
    """The scorers of every table: ``model`` and, when the baseline suite ran, ``baseline``."""
    return list(results.get("roles") or ["model"])


def _config_suites(results: Mapping[str, Any]) -> Sequence[str]:
    return results.get("config", {}).get("suites", [])


def _cell(per_role: Mapping[str, Any], roles: Sequence[str], get: Callable[[Any], Any], digits: int = 1) -> str:
    return " / ".join(fmt(get(per_role[r]) if r in per_role else None, digits) for r in roles)


def _at(*path: str) -> Callable[[Any], Any]:
    """A getter for ``value[path[0]][path[1]]...`` (None where a level is missing)."""

    def get(value: Any) -> Any:
        for key in path:
            value = value.get(key) if isinstance(value, Mapping) else None
        return value

    return get


def _roles_note(results: Mapping[str, Any], roles: Sequence[str]) -> str:
    names = [f"**{r}** = {results.get(r, {}).get('name', r)}" for r in roles]
    return "Cells: " + " / ".join(r for r in roles) + f" ({'; '.join(names)})."


def header_section(results: Mapping[str, Any], plots: Mapping[str, str]) -> list[str]:
    model = results["model"]
    cfg = results.get("config", {})
    out = [
        f"# Robustness report: {model.get('name')}",
        "",
        f"- model: `{model.get('path', model.get('name'))}` ({model.get('kind', 'scorer')}), "
        f"decision threshold {fmt(model.get('threshold'), 3)}",
        f"- data: `{results.get('data_dir')}`; suites: {', '.join(cfg.get('suites', []))}; seed {cfg.get('seed')}; "
        f"limit {cfg.get('limit') or 'none'} (examples per source split / suite)",
    ]
    if results.get("previous"):
        prev = results["previous"]
        out.append(
            f"- previous: `{prev.get('path', prev.get('name'))}` ({prev.get('name')}), decision threshold "
            f"{fmt(prev.get('threshold'), 3)}: the **previous** column of every table"
        )
    if results.get("baseline"):
        b = results["baseline"]
        out.append(
            f"- baseline: {b.get('name')} (word 1–2-gram TF-IDF + logistic regression) trained on the train "
            f"splits of {', '.join(b.get('sources', [])) or DASH} ({b.get('n_train')} examples), threshold "
            f"{fmt(b.get('threshold'), 3)} tuned for OFFENSIVE-F1 on {b.get('n_valid')} valid examples"
        )
    if model.get("kind") == "baseline":
        out.append("- the model *is* the baseline, so the tables have no separate baseline column")
    if results.get("skipped"):
        reasons = "; ".join(f"{k} ({v.split('; obtain')[0]})" for k, v in results["skipped"].items())
        out.append(f"- sources not available (skipped): {reasons}")
    timings = results.get("timings_s") or {}
    if timings:
        out.append("- time: " + ", ".join(f"{k} {v:.1f} s" for k, v in timings.items()))
    out += ["", "F1, precision, recall, accuracy: %; ROC-AUC, PR-AUC, AAA: [0, 1].", ""]
    if plots.get("training_curve"):
        checks = model["training_curve"]["valid"]
        out += [
            f"The model's training run validated {len(checks)} times (its card has every check, per task):",
            "",
            f"![training curve]({plots['training_curve']})",
            "",
        ]
    return out


def rounds_section(results: Mapping[str, Any], plots: Mapping[str, str]) -> list[str]:
    data = results.get("rounds")
    if not data:
        return ["## 1. Held-out and adversarial rounds", "", "Not run (no evaluation data).", ""]
    roles = _roles(results)
    rows = data["rows"]
    out = ["## 1. Held-out and adversarial rounds", "", _roles_note(results, roles), ""]
    out += ["### Per task, round and split (BBF Table 6 layout)", ""]
    header = ["task", "round", "split", "n", "pos"] + [title for _, title, _ in METRIC_COLUMNS]
    body = []
    for row in rows:
        cells = [row["task"], row["round"], row["split"], row["n"], row["positives"]]
        cells += [_cell(row["metrics"], roles, _at(key), d) for key, _, d in METRIC_COLUMNS]
        body.append(cells)
    out += [table(header, body), ""]

    # DynaHate Table 4 layout: rounds as columns, one table per (task, split) with several rounds
    by_task: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for row in rows:
        by_task[(row["task"], row["split"])].append(row)
    multi = {k: v for k, v in by_task.items() if len(v) > 2}
    if multi:
        out += ["### Rounds as columns (DynaHate Table 4 layout)", ""]
        for (task, split), group in multi.items():
            group = sorted(group, key=lambda r: round_sort_key(r["round"]))
            header = ["", *(r["round"] for r in group)]
            body = []
            for role in roles:
                for key, title in (("offensive_f1", "OFF-F1"), ("macro_f1", "macro-F1"), ("accuracy", "Acc")):
                    name = results.get(role, {}).get("name", role)
                    body.append([f"{name}: {title}"] + [fmt(r["metrics"][role][key]) for r in group])
            body.append(["n", *(r["n"] for r in group)])
            out += [f"**{task}, {split}**", "", table(header, body), ""]

    pert = [
        r
        for r in rows
        if r.get("perturbation") and all(r["perturbation"][roles[0]][k]["n"] for k in ("original", "perturbation"))
    ]
    out += ["### Original vs perturbation accuracy", ""]
    if pert:
        header = ["task", "round", "split", "n orig", "Acc orig", "n pert", "Acc pert", "Δ (pert − orig)"]
        body = []
        for r in pert:
            p = r["perturbation"]
            first = p[roles[0]]
            body.append(
                [
                    r["task"],
                    r["round"],
                    r["split"],
                    first["original"]["n"],
                    _cell(p, roles, lambda x: x["original"]["accuracy"]),
                    first["perturbation"]["n"],
                    _cell(p, roles, lambda x: x["perturbation"]["accuracy"]),
                    " / ".join(
                        signed(_diff(p[role]["perturbation"]["accuracy"], p[role]["original"]["accuracy"]))
                        for role in roles
                    ),
                ]
            )
        out += [table(header, body), ""]
    else:
        out += ["n/a: no source marks original vs perturbed entries.", ""]

    out += ["### Model-in-the-loop error rate per round", ""]
    mitl = [r for r in rows if r["model_in_the_loop"]["n"]]
    if mitl:
        body = [
            [r["task"], r["round"], r["split"], r["model_in_the_loop"]["n"], fmt(r["model_in_the_loop"]["error_rate"])]
            for r in mitl
        ]
        out += [table(["task", "round", "split", "n with MITL prediction", "MITL error rate %"], body), ""]
    else:
        out += [
            "n/a: the data records no prediction of the round's model-in-the-loop "
            "(no `model_wrong` / `model_correct` / `model_prediction`-style metadata).",
            "",
        ]

    cal = data.get("calibration") or {}
    if cal:
        out += ["### Calibration (pooled test splits)", ""]
        out += [
            table(
                ["scorer", "n", "ECE (15 bins)"],
                [[results.get(r, {}).get("name", r), cal[r]["n"], fmt(cal[r]["ece"], 4)] for r in cal],
            ),
            "",
        ]
        if "calibration" in plots:
            out += [f"![reliability diagram]({plots['calibration']})", ""]
    return out


def _diff(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else a - b


def functional_section(results: Mapping[str, Any], plots: Mapping[str, str]) -> list[str]:
    suites = results.get("functional")
    out = ["## 2. Functional suites", ""]
    if not suites:
        return [*out, "Not run (no functional suite in the data directory).", ""]
    roles = _roles(results)
    out += [_roles_note(results, roles), ""]
    for name, suite in suites.items():
        sc = suite["scorers"]
        out += [f"### {name} ({suite['n']} cases)", ""]
        out += [
            table(
                ["", "overall", "hateful", "non-hateful"],
                [
                    [
                        "accuracy %",
                        _cell(sc, roles, lambda s: s["overall"]["accuracy"]),
                        _cell(sc, roles, lambda s: s["hateful"]["accuracy"]),
                        _cell(sc, roles, lambda s: s["non_hateful"]["accuracy"]),
                    ],
                    ["n", sc[roles[0]]["overall"]["n"], sc[roles[0]]["hateful"]["n"], sc[roles[0]]["non_hateful"]["n"]],
                ],
            ),
            "",
        ]
        flagged = sc["model"]["flagged"]
        out += [
            f"Functionalities below 50 % for the model ({len(flagged)}): "
            + (", ".join(f"`{f}`" for f in flagged) if flagged else "none")
            + ".",
            "",
        ]
        per_role = {r: {f["functionality"]: f for f in sc[r]["functionalities"]} for r in roles}
        body = []
        for f in sc["model"]["functionalities"]:
            name_f = f["functionality"]
            accs = [per_role[r].get(name_f, {}).get("accuracy") for r in roles]
            flags = "⚠ " if f["below_50"] else ""
            body.append([f"{flags}`{name_f}`", f["gold"], f["n"], " / ".join(fmt(a) for a in accs)])
        out += [table(["functionality", "gold", "n", "accuracy %"], body), ""]
        if f"functional/{name}" in plots:
            out += [f"![{name} per functionality]({plots[f'functional/{name}']})", ""]
        targets = sc["model"]["targets"]
        if targets:
            per_t = {r: {t["target"]: t for t in sc[r]["targets"]} for r in roles}
            body = []
            for t in targets:
                g = t["target"]
                vals = {r: per_t[r].get(g, {}) for r in roles}
                body.append(
                    [g, t["n"], t["n_hateful"], t["n_non_hateful"]]
                    + [_cell(vals, roles, _at(k)) for k in ("accuracy", "fpr", "fnr", "selection_rate")]
                )
            out += [
                "Per target group (FPR: non-hateful cases predicted hateful; FNR: hateful cases missed; "
                "selection rate: share predicted hateful):",
                "",
                table(["target", "n", "n hateful", "n non-hateful", "Acc %", "FPR %", "FNR %", "selection %"], body),
                "",
            ]
            if f"groups/{name}" in plots:
                out += [f"![{name} error rates per group]({plots[f'groups/{name}']})", ""]
        if sc["model"].get("sets"):
            per_s = {r: {s["set"]: s for s in sc[r]["sets"] or []} for r in roles}
            body = [
                [s["set"], s["n"], " / ".join(fmt(per_s[r].get(s["set"], {}).get("accuracy")) for r in roles)]
                for s in sc["model"]["sets"]
            ]
            out += [table(["set", "n", "accuracy %"], body), ""]
        if sc["model"].get("emoji_difference"):
            out += _emoji_lines(sc, roles)
    return out


def _emoji_lines(sc: Mapping[str, Any], roles: Sequence[str]) -> list[str]:
    out = ["Emoji difference (accuracy on original emoji cases − on their no-emoji perturbations, points):", ""]
    body = []
    overall = {r: sc[r]["emoji_difference"]["overall"] for r in roles}
    rows: list[tuple[str, Mapping[str, Any]]] = [("overall", overall)]
    funcs = sc["model"]["emoji_difference"]["functionalities"]
    rows += [(f, {r: sc[r]["emoji_difference"]["functionalities"].get(f, {}) for r in roles}) for f in funcs]
    for label, per in rows:
        first = per[roles[0]]
        value = " / ".join(signed(per[r].get("value")) for r in roles)
        if first.get("value") is None:
            value = f"undefined ({first.get('reason')})"
        body.append([label, first.get("n_pairs"), first.get("n_undefined"), value])
    return [*out, table(["", "pairs", "label-flipping pairs (left out)", "difference"], body), ""]


def aaa_section(results: Mapping[str, Any], plots: Mapping[str, str]) -> list[str]:
    data = results.get("aaa")
    out = ["## 3. AAA (Adversarial Attacks against Abuse)", ""]
    if not data:
        return [*out, "Not run.", ""]
    if data.get("error"):
        return [*out, f"Not run: {data['error']}", ""]
    sources = data.get("sources") or {}
    if not sources:
        return [*out, "No source with a train and a test split.", ""]
    header = ["source", "scorer", "OFF-F1 orig", "macro-F1 orig"] + [ATTACK_TITLES[a] for a in ATTACKS]
    header += ["hashtag check (TPR, TNR: before → after, p)", "AAA"]
    body = []
    for name, res in sources.items():
        for role, r in res["scorers"].items():
            hc = r["hashtag_check"]
            check = "; ".join(
                f"{k.upper()} {fmt(hc[k]['before'], 3)} → {fmt(hc[k]['after'], 3)} (p={fmt(hc[k]['p_value'], 3)})"
                for k in ("tpr", "tnr")
            ) + (" **failed: Corr = 0**" if hc["failed"] else "")
            body.append(
                [
                    name,
                    results.get(role, {}).get("name", role),
                    fmt(r["original"]["offensive_f1"]),
                    fmt(r["original"]["macro_f1"]),
                ]
                + [fmt(r["scores"][a], 3) for a in ATTACKS]
                + [check, f"**{fmt(r['aaa'], 3)}**"]
            )
    sizes = "; ".join(
        f"{name}: " + ", ".join(f"{ATTACK_TITLES.get(a, a)} {n}" for a, n in res["n"].items())
        for name, res in sources.items()
    )
    out += [table(header, body), "", f"Attack set sizes: {sizes}.", ""]
    if data.get("not_run"):
        out += ["Not run: " + "; ".join(f"{k} ({v})" for k, v in data["not_run"].items()) + ".", ""]
    if "aaa" in plots:
        out += [f"![AAA breakdown]({plots['aaa']})", ""]
    return out


def context_section(results: Mapping[str, Any], plots: Mapping[str, str]) -> list[str]:
    data = results.get("context")
    out = ["## 4. Context sensitivity (with vs without history, BBF Table 10)", ""]
    if not data or not data.get("rows"):
        return [*out, "No dialogue source (examples with history) was evaluated.", ""]
    roles = _roles(results)
    out += [_roles_note(results, roles), ""]
    header = ["source", "split", "n", "with history"]
    keys = (("offensive_f1", "OFF-F1"), ("weighted_f1", "wF1"), ("accuracy", "Acc"))
    for _, title in keys:
        header += [f"{title} with", f"{title} without", f"Δ {title}"]
    body = []
    for row in data["rows"]:
        sc = row["scorers"]
        cells = [row["source"], row["split"], row["n"], row["n_with_history"]]
        for key, _ in keys:
            cells += [
                _cell(sc, roles, _at("with", key)),
                _cell(sc, roles, _at("without", key)),
                " / ".join(signed(sc[r]["difference"][key]) for r in roles),
            ]
        body.append(cells)
    return [*out, table(header, body), ""]


def context_flips_section(results: Mapping[str, Any]) -> list[str]:
    data = results.get("context_flips")
    out = ["## 5. Context flips (the same reply after a harmful and a harmless turn)", ""]
    if not data:
        return [*out, "Not run.", ""]
    roles = [r for r in _roles(results) if r in data["scorers"]]
    out += [
        _roles_note(results, roles),
        "",
        f"{data['pairs']} hand-written pairs (`dialogue_safety/evaluation/suites/context_flips.csv`, "
        "never trained on). "
        "**Both right**: OFFENSIVE after the harmful turn and SAFE after the harmless one, at each "
        "scorer's own threshold. A scorer that ignores the history gets at most one side of a pair right.",
        "",
    ]
    header = ["category", "pairs", "both right %", "harmful flagged %", "harmless passed %"]
    cats = sorted(data["scorers"][roles[0]]["categories"]) if roles else []
    body = []
    for cat in [*cats, "all"]:
        per_role = {
            r: data["scorers"][r]["overall"] if cat == "all" else data["scorers"][r]["categories"][cat] for r in roles
        }
        first = per_role[roles[0]] if roles else {}
        body.append(
            [
                f"**{cat}**" if cat == "all" else cat,
                first.get("pairs"),
                _cell(per_role, roles, _at("both_right_pct")),
                _cell(per_role, roles, _at("harmful_flagged_pct")),
                _cell(per_role, roles, _at("harmless_passed_pct")),
            ]
        )
    return [*out, table(header, body), ""]


def history_section(results: Mapping[str, Any]) -> list[str]:
    data = results.get("history")
    out = ["## 6. How the history moves the verdict", ""]
    if not data:
        return [*out, "Not run.", ""]
    roles = [r for r in _roles(results) if r in data["scorers"]]
    sc = data["scorers"]
    lengths = [str(n) for n in data["friendly_lengths"]]
    out += [
        _roles_note(results, roles),
        "",
        "Built from test splits only (`dialogue_safety/evaluation/history_robustness.py`), "
        "at each scorer's own threshold. "
        "**Benign-history recall**: offensive test utterances alone and after the last 1, 3 and 6 turns of a "
        "friendly chat that no training source contains; the headline is the worst drop (points). "
        f"**Hostile-history flag rate**: harmless test utterances alone and after one of {data['hostile_turns']} "
        "hateful test turns; the headline is the rise (points), and beside it the rise over the utterances that "
        'answer no turn in their source (a reply such as "yes, of course" agrees with the hateful turn before '
        "it). **Bot replies after abuse**: the distinct ConvAbuse test agents' replies (deflections, refusals, "
        "apologies; reflections of the user's words left out) after abusive and after non-abusive test user turns "
        "(the headline is the rise, points), and BAD's test bot turns labelled OK after a human turn labelled "
        "not OK, in their dialogue and alone. **Counter-speech**: civil "
        "counter-narratives after their hateful turn (flagged, lower is better), replies agreeing with hate "
        "(caught, higher is better); Reddit counter-hate is often rude itself (for information).",
        "",
    ]
    header = ["measure", *roles]
    rows = [
        [
            "benign-history recall: worst drop (points)",
            *[fmt(sc[r]["benign_history"].get("worst_drop")) for r in roles],
        ],
        ["  recall alone %", *[fmt(sc[r]["benign_history"]["pooled"].get("alone")) for r in roles]],
        *[
            [f"  recall after {n} friendly turns %", *[fmt(sc[r]["benign_history"]["pooled"].get(n)) for r in roles]]
            for n in lengths
        ],
        ["hostile-history flag rate: rise (points)", *[fmt(sc[r]["hostile_history"].get("rise")) for r in roles]],
        ["  harmless flagged alone %", *[fmt(sc[r]["hostile_history"].get("pooled", {}).get("alone")) for r in roles]],
        [
            "  harmless flagged after a hostile turn %",
            *[fmt(sc[r]["hostile_history"].get("pooled", {}).get("after")) for r in roles],
        ],
        [
            "  rise over utterances that answer no turn (points)",
            *[fmt(sc[r]["hostile_history"].get("statements", {}).get("rise")) for r in roles],
        ],
        *_bot_reply_rows(sc, roles),
        ["civil counter-speech flagged %", *[fmt(sc[r]["counter_speech"]["civil_counter"]["flagged"]) for r in roles]],
        ["endorsements of hate caught %", *[fmt(sc[r]["counter_speech"]["endorsements"]["caught"]) for r in roles]],
        [
            "Reddit counter-hate flagged % (info)",
            *[fmt(sc[r]["counter_speech"]["reddit_counter"]["flagged"]) for r in roles],
        ],
    ]
    out += [table(header, rows), ""]
    first = sc[roles[0]] if roles else None
    if first:
        body = [
            [name, v["n"], fmt(v["alone"]), *[fmt(v.get(n)) for n in lengths]]
            for name, v in first["benign_history"]["sources"].items()
        ]
        out += [
            f"Recall by source ({roles[0]}):",
            "",
            table(["source", "n", "alone %", *[f"after {n} %" for n in lengths]], body),
            "",
        ]
        body = [
            [name, v["n"], fmt(v["alone"]), fmt(v["after"])] for name, v in first["hostile_history"]["sources"].items()
        ]
        out += [
            f"Harmless utterances flagged by source ({roles[0]}):",
            "",
            table(["source", "n", "alone %", "after a hostile turn %"], body),
            "",
        ]
    return out


def _bot_reply_rows(sc: Mapping[str, Any], roles: Sequence[str]) -> list[list[str]]:
    """The history table's rows of the "bot replies after abuse" measure (none when it was not run)."""

    def at(*path: str) -> list[str]:
        return [fmt(_at("bot_replies", *path)(sc[r])) for r in roles]

    if not any(sc[r].get("bot_replies") for r in roles):
        return []
    return [
        ["bot replies after an abusive turn (ConvAbuse): rise (points)", *at("convabuse", "rise")],
        ["  bot replies flagged alone %", *at("convabuse", "alone")],
        ["  after a non-abusive user turn %", *at("convabuse", "after_harmless")],
        ["  after an abusive user turn %", *at("convabuse", "after_abusive")],
        ["  rise over replies not trained on (points)", *at("convabuse", "unseen", "rise")],
        ["  in their own conversation, after abuse %", *at("convabuse", "natural_after_abuse", "flagged")],
        [
            "BAD safe bot turns after an unsafe human turn: flagged in context %",
            *at("bad", "after_unsafe", "in_context"),
        ],
        ["  the same turns alone %", *at("bad", "after_unsafe", "alone")],
        ["  after a safe human turn, in context % (for comparison)", *at("bad", "after_safe", "in_context")],
    ]


def anchors_section(results: Mapping[str, Any]) -> list[str]:
    ours = _our_anchor_numbers(results)
    return [
        "## Anchors from the papers",
        "",
        "Published reference points, next to the closest number of this report. They are *anchors*, "
        "not like-for-like comparisons: datasets, label definitions and splits differ (notes per line).",
        "",
        "- **HateCheck** (Röttger et al., ACL 2021, Table 1): all four systems tested (BERT fine-tuned on "
        "Davidson et al. 2017 and on Founta et al. 2018, Google Jigsaw's Perspective, Two Hat's SiftNinja) "
        "show clear functional weaknesses: counter-speech (`counter_quote_nh`, `counter_ref_nh`) and "
        "reclaimed slurs are misread as hate and spelling variations let hate through, while "
        "SiftNinja misses most hateful cases. We quote no overall numbers here; see Table 1 of the "
        f"paper. Ours: {ours['hatecheck']}.",
        "- **HatemojiCheck** (Kirk et al., NAACL 2022): accuracy 0.87–0.88 for the models trained on "
        "DynaHate + HatemojiBuild rounds (R6–R8), 0.69 for Perspective. HatemojiCheck is not in the data "
        f"directory (pass it as a functional suite to compare); ours on HatemojiBuild: {ours['hatemoji']}.",
        "- **DynaHate** (Vidgen et al., ACL 2021): the R4 target model reaches macro-F1 ≈ 76 on the R4 "
        f"test set. Ours (dynahate R4 = 4a + 4b, test split): {ours['dynahate']}. The data here is a filtered "
        "subset (entries of at most 44 whitespace tokens), so this is indicative only.",
        "- **BBF** (Dinan et al., EMNLP 2019, Table 10): multi-turn OFFENSIVE-F1 66.4 with dialogue "
        f"segments vs 59.0 without context (+7.4). Ours, Δ OFF-F1 with − without history: {ours['context']}.",
        "",
    ]


def _our_anchor_numbers(results: Mapping[str, Any]) -> dict[str, str]:
    roles = _roles(results)
    names = {r: results.get(r, {}).get("name", r) for r in roles}
    out = {k: "not evaluated" for k in ("hatecheck", "hatemoji", "dynahate", "context")}
    hc = (results.get("functional") or {}).get("hatecheck")
    if hc:
        out["hatecheck"] = ", ".join(
            f"{names[r]} overall accuracy {fmt(hc['scorers'][r]['overall']['accuracy'])} %" for r in roles
        )
    rows = (results.get("rounds") or {}).get("rows") or []
    for row in rows:
        if row["source"] == "hatemoji" and row["split"] == "test" and row["round"] == ALL_ROUNDS:
            out["hatemoji"] = ", ".join(
                f"{names[r]} test accuracy {fmt(row['metrics'][r]['accuracy'] / 100, 2)}" for r in roles
            )
        if row["source"] == "dynahate" and row["split"] == "test" and row["round"] in ("4", "R4"):
            out["dynahate"] = ", ".join(f"{names[r]} macro-F1 {fmt(row['metrics'][r]['macro_f1'])}" for r in roles)
    ctx = (results.get("context") or {}).get("rows") or []
    if ctx:
        out["context"] = "; ".join(
            f"{row['source']} {row['split']}: "
            + ", ".join(f"{names[r]} {signed(row['scorers'][r]['difference']['offensive_f1'])}" for r in roles)
            for row in ctx
        )
    return out


def long_messages_section(results: Mapping[str, Any]) -> list[str]:
    from dialogue_safety.evaluation.long_messages import markdown

    data = results.get("long_messages")
    out = ["## 7. Long messages (an offensive utterance inside a long harmless text)", ""]
    if not data or not data.get("scorers"):
        return [*out, "Not run (no offensive and harmless test utterances of its sources).", ""]
    return [*out, markdown(data), ""]


def obfuscation_section(results: Mapping[str, Any]) -> list[str]:
    from dialogue_safety.evaluation.obfuscation import markdown

    data = results.get("obfuscation")
    out = ["## 8. Obfuscation (offensive and harmless utterances with disguised words)", ""]
    if not data or not data.get("scorers"):
        return [*out, "Not run (no offensive test utterances of its sources).", ""]
    return [*out, markdown(data), ""]


def targets_table(results: Mapping[str, Any], rows: Sequence[Sequence[str]] | None = None) -> str:
    """The targets table (``evaluation.targets``; ``rows`` when already computed), the model's and the previous
    model's names in the header."""
    from dialogue_safety.evaluation.targets import target_rows

    name = results["model"].get("name", "model")
    previous = (results.get("previous") or {}).get("name", "previous")
    header = ["measure (test splits, through the runtime)", "target", name, previous, "met"]
    return table(header, target_rows(results) if rows is None else rows)


def targets_section(results: Mapping[str, Any]) -> list[str]:
    from dialogue_safety.evaluation.targets import target_rows

    rows = target_rows(results)
    if not rows:
        return []
    note = (
        "The project's targets, from the tables below (the **previous** model beside the model when it ran). "
        "docs/model.md quotes this table."
    )
    return ["## Targets", "", note, "", targets_table(results, rows), ""]


def render_report(results: Mapping[str, Any], plots: Mapping[str, str]) -> str:
    """The markdown page; ``plots`` maps plot keys to file names next to report.md."""
    lines = header_section(results, plots)
    lines += targets_section(results)
    suites = _config_suites(results)
    if "rounds" in suites:
        lines += rounds_section(results, plots)
    if "functional" in suites:
        lines += functional_section(results, plots)
    if "aaa" in suites:
        lines += aaa_section(results, plots)
    if "context" in suites:
        lines += context_section(results, plots)
    if "context_flips" in suites:
        lines += context_flips_section(results)
    if "history" in suites:
        lines += history_section(results)
    if "long_messages" in suites:
        lines += long_messages_section(results)
    if "obfuscation" in suites:
        lines += obfuscation_section(results)
    lines += anchors_section(results)
    lines += [
        "---",
        "Regenerate: `dialogue-safety evaluate "
        f"{results['model'].get('path', 'MODEL')} --data-dir {results.get('data_dir')} "
        f"--suite {','.join(suites)} --seed {results.get('config', {}).get('seed')}"
        + (f" --limit {results['config']['limit']}" if results.get("config", {}).get("limit") else "")
        + "`. Every number is in results.json.",
        "",
    ]
    return "\n".join(lines)
