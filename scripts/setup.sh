#!/usr/bin/env bash
# Create .venv with the pinned stack: torch 2.13.0 first (CPU wheel here; on a CUDA machine pip picks the
# CUDA build of the same version), then the project with constraints that keep that torch.
# Usage: bash scripts/setup.sh            (idempotent; re-run after pulling)
set -euo pipefail
cd "$(dirname "$0")/.."
[ -d .venv ] || python3 -m venv .venv
. .venv/bin/activate
python -m pip install -q --upgrade pip
python -m pip install -q torch==2.13.0
python -m pip install -q -c constraints.txt -r requirements.txt -e .
python -m pip check
echo "tunelab installed in .venv: . .venv/bin/activate && tunelab --help"
