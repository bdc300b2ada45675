"""Dataset loaders: one module per official format, each yielding ``LabelledExample``.

Use :mod:`dialogue_safety.sources.registry` (``available_sources``, ``load_source``, ``load_sources``)
rather than the per-format modules unless you need one file read directly.
"""
