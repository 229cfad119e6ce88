#!/usr/bin/env bash
# Run HERE (a machine with the package registries) before using a lent GPU machine that has torch, lightning,
# transformers and peft but not litgpt and no network: downloads the missing wheels for its Python 3.12 into .whl/
# (ignored by git; carried with the working tree, 64 MiB at most: about 47 MB today).
#   bash scripts/gpu/fetch_wheels.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >> .git/info/exclude
rm -rf .whl && mkdir -p .whl
plat=(--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64
      --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64)
# the pinned versions of requirements.txt, and what they need that the GPU image lacks
for pkg in litgpt==0.5.13 jsonargparse==4.41.0 docstring-parser typeshed-client bitsandbytes==0.50.2 hjson py-cpuinfo; do
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp "${plat[@]}" \
    -d .whl "$pkg"
done
python3 -m pip wheel -q --no-deps --no-build-isolation -w .whl deepspeed==0.19.8   # pure-Python wheel
du -sh .whl && ls .whl
