"""Several devices simulated per rank (tunelab.plan.ranks): FSDP2 sharded as the run shards it under a fake process
group, DDP's buckets; the plan checked against the simulation, the traced collectives against comm.py."""

from __future__ import annotations

import pytest

from tests.plan.test_ranks import _variant
from tunelab.plan import ranks
from tunelab.plan.recipe import plan_recipe
from tunelab.plan.simulate import optimizer_of
from tunelab.recipes import resolve
from tunelab.strategies import load_strategy

GEMMA = ("open-llama-3b", "checkpoints/google/gemma-2b")
"""Gemma 2B on OpenLLaMA 3B's recipe: a 256k vocabulary, where the head, the root unit and the logits are largest."""


@pytest.mark.parametrize(
    ("model", "strategy", "method", "world"),
    [
        (("tiny-llama-1.1b", None), "fsdp2", "full", 8),
        (("tiny-llama-1.1b", None), "fsdp2", "full", 4),
        (("tiny-llama-1.1b", None), "ddp", "lora", 4),
        pytest.param(("tiny-llama-1.1b", None), "fsdp2", "lora", 2, marks=pytest.mark.slow),  # 35 s: DDP's LoRA
        pytest.param(("open-llama-3b", None), "fsdp2", "lora", 2, marks=pytest.mark.slow),  # 40 s: as above
        (GEMMA, "fsdp2", "full", 2),
        (GEMMA, "ddp", "lora", 2),
        pytest.param(GEMMA, "fsdp", "lora", 8, marks=pytest.mark.slow),  # -m slow: a minute; FSDP1 LoRA below
        (GEMMA, "fsdp", "full", 8),
    ],
)
def test_the_plan_is_within_3_percent_of_rank_0s_simulated_peak(model, strategy, method, world):
    """Recipes at micro 2 x 512 on several devices under a strategy file (tunelab's loop: its loss function drops
    the logits before backward): the plan's peak per device against rank 0's simulated step. Each case holds a term
    by cause: FSDP2 gathers nothing at the loss and the root twice over at the backward's start (TinyLlama LoRA,
    Gemma full: +4.3% and +4.6% when the gathered units and the logits were summed), a late block's forward holds
    the root and three blocks (OpenLLaMA 3B LoRA); tunelab's loop on one device or DDP holds the chunks and the last
    one's reshaped copy at its loss, not the backward's temporaries (Gemma LoRA, DDP); FSDP1 LoRA sums the head's
    gradients in backward (Gemma on 8: -4.9% without); FSDP1's loss runs with the root gathered and no block
    (Gemma full on 8: +5.0% with both). On 4 devices TinyLlama's recipe accumulates 2 micro batches."""
    recipe, checkpoint = model
    overrides = ["--train.micro_batch_size", "2", "--train.max_seq_length", "512"]
    planned = plan_recipe(
        resolve(f"{recipe}/{method}"), overrides + (["--checkpoint_dir", checkpoint] if checkpoint else []),
        gpu=None, devices=world, strategy=strategy,
    )  # fmt: skip
    x = planned.input
    assert not x.activation_checkpointing
    sim = ranks.simulate_ranks(
        x.config, load_strategy(strategy), world, method, str(x.precision), 2, 512, x.accumulation, optimizer_of(x),
        x.lora_r, x.lora_targets,
    )  # fmt: skip
    assert planned.plan.peak_allocated_bytes == pytest.approx(sim.peak_bytes, rel=0.03)


@pytest.mark.parametrize(
    ("model", "method", "world", "precision"),
    [
        (("tiny-llama-1.1b", None), "full", 8, None),
        pytest.param(("tiny-llama-1.1b", None), "lora", 4, None, marks=pytest.mark.slow),  # 55 s: DDP's LoRA above
        pytest.param(("open-llama-3b", None), "full", 8, None, marks=pytest.mark.slow),  # 25 s: TinyLlama's full
        pytest.param(
            GEMMA, "full", 2, None, marks=pytest.mark.slow
        ),  # 30 s; Gemma full against rank 0 under FSDP2 above
        (("tiny-llama-1.1b", None), "full", 4, "bf16-mixed"),
        pytest.param(("tiny-llama-1.1b", None), "lora", 4, "bf16-mixed", marks=pytest.mark.slow),  # 40 s: as above
    ],
)
def test_litgpts_own_choice_is_planned_within_2_percent_of_rank_0(model, method, world, precision):
    """``tunelab plan RECIPE --devices N`` without a strategy file (litgpt's own choice, each block checkpointed, the
    logits held by litgpt's loop until the next forward) against rank 0 wrapped as litgpt's scripts wrap it.
    TinyLlama full (32-true) on 8 peaks at FSDP1's backward end: the root unit's gradient twice over beside its
    parameters and every block's sharded gradient (-5.2% without that moment, -3.4% without the held logits).
    TinyLlama LoRA on 4 (accumulation 2) peaks at FSDP2's forward start: the root and the first block each beside
    its all-gather buffer, the last micro batch's logits (+19.6% when the plan summed a regathered root with the
    logits at the loss; -2.5% without the forward's start, the loss beside the kept root then the largest).
    OpenLLaMA 3B full (bf16) on 8 peaks in the first block's backward, the last to run: every other block's sharded
    gradient outweighs the checkpointed inputs freed (-6.5% without that moment). Gemma 2B full on 2, accumulating
    4, peaks at a middle micro batch's backward end: the root's new flat gradient and its original parameters'
    beside every accumulated unsharded gradient (-8.0% without). At bf16-mixed, Lightning's FSDPPrecision gathers
    and reduces full fine-tuning's parameters in bf16 (+47% when planned in fp32), and litgpt's LoRA runs autocast
    over FSDP2's fp32 weights, whose checkpointed blocks keep no autocast copy, the head's only (+79% with every
    block's copy; -5.3% with none)."""
    recipe, checkpoint = model
    overrides = ["--train.micro_batch_size", "2", "--train.max_seq_length", "512"]
    overrides += ["--checkpoint_dir", checkpoint] if checkpoint else []
    overrides += ["--precision", precision] if precision else []
    planned = plan_recipe(resolve(f"{recipe}/{method}"), overrides, gpu=None, devices=world)
    x = planned.input
    assert x.activation_checkpointing and x.fabric
    sim = ranks.for_plan(x, None)
    assert sim.strategy == "litgpt"
    assert planned.plan.peak_allocated_bytes == pytest.approx(sim.peak_bytes, rel=0.02 if precision else 0.015)


@pytest.mark.parametrize(("world", "accumulation"), [(4, 1), (2, 2)])
def test_lora_under_fsdp1_is_planned_within_5_percent_of_rank_0(world, accumulation):
    """TinyLlama's width with 4 blocks, LoRA on litgpt's default targets under a ``name: fsdp`` file: its frozen
    weights are differentiable views during the forward (every matmul keeps its input, as in full fine-tuning) and
    take gradients (flat parameters): the plan within 5% of rank 0's simulated peak (TinyLlama's 22 blocks: -0.8% on
    4 devices; without the two terms -41% and -20%)."""
    import dataclasses

    from litgpt import Config

    from tunelab.plan import memory
    from tunelab.settings import LORA_TARGETS

    c = dataclasses.replace(Config.from_name("tiny-llama-1.1b"), n_layer=4)
    x = memory.PlanInput(config=c, method="lora", precision="bf16-true", micro_batch_size=2, seq_len=256, lora_r=8,
                         lora_targets=LORA_TARGETS, fabric=False, strategy="fsdp", fsdp_root_kept=True, devices=world,
                         accumulation=accumulation)  # fmt: skip
    sim = ranks.simulate_ranks(c, load_strategy("fsdp"), world, "lora", "bf16-true", 2, 256, accumulation=accumulation,
                               lora_r=8, lora_targets=LORA_TARGETS)  # fmt: skip
    assert memory.predict(x).peak_allocated_bytes == pytest.approx(sim.peak_bytes, rel=0.05)


def test_full_fine_tuning_under_fsdp1_peaks_in_backward_as_planned():
    """TinyLlama's full recipe (32-true) under a ``name: fsdp`` file on 8 devices, micro 2 x 512: rank 0's peak is in
    backward, where FSDP1 holds a block's unsharded gradient twice over (its flat parameter's and its original
    parameters'), the head's gradient and one activation gradient beside every activation, the logits freed
    (memory.fsdp1_backward_gradients); the plan names that peak and is within 1% of the simulation (without the
    term it planned the forward's end, -2.6%; OpenLLaMA 3B -4.5%: reports/planner-strategies/)."""
    planned = plan_recipe(
        resolve("tiny-llama-1.1b/full"), ["--train.micro_batch_size", "2", "--train.max_seq_length", "512"],
        gpu=None, devices=8, strategy="fsdp",
    )  # fmt: skip
    x, plan = planned.input, planned.plan
    sim = ranks.simulate_ranks(x.config, load_strategy("fsdp"), 8, "full", str(x.precision), 2, 512, x.accumulation,
                               optimizer_of(x))  # fmt: skip
    assert sim.peak_phase == "backward" and plan.breakdown_bytes["fsdp1_backward_gradients"] > 0
    assert plan.breakdown_bytes["logits_and_loss"] == 0
    assert plan.peak_allocated_bytes == pytest.approx(sim.peak_bytes, rel=0.01)


@pytest.mark.parametrize(("method", "accumulation"), [("full", 1), ("full", 2), ("lora", 2)])
def test_fsdp1_without_auto_wrap_peaks_at_the_backwards_end(method, accumulation):
    """One unit (``fsdp-no-wrap``): the peak is the backward's end, every activation freed, the whole model's
    unsharded gradient twice over (flat parameter's and original parameters'; under LoRA the flat parameter's whole
    gradient) beside the gathered model and the no_sync() gradients; the plan names it and is within 1% (before:
    the forward's end, -21.5% on TinyLlama full)."""
    from tunelab.plan import memory

    sim, x = _variant("fsdp-no-wrap", method, accumulation)
    plan = memory.predict(x)
    assert sim.peak_phase == "backward" and sim.phases["backward"].get("Activation", 0) < 1e3  # a scalar or two
    assert plan.breakdown_bytes["fsdp1_backward_gradients"] > 0 and plan.breakdown_bytes["activations"] == 0
    assert plan.peak_allocated_bytes == pytest.approx(sim.peak_bytes, rel=0.01)


@pytest.mark.parametrize(("method", "world"), [("full", 8), pytest.param("lora", 4, marks=pytest.mark.slow)])  # 50 s
def test_fsdp_offload_is_planned_on_the_device_within_1_percent(method, world):
    """``fsdp-offload`` (FSDP1's ``cpu_offload``) simulated on the stand-in accelerator (tunelab.plan.fake_device):
    the device holds the gathered units, each beside its shard's device copy, and the backward's sharded gradients,
    not the shards, their host gradients or the optimizer's states (the step runs on the host: nothing on the device
    then). TinyLlama full (32-true) on 8: +14.6% when the plan kept the optimizer's states on the device (and two
    blocks of weights), -2.0% without the shards' device copies; LoRA on 4 (accumulating 2) holds no_sync()'s
    unsharded gradients on the device as without offload. The host's peak per rank: the shards and the optimizer's
    states beside the step, or, for LoRA, beside a host gradient made again after a step (zeros and their pinned
    copy at once: -34% without that moment)."""
    planned = plan_recipe(
        resolve(f"tiny-llama-1.1b/{method}"), ["--train.micro_batch_size", "2", "--train.max_seq_length", "512"],
        gpu=None, devices=world, strategy="fsdp-offload",
    )  # fmt: skip
    x = planned.input
    sim = ranks.for_plan(x, load_strategy("fsdp-offload"))
    assert planned.plan.peak_allocated_bytes == pytest.approx(sim.peak_bytes, rel=0.01)
    assert sim.phases["optimizer step"]["Total"] < 1e6  # the step on the host
    assert sim.host_peak_bytes == pytest.approx(planned.plan.host_ram_bytes, rel=0.02)  # host RAM per rank
