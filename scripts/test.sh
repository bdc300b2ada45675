#!/usr/bin/env bash
# The README's test command: set up the development environment (.venv-dev: CPU torch, every extra,
# the base encoder; see scripts/env.sh dev) and run the suite. The serving environment (.venv) is
# never touched. DIALOGUE_SAFETY_VENV=DIR tests in another environment (.ci/run uses .ci/venv).
#   scripts/test.sh [pytest arguments]
set -euo pipefail
cd "$(dirname "$0")/.."
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
venv="$(scripts/env.sh dev)"
# System packages for the break-it tests (they fail, never skip, without them): a throwaway PostgreSQL
# server (Debian's postgresql) and a headless browser (Debian's chromium, driven by Playwright).
have_pg() { command -v initdb >/dev/null || compgen -G "/usr/lib/postgresql/*/bin/initdb" >/dev/null; }
if ! have_pg || ! command -v chromium >/dev/null; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    apt-get update -q >&2 && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends postgresql chromium >&2
  else
    echo "the break-it tests need PostgreSQL and Chromium: sudo apt-get install postgresql chromium" >&2
  fi
fi
# lint, types and the Dockerfile first (each pinned in the dev extra), then the tests
"$venv/bin/ruff" check .
"$venv/bin/ruff" format --check .
"$venv/bin/mypy" dialogue_safety lab/
"$venv/bin/hadolint" Dockerfile
exec "$venv/bin/python" -m pytest -q "$@"
