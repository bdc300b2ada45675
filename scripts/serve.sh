#!/usr/bin/env bash
# The README's quickstart: serve the bundled model (models/default) on http://127.0.0.1:8000.
# Needs only Python 3.11: sets up .venv with the serving extra (onnxruntime, FastAPI, uvicorn; no torch)
# through scripts/env.sh serve (an active virtual environment is used instead), then runs
# `dialogue-safety serve`. With the break-it game on (SAFETY_BREAKIT_DB or --breakit-db), the same .venv
# also gets the game's extra (scripts/env.sh breakit: SQLAlchemy, Alembic, psycopg, limits).
#   scripts/serve.sh [--model DIR] [--host H] [--port P] ...   (see: dialogue-safety serve --help)
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
job=serve
if [ -n "${SAFETY_BREAKIT_DB:-}" ]; then job=breakit; fi
for arg in "$@"; do
  case "$arg" in --breakit-db|--breakit-db=*) job=breakit ;; esac
done
venv="$(DIALOGUE_SAFETY_VENV="${DIALOGUE_SAFETY_VENV:-${VIRTUAL_ENV:-}}" "$REPO/scripts/env.sh" "$job")"
exec "$venv/bin/dialogue-safety" serve "$@"
