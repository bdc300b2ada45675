"""Print the digest of pyproject.toml's dependency tables: what constraints/*.txt were resolved from.

scripts/lock.sh writes it into every lock's header; tests/test_locks.py recomputes it, so a changed
dependency without new locks fails the tests. Comments and formatting do not count, only the requirements.
"""

import hashlib
import json
import sys
import tomllib
from pathlib import Path


def dependency_digest(pyproject: Path) -> str:
    project = tomllib.loads(pyproject.read_text(encoding="utf-8"))["project"]
    tables = {"dependencies": project.get("dependencies", []), "extras": project.get("optional-dependencies", {})}
    return hashlib.sha256(json.dumps(tables, sort_keys=True).encode()).hexdigest()[:16]


if __name__ == "__main__":
    root = Path(__file__).resolve().parent.parent
    print(dependency_digest(Path(sys.argv[1]) if len(sys.argv) > 1 else root / "pyproject.toml"))
