"""The export's defaults, torch-free: ``dialogue-safety export --help`` and its argument checks
need them before torch is imported (``dialogue_safety.export.onnx_export`` imports them from here)."""

from __future__ import annotations

DEFAULT_OPSET = 17  # LayerNormalization is native from 17; every onnxruntime >= 1.15 runs it
DEFAULT_TOLERANCE = 1e-4
DEFAULT_VARIANTS: tuple[str, ...] = ("fp32", "optimized", "int8", "fp16")
