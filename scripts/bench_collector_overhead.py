#!/usr/bin/env python
"""Measure the collector's overhead: the same litgpt run with and without tunelab around it.

Alternates N pairs on the embedded tiny model (CPU unless a GPU is present):
  without: `litgpt finetune_full ...`                      (plain litgpt CLI)
  with:    `tunelab run ...` (tunelab.entry in the child, record collection, NVML sampling where a GPU is)
and compares litgpt's own printed Tok/sec (padded tokens over its Training Time) of each, so both sides are
measured by the same clock. Prints the medians and their ratio.

Usage: python scripts/bench_collector_overhead.py [--pairs 5] [--steps 20]
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tunelab import checkpoints  # noqa: E402

TOK = re.compile(r"Tok/sec\s*:\s*([\d.]+)")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pairs", type=int, default=5)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--recipe", default="recipes/tiny-llama-1.1b/full.yaml")
    a = ap.parse_args()
    ckpt = checkpoints.build("tiny")
    bindir = Path(sys.executable).parent
    common = ["--config", a.recipe, "--train.max_steps", str(a.steps), "--train.micro_batch_size", "8",
              "--train.global_batch_size", "8", "--data.num_workers", "0", "--eval.final_validation", "false"]
    results: dict[str, list[float]] = {"without": [], "with": []}
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(a.pairs):
            for side in ("without", "with"):
                out = Path(tmp) / f"{side}{i}"
                if side == "without":
                    cmd = [str(bindir / "litgpt"), "finetune_full", *common, "--out_dir", str(out), str(ckpt)]
                    text = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, check=True).stdout
                else:
                    cmd = [str(bindir / "tunelab"), "run", a.recipe, "--model", "tiny", "--out", str(out),
                           *common[2:]]
                    subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, check=True)
                    text = (out / "stdout.log").read_text()
                tok = float(TOK.findall(text)[-1])
                results[side].append(tok)
                print(f"pair {i + 1} {side:>7}: {tok:,.0f} tok/s (litgpt's figure)", flush=True)
    med = {k: statistics.median(v) for k, v in results.items()}
    print(f"median without collector: {med['without']:,.0f} tok/s; with: {med['with']:,.0f} tok/s; "
          f"ratio with/without = {med['with'] / med['without']:.3f} ({a.pairs} pairs, {a.steps} steps, micro 8)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
