"""``python -m dialogue_safety.core.variants``: see :mod:`dialogue_safety.core.variants.cli`."""

from dialogue_safety.core.variants.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
