"""Checkpoint → ONNX model directory: optimum export, torch parity check, variants, model card.

The public entry point is :func:`dialogue_safety.export.onnx_export.export_checkpoint` (and the
``dialogue-safety export`` command in :mod:`dialogue_safety.export.cli`); variant quality against fp32 is
:func:`dialogue_safety.export.comparison.compare_variants`. This package imports torch; the service never
imports it.
"""
