#!/usr/bin/env bash
# The main job on a laptop: validate every recipe, build the embedded tiny model, and fine-tune one recipe on
# CPU through the real `litgpt finetune_lora` (a few steps). Usage: bash scripts/quickstart.sh [RECIPE]
set -euo pipefail
cd "$(dirname "$0")/.."
. .venv/bin/activate
recipe="${1:-tiny-llama-1.1b/lora}"
tunelab validate
ckpt=$(tunelab build-model tiny)
# the recipe as written; only the checkpoint, the step count and the loader processes change
litgpt "$( [ "${recipe#*/}" = full ] && echo finetune_full || echo finetune_lora )" \
  --config "recipes/${recipe}.yaml" --train.max_steps 4 --data.num_workers 0 \
  --out_dir "out/quickstart/${recipe}" "$ckpt"
echo "metrics: out/quickstart/${recipe}/logs/csv/version_*/metrics.csv; checkpoint: out/quickstart/${recipe}/final"
