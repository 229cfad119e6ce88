"""What a GPU run would get wrong, checked here on CPU: the MFU peak of 32-true runs (TF32), the multi-device
loop's all-reduce device, the benchmark workload's token counts, the usable GPU memory in fit verdicts."""

from __future__ import annotations

import pytest


@pytest.mark.slow  # 35 s on 2 cores (two training runs); the run's matmul precision as the record keeps it is
# what it means for MFU is checked in-process (tests/run/test_gpu_ready.py); that both paths set it runs here alone
def test_litgpt_and_strategy_runs_compute_float32_the_same_way(tiny_ckpt, tmp_path):
    """Both paths run with float32 matmul precision 'high' (litgpt's CLI sets it; the multi-device loop now does
    too), and the record keeps it: a 32-true recipe is the same computation on one GPU and under --strategy."""
    from tunelab.recipes import resolve
    from tunelab.run.runner import RunOptions, run

    common = [
        "--precision",
        "32-true",
        "--train.max_steps",
        "2",
        "--data.num_workers",
        "0",
        "--eval.final_validation",
        "false",
        "--checkpoint_dir",
        str(tiny_ckpt),
    ]
    single = run(resolve("tiny-llama-1.1b/full"), common, tmp_path / "single", RunOptions(model="checkpoint"))
    ddp = run(
        resolve("tiny-llama-1.1b/full"),
        [*common, "--devices", "1"],
        tmp_path / "ddp",
        RunOptions(model="checkpoint", strategy="ddp"),
    )
    assert single.status == ddp.status == "ok", (single.error, ddp.error)
    assert single.ranks[0].float32_matmul_precision == ddp.ranks[0].float32_matmul_precision == "high"
