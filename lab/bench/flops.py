"""FLOPs of a BERT classifier forward pass and the CPU's peak, for "fraction of peak" figures.

FLOPs per token (forward, one multiply-add = 2 FLOPs)::

    2 × non-embedding parameters  +  4 · L · d · seq
    (every weight once per token)    (QKᵀ and attention × V: 2·seq·d each, per layer)

Embedding lookups, softmax, LayerNorm and GELU are ignored (a few % at these sizes). Only real
tokens count (padding is wasted work, not useful FLOPs), with ``seq`` = the example's own length.

Peak fp32 FLOP/s = cores × clock × FLOP/cycle/core. FLOP/cycle: AVX2+FMA = 2 FMA units × 8
lanes × 2 = 32 (the figure the project quotes for its 2-core Zen machine); cores with native
512-bit FMA (AMD Zen 5, Intel server parts with AVX-512) do 64; Zen 4 runs AVX-512 on 256-bit
units (32). The clock is the nominal one from ``/proc/cpuinfo`` (turbo is not counted).
"""

from __future__ import annotations

import platform
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

AVX2_FMA_FLOP_PER_CYCLE = 32
AVX2_KEY = "peak_gflops_avx2_fma"
ISA_KEY = "peak_gflops_isa"


def non_embedding_parameters(geometry: Mapping[str, int]) -> int:
    """Encoder layers + pooler + classifier weights of a BERT classifier."""
    d = int(geometry["hidden_size"])
    ff = int(geometry.get("intermediate_size", 4 * d))
    layers = int(geometry["num_hidden_layers"])
    labels = int(geometry.get("num_labels", 1))
    per_layer = (4 * d * d + 4 * d) + (2 * d * ff + ff + d) + 4 * d  # attention, FFN, two LayerNorms
    return layers * per_layer + (d * d + d) + (d * labels + labels)


def flops_per_token(geometry: Mapping[str, int], seq_len: int) -> float:
    d = int(geometry["hidden_size"])
    layers = int(geometry["num_hidden_layers"])
    return 2.0 * non_embedding_parameters(geometry) + 4.0 * layers * d * seq_len


def sequence_flops(geometry: Mapping[str, int], lengths: Sequence[int]) -> float:
    """Useful FLOPs of a forward pass over examples of these (unpadded) lengths."""
    return float(sum(n * flops_per_token(geometry, n) for n in lengths))


def _cpuinfo() -> str:
    try:
        return Path("/proc/cpuinfo").read_text()
    except OSError:
        return ""


def cpu_peak(cores: int) -> dict[str, Any]:
    """Peak fp32 FLOP/s of ``cores`` cores, with the clock, the ISA and where they came from."""
    info = _cpuinfo()
    mhz = [float(m) for m in re.findall(r"^cpu MHz\s*:\s*([\d.]+)", info, re.M)]
    flags_line = re.search(r"^flags\s*:\s*(.*)$", info, re.M)
    flags = set(flags_line.group(1).split()) if flags_line else set()
    vendor = (re.search(r"^vendor_id\s*:\s*(\S+)", info, re.M) or [None, ""])[1]
    family_match = re.search(r"^cpu family\s*:\s*(\d+)", info, re.M)
    family = int(family_match.group(1)) if family_match else 0
    model_name = (re.search(r"^model name\s*:\s*(.*)$", info, re.M) or [None, platform.processor()])[1]
    clock_ghz = max(mhz) / 1000.0 if mhz else None
    avx2_fma = {"avx2", "fma"} <= flags
    avx512 = "avx512f" in flags
    if avx512 and not (vendor == "AuthenticAMD" and family < 26):  # Zen 4 (family 25) double-pumps
        isa, isa_flop = "AVX-512 (2 x 512-bit FMA)", 64
    elif avx2_fma or avx512:
        isa, isa_flop = "AVX2+FMA (2 x 256-bit FMA)", 32
    else:
        isa, isa_flop = "unknown (no AVX2+FMA flags)", 16
    out: dict[str, Any] = {
        "cpu": str(model_name).strip(),
        "cpu_family": family,
        "cores": cores,
        "clock_ghz": round(clock_ghz, 3) if clock_ghz else None,
        "clock_source": "/proc/cpuinfo 'cpu MHz' (nominal; turbo not counted)" if mhz else "unknown",
        "flags": {k: k in flags for k in ("avx2", "fma", "avx512f", "avx512_vnni", "avx_vnni", "avx512_bf16")},
        "flop_per_cycle_avx2_fma": AVX2_FMA_FLOP_PER_CYCLE,
        "peak_gflops_avx2_fma": round(cores * clock_ghz * AVX2_FMA_FLOP_PER_CYCLE, 1) if clock_ghz else None,
        "isa": isa,
        "flop_per_cycle_isa": isa_flop,
        "peak_gflops_isa": round(cores * clock_ghz * isa_flop, 1) if clock_ghz else None,
    }
    return out


def fraction_of_peak(flops_per_s: float, peak: Mapping[str, Any], key: str = ISA_KEY) -> float | None:
    """Achieved / peak, against the detected ISA's peak (``ISA_KEY``) or AVX2+FMA's (``AVX2_KEY``)."""
    gflops = peak.get(key)
    return round(flops_per_s / (gflops * 1e9), 4) if gflops else None
