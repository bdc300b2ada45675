"""What the written training sources (requests, threats) must never contain: the probes of
``tests/test_model_probes.py`` and the texts of the context-flip suite, compared after the same normalisation."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from dialogue_safety.evaluation.context_flips import load_pairs

PROBES = Path(__file__).with_name("test_model_probes.py")


def norm(text: str) -> str:
    return re.sub(r"[^a-z0-9 ]+", "", text.lower()).strip()


def probe_texts() -> set[str]:
    """Every short string constant of the probes module, normalised."""
    constants = [n.value for n in ast.walk(ast.parse(PROBES.read_text())) if isinstance(n, ast.Constant)]
    return {norm(c) for c in constants if isinstance(c, str) and len(c) < 120}


def flip_texts() -> set[str]:
    return {norm(t) for p in load_pairs() for t in (p.harmful_context, p.harmless_context, p.reply)}
