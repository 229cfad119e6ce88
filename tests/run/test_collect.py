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
