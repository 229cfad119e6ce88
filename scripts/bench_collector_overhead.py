#!/usr/bin/env python
"""Measure the collector's overhead: the same litgpt run with and without tunelab around it.

Alternates pairs, on the embedded tiny model (default) or the recipe's real architecture with random weights
(--model random, on a GPU: the benchmark dataset and tokenizer, as `tunelab run --weights random` uses them):
  without: `python -m litgpt finetune_* ...`                  (plain litgpt CLI)
  with:    `python -m tunelab run ...` (tunelab.run.entry in the child, record collection, NVML sampling where a GPU is)
and compares litgpt's own printed Tok/sec (padded tokens over its Training Time, its first iterations included)
of each, so both sides are measured by the same clock. Each pair's ratio (with / without, the two runs side by
side) is the unit: the report is their median with its distribution-free 95% interval (from 6 pairs on). With
--target T it stops once that interval's half-width is within T of the median (after at least 6 pairs), at
--pairs, or when --deadline seconds are spent (no pair starts that could not finish by then, judged by the
slowest pair so far). The JSON is rewritten after every pair, so a run cut short keeps what it measured.

Usage: python scripts/bench_collector_overhead.py [--pairs 5] [--target 0.01] [--deadline S] [--steps 20]
                                                  [--micro 8] [--precision bf16-true] [--recipe FILE]
                                                  [--model tiny|random] [--json-out FILE]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tunelab import checkpoints, record  # noqa: E402
from tunelab.data import benchmark as benchmark_data  # noqa: E402
from tunelab.errors import InputError  # noqa: E402
from tunelab.files import check_target, write_json_atomic  # noqa: E402
from tunelab.recipes import resolve  # noqa: E402
from tunelab.report.stats import median_interval  # noqa: E402
from tunelab.run.collect import parse_litgpt_report  # noqa: E402
from tunelab.run.gpu_monitor import GPUMonitor, cpu_name  # noqa: E402
from tunelab.run.runner import build_in_child, cuda_available  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pairs", type=int, default=5, help="at most this many pairs (default 5)")
    ap.add_argument(
        "--target", type=float, help="stop once the 95%% interval's half-width is within this fraction of the median"
    )
    ap.add_argument("--deadline", type=float, help="start no pair that would end after S seconds")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--micro", type=int, default=8, help="micro batch = global batch (no accumulation)")
    ap.add_argument("--precision", help="override the recipe's precision (e.g. bf16-true)")
    ap.add_argument("--recipe", default="tiny-llama-1.1b/full", help="a recipe key or YAML path (default %(default)s)")
    ap.add_argument("--model", choices=["tiny", "random"], default="tiny")
    ap.add_argument("--json-out", type=Path, help="write the per-pair figures and medians here")
    a = ap.parse_args()
    if a.pairs < 1 or a.steps < 1 or a.micro < 1:
        ap.error("--pairs, --steps and --micro must be at least 1")
    if a.target is not None and not 0 < a.target < 1:
        ap.error(f"--target is a fraction of the median in (0, 1), e.g. 0.01; got {a.target}")
    if a.deadline is not None and not a.deadline > 0:
        ap.error(f"--deadline is seconds, more than 0; got {a.deadline}")
    try:
        recipe = resolve(a.recipe)
        if a.json_out is not None:
            check_target(a.json_out, "--json-out")
    except InputError as e:  # a recipe that cannot be read, an output that is a link, FIFO or directory
        ap.error(str(e))
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
    started, slowest, why = time.monotonic(), 0.0, f"{a.pairs} pairs"
    device = device_name()
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(a.pairs):
            spent = time.monotonic() - started
            if a.deadline is not None and spent + slowest > a.deadline:
                why = f"deadline: {spent:.0f} s spent of {a.deadline:.0f}, a pair takes up to {slowest:.0f} s"
                break
            t0 = time.monotonic()
            for side in ("without", "with"):
                results[side].append(run_side(side, recipe, a.model, common, ckpt, Path(tmp) / f"{side}{i}"))
                print(f"pair {i + 1} {side:>7}: {results[side][-1]:,.0f} tok/s (litgpt's figure)", flush=True)
            slowest = max(slowest, time.monotonic() - t0)
            summary = summarise(results)
            if a.json_out:
                write_json_atomic(a.json_out, {**settings(a, recipe, device), **summary, "stopped": "running"})
            ci = summary["interval_95"]
            if a.target is not None and ci and ci["half_width"] <= a.target:
                why = f"target: the 95% interval is within +-{ci['half_width']:.2%} after {i + 1} pairs"
                break
    summary = summarise(results)
    if a.json_out:
        write_json_atomic(a.json_out, {**settings(a, recipe, device), **summary, "stopped": why})
    if not summary["ratios"]:
        print(f"no pair measured ({why})")
        return 1
    ci = summary["interval_95"]
    print(
        f"median without collector: {summary['median']['without']:,.0f} tok/s; with: "
        f"{summary['median']['with']:,.0f} tok/s; ratio with/without, median of {len(summary['ratios'])} pair "
        f"ratios = {summary['ratio_with_over_without']:.4f}, 95% interval "
        + (f"{ci['low']:.4f}-{ci['high']:.4f} (+-{ci['half_width']:.2%})" if ci else "needs 6 pairs")
        + f"; range {min(summary['ratios']):.4f}-{max(summary['ratios']):.4f}; stopped: {why} "
        f"({a.steps} steps, micro {a.micro}, {a.precision or 'recipe precision'}, model {a.model}, {device})"
    )
    return 0


def run_side(side: str, recipe, model: str, common: list[str], ckpt: Path, out: Path) -> float:
    """One run, plain litgpt or under ``tunelab run``: litgpt's printed Tok/sec (from its output, or from the run
    record, which holds the same figure parsed the same way). A run that fails ends the script in one line."""
    if side == "without":  # litgpt 0.5.13: the checkpoint directory is positional
        cmd = [sys.executable, "-m", "litgpt", recipe.command, *common, "--out_dir", str(out), str(ckpt)]
    else:  # tunelab run chooses the checkpoint by --model
        cmd = [
            sys.executable,
            "-m",
            "tunelab",
            "run",
            str(recipe.path),
            "--model",
            model,
            "--out",
            str(out),
            *common[2:],
        ]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    tok_s = (
        parse_litgpt_report(proc.stdout)["tok_s"]
        if side == "without"
        else record.load(out / "record.json").litgpt_tok_s
        if (out / "record.json").is_file()
        else None
    )
    shutil.rmtree(out / "litgpt" / "final", ignore_errors=True)
    shutil.rmtree(out / "final", ignore_errors=True)
    if proc.returncode != 0 or tok_s is None:
        last = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
        raise SystemExit(f"bench_collector_overhead: the {side} run failed (exit {proc.returncode}): {last[0]}")
    return tok_s


def summarise(results: dict[str, list[float]]) -> dict:
    """Per-pair ratios (with / without), their median and 95% interval, and each side's median."""
    ratios = [w / wo for w, wo in zip(results["with"], results["without"])]
    ci = median_interval(ratios) if ratios else None
    return {
        "tok_s": results,
        "median": {k: statistics.median(v) for k, v in results.items() if v},
        "ratios": ratios,
        "ratio_with_over_without": statistics.median(ratios) if ratios else None,
        "interval_95": (
            {"low": ci.low, "high": ci.high, "coverage": ci.coverage, "half_width": ci.half_width} if ci else None
        ),
    }


def settings(a, recipe, device: str) -> dict:
    return {
        "pairs_max": a.pairs,
        "target": a.target,
        "deadline_s": a.deadline,
        "steps": a.steps,
        "micro": a.micro,
        "precision": a.precision,
        "model": a.model,
        "recipe": recipe.key,
        "device": device,
        "tok_s_is": "litgpt's printed Tok/sec: padded tokens over its Training Time, first iterations included",
    }


def device_name() -> str:
    mon = GPUMonitor()
    return mon.names[0] if mon.names else cpu_name()


if __name__ == "__main__":
    raise SystemExit(main())
