#!/usr/bin/env bash
# Writes constraints/JOB.txt, the versions every install of a job gets (scripts/env.sh, so scripts/serve.sh,
# scripts/test.sh and .ci/run; the Dockerfile uses constraints/serve.txt), from pyproject.toml: dev first (every
# extra), then each job's lock as the part of dev's versions that job needs, so all jobs agree.
# Resolved for Linux x86_64 and Python 3.11 (CI and the image). torch itself is pinned by scripts/env.sh
# (TORCH_VERSION), not here; its dependencies are locked as the CPU build's.
# tests/test_locks.py fails when pyproject.toml changed and the locks were not written again.
#   scripts/lock.sh             re-resolve, keeping the locked versions where pyproject.toml still allows them
#   scripts/lock.sh --upgrade   the newest versions pyproject.toml allows
# Settings: UV (the uv binary; default: the one on PATH, else .venv-dev/bin/uv),
#           TORCH_FIND_LINKS (where the CPU torch wheel is listed; default: the PyTorch CPU index's torch page)
set -euo pipefail
cd "$(dirname "$0")/.."
uv="${UV:-$(command -v uv || echo .venv-dev/bin/uv)}"
torch_version="$(sed -n 's/^TORCH_VERSION="\(.*\)"/\1/p' scripts/env.sh)"
encoder="$(sed -n 's/^BASE_ENCODER="\(.*\)"/\1/p' scripts/env.sh)"
upgrade=()
if [ "${1:-}" = --upgrade ]; then upgrade=(--upgrade); fi
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
echo "torch==$torch_version+cpu" > "$tmp/torch-cpu.txt"
echo "$encoder" > "$tmp/base-encoder.txt"
digest="$(python3 scripts/lock_digest.py)"
compile() {
  local job="$1"; shift
  local extras args=() inputs=(pyproject.toml)
  extras="$(scripts/env.sh extras "$job")"
  IFS=, read -ra names <<< "$extras"
  for name in "${names[@]}"; do args+=(--extra "$name"); done
  case "$job" in train|dev) inputs+=("$tmp/base-encoder.txt") ;; esac
  "$uv" pip compile -q "${inputs[@]}" "${args[@]}" "$@" \
    --python-version 3.11 --python-platform x86_64-manylinux_2_28 \
    --find-links "${TORCH_FIND_LINKS:-https://download.pytorch.org/whl/cpu/torch/}" \
    -c "$tmp/torch-cpu.txt" --no-emit-package torch --no-emit-package dialogue-safety \
    --no-header --no-annotate -o "$tmp/$job.txt" >&2
  {
    echo "# constraints for 'scripts/env.sh $job' (extras: $extras), written by scripts/lock.sh; do not edit."
    echo "# pyproject.toml dependencies digest: $digest"
    echo "# Linux x86_64, Python 3.11; torch==$torch_version comes from scripts/env.sh."
    grep -v '^#' "$tmp/$job.txt"
  } > "constraints/$job.txt"
  echo "scripts/lock.sh: constraints/$job.txt ($(grep -vc '^#' "constraints/$job.txt") pins)" >&2
}
if [ -f constraints/dev.txt ] && [ ${#upgrade[@]} -eq 0 ]; then
  grep -v '^#' constraints/dev.txt > "$tmp/dev.txt"   # uv keeps an output file's versions where it can
fi
compile dev "${upgrade[@]}"
for job in serve evaluate score train; do
  compile "$job" -c constraints/dev.txt
done
