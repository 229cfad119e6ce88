"""Every runnable recipe trains for real on CPU through `litgpt finetune_*` (a child process), on the tiny model."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import equal_length_dataset, read_metrics, run_litgpt
from tunelab.recipes import discover, resolve
from tunelab.validate import litgpt_args

RUNNABLE = [r for r in discover() if r.method != "qlora"]
QLORA = [r for r in discover() if r.method == "qlora"]
FEW_STEPS = ["--train.max_steps", "2", "--data.num_workers", "0", "--eval.max_iters", "2"]


def cpu_overrides(recipe, ckpt: Path, out: Path) -> list[str]:
    # the recipe as written, plus: the tiny checkpoint, a few steps, no loader processes, one device
    return [*FEW_STEPS, "--devices", "1", "--out_dir", str(out), "--checkpoint_dir", str(ckpt)]


@pytest.mark.parametrize("recipe", RUNNABLE, ids=lambda r: r.key)
def test_recipe_trains_on_cpu(recipe, tiny_ckpt, tmp_path):
    out = tmp_path / "out"
    proc = run_litgpt(litgpt_args(recipe, cpu_overrides(recipe, tiny_ckpt, out)))
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    rows = read_metrics(out)
    # litgpt logs with step=iter_num, so metrics.csv's "step" column counts micro-batch iterations
    accumulation = recipe.get("train.global_batch_size") // recipe.get("train.micro_batch_size")
    assert max(int(r["iter"]) for r in rows if r.get("iter")) == 2 * accumulation
    losses = [float(r["loss"]) for r in rows if r.get("loss")]
    assert losses and all(0 < x < 20 for x in losses)
    assert any(r.get("val_loss") for r in rows)  # the final validation ran
    final = out / "final"
    assert (final / "lit_model.pth").is_file() and (final / "model_config.yaml").is_file()
    if recipe.method == "lora":
        assert (final / "lit_model.pth.lora").is_file()


@pytest.mark.parametrize("recipe", QLORA, ids=lambda r: r.key)
def test_qlora_on_cpu_is_refused_only_for_bitsandbytes(recipe, tiny_ckpt, tmp_path):
    """QLoRA fails on CPU at Lightning's bitsandbytes precision, and the same recipe minus quantize trains (shown
    for one of them: without quantize they are the LoRA recipes, which test_recipe_trains_on_cpu trains)."""
    proc = run_litgpt(litgpt_args(recipe, cpu_overrides(recipe, tiny_ckpt, tmp_path / "q")))
    assert proc.returncode != 0
    assert "bitsandbytes" in proc.stderr.lower() or "bitsandbytes" in proc.stdout.lower()
    assert "cpu" in (proc.stderr + proc.stdout).lower()
    assert not (tmp_path / "q" / "final").exists()
    if recipe.model != "tiny-llama-1.1b":
        return

    proc = run_litgpt(litgpt_args(recipe, [*cpu_overrides(recipe, tiny_ckpt, tmp_path / "l"), "--quantize", "null"]))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (tmp_path / "l" / "final" / "lit_model.pth.lora").is_file()


@pytest.mark.gpu
@pytest.mark.parametrize("recipe", QLORA, ids=lambda r: r.key)
def test_qlora_trains_on_gpu(recipe, tiny_ckpt, tmp_path):
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    import os
    import subprocess
    import sys

    out = tmp_path / "out"
    env = dict(os.environ)
    proc = subprocess.run([sys.executable, "-m", "litgpt",
                           *litgpt_args(recipe, [*FEW_STEPS, "--out_dir", str(out), "--checkpoint_dir", str(tiny_ckpt)])],
                          cwd=Path(__file__).resolve().parents[1], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Memory Used" in proc.stdout and (out / "final" / "lit_model.pth.lora").is_file()


def test_gradient_accumulation_is_equivalent(tiny_ckpt, tmp_path):
    """micro 4 x accumulation 1 and micro 2 x accumulation 2 give the same losses (fp32, tiny model)."""
    data_file = equal_length_dataset(tiny_ckpt, tmp_path / "equal.json")
    recipe = resolve("tiny-llama-1.1b/full")
    runs = {}
    for micro in (4, 2):
        out = tmp_path / f"micro{micro}"
        args = ["--precision", "32-true", "--train.global_batch_size", "4", "--train.micro_batch_size", str(micro),
                "--train.max_steps", "4", "--train.lr_warmup_steps", "1", "--data.json_path", str(data_file),
                "--data.num_workers", "0", "--out_dir", str(out), "--checkpoint_dir", str(tiny_ckpt),
                "--optimizer.init_args.lr", "0.01"]
        proc = run_litgpt(litgpt_args(recipe, args))
        assert proc.returncode == 0, proc.stderr[-3000:]
        rows = read_metrics(out)
        # the loss logged at each optimizer step: litgpt's running mean over that step's micro batches
        per_step = {}  # metrics.csv's "step" column is litgpt's iter_num: optimizer step = iter / accumulation
        for r in rows:
            if r.get("loss") and int(r["iter"]) % (4 // micro) == 0:
                per_step[int(r["iter"]) // (4 // micro)] = float(r["loss"])
        runs[micro] = ([per_step[s] for s in sorted(per_step)],
                       [float(r["val_loss"]) for r in rows if r.get("val_loss")][-1])
    (losses4, val4), (losses2, val2) = runs[4], runs[2]
    assert len(losses4) == len(losses2) == 4
    assert losses4[0] != losses4[-1]  # the weights did change: the comparison is not of a frozen model
    assert losses4 == pytest.approx(losses2, rel=1e-4, abs=1e-5)
    assert val4 == pytest.approx(val2, rel=1e-4, abs=1e-5)
