"""What only a CUDA GPU can show (pytest -m gpu on the lent GPU machine; skipped elsewhere with the reason):
the CUDA allocator figures, NVML power and energy in a record, the steady-state window, one strategy run per
backend at world size 1 over NCCL, and a parent process that holds no CUDA memory while its child trains."""

from __future__ import annotations

import pytest

from tunelab.recipes import resolve
from tunelab.run.runner import RunOptions, run

pytestmark = pytest.mark.gpu


def need_cuda():
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")


STEPS = ["--data.num_workers", "0", "--eval.final_validation", "false"]


def test_record_holds_allocator_nvml_and_steady_window(tiny_ckpt, tmp_path):
    need_cuda()
    import torch

    rec = run(
        resolve("tiny-llama-1.1b/lora"),
        [*STEPS, "--train.max_steps", "40", "--checkpoint_dir", str(tiny_ckpt)],
        tmp_path / "r",
        RunOptions(model="checkpoint", nvml_hz=50),
    )
    assert rec.status == "ok", rec.error
    assert (
        rec.device_type == "cuda"
        and rec.peak_allocated_bytes > 0
        and rec.peak_reserved_bytes >= rec.peak_allocated_bytes
        and rec.num_alloc_retries is not None
    )
    r0 = rec.ranks[0]
    assert r0.float32_matmul_precision == "high" and r0.cuda_total_bytes > 0
    assert set(r0.phase_peak_allocated) == {"loaded", "first_step", "end"}
    assert rec.gpus and rec.gpus[0].samples > 0 and rec.power_mean_w > 0 and rec.energy_j > 0
    assert rec.steady_window_s > 0 and rec.power_steady_w > 0 and rec.energy_steady_j > 0
    assert rec.mfu is not None and rec.mfu_padded >= rec.mfu and rec.peak_basis == "bf16 dense"
    assert not torch.cuda.is_initialized()  # the parent never touched CUDA: all of it was the child's


@pytest.mark.parametrize("strategy", ["ddp", "fsdp", "deepspeed-zero3"])
def test_strategy_at_world_size_one_over_nccl(strategy, tiny_ckpt, tmp_path):
    """The multi-device loop's code path on one GPU (NCCL, world size 1): it must finish and write its record
    (an all-reduce of a CPU tensor on NCCL failed every --strategy run at its end)."""
    need_cuda()
    rec = run(
        resolve("tiny-llama-1.1b/full"),
        ["--devices", "1", "--train.max_steps", "3", "--data.num_workers", "0", "--checkpoint_dir", str(tiny_ckpt)],
        tmp_path / strategy,
        RunOptions(model="checkpoint", strategy=strategy, timeout_s=600),
    )
    assert rec.status == "ok", rec.error
    assert rec.val_loss_final is not None  # the final validation's all-reduce ran
    assert len(rec.ranks) == 1 and rec.ranks[0].peak_allocated_bytes > 0
    assert rec.ranks[0].float32_matmul_precision == "high"  # as litgpt's CLI


def test_random_weights_build_in_a_child(tmp_path):
    """--weights random builds the checkpoint in a child process: this process holds no CUDA memory after."""
    need_cuda()
    import torch

    rec = run(
        resolve("tiny-llama-1.1b/lora"),
        [*STEPS, "--train.max_steps", "2", "--checkpoint_dir", "checkpoints/EleutherAI/pythia-14m"],
        tmp_path / "p",
        RunOptions(model="random"),
    )
    assert rec.status == "ok", rec.error
    assert not torch.cuda.is_initialized()
    assert rec.saves_skipped and not list((tmp_path / "p" / "litgpt").rglob("*.pth*"))


@pytest.mark.parametrize("method", ["full", "lora"])
def test_fast_path_on_a_gpu(method, tiny_ckpt, tmp_path):
    """configs/strategies/fast.yaml on CUDA: the prefetcher's side stream, compiled blocks (Triton), the fused CUDA
    AdamW and the loss read every 25 iterations; the first iteration (compilation) recorded apart; the loss falls."""
    need_cuda()
    rec = run(
        resolve(f"tiny-llama-1.1b/{method}"),
        ["--devices", "1", "--train.max_steps", "60", "--data.num_workers", "0", "--checkpoint_dir", str(tiny_ckpt)],
        tmp_path / method,
        RunOptions(model="checkpoint", strategy="fast", timeout_s=600),
    )
    assert rec.status == "ok", rec.error
    assert rec.first_iteration_s > 0 and rec.tok_s_real > 0 and rec.peak_allocated_bytes > 0
    assert rec.loss_last < rec.loss_first and rec.optimizer_steps == 60


def test_memory_history_replays_to_the_allocators_own_peak(tiny_ckpt, tmp_path, monkeypatch):
    """TUNELAB_MEMORY_HISTORY=1: the child records the allocator's history and leaves memory-rank0.json; replayed,
    the history's highest point (bytes requested) lies just under the peak torch reports (max_memory_allocated, the
    allocator's rounded blocks), the callers alive there add up to it, and litgpt's code is among them."""
    need_cuda()
    import json

    from tunelab.run import memory_history

    monkeypatch.setenv(memory_history.ENV, "1")
    rec = run(
        resolve("tiny-llama-1.1b/lora"),
        [*STEPS, "--train.max_steps", "4", "--checkpoint_dir", str(tiny_ckpt)],
        tmp_path / "r",
        RunOptions(model="checkpoint"),
    )
    assert rec.status == "ok", rec.error
    mem = json.loads((tmp_path / "r" / "stats" / "memory-rank0.json").read_text())
    phases = mem["phases"]
    assert not mem["truncated"] and mem["events"] > 0
    peak = max(p["peak_bytes"] for p in phases.values())
    assert 0.5 * mem["max_memory_allocated_bytes"] < peak <= mem["max_memory_allocated_bytes"]
    assert 0 < phases["loaded"]["peak_bytes"] <= phases["training"]["peak_bytes"]
    for p in phases.values():
        assert sum(n for _, n in p["alive_by_caller"]) <= p["peak_bytes"]  # the top callers, at most all of it
    assert any("litgpt/" in who for who, _ in phases["training"]["alive_by_caller"])


def test_host_auto_measures_litgpts_step_per_op_on_the_gpu():
    """`plan --host auto` on a GPU machine: litgpt's step at a toy width on CUDA, a figure of the order the
    host-bound runs we hold imply (tens of microseconds an op), every step's within a factor of two of the median."""
    need_cuda()
    from tunelab.plan.recipe import plan_recipe
    from tunelab.plan.trace.host_probe import measure_here

    probe = measure_here(plan_recipe(resolve("tiny-llama-1.1b/full"), [], gpu=None).input)
    assert probe.device == "cuda" and 3 < probe.us_per_op < 500, probe
    assert probe.low_us > probe.us_per_op / 2 and probe.high_us < 2 * probe.us_per_op, probe
