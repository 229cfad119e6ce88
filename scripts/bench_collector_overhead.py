#!/usr/bin/env python
"""Measure the collector's overhead: the same litgpt run with and without tunelab around it.

Alternates N pairs, on the embedded tiny model (default) or the recipe's real architecture with random weights
(--model random, on a GPU: the benchmark dataset and tokenizer, as `tunelab run --weights random` uses them):
  without: `python -m litgpt finetune_* ...`                  (plain litgpt CLI)
  with:    `python -m tunelab run ...` (tunelab.run.entry in the child, record collection, NVML sampling where a GPU is)
and compares litgpt's own printed Tok/sec (padded tokens over its Training Time) of each, so both sides are
measured by the same clock. Prints the medians and their ratio (and writes them as JSON with --json-out).

Usage: python scripts/bench_collector_overhead.py [--pairs 5] [--steps 20] [--micro 8] [--precision bf16-true]
                                                  [--model tiny|random] [--json-out FILE]
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tunelab import checkpoints  # noqa: E402
from tunelab.data import benchmark as benchmark_data  # noqa: E402
from tunelab.recipes import resolve  # noqa: E402
from tunelab.run.gpu_monitor import GPUMonitor  # noqa: E402
from tunelab.run.runner import build_in_child, cpu_name, cuda_available  # noqa: E402

TOK = re.compile(r"Tok/sec\s*:\s*([\d.]+)")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pairs", type=int, default=5)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--micro", type=int, default=8, help="micro batch = global batch (no accumulation)")
    ap.add_argument("--precision", help="override the recipe's precision (e.g. bf16-true)")
    ap.add_argument("--recipe", default="recipes/tiny-llama-1.1b/full.yaml")
    ap.add_argument("--model", choices=["tiny", "random"], default="tiny")
    ap.add_argument("--json-out", type=Path, help="write the per-pair figures and medians here")
    a = ap.parse_args()
    recipe = resolve(a.recipe)
    common = [
        "--config",
        str(recipe.path),
        "--train.max_steps",
        str(a.steps),
        "--train.micro_batch_size",
        str(a.micro),
        "--train.global_batch_size",
        str(a.micro),
        "--data.num_workers",
        "0",
        "--eval.final_validation",
        "false",
        "--train.save_interval",
        "null",
    ]
    if a.precision:
        common += ["--precision", a.precision]
    if a.model == "tiny":
        ckpt = checkpoints.build("tiny")
    else:
        from litgpt import Config

        name = Config.from_name(Path(str(recipe.get("checkpoint_dir"))).name).name
        ckpt = build_in_child(name, device="cuda" if cuda_available() else "cpu")
        common += ["--data.json_path", str(benchmark_data.ensure())]
    results: dict[str, list[float]] = {"without": [], "with": []}
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(a.pairs):
            for side in ("without", "with"):
                out = Path(tmp) / f"{side}{i}"
                if side == "without":
                    cmd = [
                        sys.executable,
                        "-m",
                        "litgpt",
                        recipe.command,
                        *common,
                        "--out_dir",
                        str(out),
                        str(ckpt),
                    ]  # litgpt 0.5.13: the checkpoint directory is positional
                    text = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, check=True).stdout
                else:
                    cmd = [
                        sys.executable,
                        "-m",
                        "tunelab",
                        "run",
                        str(recipe.path),
                        "--model",
                        a.model,
                        "--out",
                        str(out),
                        *common[2:],
                    ]
                    subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, check=True)
                    text = (out / "stdout.log").read_text()
                tok = float(TOK.findall(text)[-1])
                results[side].append(tok)
                print(f"pair {i + 1} {side:>7}: {tok:,.0f} tok/s (litgpt's figure)", flush=True)
                shutil.rmtree(out / "litgpt" / "final", ignore_errors=True)
                shutil.rmtree(out / "final", ignore_errors=True)
    med = {k: statistics.median(v) for k, v in results.items()}
    ratio = med["with"] / med["without"]
    print(
        f"median without collector: {med['without']:,.0f} tok/s; with: {med['with']:,.0f} tok/s; "
        f"ratio with/without = {ratio:.4f} ({a.pairs} pairs, {a.steps} steps, micro {a.micro}, "
        f"{a.precision or 'recipe precision'}, model {a.model}, {device_name()})"
    )
    if a.json_out:
        a.json_out.write_text(
            json.dumps(
                {
                    "pairs": a.pairs,
                    "steps": a.steps,
                    "micro": a.micro,
                    "precision": a.precision,
                    "model": a.model,
                    "recipe": recipe.key,
                    "device": device_name(),
                    "tok_s": results,
                    "median": med,
                    "ratio_with_over_without": ratio,
                },
                indent=2,
            )
        )
    return 0


def device_name() -> str:
    mon = GPUMonitor()
    return mon.names[0] if mon.names else cpu_name()


if __name__ == "__main__":
    raise SystemExit(main())
