"""The runtime point estimate (tunelab/runtime.py): its constants are the fit to the lab's A100 times (not
hand-set), leave-one-out errors are what the module states, its terms count litgpt's validations and optimizer
steps as the lab ran them, and `tunelab plan --json` carries it."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import ROOT, cpu_env
from tunelab.plan import runtime
from tunelab.plan.accuracy import _lab_runtime_items, fit_runtime_constants, runtime_rows


@pytest.fixture(scope="module")
def items():
    return _lab_runtime_items()  # the lab's timed rows, planned once for this file


def test_constants_are_the_fit_to_the_lab_and_the_stated_leave_one_out_errors_hold(items):
    eta, mu, overhead = fit_runtime_constants(items)
    assert (eta, mu, overhead) == pytest.approx((runtime.ETA, runtime.MU, runtime.OVERHEAD_S), abs=1e-4)
    rows = runtime_rows(items)
    assert {r["id"] for r in rows} == {"s2", "s3", "s4", "s5", "s6", "s7", "s10", "s11", "s12", "s13", "s14"}
    loo = [abs(r["loo_error"]) for r in rows]
    assert sum(loo) / len(loo) == pytest.approx(runtime.LOO_MEAN_ABS_ERROR, abs=5e-4)
    assert max((r["loo_error"] for r in rows), key=abs) == pytest.approx(runtime.LOO_WORST_ERROR, abs=5e-4)


def test_terms_count_the_lab_loop(items):
    rows = {r["id"]: r for r in runtime_rows(items)}
    # global batch 8 vs 32 over 1,000 samples: 125 vs 31 optimizer steps, validations every 25 steps
    assert (rows["s2"]["optimizer_steps"], rows["s2"]["evaluations"]) == (125, 5)
    assert (rows["s3"]["optimizer_steps"], rows["s3"]["evaluations"]) == (31, 1)
    assert rows["s2"]["eval_batches_each"] == 100  # eval.max_iters caps the 125 validation batches
    assert rows["s13"]["dequantization_bytes"] > 0 and rows["s12"]["dequantization_bytes"] == 0
    # the steps and validations s2 adds over s3 are what separates their times, and the estimate sees most of it
    assert rows["s2"]["estimate_s"] - rows["s3"]["estimate_s"] > 0.75 * (rows["s2"]["lab_s"] - rows["s3"]["lab_s"])


def test_plan_json_has_the_point_estimate_inside_its_band():
    p = subprocess.run(
        [sys.executable, "-m", "tunelab", "plan", "open-llama-7b/lora", "--gpu", "H100-SXM", "--json"],
        cwd=ROOT,
        env=cpu_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 0, p.stderr
    proj = json.loads(p.stdout)["projection"]
    lo, hi = proj["seconds_band"]
    assert lo < proj["seconds"] < hi and "leave-one-out" in proj["seconds_source"]


def test_activation_checkpointing_recomputes_the_forward():
    """With checkpointing each training token's forward runs again: the compute grows by the forward FLOPs of the
    training tokens (a third of training's), and nothing else changes."""
    import dataclasses

    from tunelab import hardware
    from tunelab.plan.recipe import plan_recipe
    from tunelab.recipes import resolve

    x = plan_recipe(resolve("tiny-llama-1.1b/full"), [], gpu=hardware.lookup("H100-SXM")).input
    args = {"train": {"global_batch_size": 16, "epochs": 1}, "eval": {"interval": None}}
    off = runtime.terms(dataclasses.replace(x, activation_checkpointing=False), args, 1000, 0, 437.0)
    on = runtime.terms(dataclasses.replace(x, activation_checkpointing=True), args, 1000, 0, 437.0)
    assert off.detail["recompute_flops"] == 0
    assert on.detail["recompute_flops"] == pytest.approx(on.detail["train_flops"] / 3, rel=0.02)
    assert on.compute_flops - off.compute_flops == pytest.approx(on.detail["recompute_flops"])
    assert on.memory_bytes == off.memory_bytes and on.iterations == off.iterations


def test_the_kernel_trace_counts_the_models_matmul_flops():
    """Every matmul the simulated step dispatches (forward, backward, optimizer; one and two blocks, extrapolated)
    adds up to the FLOPs formula's matmul part: 6N per token for full fine-tuning, 4N + 6N_lora for LoRA (its
    adapters' products included)."""
    import dataclasses

    from litgpt import Config

    from tunelab.models import lora_param_count
    from tunelab.plan import kernels
    from tunelab.plan.flops import flops_per_token
    from tunelab.settings import LITGPT_LORA_R, LORA_TARGETS

    c = Config.from_name("tiny-llama-1.1b")
    for method, rel in (("full", 1e-3), ("lora", 1e-2)):
        per_block = [
            sum(k.flops for k in kernels.trace_step(dataclasses.replace(c, n_layer=n), method, "bf16-true", 2, 128)
                if k.category == "matmul")
            for n in (1, 2)
        ]  # fmt: skip
        traced = per_block[1] + (c.n_layer - 2) * (per_block[1] - per_block[0])
        lora = lora_param_count(c, LITGPT_LORA_R, LORA_TARGETS) if method == "lora" else 0
        f = flops_per_token(c, 128, method, lora)
        assert traced == pytest.approx((f.total - f.attention) * 2 * 128, rel=rel), method


def test_the_kernel_model_puts_lora_on_the_host_and_full_on_the_gpu():
    """On an H100 a TinyLlama LoRA step dispatches more ops than full fine-tuning's for two thirds of the FLOPs:
    the host's launches outlast its kernels, and the step is as slow as full fine-tuning's (measured: 160.7 ms
    against 97.6 ms), where a FLOP-rate model makes it faster. A partly empty last wave costs a matmul its share."""
    from litgpt import Config

    from tunelab.plan import kernels

    c = Config.from_name("tiny-llama-1.1b")
    full = kernels.step_time(c, "full", "bf16-true", 8, 437, "H100-SXM")
    lora = kernels.step_time(c, "lora", "bf16-true", 8, 437, "H100-SXM")
    assert lora.host_s > lora.gpu_s and full.gpu_s > 0.8 * full.host_s
    assert lora.step_s > full.step_s
    assert sum(full.gpu_by_category.values()) == pytest.approx(full.gpu_s)
    assert kernels.wave_efficiency(132, 132) == 1.0 and kernels.wave_efficiency(133, 132) == pytest.approx(133 / 264)


def test_plan_simulate_prints_the_step_by_kernel():
    """`tunelab plan --simulate --gpu` carries the step by kernel (its categories sum to the GPU time; the step is
    the longer of GPU and host) and says where it is not modelled (tunelab's loop)."""

    def plan(*extra):
        out = subprocess.run(
            [sys.executable, "-m", "tunelab", "plan", "tiny-llama-1.1b/lora", "--gpu", "H100-SXM", "--simulate",
             "--json", *extra],
            capture_output=True, text=True, cwd=ROOT, env=cpu_env(),
        )  # fmt: skip
        assert out.returncode == 0, out.stderr
        return json.loads(out.stdout)["step_by_kernel"]

    st = plan()
    assert st["gpu"] == "H100-SXM" and st["ops"] > 1000
    assert sum(st["gpu_by_category"].values()) == pytest.approx(st["gpu_s"])
    assert st["step_s"] == max(st["gpu_s"], st["host_s"])
    from litgpt import Config

    from tunelab import hardware
    from tunelab.plan import kernels, memory

    x = memory.PlanInput(config=Config.from_name("tiny-llama-1.1b"), fabric=False)  # a strategies file's loop
    assert "tunelab's loop" in kernels.to_json(kernels.for_plan(x, hardware.lookup("H100-SXM")))["not_modelled"]
