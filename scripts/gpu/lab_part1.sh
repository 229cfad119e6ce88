#!/usr/bin/env bash
# Run ON the lent GPU machine (device tool: carry .whl; the command is this script). Installs the carried wheels,
# checks versions, then measures the lab's Part 1 with the real architectures and random weights, writing the
# records and the report under $OUT (fetched back) and reports/.
#   device run: bash scripts/gpu/lab_part1.sh            (carry: [".whl"])
set -euo pipefail
cd "$(dirname "$0")/../.."
SITE=${SITE:-$(mktemp -d)}   # where the carried wheels are installed
RUNS=${RUNS:-$(mktemp -d)}   # records and logs (archived into $OUT at the end)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" .whl/*.whl
export PYTHONPATH=$SITE:$PWD PYTHONUNBUFFERED=1 JSONARGPARSE_DEPRECATION_WARNINGS=off
python3 -c "import torch, lightning, litgpt, bitsandbytes, deepspeed; print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name(0)); print('lightning', lightning.__version__, 'litgpt', litgpt.__version__ if hasattr(litgpt, '__version__') else '0.5.13', 'bnb', bitsandbytes.__version__, 'deepspeed', deepspeed.__version__)"
OUT=${OUT:?OUT: the folder whose files come back}
# at most 8 files come back from the device: the report (4 files) and one archive of every record and log
python3 -m tunelab sweep configs/sweeps/lab-part1.yaml --weights random --out "$RUNS/lab-part1" \
  --report-dir "$OUT" "$@" || true
tar czf "$OUT/records.tgz" -C "$RUNS" lab-part1 --exclude='*/litgpt/final'
ls -la "$OUT"
