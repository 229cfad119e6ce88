"""The record's compute figures (tunelab/run/collect.py): FLOPs per token, achieved TFLOP/s and MFU."""

from __future__ import annotations

import pytest

from tunelab import hardware
from tunelab.recipes import resolve as recipe
from tunelab.record import RunRecord
from tunelab.run import collect
from tunelab.settings import resolve


@pytest.mark.parametrize(
    "device, name, picked",
    [("cuda", "NVIDIA H100 80GB HBM3", "bf16-mixed"), ("cuda", "Tesla T4", "16-mixed"), ("cpu", "", "bf16-mixed")],
)
def test_a_run_without_a_precision_is_recorded_and_measured_at_litgpts_pick(device, name, picked):
    """A recipe without a precision trains at what litgpt picks on the device (bf16-mixed, 16-mixed on a GPU
    without bfloat16); the record said None and its MFU was taken against the GPU's float32 peak (on an H100 2x
    the bf16 MFU under TF32, 15x without). Now the record holds litgpt's pick and the MFU its peak."""
    settings = resolve(recipe("tiny-llama-1.1b/lora"), ["--precision", "null"])
    assert settings.precision is None
    rec = RunRecord(
        device_type=device, device_name=name, micro_batch_size=4, tok_s_real=10_000.0, tok_s_padded=12_000.0
    )
    collect._compute(rec, settings, settings.checkpoint_dir, 0)
    assert rec.precision == picked, rec.flops_formula
    if device == "cuda":
        gpu = hardware.identify(name)
        assert rec.peak_tflops_per_device == pytest.approx(gpu.peak_flops(picked, None) / 1e12)
        assert rec.peak_tflops_per_device > gpu.peak_flops("32-true", None) / 1e12
    stated = RunRecord(device_type=device, device_name=name, precision="32-true", micro_batch_size=4)
    collect._compute(stated, settings, settings.checkpoint_dir, 0)
    assert stated.precision == "32-true"  # a precision the recipe sets is kept


def test_two_ranks_speed_and_mfu_are_summed_then_taken_per_device():
    """Two ranks, 20 iterations of 0.5 s each at accumulation 2 (the first step dropped as warm-up), 1,000 padded
    tokens an iteration on both, 800 real on rank 0 and 700 on rank 1: the rates add the ranks' (3,000 real tok/s,
    4,000 padded), the whole run's tokens count every iteration, the FLOPs per token are taken at the padded
    sequence of one sample (1,000 / micro 4 = 250), and MFU divides the rate per device by one H100's bf16 peak."""
    from tunelab.models import load_config
    from tunelab.plan.model.flops import flops_per_token
    from tunelab.record import GPUSample, RankStats

    logs = [[(0.5 * i, 1000, real, 0.0) for i in range(20)] for real in (800, 700)]
    rec = RunRecord(
        device_type="cuda",
        device_name="NVIDIA H100 80GB HBM3",
        device_count=2,
        micro_batch_size=4,
        accumulation=2,
        precision="bf16-true",
        ranks=[RankStats(rank=r, trained_until=10.0) for r in (0, 1)],
    )
    collect._speed(rec, logs, 20)
    assert (rec.tokens_padded, rec.tokens_real) == (40_000, 30_000)
    assert rec.tok_s_real == pytest.approx(800 / 0.5 + 700 / 0.5) and rec.tok_s_padded == pytest.approx(4000)
    assert rec.tok_s_padded_per_device == pytest.approx(2000) and rec.step_time_s == pytest.approx(1.0)
    assert rec.samples_s == pytest.approx(2 * 4 / 0.5) and rec.padded_per_sample == pytest.approx(250)
    settings = resolve(recipe("tiny-llama-1.1b/full"), [])
    collect._compute(rec, settings, settings.checkpoint_dir, 20)
    fpt = flops_per_token(load_config(settings.checkpoint_dir), 250, "full").total
    peak = hardware.identify("NVIDIA H100 80GB HBM3").peak_flops("bf16-true", None)
    assert rec.flops_per_token == pytest.approx(fpt)
    assert rec.mfu == pytest.approx(fpt * 1500 / peak) and rec.mfu_padded == pytest.approx(fpt * 2000 / peak)
    assert rec.achieved_tflops_per_device == pytest.approx(fpt * 1500 / 1e12)
    gpus = [GPUSample(index=i, name="H100", energy_j=600.0 + 300 * i, power_mean_w=60.0) for i in (0, 1)]
    collect._gpu_figures(rec, gpus, {}, None)  # both boards' energy over the run's real tokens
    assert rec.energy_j == 1500 and rec.energy_j_per_1k_tokens == pytest.approx(1500 / 30_000 * 1000)
