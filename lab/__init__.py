"""The lab: benchmarks, experiments, research int8 presets and dated notes. Repository only, never installed.

The product (``dialogue_safety``) is configured; the lab measures it and recommends settings. The lab
imports the product; the product never imports the lab (tests/test_import_layers.py).
"""
