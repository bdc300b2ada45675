"""``python -m lab.bench <benchmark> ...``: see :mod:`lab.bench.cli`."""

from lab.bench.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
