"""What a GPU run would get wrong, checked here on CPU: the MFU peak of 32-true runs (TF32), the multi-device
loop's all-reduce device, the benchmark workload's token counts, the usable GPU memory in fit verdicts."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from tests.conftest import ROOT
from tunelab import hardware
from tunelab.plan.model import memory as planner


def test_mfu_peak_is_the_math_the_run_did():
    h100, v100 = hardware.lookup("H100-SXM"), hardware.lookup("V100-32GB")
    # litgpt's CLI sets float32 matmul precision 'high': 32-true matmuls run as TF32 on Hopper/Ampere
    assert h100.peak_flops("32-true", "high") == pytest.approx(494.7e12)
    assert h100.peak_flops("32-true", "highest") == pytest.approx(66.9e12)
    assert hardware.peak_basis("32-true", "high", h100) == "tf32 dense (float32 matmul precision high)"
    assert v100.peak_flops("32-true", "high") == pytest.approx(15.7e12)  # no TF32 on V100: plain FP32
    assert h100.peak_flops("bf16-mixed", "high") == h100.peak_flops("bf16-true") == pytest.approx(989.4e12)


def test_all_reduce_uses_the_compute_device(monkeypatch):
    """NCCL reduces CUDA tensors only: the loop's sums are made on the rank's device (a CPU tensor there failed
    every --strategy run at its end). 'meta' stands in for cuda here."""
    from tunelab.run import loop as train

    seen = []
    monkeypatch.setattr(train.dist, "all_reduce", lambda t, op=None: seen.append(t.device))
    train.reduce_sum([1.0, 2.0], torch.device("meta"), 2)
    assert seen == [torch.device("meta")]
    train.reduce_sum([1.0, 2.0], torch.device("meta"), 1)  # one rank: no collective at all
    assert seen == [torch.device("meta")]


def test_benchmark_workload_has_the_labs_token_counts(tmp_path):
    """2,000 records, 1,000 training samples after the 0.5 split, and through litgpt's own JSON data module,
    tokenizer and collate at micro batch 8: ~437 padded tokens per sample (the lab's), a long tail cut at 512."""
    import lightning as L
    from litgpt.data import JSON
    from litgpt.tokenizer import Tokenizer

    from tunelab.data import benchmark as benchmark_data

    records = benchmark_data.generate()
    assert len(records) == 2000 and records == benchmark_data.generate()  # deterministic
    benchmark_data.write_tokenizer(tmp_path)
    path = tmp_path / "bench.json"
    path.write_text(json.dumps(records))
    L.seed_everything(1337)
    dm = JSON(json_path=path, mask_prompt=False, val_split_fraction=0.5, prompt_style="alpaca", seed=42, num_workers=0)
    dm.connect(tokenizer=Tokenizer(tmp_path), batch_size=8, max_seq_length=512)
    dm.setup()
    n = padded = full = 0
    for batch in dm.train_dataloader():
        n += batch["input_ids"].shape[0]
        padded += batch["input_ids"].numel()
        full += int((batch["token_counts"]["raw_plus_prompt_template"] == 512).sum())
    assert n == 1000
    assert padded / n == pytest.approx(benchmark_data.LAB_PADDED_PER_SAMPLE, rel=0.03)
    assert 0.02 < full / n < 0.12  # the tail truncated at max_seq_length, as in the lab's Alpaca subset


def test_fit_verdicts_use_the_memory_cuda_exposes():
    """'80GB' boards expose ~79.2 GiB to CUDA (H100 measured: 85,017,493,504 B): a need between that and 80 GiB
    does not fit, and every GPU says where its figure comes from."""
    for gpu in hardware.table().values():
        assert gpu.cuda_total_gib < gpu.memory_gib and gpu.cuda_total_source
    h100 = hardware.lookup("H100-SXM")
    assert h100.memory_bytes == pytest.approx(85_017_493_504, rel=1e-3)
    need = int(79.6 * 2**30)  # fits 80 GiB nominal, not 79.18 GiB
    plan = planner.Plan(
        model="m",
        method="full",
        precision="bf16-true",
        strategy="single",
        devices=1,
        micro_batch_size=1,
        seq_len=512,
        params=1,
        trainable_params=1,
        breakdown_bytes={},
        peak_allocated_bytes=need,
        predicted_reserved_bytes=need - planner.CUDA_CONTEXT_BYTES,
        cuda_context_bytes=planner.CUDA_CONTEXT_BYTES,
        host_ram_bytes=0,
    )
    planner.verdict(plan, h100)
    assert plan.fits is False and plan.margin_bytes < 0 and plan.edge  # short by < 2%: said to be at the edge
    far = planner.verdict(dataclasses.replace(plan, predicted_reserved_bytes=70 * 2**30), h100)
    assert far.fits and not far.edge


def test_report_defines_mfu_on_real_and_padded_tokens():
    from tunelab.report.sweep import COLUMNS, DEFINITIONS

    assert {
        "mfu",
        "mfu_padded",
        "peak_basis",
        "power_steady_w",
        "energy_steady_j_per_1k_tokens",
        "energy_j_per_1k_tokens",
    } <= set(COLUMNS)
    assert "**real** tokens" in DEFINITIONS and "**padded** tokens" in DEFINITIONS
    assert "steady-state window" in DEFINITIONS


def test_committed_h100_report_names_its_device_and_every_row():
    """The first hardware report: made by `tunelab report`, device named, all 14 rows there (not-run ones too)."""
    md = ROOT / "reports" / "2026-11-23-lab-part1-h100" / "results.md"
    if not md.is_file():
        pytest.skip("no H100 report in this checkout")
    text = md.read_text()
    assert "NVIDIA H100 80GB HBM3" in text
    for row in [f"s{i}" for i in range(1, 15)]:
        assert f"| {row} |" in text
    assert "not run" in text
