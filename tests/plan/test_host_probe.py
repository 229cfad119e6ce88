"""The host's time per op measured here (tunelab.plan.trace.host_probe, ``plan --host auto``): litgpt's step of the
planned model at a toy width, per op the planner counts. On CPU here (no CUDA launches: the mechanics, not a
figure to plan with); the GPU figure in tests/e2e/test_gpu.py."""

from __future__ import annotations

import dataclasses

import pytest
from litgpt import Config

from tunelab.plan.model.kernels import ADAM_FOREACH_HOST_OPS_PER_TENSOR
from tunelab.plan.model.memory import PlanInput
from tunelab.plan.trace import host_probe
from tunelab.plan.trace.kernel_trace import record_step


def test_a_toy_width_keeps_the_models_blocks_heads_and_features():
    """Only the widths shrink: the layers, heads, query groups, sliding windows and an MoE's experts (narrowed too)
    stay, so the host dispatches the planned model's ops."""
    gemma = Config.from_name("gemma-2-2b")
    toy = host_probe.toy_config(gemma)
    kept = ("n_layer", "n_head", "n_query_groups", "sliding_window_size", "attention_logit_softcapping")
    assert [getattr(toy, k) for k in kept] == [getattr(gemma, k) for k in kept]
    assert (toy.n_embd, toy.head_size, toy.intermediate_size, toy.padded_vocab_size) == (64, 8, 128, 256)
    mixtral = host_probe.toy_config(Config.from_name("Mixtral-8x7B-v0.1"))  # experts as wide as the MLP
    assert (mixtral.n_expert, mixtral.intermediate_size, mixtral.moe_intermediate_size) == (8, 128, None)
    qwen = host_probe.toy_config(Config.from_name("Qwen3-30B-A3B"))  # experts of their own width
    assert (qwen.n_expert, qwen.moe_intermediate_size) == (128, 128)


def test_the_probe_times_litgpts_step_per_op_as_the_planner_counts_them():
    """On this CPU: every step's figure positive and ordered (fastest, median, slowest), a few to a few hundred
    microseconds an op (a dropped divisor or unit reads seconds or picoseconds), over as many ops as the planner's
    own trace counts in the same step of the same toy model (forward, loss, backward, AdamW, zero_grad), plus the
    for-each AdamW's host work per trainable tensor."""
    config = Config.from_name("tiny-llama-1.1b")
    for method, precision in (("full", "32-true"), ("lora", "bf16-true")):
        case = PlanInput(config, method, precision, seq_len=512)
        probe = host_probe.measure_host(case, "cpu", steps=3, warmup=1)
        assert 0.5 < probe.low_us <= probe.us_per_op <= probe.high_us < 2000, probe
        micro, tokens = host_probe.TOY_BATCH
        traced = record_step(host_probe.toy_config(config), method, precision, micro, tokens, evaluate=False)
        trainable = 22 * 9 + 3 if method == "full" else 22 * 4  # TinyLlama: per block 9 tensors; LoRA: q, v A and B
        planned = len(traced) + trainable * ADAM_FOREACH_HOST_OPS_PER_TENSOR
        assert probe.ops == pytest.approx(planned, rel=0.05), (method, probe.ops, planned)
        assert probe.device == "cpu" and probe.steps == 3
        assert f"{probe.us_per_op:.1f} us an op, measured here (--host auto" in probe.source()


def test_here_without_cuda_or_on_the_fast_path_it_refuses_in_one_line():
    """``measure_here`` needs the GPU the run will use (its launches are part of a host's cost), and a plan whose step
    launches as litgpt's loop does: the fast path (a strategy file's speed switches) has its own launch model, while
    tunelab's loop without a switch (a DDP or FSDP file) is planned at litgpt's host cost and takes the figure."""
    import torch

    case = PlanInput(Config.from_name("tiny-llama-1.1b"), "full", "bf16-true", seq_len=512)
    fast = dataclasses.replace(case, loop=dataclasses.replace(case.loop, fabric=False, compiled=True))
    with pytest.raises(ValueError, match="the fast path.*fix: leave --host out"):
        host_probe.measure_here(fast)
    if torch.cuda.is_available():
        pytest.skip("CUDA here: the GPU test measures it")
    plain = dataclasses.replace(case, loop=dataclasses.replace(case.loop, fabric=False))
    for litgpts_launches in (case, plain):
        with pytest.raises(ValueError, match="no CUDA device here.*fix: run it on the machine the run will use"):
            host_probe.measure_here(litgpts_launches)
