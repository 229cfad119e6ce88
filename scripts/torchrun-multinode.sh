#!/usr/bin/env bash
# Two (or more) nodes without SLURM: run this on every node with its NODE_RANK.
#   node 0: NODE_RANK=0 MASTER_ADDR=10.0.0.1 bash scripts/torchrun-multinode.sh open-llama-7b/full fsdp
#   node 1: NODE_RANK=1 MASTER_ADDR=10.0.0.1 bash scripts/torchrun-multinode.sh open-llama-7b/full fsdp
# Both nodes must see the same OUT directory (shared filesystem); node 0 writes the record.
set -euo pipefail
cd "$(dirname "$0")/.."
. .venv/bin/activate
RECIPE=${1:?recipe}; STRATEGY=${2:-fsdp}; shift 2 || true
tunelab run "$RECIPE" --strategy "$STRATEGY" --devices "${GPUS_PER_NODE:-$(nvidia-smi -L 2>/dev/null | wc -l)}" \
  --nnodes "${NNODES:-2}" --node-rank "${NODE_RANK:?NODE_RANK}" --master-addr "${MASTER_ADDR:?MASTER_ADDR}" \
  --master-port "${MASTER_PORT:-29500}" --out "${OUT:-runs/multinode}" "$@"
