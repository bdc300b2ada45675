"""Research int8 presets: recipes measured in the lab, never candidates of ``dialogue-safety export``.

Each is a recipe for :func:`dialogue_safety.core.variants.derive` (or a card's ``export.recipes["int8"]``),
built from the product's presets (:data:`dialogue_safety.core.variants.INT8_PRESETS`) so that a change to those
carries over. :data:`INT8_PRESETS` is the product's presets and these together, for the lab's tools.
"""

from __future__ import annotations

from typing import Any

from dialogue_safety.core.variants import ATTENTION_SCORES, FFN_DOWN, FFN_UP
from dialogue_safety.core.variants import INT8_PRESETS as PRODUCT_PRESETS

_ALL = PRODUCT_PRESETS["all"]
_STATIC = PRODUCT_PRESETS["static"]
_DYNAMIC = PRODUCT_PRESETS["dynamic"]

RESEARCH_INT8_PRESETS: dict[str, dict[str, Any]] = {
    # 8-bit weights: closer to fp32 (0.3.0: no test split loses more than 0.07 F1 points, where the
    # 7-bit "all" preset loses 1.6 on ConvAbuse), but only exact on CPUs with VNNI (AVX512-VNNI or
    # AVX-VNNI): without it, u8*s8 products can saturate. The runtime falls back to the optimized
    # fp32 graph on x86 CPUs without VNNI (dialogue_safety.core.runtime.int8_supported).
    "vnni": {**_ALL, "reduce_range": False},
    # only the attention projections: moves fewer decisions (0.1-2 %) for a ~1.2x speed-up
    "attention": {**_ALL, "exclude_patterns": [FFN_UP, FFN_DOWN]},  # the feed-forward blocks stay fp32
    # "static" with the 8 widest input channels of each feed-forward layer (from the calibration rows) computed
    # apart in fp32 (graphs.split_outlier_channels): their 14-30 ranges no longer set the fixed activation
    # scales. 0.4.0 on validation: score error p99 0.09 -> 0.03-0.05, max 0.27 -> 0.075; ~1.2x slower than
    # "static". The product's "static-split-lean" is its cheaper form.
    "static-split": {**_STATIC, "outlier_channels": 8, "outlier_patterns": [FFN_UP, FFN_DOWN]},
    "static-percentile": {**_STATIC, "calibrate_method": "Percentile", "percentile": 99.999},
    "static-entropy": {**_STATIC, "calibrate_method": "Entropy"},
    # the most sensitive inputs (measured: lab/notes/runtime.md): the GELU outputs that feed the
    # feed-forward down-projections; kept fp32 (the down-projections then run in fp32)
    "static-percentile-ffn-down-fp32": {
        **_STATIC,
        "calibrate_method": "Percentile",
        "percentile": 99.999,
        "exclude_patterns": [ATTENTION_SCORES, FFN_DOWN],
    },
    # "dynamic" with the 8 widest input channels of each feed-forward layer (calibration.npz) computed
    # apart in fp32 (graphs.split_outlier_channels): 0.4.0's FFN inputs have one or two channels reaching
    # 14-30 where the rest stay under 7, which set the per-tensor activation scale. Halves the score error
    # (p99 0.09 -> 0.04), ~1.2x slower than "dynamic".
    "dynamic-split": {**_DYNAMIC, "outlier_channels": 8, "outlier_patterns": [FFN_UP, FFN_DOWN]},
}

#: the product's presets and the research ones, by name (the names do not overlap: tests/test_quantization.py)
INT8_PRESETS: dict[str, dict[str, Any]] = {**PRODUCT_PRESETS, **RESEARCH_INT8_PRESETS}
