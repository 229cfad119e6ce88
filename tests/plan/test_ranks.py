"""Several devices simulated per rank (tunelab.plan.trace.ranks): FSDP2 sharded as the run shards it under a fake process
group, DDP's buckets; the plan checked against the simulation, the traced collectives against comm.py."""

from __future__ import annotations

import pytest

from tunelab.models import count_params, lora_param_count
from tunelab.plan.model import comm
from tunelab.plan.model.case import PlanInput
from tunelab.plan.recipe import plan_recipe
from tunelab.plan.trace import ranks
from tunelab.plan.trace.tables import TRACED
from tunelab.recipes import resolve
from tunelab.strategies import load_strategy


def small_llama(n_layer: int = 3):
    from litgpt import Config

    return Config(
        name="small-llama",
        block_size=256,
        vocab_size=1000,
        padded_vocab_size=1024,
        n_layer=n_layer,
        n_head=4,
        n_embd=256,
        n_query_groups=4,
        rotary_percentage=1.0,
        parallel_residual=False,
        bias=False,
        norm_class_name="RMSNorm",
        mlp_class_name="LLaMAMLP",
        intermediate_size=688,
    )


def case(config, method: str, world: int, precision: str = "bf16-true", **fields) -> PlanInput:
    """Rank 0's case on ``world`` devices: ``config`` at micro 2 x 64 tokens."""
    return PlanInput.of(
        config=config, method=method, precision=precision, micro_batch_size=2, seq_len=64, devices=world, **fields
    )


def test_fsdp2_rank_holds_its_shard_and_gathers_what_comm_py_says():
    """Sharded parameters and optimizer states are exactly 1/world of the model's (bf16, AdamW: two states); the
    traced bytes each device sends per step equal comm.py's FULL_SHARD formula with accumulation (gathered for
    forward and backward of each micro batch, gradients reduce-scattered once)."""
    config, world = small_llama(), 4
    sim = ranks.simulate_ranks(case(config, "full", world, accumulation=2), load_strategy("fsdp2"))
    total, _ = count_params(config)
    step = sim.phases["optimizer step"]
    assert step["Sharded Param"] == pytest.approx(total * 2 / world, rel=0.01)
    # two bf16 states and one for-each temporary list, all of shard size (DTensor's shape inference not counted)
    assert 2 * total * 2 / world <= step["OptState"] <= 3 * total * 2 / world * 1.01
    assert {c.kind for c in sim.collectives} == {"all-gather", "reduce-scatter"}
    assert sum(c.calls for c in sim.collectives if c.kind == "reduce-scatter") == config.n_layer + 1  # once per unit

    x = PlanInput.of(
        config=config,
        method="full",
        precision="bf16-true",
        micro_batch_size=2,
        seq_len=64,
        accumulation=2,
        devices=world,
        strategy="fsdp",
        sharding="FULL_SHARD",
        tables=TRACED,
    )
    link = comm.lookup("nvlink4", "gpu")
    planned = comm.per_step(x, link, param_bytes=2)
    assert sim.bytes_moved() == pytest.approx(planned.bytes_gpu, rel=0.01)
    traced = {k: sum(c.calls for c in sim.collectives if c.kind == k) for k in ("all-gather", "reduce-scatter")}
    assert {k: n for k, n, _, _ in planned.calls} == traced  # the calls comm.py charges NCCL's latency for
    # four micro batches: three without sync gather as often as the simulated one did
    four = ranks.simulate_ranks(case(config, "full", world, accumulation=4), load_strategy("fsdp2"))
    x4 = x.changed(accumulation=4)
    assert four.bytes_moved() == pytest.approx(comm.per_step(x4, link, param_bytes=2).bytes_gpu, rel=0.01)
    assert four.phases == sim.phases  # memory: a third micro batch adds nothing


def test_ddp_buckets_are_ddps_own_assignment_of_the_trainable_gradients():
    """The buckets hold every trainable gradient once; the first (gradient-ready order: the model's last
    parameters) is capped at 1 MiB, the others at bucket_cap_mb; each is one all-reduce in backward."""
    config = small_llama()
    full = ranks.ddp_buckets(config, "full", "bf16-true", bucket_cap_mb=1)
    total, _ = count_params(config)
    assert sum(full) == total * 2
    assert len(full) > 2
    targets = ("query", "value")
    lora = ranks.ddp_buckets(config, "lora", "bf16-true", bucket_cap_mb=25, lora_r=8, targets=targets)
    assert sum(lora) == lora_param_count(config, 8, targets) * 2
    sim = ranks.simulate_ranks(case(config, "full", 2), load_strategy("ddp"))
    assert sim.bytes_moved("all-reduce") == pytest.approx(2 * (1 / 2) * total * 2)
    assert all(snap["Buckets"] == total * 2 for snap in sim.phases.values())

    x = PlanInput(
        config=config,
        method="full",
        precision="bf16-true",
        micro_batch_size=2,
        seq_len=64,
        devices=2,
        strategy="ddp",
        tables=TRACED,
    )
    planned = comm.per_step(x, comm.lookup("nvlink4", "gpu"))
    assert planned.calls == [("all-reduce", sum(c.calls for c in sim.collectives), 2, 0)]  # one call per bucket


@pytest.mark.parametrize(
    ("method", "precision"), [("full", "bf16-true"), ("lora", "bf16-true"), ("full", "bf16-mixed")]
)
def test_litgpts_own_choice_is_wrapped_as_litgpts_scripts_wrap_it_and_keeps_its_root(method, precision):
    """No strategy file (litgpt's own choice): full fine-tuning wrapped by Lightning's own FSDPStrategy with the
    keywords litgpt's finetune/full.py passes (read from its source), LoRA by litgpt's parallelize_fn (FSDP2), each
    block checkpointed. Both keep the root unit gathered from forward to backward (FSDP1 always, FSDP2 by torch's
    default ``reshard_after_forward=None``), so a micro batch gathers it once; the traced calls and bytes equal
    comm.py's for the plan of litgpt's own choice (under bf16-mixed Lightning's FSDPPrecision gathers and reduces
    in bf16: half the bytes of fp32)."""
    from dataclasses import replace

    from litgpt.model import Block

    assert ranks.litgpt_fsdp_keywords() == {
        "auto_wrap_policy": {Block},
        "activation_checkpointing_policy": {Block},
        "state_dict_type": "full",
        "limit_all_gathers": True,
        "cpu_offload": False,
    }
    config, world = small_llama(), 4
    sim = ranks.simulate_ranks(case(config, method, world, precision, accumulation=2), None)
    assert sim.strategy == "litgpt" and sim.activation_checkpointing
    assert "Lightning's FSDPStrategy" in sim.notes[0] if method == "full" else "parallelize_fn" in sim.notes[0]
    units = config.n_layer + 1
    gathers = {
        p: sum(c.calls for c in sim.collectives if c.kind == "all-gather" and c.phase == p)
        for p in ("forward", "backward")
    }
    assert gathers == {"forward": 2 * units, "backward": 2 * (units - 1)}  # the root: forward only
    overrides = ["--precision", precision, "--train.global_batch_size", "128"]  # a batch litgpt's scripts can feed
    x = plan_recipe(resolve(f"tiny-llama-1.1b/{method}"), overrides, gpu=None, devices=world).input
    x = replace(x, config=config, micro_batch_size=2, seq_len=64, accumulation=2)
    planned = comm.per_step(x, comm.lookup("nvlink4", "gpu"))
    traced = {k: sum(c.calls for c in sim.collectives if c.kind == k) for k in ("all-gather", "reduce-scatter")}
    assert {k: n for k, n, _, _ in planned.calls} == traced
    assert sim.bytes_moved() == pytest.approx(planned.bytes_gpu, rel=0.03)


@pytest.mark.parametrize("name", ["fsdp", "fsdp-no-wrap"])
def test_fsdp1_rank_is_simulated_and_its_gathers_are_what_comm_py_says(name):
    """FSDP1 (what litgpt's CLI runs, and a ``name: fsdp`` file) on fake tensors and the fake process group: each
    block gathered for forward and again for backward, the root unit (embedding, final norm, head) once per forward
    and kept for backward (FSDP1 does not free the root after forward; with no auto-wrap the whole model is the root),
    gradients reduce-scattered once per step after no_sync() micro batches; the bytes each device sends equal
    comm.py's formula; no_sync keeps whole unsharded gradients (accumulation 2 holds more than 1)."""
    config, world = small_llama(), 4
    sim = ranks.simulate_ranks(case(config, "full", world, accumulation=2), load_strategy(name))
    one = ranks.simulate_ranks(case(config, "full", world), load_strategy(name))
    units = 1 if name == "fsdp-no-wrap" else config.n_layer + 1
    gathers = {
        p: sum(c.calls for c in sim.collectives if c.kind == "all-gather" and c.phase == p)
        for p in ("forward", "backward")
    }
    assert gathers == {"forward": 2 * units, "backward": 2 * (units - 1)}  # the root: forward only
    assert sum(c.calls for c in sim.collectives if c.kind == "reduce-scatter") == units
    x = plan_recipe(resolve("tiny-llama-1.1b/full"), [], gpu=None, devices=world, strategy=name).input
    x = x.changed(config=config, micro_batch_size=2, seq_len=64, accumulation=2)
    assert x.options.fsdp_root_kept
    planned = comm.per_step(x, comm.lookup("nvlink4", "gpu"), param_bytes=2)
    assert sim.bytes_moved() == pytest.approx(planned.bytes_gpu, rel=0.01)
    traced = {k: sum(c.calls for c in sim.collectives if c.kind == k) for k in ("all-gather", "reduce-scatter")}
    assert {k: n for k, n, _, _ in planned.calls} == traced  # the calls comm.py charges NCCL's latency for
    total, _ = count_params(config)
    assert sim.peak_bytes - one.peak_bytes == pytest.approx(total * 2, rel=0.1)  # the unsharded gradients


def test_the_plans_activation_checkpointing_is_what_the_rank_simulation_runs(capsys):
    """`plan --strategy fsdp --activation-checkpointing --simulate`: the file does not checkpoint, the plan asks it;
    rank 0's simulation runs the plan's choice (it simulated without and printed a -74% gap at TinyLlama micro 64)."""
    config, world = small_llama(), 2
    fields = {"strategy": "fsdp", "fsdp_root_kept": True, "precision": "bf16-mixed", "tables": TRACED}
    asked, plain = (case(config, "full", world, activation_checkpointing=ac, **fields) for ac in (True, False))
    checkpointed, not_checkpointed = ranks.simulation(asked, "fsdp"), ranks.simulation(plain, "fsdp")
    assert checkpointed.activation_checkpointing and not not_checkpointed.activation_checkpointing
    acts = [sim.phases["forward"]["Activation"] for sim in (checkpointed, not_checkpointed)]
    assert acts[0] < acts[1]
