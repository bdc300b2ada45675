#!/usr/bin/env bash
# The README's test command: set up the development environment (.venv-dev: CPU torch, every extra,
# the base encoder; see scripts/env.sh dev) and run the suite. The serving environment (.venv) is
# never touched. DIALOGUE_SAFETY_VENV=DIR tests in another environment (.ci/run uses .ci/venv).
#   scripts/test.sh [pytest arguments]
set -euo pipefail
cd "$(dirname "$0")/.."
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
venv="$(scripts/env.sh dev)"
exec "$venv/bin/python" -m pytest -q "$@"
