"""``python -m service.variants``: see :mod:`service.variants.cli`."""

from service.variants.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
