"""PNG plots of an evaluation's results (matplotlib, Agg backend; no display needed).

* ``functional_<suite>.png``: per-functionality accuracy (horizontal bars, below 50 % in red);
* ``groups_<suite>.png``: per-target-group false positive / false negative rates;
* ``calibration.png``: reliability diagram of the pooled test splits;
* ``aaa.png``: the four AAA attack scores and AAA per source;
* ``training_curve.png``: the model's validation checks during training (its card's curve) and the loss.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402

from dialogue_safety.evaluation.aaa import ATTACK_TITLES, ATTACKS  # noqa: E402

ROLE_COLOURS = {"model": "#1f77b4", "previous": "#ff7f0e", "baseline": "#9e9e9e", "peer": "#8c564b"}
ROLE_BELOW = {"model": "#d62728", "previous": "#ffbb78", "baseline": "#f4a6a6", "peer": "#e7b9a5"}
FPR_COLOUR, FNR_COLOUR = "#ff7f0e", "#6a3d9a"
DPI = 110


def _label(results: Mapping[str, Any], role: str) -> str:
    return str(results.get(role, {}).get("name") or role)


def _save(fig: Figure, path: Path) -> str:
    fig.savefig(path, dpi=DPI, bbox_inches="tight")
    plt.close(fig)
    return path.name


def functional_plot(results: Mapping[str, Any], suite: str, path: Path) -> str:
    scorers = results["functional"][suite]["scorers"]
    roles = list(scorers)
    funcs = [f["functionality"] for f in scorers[roles[0]]["functionalities"]]
    height = 0.8 / len(roles)
    fig, ax = plt.subplots(figsize=(8, 1.2 + 0.28 * len(funcs) * max(1, len(roles) * 0.7)))
    y = np.arange(len(funcs))
    for k, role in enumerate(roles):
        acc = {f["functionality"]: f["accuracy"] or 0.0 for f in scorers[role]["functionalities"]}
        values = [acc.get(f, 0.0) for f in funcs]
        colours = [ROLE_BELOW[role] if v < 50 else ROLE_COLOURS[role] for v in values]
        ys = y + (k - (len(roles) - 1) / 2) * height
        ax.barh(ys, values, height=height, color=colours)
        for yy, v in zip(ys, values, strict=True):
            below = v < 50
            ax.text(
                v + 1 if v < 88 else v - 1,
                yy,
                f"{v:.0f}",
                va="center",
                ha="left" if v < 88 else "right",
                fontsize=6.5,
                color=ROLE_BELOW["model"] if below else ("white" if v >= 88 else "black"),
            )
    ax.axvline(50, color="black", linestyle="--", linewidth=0.8)
    ax.set_yticks(y, funcs, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlim(0, 100)
    ax.set_xlabel("accuracy (%)")
    ax.set_title(f"{suite}: accuracy per functionality (n={results['functional'][suite]['n']})")
    handles = [Patch(color=ROLE_COLOURS[r], label=_label(results, r)) for r in roles]
    handles += [
        Patch(color=ROLE_BELOW[r], label="below 50%" if len(roles) == 1 else f"below 50% ({_label(results, r)})")
        for r in roles
    ]
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)
    ax.grid(axis="x", alpha=0.3)
    return _save(fig, path)


def groups_plot(results: Mapping[str, Any], suite: str, path: Path) -> str | None:
    scorers = results["functional"][suite]["scorers"]
    roles = list(scorers)
    groups = [g["target"] for g in scorers[roles[0]]["targets"]]
    if not groups:
        return None
    fig, axes = plt.subplots(
        1, len(roles), figsize=(5 * len(roles), 0.9 + 0.38 * len(groups)), squeeze=False, sharey=True
    )
    y = np.arange(len(groups))
    for ax, role in zip(axes[0], roles, strict=True):
        stats = {g["target"]: g for g in scorers[role]["targets"]}
        fpr = [stats[g]["fpr"] or 0.0 for g in groups]
        fnr = [stats[g]["fnr"] or 0.0 for g in groups]
        ax.barh(y - 0.2, fpr, height=0.4, color=FPR_COLOUR, label="false positive rate")
        ax.barh(y + 0.2, fnr, height=0.4, color=FNR_COLOUR, label="false negative rate")
        ax.set_xlim(0, 100)
        ax.set_xlabel("%")
        ax.set_title(_label(results, role), fontsize=10)
        ax.grid(axis="x", alpha=0.3)
    axes[0][0].set_yticks(y, groups, fontsize=9)
    axes[0][0].invert_yaxis()
    axes[0][-1].legend(loc="lower right", fontsize=8)
    fig.suptitle(f"{suite}: error rates per target group")
    return _save(fig, path)


def calibration_plot(results: Mapping[str, Any], path: Path) -> str | None:
    calibration = (results.get("rounds") or {}).get("calibration") or {}
    if not calibration:
        return None
    fig, (ax, hist) = plt.subplots(2, 1, figsize=(5.5, 6.5), gridspec_kw={"height_ratios": [3, 1]}, sharex=True)
    ax.plot([0, 1], [0, 1], color="black", linestyle="--", linewidth=0.8, label="perfect calibration")
    width = 1.0 / max(len(next(iter(calibration.values()))["bins"]), 1)
    for k, (role, cal) in enumerate(calibration.items()):
        bins = [b for b in cal["bins"] if b["count"]]
        xs = [b["mean_prob"] for b in bins]
        ys = [b["positive_rate"] for b in bins]
        colour = ROLE_COLOURS.get(role)
        ax.plot(xs, ys, marker="o", color=colour, label=f"{_label(results, role)} (ECE {cal['ece']:.3f})")
        centres = [(b["lo"] + b["hi"]) / 2 for b in cal["bins"]]
        counts = [b["count"] for b in cal["bins"]]
        offset = (k - (len(calibration) - 1) / 2) * width / len(calibration)
        hist.bar(np.array(centres) + offset, counts, width=width / len(calibration), color=colour)
    ax.set_ylabel("observed OFFENSIVE rate")
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1)
    ax.set_title(f"Reliability diagram (pooled test splits, n={next(iter(calibration.values()))['n']})")
    ax.legend(loc="upper left", fontsize=8)
    ax.grid(alpha=0.3)
    hist.set_xlabel("predicted probability of OFFENSIVE")
    hist.set_ylabel("examples")
    hist.grid(alpha=0.3)
    return _save(fig, path)


def aaa_plot(results: Mapping[str, Any], path: Path) -> str | None:
    sources = (results.get("aaa") or {}).get("sources") or {}
    if not sources:
        return None
    names = list(sources)
    cats = [*ATTACKS, "aaa"]
    titles = [ATTACK_TITLES[a] for a in ATTACKS] + ["AAA"]
    fig, axes = plt.subplots(1, len(names), figsize=(4.2 * len(names), 3.6), squeeze=False, sharey=True)
    for ax, name in zip(axes[0], names, strict=True):
        roles = list(sources[name]["scorers"])
        width = 0.8 / len(roles)
        x = np.arange(len(cats))
        for k, role in enumerate(roles):
            res = sources[name]["scorers"][role]
            values = [res["scores"][a] for a in ATTACKS] + [res["aaa"]]
            xs = x + (k - (len(roles) - 1) / 2) * width
            heights = [v if v is not None else 0.0 for v in values]
            ax.bar(xs, heights, width=width, color=ROLE_COLOURS.get(role), label=_label(results, role))
            for xx, v in zip(xs, values, strict=True):
                ax.text(xx, (v or 0.0) + 0.01, "n/a" if v is None else f"{v:.2f}", ha="center", fontsize=6.5)
            if res["hashtag_check"]["failed"]:
                ax.text(
                    x[2] + 0.5,
                    0.9,
                    f"{_label(results, role)}:\nhashtag check failed,\nCorr set to 0",
                    ha="center",
                    fontsize=7,
                    color=ROLE_BELOW["model"],
                )
        ax.set_xticks(x, titles, rotation=30, ha="right", fontsize=8)
        ax.set_ylim(0, 1.05)
        ax.set_title(f"{name} (n test={sources[name]['n_test']})", fontsize=10)
        ax.grid(axis="y", alpha=0.3)
    axes[0][0].set_ylabel("share correct / AAA")
    axes[0][0].legend(fontsize=8, loc="upper left")
    fig.suptitle("AAA breakdown")
    return _save(fig, path)


#: tasks drawn in the training-curve plot when the run validated them (the rest are in the card's table)
CURVE_TASKS = (
    "bad_fsb/bot",
    "bad_fsb/human",
    "toxicchat",
    "requests",
    "safetext",
    "context_pairs",
    "olid",
    "diasafety",
)


def training_curve_plot(results: Mapping[str, Any], path: Path) -> str | None:
    curve = results.get("model", {}).get("training_curve")
    if not curve or not curve.get("valid"):
        return None
    checks = curve["valid"]
    steps = [c["step"] for c in checks]
    fig, (ax, lx) = plt.subplots(1, 2, figsize=(11, 4), gridspec_kw={"width_ratios": [3, 2]})
    ax.plot(steps, [c["macro_f1"] for c in checks], color="black", linewidth=2.2, marker="o", label="macro (valid)")
    for task in CURVE_TASKS:
        values = [c["offensive_f1"].get(task) for c in checks]
        if any(v is not None for v in values):
            ax.plot(steps, [np.nan if v is None else v for v in values], marker=".", linewidth=1, label=task)
    ax.set_xlabel("step")
    ax.set_ylabel("OFFENSIVE-F1 on the valid split (%)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="lower right", ncol=2)
    loss = curve.get("loss") or []
    if loss:
        lx.plot([s for s, _ in loss], [v for _, v in loss], color="#555555")
    lx.set_xlabel("step")
    lx.set_ylabel("training loss")
    lx.grid(alpha=0.3)
    fig.suptitle(f"Training curve of {_label(results, 'model')}")
    return _save(fig, path)


def write_plots(results: Mapping[str, Any], out_dir: Path) -> dict[str, str]:
    """Write every plot the results allow; returns plot key → file name (relative to ``out_dir``)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    plots: dict[str, str | None] = {}
    for suite in results.get("functional") or {}:
        plots[f"functional/{suite}"] = functional_plot(results, suite, out_dir / f"functional_{suite}.png")
        plots[f"groups/{suite}"] = groups_plot(results, suite, out_dir / f"groups_{suite}.png")
    plots["calibration"] = calibration_plot(results, out_dir / "calibration.png")
    plots["aaa"] = aaa_plot(results, out_dir / "aaa.png")
    plots["training_curve"] = training_curve_plot(results, out_dir / "training_curve.png")
    return {k: v for k, v in plots.items() if v is not None}
