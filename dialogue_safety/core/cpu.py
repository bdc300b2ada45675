"""The CPU this process runs on, as the runtime's choices need it: its flags and its family.

The one place that reads ``/proc/cpuinfo``. Two facts depend on it:

* whether 8-bit int8 weights compute here what the export validated (:func:`cpu_has_vnni`: x86 without
  VNNI adds u8*s8 products in saturating 16-bit pairs; ``dialogue_safety.core.runtime.int8_supported``);
* which variant is the CPU default (:func:`cpu_family`): the model card records the variants that pass
  the decision gate and, per family, figures measured on such a CPU
  (:attr:`dialogue_safety.core.model_card.ModelCard.cpu_speed`); the runtime serves the fastest.

The families are the instruction sets this project's machines have: :data:`AVX512_VNNI` (AVX-512 with VNNI:
Intel Cascade Lake and later, AMD Zen 4 and later) and :data:`AVX2` (AVX2 without AVX-512 and without
VNNI: e.g. AMD Zen 3). Any other CPU (AVX-512 without VNNI, AVX-VNNI without AVX-512, ARM) has no family
here: nothing is measured for it.
"""

from __future__ import annotations

from pathlib import Path

CPUINFO = Path("/proc/cpuinfo")
VNNI_FLAGS = frozenset({"avx512_vnni", "avx_vnni"})
AVX512_VNNI = "avx512_vnni"
AVX2 = "avx2"
#: the CPU families figures are recorded for, in the order the docs name them
CPU_FAMILIES: tuple[str, ...] = (AVX2, AVX512_VNNI)


def cpu_flags(cpuinfo: str | None = None) -> frozenset[str] | None:
    """The first processor's ``flags`` (None when /proc/cpuinfo cannot be read or lists none: not x86)."""
    if cpuinfo is None:
        try:
            cpuinfo = CPUINFO.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return None
    line = next((line for line in cpuinfo.splitlines() if line.startswith("flags")), None)
    return None if line is None else frozenset(line.split(":", 1)[1].split())  # ARM lists "Features"


def cpu_has_vnni(cpuinfo: str | None = None) -> bool | None:
    """Whether an x86 CPU reports VNNI (None when /proc/cpuinfo cannot be read or is not x86)."""
    flags = cpu_flags(cpuinfo)
    return None if flags is None else bool(VNNI_FLAGS & flags)


def cpu_family(cpuinfo: str | None = None) -> str | None:
    """:data:`AVX512_VNNI`, :data:`AVX2` or None (another CPU, or none could be read)."""
    flags = cpu_flags(cpuinfo)
    if flags is None:
        return None
    if {"avx512f", "avx512_vnni"} <= flags:
        return AVX512_VNNI
    if "avx2" in flags and "avx512f" not in flags and not VNNI_FLAGS & flags:
        return AVX2
    return None
