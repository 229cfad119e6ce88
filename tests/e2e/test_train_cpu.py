"""Every runnable recipe trains for real on CPU through `litgpt finetune_*` (a child process), on the tiny model."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests import printed
from tests.conftest import equal_length_dataset, read_metrics, run_litgpt
from tunelab.recipes import discover, resolve
from tunelab.validate import check, litgpt_args

QLORA = [r for r in discover() if r.method == "qlora"]
FEW_STEPS = ["--train.max_steps", "2", "--data.num_workers", "0", "--eval.max_iters", "2"]
_SHOWN = {p.source: p.command for p in printed.show_lines()}
_HEADERS = {p.source: p.command for p in printed.recipe_headers()}


def cpu_command(recipe) -> str:
    """What this file runs for ``recipe``: the line `tunelab show` prints for the tiny model on CPU (the header's
    Launch line plus CPU arguments) followed by the extra arguments of the header's Override line, so that one run
    is the CPU variant of all three."""
    launch = _HEADERS[f"{recipe.path.relative_to(printed.ROOT)} header (Launch)"]
    override = _HEADERS[f"{recipe.path.relative_to(printed.ROOT)} header (Override)"]
    tiny = _SHOWN[f"tunelab show {recipe.key} (on the tiny model (CPU))"]
    assert override.startswith(launch + " ") and tiny.startswith(launch + " "), (launch, override, tiny)
    return f"{tiny} {override[len(launch) + 1 :]}"


RUN_COMMANDS = {r.key: cpu_command(r) for r in discover()}
PRINTED = set(RUN_COMMANDS.values())
"""What test_recipe_trains_on_cpu runs: each holds every argument of its recipe's printed Launch, Override and show
lines (tests/e2e/test_printed_commands.py checks every printed `litgpt finetune_*` line is covered by one)."""


CI_RECIPE = "tiny-llama-1.1b/lora"
"""The recipe run in CI (20 to 30 s on 2 cores, as `tunelab run` in tests/e2e/test_runner.py); the others run with
-m slow: on the tiny model they differ only in their YAML's values (method and precision), which
tests/core/test_settings.py checks against litgpt's own parser on every recipe."""


@pytest.mark.parametrize(
    "recipe",
    [r if r.key == CI_RECIPE else pytest.param(r, marks=pytest.mark.slow) for r in discover()],
    ids=lambda r: r.key,
)
def test_recipe_trains_on_cpu(recipe, tiny_ckpt, tmp_path):
    """Every recipe, QLoRA included (`tunelab show` prints it with --quantize null on CPU: bitsandbytes' layers
    need CUDA), through the real `litgpt finetune_*`, as `cpu_command` says."""
    out = tmp_path / "out"
    argv = printed.tiny_training_argv(RUN_COMMANDS[recipe.key], tiny_ckpt, out)
    proc = run_litgpt(argv)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    rows = read_metrics(out)
    # litgpt logs with step=iter_num, so metrics.csv's "step" column counts micro-batch iterations
    resolved = check(recipe, argv[3:]).resolved
    train = resolved["train"]
    accumulation = train["global_batch_size"] // train["micro_batch_size"]
    assert train["max_steps"] == 2 and accumulation > 1
    assert max(int(r["iter"]) for r in rows if r.get("iter")) == 2 * accumulation
    losses = [float(r["loss"]) for r in rows if r.get("loss")]
    assert losses and all(0 < x < 20 for x in losses)
    assert any(r.get("val_loss") for r in rows)  # the final validation ran
    final = out / "final"
    assert (final / "lit_model.pth").is_file() and (final / "model_config.yaml").is_file()
    if recipe.method != "full":
        assert (final / "lit_model.pth.lora").is_file() and resolved["lora_r"] == 16


def test_qlora_on_cpu_is_refused_only_for_bitsandbytes(tiny_ckpt, tmp_path):
    """QLoRA fails on CPU at Lightning's bitsandbytes precision (`tunelab validate --device cpu` and `tunelab run`
    say so before launch); the same recipe with --quantize null trains (test_recipe_trains_on_cpu). One recipe
    shows it: the refusal is Lightning's, whatever the recipe."""
    recipe = resolve("tiny-llama-1.1b/qlora")
    proc = run_litgpt(
        litgpt_args(
            recipe, [*FEW_STEPS, "--devices", "1", "--out_dir", str(tmp_path / "q"), "--checkpoint_dir", str(tiny_ckpt)]
        )
    )
    assert proc.returncode != 0
    assert "bitsandbytes" in proc.stderr.lower() or "bitsandbytes" in proc.stdout.lower()
    assert "cpu" in (proc.stderr + proc.stdout).lower()
    assert not (tmp_path / "q" / "final").exists()


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
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "litgpt",
            *litgpt_args(recipe, [*FEW_STEPS, "--out_dir", str(out), "--checkpoint_dir", str(tiny_ckpt)]),
        ],
        cwd=Path(__file__).resolve().parents[2],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Memory Used" in proc.stdout and (out / "final" / "lit_model.pth.lora").is_file()


@pytest.mark.slow  # 20 s on 2 cores: litgpt's own accumulation; the fast loop's is checked against litgpt in
# tests/e2e/test_fast.py
def test_gradient_accumulation_is_equivalent(tiny_ckpt, tmp_path):
    """micro 4 x accumulation 1 and micro 2 x accumulation 2 give the same losses (fp32, tiny model)."""
    data_file = equal_length_dataset(tiny_ckpt, tmp_path / "equal.json")
    recipe = resolve("tiny-llama-1.1b/full")
    runs = {}
    for micro in (4, 2):
        out = tmp_path / f"micro{micro}"
        args = [
            "--precision",
            "32-true",
            "--train.global_batch_size",
            "4",
            "--train.micro_batch_size",
            str(micro),
            "--train.max_steps",
            "4",
            "--train.lr_warmup_steps",
            "1",
            "--data.json_path",
            str(data_file),
            "--data.num_workers",
            "0",
            "--out_dir",
            str(out),
            "--checkpoint_dir",
            str(tiny_ckpt),
            "--optimizer.init_args.lr",
            "0.01",
        ]
        proc = run_litgpt(litgpt_args(recipe, args))
        assert proc.returncode == 0, proc.stderr[-3000:]
        rows = read_metrics(out)
        # the loss logged at each optimizer step: litgpt's running mean over that step's micro batches
        per_step = {}  # metrics.csv's "step" column is litgpt's iter_num: optimizer step = iter / accumulation
        for r in rows:
            if r.get("loss") and int(r["iter"]) % (4 // micro) == 0:
                per_step[int(r["iter"]) // (4 // micro)] = float(r["loss"])
        runs[micro] = (
            [per_step[s] for s in sorted(per_step)],
            [float(r["val_loss"]) for r in rows if r.get("val_loss")][-1],
        )
    (losses4, val4), (losses2, val2) = runs[4], runs[2]
    assert len(losses4) == len(losses2) == 4
    assert losses4[0] != losses4[-1]  # the weights did change: the comparison is not of a frozen model
    assert losses4 == pytest.approx(losses2, rel=1e-4, abs=1e-5)
    assert val4 == pytest.approx(val2, rel=1e-4, abs=1e-5)
