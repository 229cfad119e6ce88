"""Several devices simulated per rank (tunelab.plan.ranks): FSDP2 sharded as the run shards it under a fake process
group, DDP's buckets; the plan checked against the simulation, the traced collectives against comm.py."""

from __future__ import annotations

import pytest

from tunelab.models import count_params, lora_param_count
from tunelab.plan import comm, ranks
from tunelab.plan.recipe import plan_recipe
from tunelab.recipes import resolve
from tunelab.strategies import load_strategy


def small_llama(n_layer: int = 3):
    from litgpt import Config

    return Config(
        name="small-llama", block_size=256, vocab_size=1000, padded_vocab_size=1024, n_layer=n_layer, n_head=4,
        n_embd=256, n_query_groups=4, rotary_percentage=1.0, parallel_residual=False, bias=False,
        norm_class_name="RMSNorm", mlp_class_name="LLaMAMLP", intermediate_size=688,
    )  # fmt: skip


def test_fsdp2_rank_holds_its_shard_and_gathers_what_comm_py_says():
    """Sharded parameters and optimizer states are exactly 1/world of the model's (bf16, AdamW: two states); the
    traced bytes each device sends per step equal comm.py's FULL_SHARD formula with accumulation (gathered for
    forward and backward of each micro batch, gradients reduce-scattered once)."""
    config, world = small_llama(), 4
    sim = ranks.simulate_ranks(config, load_strategy("fsdp2"), world, "full", "bf16-true", 2, 64, accumulation=2)
    total, _ = count_params(config)
    step = sim.phases["optimizer step"]
    assert step["Sharded Param"] == pytest.approx(total * 2 / world, rel=0.01)
    # two bf16 states and one for-each temporary list, all of shard size (DTensor's shape inference not counted)
    assert 2 * total * 2 / world <= step["OptState"] <= 3 * total * 2 / world * 1.01
    assert {c.kind for c in sim.collectives} == {"all-gather", "reduce-scatter"}
    assert sum(c.calls for c in sim.collectives if c.kind == "reduce-scatter") == config.n_layer + 1  # once per unit

    from tunelab.plan.memory import PlanInput

    x = PlanInput(config=config, method="full", precision="bf16-true", micro_batch_size=2, seq_len=64,
                  accumulation=2, devices=world, strategy="fsdp", sharding="FULL_SHARD")  # fmt: skip
    link = comm.lookup("nvlink4", "gpu")
    planned = comm.per_step(x, link, param_bytes=2)
    assert sim.bytes_moved() == pytest.approx(planned.bytes_gpu, rel=0.01)
    traced = {k: sum(c.calls for c in sim.collectives if c.kind == k) for k in ("all-gather", "reduce-scatter")}
    assert {k: n for k, n, _, _ in planned.calls} == traced  # the calls comm.py charges NCCL's latency for
    # four micro batches: three without sync gather as often as the simulated one did
    four = ranks.simulate_ranks(config, load_strategy("fsdp2"), world, "full", "bf16-true", 2, 64, accumulation=4)
    x4 = PlanInput(**{**x.__dict__, "accumulation": 4})
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
    sim = ranks.simulate_ranks(config, load_strategy("ddp"), 2, "full", "bf16-true", 2, 64)
    assert sim.bytes_moved("all-reduce") == pytest.approx(2 * (1 / 2) * total * 2)
    assert all(snap["Buckets"] == total * 2 for snap in sim.phases.values())
    from tunelab.plan.memory import PlanInput

    x = PlanInput(config=config, method="full", precision="bf16-true", micro_batch_size=2, seq_len=64, devices=2,
                  strategy="ddp")  # fmt: skip
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
        "auto_wrap_policy": {Block}, "activation_checkpointing_policy": {Block}, "state_dict_type": "full",
        "limit_all_gathers": True, "cpu_offload": False,
    }  # fmt: skip
    config, world = small_llama(), 4
    sim = ranks.simulate_ranks(config, None, world, method, precision, 2, 64, accumulation=2)
    assert sim.strategy == "litgpt" and sim.activation_checkpointing
    assert "Lightning's FSDPStrategy" in sim.notes[0] if method == "full" else "parallelize_fn" in sim.notes[0]
    units = config.n_layer + 1
    gathers = {p: sum(c.calls for c in sim.collectives if c.kind == "all-gather" and c.phase == p) for p in
               ("forward", "backward")}  # fmt: skip
    assert gathers == {"forward": 2 * units, "backward": 2 * (units - 1)}  # the root: forward only
    x = plan_recipe(resolve(f"tiny-llama-1.1b/{method}"), ["--precision", precision], gpu=None, devices=world).input
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
    sim = ranks.simulate_ranks(config, load_strategy(name), world, "full", "bf16-true", 2, 64, accumulation=2)
    one = ranks.simulate_ranks(config, load_strategy(name), world, "full", "bf16-true", 2, 64, accumulation=1)
    units = 1 if name == "fsdp-no-wrap" else config.n_layer + 1
    gathers = {p: sum(c.calls for c in sim.collectives if c.kind == "all-gather" and c.phase == p) for p in
               ("forward", "backward")}  # fmt: skip
    assert gathers == {"forward": 2 * units, "backward": 2 * (units - 1)}  # the root: forward only
    assert sum(c.calls for c in sim.collectives if c.kind == "reduce-scatter") == units
    x = plan_recipe(resolve("tiny-llama-1.1b/full"), [], gpu=None, devices=world, strategy=name).input
    x = x.__class__(**{**x.__dict__, "config": config, "micro_batch_size": 2, "seq_len": 64, "accumulation": 2})
    assert x.fsdp_root_kept
    planned = comm.per_step(x, comm.lookup("nvlink4", "gpu"), param_bytes=2)
    assert sim.bytes_moved() == pytest.approx(planned.bytes_gpu, rel=0.01)
    traced = {k: sum(c.calls for c in sim.collectives if c.kind == k) for k in ("all-gather", "reduce-scatter")}
    assert {k: n for k, n, _, _ in planned.calls} == traced  # the calls comm.py charges NCCL's latency for
    total, _ = count_params(config)
    assert sim.peak_bytes - one.peak_bytes == pytest.approx(total * 2, rel=0.1)  # the unsharded gradients


def test_fsdp1_gives_a_lora_models_frozen_weights_gradients():
    """LoRA under FSDP1 (use_orig_params): each block's flat parameter holds frozen and trainable weights and gets a
    gradient for all of them; under no_sync() they are whole. The trace's gradients equal the planner's
    flat_parameter_grads (the head is a target in litgpt's default list: the root unit takes one too), far above
    the adapters' own."""
    from tunelab.plan import memory
    from tunelab.settings import LORA_TARGETS

    config, world = small_llama(), 2
    sim = ranks.simulate_ranks(config, load_strategy("fsdp"), world, "lora", "bf16-true", 2, 64, accumulation=2,
                               lora_r=8, lora_targets=LORA_TARGETS)  # fmt: skip
    x = memory.PlanInput(config=config, method="lora", precision="bf16-true", micro_batch_size=2, seq_len=64,
                         accumulation=2, devices=world, strategy="fsdp", fsdp_root_kept=True, lora_r=8,
                         lora_targets=LORA_TARGETS)  # fmt: skip
    planned = memory.flat_parameter_grads(x, memory.model_states(x, []))
    traced = max(snap.get("Gradient", 0) for snap in sim.phases.values())
    assert traced == pytest.approx(planned, rel=0.05)
    assert planned > 10 * lora_param_count(config, 8, LORA_TARGETS) * 2


def test_fsdp1_lora_reduce_scatters_the_whole_flat_gradients():
    """LoRA under FSDP1 (a ``name: fsdp`` file): each flat parameter mixing frozen and trainable weights gets a whole
    gradient, and FSDP1 reduce-scatters all of it, frozen weights' zeros included: the traced bytes are comm.py's
    (within 3%), not the adapters' gradients alone (before: 21% under on OpenLLaMA 3B)."""
    from tunelab.plan.memory import PlanInput

    config, world, targets = small_llama(), 4, ("query", "value", "head")
    sim = ranks.simulate_ranks(config, load_strategy("fsdp"), world, "lora", "bf16-true", 2, 64, accumulation=2,
                               lora_r=8, lora_targets=targets)  # fmt: skip
    x = PlanInput(config=config, method="lora", lora_r=8, lora_targets=targets, precision="bf16-true",
                  micro_batch_size=2, seq_len=64, accumulation=2, devices=world, strategy="fsdp",
                  sharding="FULL_SHARD", fsdp_root_kept=True)  # fmt: skip
    planned = comm.per_step(x, comm.lookup("nvlink4", "gpu"))
    assert sim.bytes_moved() == pytest.approx(planned.bytes_gpu, rel=0.03)
    assert sim.bytes_moved("reduce-scatter") > 10 * lora_param_count(config, 8, targets) * 2 * (world - 1) / world


def _variant(name: str, method: str, accumulation: int, config=None, seq: int = 64):
    """(rank 0's simulation, the plan's PlanInput) of ``config`` (default ``small_llama``) on 4 devices under an
    FSDP1 strategy file, at the recipe's LoRA settings, bf16-true, micro 2 x ``seq``, tunelab's loop."""
    config, world = config or small_llama(), 4
    x = plan_recipe(resolve(f"tiny-llama-1.1b/{method}"), [], gpu=None, devices=world, strategy=name).input
    x = x.__class__(**{**x.__dict__, "config": config, "micro_batch_size": 2, "seq_len": seq, "precision": "bf16-true",
                       "accumulation": accumulation, "fabric": False})  # fmt: skip
    sim = ranks.simulate_ranks(config, load_strategy(name), world, method, "bf16-true", 2, seq, accumulation,
                               lora_r=x.lora_r, lora_targets=x.lora_targets)  # fmt: skip
    return sim, x


@pytest.mark.parametrize("accumulation", [1, 2, 4])
def test_fsdp1_shard_grad_op_keeps_units_gathered_and_gathers_once_per_step(accumulation):
    """SHARD_GRAD_OP (FSDP1, the ``fsdp-shard-grad-op`` file): no reshard after forward, so every unit is gathered
    at the forward's end (the whole model beside its shard) and, under no_sync(), kept through the micro batches:
    one all-gather per unit per optimizer step, none in backward, whatever the accumulation (comm.py charged one per
    micro batch: +50% on TinyLlama; the simulation counted the first micro batch's gathers for each of the first
    a - 1); the optimizer's states sharded (the plan kept them whole under accumulation: +32.5%)."""
    from tunelab.plan import memory

    sim, x = _variant("fsdp-shard-grad-op", "full", accumulation)
    total, _ = count_params(x.config)
    assert sim.phases["forward"]["Parameter"] == pytest.approx(total * 2 * (1 + 1 / 4), rel=0.01)
    gathers = {p: sum(c.calls for c in sim.collectives if c.kind == "all-gather" and c.phase == p) for p in
               ("forward", "backward")}  # fmt: skip
    assert gathers == {"forward": x.config.n_layer + 1, "backward": 0}
    planned = comm.per_step(x, comm.lookup("nvlink4", "gpu"))
    assert sim.bytes_moved() == pytest.approx(planned.bytes_gpu, rel=0.01)
    assert {k: n for k, n, _, _ in planned.calls} == {"all-gather": x.config.n_layer + 1, "reduce-scatter": 4}
    assert memory.predict(x).peak_allocated_bytes == pytest.approx(sim.peak_bytes, rel=0.01)


def test_fsdp1_hybrid_on_one_node_is_full_shard_and_its_replicas_move_nothing():
    """HYBRID_SHARD on one node of 4 (the simulation names the node, which FSDP1 otherwise takes from the CUDA
    devices it counts: on CPU none, and it sharded nothing): the same peak and traffic as FULL_SHARD; the
    all-reduce across the node's replicas runs over a group of one and moves no byte."""
    hybrid, x = _variant("fsdp-hybrid", "full", 2)
    full, _ = _variant("fsdp", "full", 2)
    assert hybrid.peak_bytes == full.peak_bytes
    replicas = [c for c in hybrid.collectives if c.kind == "all-reduce"]
    assert replicas and all(c.group == 1 for c in replicas)
    assert full.bytes_moved() > 0 and hybrid.bytes_moved() == pytest.approx(full.bytes_moved())


@pytest.mark.parametrize("method", ["full", "lora"])
def test_fsdp1_no_shard_has_no_ddp_buckets_and_reduces_whole_flat_gradients(method):
    """NO_SHARD through FSDP1 (``fsdp-no-shard``): gradients all-reduced in place, no second copy in buckets (the
    plan had DDP's: +19% on TinyLlama full); under LoRA its flat parameters take whole gradients, frozen weights
    included, and all-reduce them (comm.py had the adapters' alone: -85%)."""
    from tunelab.plan import memory

    sim, x = _variant("fsdp-no-shard", method, 2)
    plan = memory.predict(x)
    assert plan.breakdown_bytes["sharding_buffers"] == 0
    planned = comm.per_step(x, comm.lookup("nvlink4", "gpu"))
    assert sim.bytes_moved() == pytest.approx(planned.bytes_gpu, rel=0.01)
    if method == "full":
        assert plan.peak_allocated_bytes == pytest.approx(sim.peak_bytes, rel=0.01)
    else:
        traced = max(snap.get("Gradient", 0) for snap in sim.phases.values())
        assert traced == pytest.approx(memory.flat_parameter_grads(x, memory.model_states(x, [])), rel=0.05)


@pytest.mark.parametrize("name", ["fsdp", "fsdp2"])
def test_the_peak_update_without_the_module_walk_keeps_torchs_peaks(name, monkeypatch):
    """simulate.update_peak skips torch's walk over every module on every op (85% of an FSDP1 run): the phase peaks,
    the collectives and the tracker's own whole-step peak are those torch's full ``_update_peak_stats`` gives."""
    from torch.distributed._tools.mem_tracker import MemTracker  # FSDPMemTracker keeps MemTracker's

    from tunelab.plan.simulate import update_peak

    def run(walk: bool):
        monkeypatch.setattr(ranks, "update_peak", MemTracker._update_peak_stats if walk else update_peak)
        seen = {}
        real = ranks._recording

        def recording(base):  # keep the tracker, to read its own whole-step peak
            cls = real(base)

            class Kept(cls):
                def __init__(self, *a):
                    super().__init__(*a)
                    seen["tracker"] = self

            return Kept

        monkeypatch.setattr(ranks, "_recording", recording)
        sim = ranks.simulate_ranks(small_llama(2), load_strategy(name), 4, "lora", "bf16-true", 2, 64, accumulation=2)
        return sim.phases, sim.collectives, dict(seen["tracker"]._peak_mem)

    walked, skipped = run(True), run(False)
    assert walked == skipped
    assert max(p["Total"] for p in skipped[0].values()) == max(skipped[2].values()) > 0


@pytest.mark.parametrize("name", ["fsdp-no-shard", "fsdp-shard-grad-op"])
@pytest.mark.parametrize("accumulation", [1, 2])
def test_fsdp1_lora_peaks_where_units_stay_gathered_or_whole_are_planned(name, accumulation):
    """LoRA under FSDP1's NO_SHARD and SHARD_GRAD_OP, with a head as large as a model's (vocabulary x width over a
    block's weights, as in Phi-2): at the head's backward nothing of the gathered units is apart (the plan took a
    block off, as FULL_SHARD's forward counts two: Phi-2 -1.0% to -1.9%), and NO_SHARD's backward ends with every
    whole flat gradient beside the root's original parameters' gradients (Phi-2 on 8 devices -3.6%)."""
    import dataclasses

    from litgpt import Config

    from tunelab.plan import memory

    config = dataclasses.replace(Config.from_name("phi-2"), n_layer=8)  # fake tensors: seconds at full width
    sim, x = _variant(name, "lora", accumulation, config, seq=512)  # the head's backward in chunks of 128
    assert memory.predict(x).peak_allocated_bytes == pytest.approx(sim.peak_bytes, rel=0.01)
