#!/usr/bin/env bash
# The README's quickstart: serve the bundled model (models/default) on http://127.0.0.1:8000.
# Needs only Python 3.11: creates .venv when no virtual environment is active, installs the
# serving extra (onnxruntime, FastAPI, uvicorn; no torch), then runs `dialogue-safety serve`.
#   scripts/serve.sh [--model DIR] [--host H] [--port P] ...   (see: dialogue-safety serve --help)
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
if [ -z "${VIRTUAL_ENV:-}" ]; then
  if [ ! -d "$REPO/.venv" ]; then
    PYTHON="${PYTHON:-$(command -v python3.11 || command -v python3)}"
    "$PYTHON" -m venv "$REPO/.venv"
  fi
  # shellcheck disable=SC1091
  . "$REPO/.venv/bin/activate"
fi
python -m pip install -q --disable-pip-version-check -e "$REPO[serve]"
exec dialogue-safety serve "$@"
