#!/usr/bin/env bash
# Run HERE (a machine with the package registries), before using a lent GPU machine that has no network:
# downloads, for its Python 3.12, the wheels listed in scripts/gpu/carry.txt into .whl/ (ignored by git; carried
# with the working tree, 64 MiB at most: about 50 MB). The list is checked against the GPU image's packages by
# tests/repo/test_gpu_runbook.py.
#   bash scripts/gpu/fetch_wheels.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
mkdir -p "$(git rev-parse --git-path info)"; ex=$(git rev-parse --git-path info/exclude)
grep -qx "/.whl/" "$ex" 2>/dev/null || echo "/.whl/" >> "$ex"
rm -rf .whl && mkdir -p .whl
plat=(--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64
      --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64)
mapfile -t pkgs < <(grep -v '^\s*#' scripts/gpu/carry.txt | sed '/^\s*$/d')
for pkg in "${pkgs[@]}"; do
  if [[ $pkg == deepspeed==* ]]; then   # sdist only on the index: build its pure-Python wheel here (~15 s)
    python3 -m pip wheel -q --no-deps --no-build-isolation -w .whl "$pkg"
  else
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
      "${plat[@]}" -d .whl "$pkg"
  fi
done
du -sh .whl && ls .whl
