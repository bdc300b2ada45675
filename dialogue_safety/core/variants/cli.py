"""``python -m dialogue_safety.core.variants MODEL_DIR [VARIANT ...]``: derive variants ahead of time
(the Docker build)."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

from dialogue_safety.core.model_card import ModelCard
from dialogue_safety.core.runtime import cpu_defaults
from dialogue_safety.core.variants import VariantError, derive_all, prune


def main(argv: list[str] | None = None) -> int:
    """``python -m dialogue_safety.core.variants MODEL_DIR [VARIANT ...]``: derive variants ahead of time
    (Docker build)."""
    import argparse

    p = argparse.ArgumentParser(prog="python -m dialogue_safety.core.variants", description=main.__doc__)
    p.add_argument("model_dir", type=Path)
    p.add_argument(
        "variants",
        nargs="*",
        default=["fp32", "optimized", "int8"],
        help="variant names, or cpu / gpu for the model card's default on that device (cpu: every variant the "
        "runtime may pick, on any CPU family; default: the CPU variants); "
        "int8 with the card's fp32 check brings fp32 along",
    )
    p.add_argument(
        "--prune",
        action="store_true",
        help="then remove every other derived file (intermediates too): an image ships one",
    )
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    try:
        card = ModelCard.load(args.model_dir)
        defaults = {"cpu": cpu_defaults(card), "gpu": [card.gpu_variant]}
        wanted = [v for name in args.variants for v in defaults.get(name, [name])]
        names = list(dict.fromkeys(v for name in wanted for v in card.serving_variants(name)))
        derived = derive_all(args.model_dir, names, card)
        for name, path in derived.items():
            print(f"{name}: {path} ({path.stat().st_size / 1e6:.1f} MB)")
        if args.prune:
            for path in prune(args.model_dir, derived, card):
                print(f"removed {path}")
    except (VariantError, FileNotFoundError, ValueError) as exc:
        print(f"python -m dialogue_safety.core.variants: {exc}", file=sys.stderr)
        return 2
    return 0
