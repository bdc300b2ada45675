"""``python -m lab.bench language``: the language check's cost and accuracy on short texts.

English: the test utterances of OLID and ConvAbuse (what the model is for; short: a false "not
English" here is a wrong warning). Not English: the French and Italian originals of CONAN (hate
speech and counter-narratives, neither paraphrases nor translations), whole and cut to their
first 5 words. For each confidence the check could require (:data:`dialogue_safety.core.language.MIN_CONFIDENCE`
is the one in force), the share of each set said to be "not English"; and the time per text at
100 to 4,000 characters. Prints the JSON report and a markdown table; ``--json PATH`` also writes it.
"""

from __future__ import annotations

import argparse
import csv
import gzip
import io
import random
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from lab.bench.emit import emit_report

CONFIDENCES: tuple[float, ...] = (0.5, 0.8, 0.9, 0.95)
LENGTHS: tuple[int, ...] = (100, 600, 1000, 4000)
FOREIGN = ("FR", "IT")


def english_texts(data_dir: Path) -> list[str]:
    from dialogue_safety.core.schema import Split
    from dialogue_safety.sources.registry import load_source

    return [
        e.utterance
        for name in ("olid", "convabuse")
        for e in load_source(name, data_dir, splits=[Split.TEST])
        if e.utterance.strip()
    ]


def foreign_texts(data_dir: Path, n: int, seed: int = 0) -> list[tuple[str, str]]:
    """(text, ISO 639-1 code) of CONAN's French and Italian originals, a seeded sample of ``n``."""
    path = data_dir / "conan" / "CONAN.csv.gz"
    with gzip.open(path) as raw:
        rows = list(csv.DictReader(io.TextIOWrapper(raw, encoding="utf-8")))
    found: dict[str, str] = {}
    for r in rows:
        cid = r["cn_id"]
        if cid[:2] in FOREIGN and not cid.endswith(("P1", "P2", "T1")):
            for text in (r["hateSpeech"], r["counterSpeech"]):
                found.setdefault(text, cid[:2].lower())
    pairs = sorted(found.items())
    random.Random(seed).shuffle(pairs)
    return pairs[:n]


def run(data_dir: Path, n_foreign: int) -> dict[str, Any]:
    from dialogue_safety.core import language

    language.load()
    classify = language.top_guess
    english = english_texts(data_dir)
    foreign = foreign_texts(data_dir, n_foreign)
    short = [(" ".join(t.split()[:5]), code) for t, code in foreign]
    sets = {"english": [(t, "en") for t in english], "foreign": foreign, "foreign_5_words": short}
    guesses = {name: [classify(t) for t, _ in texts] for name, texts in sets.items()}
    rates = []
    for c in CONFIDENCES:
        row: dict[str, Any] = {"min_confidence": c, "in_force": c == language.MIN_CONFIDENCE}
        for name, got in guesses.items():
            row[f"{name}_not_english"] = sum(code != "en" and p >= c for code, p in got) / len(got)
        rates.append(row)
    top_right = {
        name: sum(code == want for (code, _), (_, want) in zip(got, sets[name], strict=True)) / len(got)
        for name, got in guesses.items()
    }
    prose = " ".join(english)
    timings = []
    for n in LENGTHS:
        text = prose[:n]
        start = time.perf_counter()
        for _ in range(50):
            language.detect(text)
        timings.append({"chars": n, "us_per_text": round((time.perf_counter() - start) / 50 * 1e6, 1)})
    return {
        "benchmark": "language",
        "detector": "py3langid",
        "sample_chars": language.SAMPLE_CHARS,
        "n": {name: len(texts) for name, texts in sets.items()},
        "top_language_right": top_right,
        "not_english_by_confidence": rates,
        "timings": timings,
    }


def markdown(report: dict[str, Any]) -> str:
    n = report["n"]
    lines = [
        f"### Language check ({report['detector']}, first {report['sample_chars']} characters)",
        "",
        f"Said 'not English' (top language other than English at this confidence at least): {n['english']} English "
        f"test utterances (OLID, ConvAbuse), {n['foreign']} French/Italian CONAN originals, the same cut to 5 words.",
        "",
        "| min confidence | English | French/Italian | French/Italian, 5 words |",
        "|---|---|---|---|",
    ]
    for r in report["not_english_by_confidence"]:
        mark = " (in force)" if r["in_force"] else ""
        lines.append(
            f"| {r['min_confidence']}{mark} | {r['english_not_english']:.2%} | {r['foreign_not_english']:.1%} | "
            f"{r['foreign_5_words_not_english']:.1%} |"
        )
    top = report["top_language_right"]
    lines += [
        "",
        f"Top language right, before any confidence rule: English {top['english']:.1%}, French/Italian "
        f"{top['foreign']:.1%}, 5 words {top['foreign_5_words']:.1%}.",
        "",
        "| characters | µs per text |",
        "|---|---|",
        *[f"| {t['chars']} | {t['us_per_text']} |" for t in report["timings"]],
    ]
    return "\n".join(lines)


def build_parser(prog: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog, description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--data-dir", default=None, help="datasets (default: $DIALOGUE_SAFETY_DATA_DIR or ../shared/data)")
    p.add_argument("--foreign", type=int, default=400, help="French/Italian texts (default: %(default)s)")
    p.add_argument("--json", type=Path, default=None, help="also write the JSON report here")
    return p


def main(argv: Sequence[str] | None = None, prog: str = "python -m lab.bench language") -> int:
    from dialogue_safety.sources.data_dir import resolve_data_dir

    args = build_parser(prog).parse_args(argv)
    report = run(Path(resolve_data_dir(args.data_dir)), args.foreign)
    emit_report(report, markdown(report), args.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
