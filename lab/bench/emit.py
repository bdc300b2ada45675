"""How a benchmark hands over its results: the JSON report and a markdown table on stdout, the JSON in a file."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def emit_report(report: dict[str, Any], table: str, json_path: Path | None) -> None:
    """Print a benchmark's JSON and markdown; also write the JSON to ``json_path`` if given."""
    text = json.dumps(report, indent=2)
    print(text)
    print()
    print(table)
    if json_path:
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_text(text + "\n", encoding="utf-8")
