"""The planner: lab verdicts and peaks from the arithmetic, a breakdown that sums, JSON fields, any litgpt model,
calibration, and the batch search against a real memory limit on CPU."""

from __future__ import annotations

import dataclasses
import json
import os

import pytest

from tunelab import hardware
from tunelab.plan import projection
from tunelab.plan.recipe import plan_recipe
from tunelab.plan.trace.tables import TRACED
from tunelab.recipes import discover, resolve
from tunelab.report.accuracy import accuracy_rows, own_rows

LAB_VERDICTS = {
    "s1": False,
    **{f"s{i}": True for i in range(2, 8)},
    "s8": False,
    "s9": True,
    **{f"s{i}": True for i in range(10, 15)},
}


@pytest.fixture(scope="module")
def rows():
    return accuracy_rows()


def test_lab_verdicts_on_one_a100(rows):
    part1 = {r["id"]: r for r in rows if r["part"] == "Part 1"}
    assert {k: part1[k]["predicted_fits"] for k in LAB_VERDICTS} == LAB_VERDICTS


def test_lab_peaks_within_15_percent(rows):
    """Part 1 (litgpt's peak) within 15%. Part 2 printed current memory, not the peak: the plan is never more than
    15% under a reading, and only FSDP without auto-wrap's rows (m3, v4), whose peak is the backward's end, where the
    whole model's gradient is held twice over (the per-rank simulation), are far above it; v4's reserved memory
    (27.5-28.4 GiB, which the lab printed too) holds that peak: the plan sits between the reading and it."""
    measured = [r for r in rows if r["rel_error"] is not None]
    part1 = [r for r in measured if r["part"] == "Part 1"]
    assert len(part1) == 11  # s2-s7, s10-s14
    bad = {r["id"]: round(r["rel_error"], 3) for r in part1 if abs(r["rel_error"]) > 0.15}
    assert not bad, bad
    part2 = {r["id"]: r for r in measured if r["part"] == "Part 2"}
    assert all(r["rel_error"] >= -0.15 for r in part2.values()), part2
    assert {k for k, r in part2.items() if r["rel_error"] > 0.15} == {"m3", "v4"}
    assert max(part2["v4"]["measured_gb"]) < part2["v4"]["predicted_gb"] < 27.5 * 2**30 / 1e9
    assert all(r["verdict_ok"] for r in rows if r["verdict_ok"] is not None)  # Part 2 verdicts too (v5 OOM)


def test_litgpts_own_choice_on_several_devices_checkpoints_every_block():
    """litgpt's scripts on several devices checkpoint each block's activations (full fine-tuning: Lightning's
    FSDPStrategy with ``activation_checkpointing_policy={Block}``; LoRA: FSDP2 over ``checkpoint_wrapper`` blocks),
    read from the installed litgpt; the plan of litgpt's own choice does as they do, on one device it does not."""
    import inspect

    from litgpt.finetune import full, lora

    assert "activation_checkpointing_policy={Block}" in inspect.getsource(full.setup)
    assert "checkpoint_wrapper(" in inspect.getsource(lora.parallelize_fn)
    for method in ("full", "lora"):
        recipe = resolve(f"tiny-llama-1.1b/{method}")
        fed = ["--train.global_batch_size", "128"]  # a batch litgpt's scripts can feed on four devices
        assert plan_recipe(recipe, fed, gpu=None, devices=4).input.activation_checkpointing, method
        assert not plan_recipe(recipe, [], gpu=None, devices=1).input.activation_checkpointing, method


def test_mixed_precision_under_fsdp_computes_with_16_bit_weights():
    """One device: autocast over fp32 weights (copies of the weights, an fp32 residual stream). FSDP's and
    DeepSpeed's mixed precision hand the forward 16-bit weights: activations as bf16-true, no autocast copies. The
    logits are fp32 whatever the precision: Lightning Fabric's plugins convert the model's outputs, tunelab's loop
    casts them itself; litgpt's loop holds them through the optimizer step, tunelab's does not."""
    from litgpt import Config

    from tunelab.plan.model import memory

    c = Config.from_name("tiny-llama-1.1b")

    def plan(precision, strategy, fabric=True):  # FSDP1, as Lightning's FSDPStrategy runs it
        x = memory.PlanInput.of(
            config=c,
            precision=precision,
            strategy=strategy,
            micro_batch_size=8,
            seq_len=512,
            fabric=fabric,
            fsdp_root_kept=strategy == "fsdp",
            tables=TRACED,
        )
        return memory.predict(x).breakdown_bytes

    single, fsdp, true = plan("bf16-mixed", "single"), plan("bf16-mixed", "fsdp"), plan("bf16-true", "fsdp")
    assert single["autocast_weight_cache"] > 0 and fsdp["autocast_weight_cache"] == 0
    assert fsdp["activations"] == true["activations"] < single["activations"]
    assert fsdp["logits_and_loss"] == true["logits_and_loss"]  # fp32 logits and log-softmax under Fabric
    loop_true, loop_mixed = plan("bf16-true", "fsdp", fabric=False), plan("bf16-mixed", "fsdp", fabric=False)
    assert loop_true["logits_and_loss"] == loop_mixed["logits_and_loss"] == fsdp["logits_and_loss"]
    held = memory.logits_held_at_step
    x = memory.PlanInput(config=c, micro_batch_size=8, seq_len=512, tables=TRACED)
    assert held(x) == 8 * 512 * c.padded_vocab_size * 4 and held(x.changed(fabric=False)) == 0


def test_our_gpu_records_are_planned_from_their_own_recipes():
    """Every measured run of the committed H100 and H200 archives, planned as `tunelab plan` would from its recipe,
    overrides and strategy file: the OpenLLaMA 7B QLoRA rows (outside the sample of the one measured QLoRA term) and the bf16-mixed
    row (activations derived per tensor dtype) within 3%; every row within 10% (the CUDA-side remainder of LoRA and
    bf16-true full fine-tuning is under 0.9 GB). The H200 LoRA benches (TinyLlama and OpenLLaMA 7B, micro 8, both
    arms, two sessions) within 1%: the first session's fast runs planned uncompiled because torch.compile's
    recompile limit left their longest shapes eager (dynamo's warning in their stderr), which is where their peak
    is; the second's compiled throughout, OpenLLaMA 7B's fast run among them (multi-head attention: the value kept
    for flash attention is a view that holds the fused q/k/v output whole; counted by its view's size the plan was
    -5.5%)."""
    rows = own_rows()
    assert len(rows) == 74 and {r["device"] for r in rows} == {"NVIDIA H100 80GB HBM3", "NVIDIA H200"}
    # Part 3: tunelab's FSDP loop on one H100, bf16-mixed, micro 8-244 (its strategy files read from the archive):
    # under 7% without checkpointing; with it the loss's moment holds the blocks' inputs, not a recomputed block
    # (counted there, the plan was +10% to +13% from micro 64 on)
    part3 = [r for r in rows if r["report"] == "2026-11-23-lab-part3-h100"]
    checkpointed = [r for r in part3 if r["row"].startswith("ac-on")]
    assert len(part3) == 20 and len(checkpointed) == 11, [r["row"] for r in part3]
    assert all(-0.07 <= r["rel_error"] <= 0 for r in part3), [(r["row"], r["rel_error"]) for r in part3]
    assert all(abs(r["rel_error"]) <= 0.05 for r in checkpointed), [(r["row"], r["rel_error"]) for r in checkpointed]
    rows = [r for r in rows if r not in part3]
    # the lab's OpenLLaMA 3B and 7B rows on an H200 (s6, s7, s11, s12; 17-70 GB): each within 1%
    openllama = [r for r in rows if r["report"] == "2026-11-27-lab-part1-openllama-h200"]
    assert {r["row"] for r in openllama} == {"s6", "s7", "s11", "s12"}
    assert all(abs(r["rel_error"]) <= 0.01 for r in openllama), [(r["row"], r["rel_error"]) for r in openllama]
    rows = [r for r in rows if r not in openllama]
    # litgpt's loop timing QLoRA beside LoRA (TinyLlama micro 4, an H200): both planned within 2%
    timed = [r for r in rows if r["report"] == "2026-11-27-qlora-time-h200"]
    assert len(timed) == 2 and all(abs(r["rel_error"]) <= 0.02 for r in timed), timed
    rows = [r for r in rows if r not in timed]
    # Part 1 again on an H200 machine: the same peaks as on the H100 to 0.1 GB (shapes, not the GPU, set them),
    # s1 (micro 32, out of memory on the H100) included: 82.04 GB measured against 81.95 planned
    again = {r["row"]: r for r in rows if r["report"] == "2026-11-27-lab-part1-h200"}
    first = {r["row"]: r for r in rows if r["report"] == "2026-11-23-lab-part1-h100"}
    assert set(again) == {"s1", "s2", "s3", "s4", "s5", "s10"} and abs(again["s1"]["rel_error"]) <= 0.005
    for row in first:
        assert abs(again[row]["measured_gb"] - first[row]["measured_gb"]) <= 0.1, row
    h200 = [r for r in rows if r["device"] == "NVIDIA H200" and r["row"] not in again]
    assert len(h200) == 14 and all(abs(r["rel_error"]) <= 0.01 for r in h200), [
        (r["row"], r["rel_error"]) for r in h200
    ]
    eager = [r for r in h200 if "planned uncompiled" in r["recipe"]]
    assert len(eager) == 3 and all("--strategy fast" in r["recipe"] for r in eager)
    compiled = [r for r in h200 if r["report"].endswith("-compiled") and "--strategy fast" in r["recipe"]]
    assert len(compiled) == 3 and "open_llama_7b" in {r["model"] for r in compiled}
    by = {r["row"]: r for r in rows}
    for row in ("7b-qlora-all-mb2", "7b-qlora-all-mb4", "s5"):
        assert abs(by[row]["rel_error"]) <= 0.03, by[row]
    assert all(abs(r["rel_error"]) <= 0.10 for r in rows), [(r["row"], r["rel_error"]) for r in rows]
    # the fast path's bench runs (compiled blocks, fused AdamW, Liger's loss; micro 8 to 97): an upper bound within
    # 5% (the partitioner's trace on the CPU keeps a little more than CUDA's run did), litgpt's beside them 0.5%
    bench = [r for r in rows if r["report"].endswith("bench-tiny-llama-1.1b-full-h100")]
    fast = [r for r in bench if r["recipe"].endswith("--strategy fast")]
    assert len(fast) == 7 and {r["micro"] for r in fast} == {8, 58, 87, 94, 97}
    assert all(0 <= r["rel_error"] <= 0.05 for r in fast), [(r["row"], r["rel_error"]) for r in fast]
    assert all(abs(r["rel_error"]) <= 0.005 for r in bench if r not in fast)


@pytest.mark.parametrize("recipe", discover(), ids=lambda r: r.key)
def test_every_recipe_plans_and_breakdown_sums(recipe):
    plan = plan_recipe(recipe, [], gpu=hardware.lookup("H100-SXM")).plan
    assert sum(plan.breakdown_bytes.values()) == plan.peak_allocated_bytes > 0
    assert plan.fits is not None and plan.max_micro_batch_size is not None
    assert (
        plan.margin_bytes
        == hardware.lookup("H100-SXM").memory_bytes - plan.predicted_reserved_bytes - plan.cuda_context_bytes
    )


def test_monotonic_and_strategies_divide_states():
    r = resolve("open-llama-7b/full")
    peaks = [
        plan_recipe(
            r, ["--train.micro_batch_size", str(m), "--train.global_batch_size", "16"], gpu=hardware.lookup("A100-80GB")
        ).plan.peak_allocated_bytes
        for m in (1, 2, 4, 8)
    ]
    # increasing; at micro 1-2 the optimizer step is the peak (gradients, its temporary and the logits litgpt's loop
    # still holds, which grow with the micro batch), from micro 4 the activations
    assert peaks[0] < peaks[1] < peaks[2] < peaks[3]
    step = plan_recipe(r, ["--train.micro_batch_size", "1", "--train.global_batch_size", "16"], gpu=None)
    step = step.plan.breakdown_bytes
    assert step["activations"] == 0 and step["optimizer_step_temporary"] > 0
    assert step["logits_and_loss"] == 1 * 512 * 32000 * 4  # micro x sequence x padded vocabulary x fp32 (Fabric)
    single = plan_recipe(r, [], gpu=hardware.lookup("A100-80GB"), devices=4, strategy="ddp").plan
    fsdp = plan_recipe(r, [], gpu=hardware.lookup("A100-80GB"), devices=4, strategy="fsdp").plan
    grad_op = plan_recipe(r, [], gpu=hardware.lookup("A100-80GB"), devices=4, strategy="fsdp-shard-grad-op").plan
    whole = plan_recipe(r, [], gpu=hardware.lookup("A100-80GB"), devices=4, strategy="fsdp-no-wrap").plan
    zero3_off = plan_recipe(r, [], gpu=hardware.lookup("A100-80GB"), devices=4, strategy="deepspeed-zero3-offload").plan
    assert fsdp.peak_allocated_bytes < grad_op.peak_allocated_bytes < single.peak_allocated_bytes
    assert fsdp.peak_allocated_bytes < whole.peak_allocated_bytes  # the whole model gathered at once
    assert zero3_off.breakdown_bytes["optimizer_states"] == 0 and zero3_off.host_ram_bytes > 50e9


def test_every_strategy_file_can_be_planned():
    """One vocabulary: every file `run --strategy` accepts, `plan --strategy` accepts too."""
    from tunelab.paths import CONFIGS_DIR

    r = resolve("open-llama-7b/full")
    names = sorted(p.stem for p in (CONFIGS_DIR / "strategies").glob("*.yaml"))
    assert len(names) >= 10
    from tunelab.strategies import StrategyError, load_strategy

    for name in names:
        devices = 1 if load_strategy(name).name == "single" else 4  # a one-device file is refused on several
        plan = plan_recipe(r, [], gpu=hardware.lookup("A100-80GB"), devices=devices, strategy=name).plan
        assert plan.peak_allocated_bytes > 0 and plan.devices == devices, name
        if devices == 1:
            with pytest.raises(StrategyError, match="name: single runs one device"):
                plan_recipe(r, [], gpu=hardware.lookup("A100-80GB"), devices=4, strategy=name)


def test_qlora_weights_are_nf4_with_scales():
    q = plan_recipe(resolve("open-llama-7b/qlora"), [], gpu=hardware.lookup("A100-80GB")).plan
    lora = plan_recipe(resolve("open-llama-7b/lora"), [], gpu=hardware.lookup("A100-80GB")).plan
    # 6.607 B linear weights x (0.5 + 4/64) bytes + 131 M embedding x 2 bytes
    assert q.breakdown_bytes["weights"] == pytest.approx(6_607_343_616 * 0.5625 + 131_072_000 * 2, rel=1e-6)
    assert q.peak_allocated_bytes < lora.peak_allocated_bytes


def test_8bit_adamw_states_are_what_bitsandbytes_allocates(configs):
    """bitsandbytes' AdamW8bit (the strategy files' ``optimizer: adamw8bit``) over TinyLlama's LoRA adapters (every
    target, r 8), stepped once on this CPU: its states (two 1-byte states per element, fp32 states for tensors under
    4,096 elements, a float32 absmax per 256-element block of each state, two 256-entry maps shared by all) against
    the plan's optimizer states (2 + 8/256 bytes per trainable parameter; litgpt's LoRA holds q, k and v's adapters
    in one tensor each, so none is under 4,096 here): within 0.1% (2 bytes alone were 1.6% under)."""
    import torch
    from bitsandbytes.optim import AdamW8bit
    from litgpt.lora import GPT, Config, mark_only_lora_as_trainable

    from tunelab.plan.model import memory

    c = configs["tiny-llama-1.1b"]
    names = ("query", "key", "value", "projection", "mlp", "head")
    targets = {f"lora_{t}": True for t in names}
    with torch.device("meta"):
        model = GPT(Config.from_name(c.name, lora_r=8, lora_alpha=16, **targets))
    mark_only_lora_as_trainable(model)
    params = [torch.nn.Parameter(torch.zeros(p.shape)) for p in model.parameters() if p.requires_grad]
    optimizer = AdamW8bit(params)
    for p in params:
        p.grad = torch.ones_like(p)
    optimizer.step()
    states = {t.data_ptr(): t for st in optimizer.state.values() for t in st.values() if torch.is_tensor(t)}
    allocated = sum(t.numel() * t.element_size() for t in states.values())  # the quantile maps are shared
    case = memory.PlanInput.of(
        config=c,
        method="lora",
        lora_r=8,
        lora_targets=names,
        optimizer="bitsandbytes.optim.AdamW8bit",
        tables=TRACED,
    )
    planned = memory.model_states(case, []).optimizer
    assert planned == pytest.approx(allocated, rel=0.001) and min(p.numel() for p in params) >= 4096


def test_calibration_uses_nearest_measured_run(tmp_path):
    from tunelab import record

    for i, (model, micro, mfu) in enumerate(
        [("open_llama_7b", 4, 0.41), ("open_llama_7b", 16, 0.5), ("tiny-llama-1.1b", 4, 0.3)]
    ):
        record.save(
            record.RunRecord(
                row_id=f"r{i}",
                status="ok",
                model_name=model,
                method="full",
                precision="bf16-true",
                micro_batch_size=micro,
                mfu=mfu,
                power_mean_w=500.0,
                device_count=1,
                device_name="NVIDIA H100 80GB HBM3",
            ),
            tmp_path / f"r{i}" / "record.json",
        )
    x = plan_recipe(resolve("open-llama-7b/full"), [], gpu=hardware.lookup("H100-SXM")).input
    proj = projection.project(x, hardware.lookup("H100-SXM"), 1e6, tmp_path)
    assert proj.mfu_low == proj.mfu_high == 0.41 and "r0" in proj.mfu_source and proj.power_w == 500.0
    # runtime = FLOPs / (MFU x peak): by hand
    assert proj.seconds_low == pytest.approx(proj.flops_per_token * 1e6 / (0.41 * 989.4e12))


def test_calibration_takes_only_a_run_of_this_model_method_precision_and_gpu(tmp_path):
    """Another model's MFU or another GPU's power says nothing of this run: a TinyLlama record on an H200 once set
    the MFU and energy of an OpenLLaMA 13B plan on an A10G. Such records are passed over, counted by why, and the
    answer says what --calibrate gave; a matching record is taken whatever its micro batch."""
    from tunelab import record
    from tunelab.plan.render import render_answer

    def save(name, model, device, mfu=0.3, precision="bf16-true"):
        rec = record.RunRecord(
            row_id=name,
            status="ok",
            model_name=model,
            method="lora",
            precision=precision,
            micro_batch_size=8,
            mfu=mfu,
            power_mean_w=250.0,
            device_count=1,
            device_name=device,
        )
        record.save(rec, tmp_path / name / "record.json")

    save("tiny", "tiny-llama-1.1b", "NVIDIA A10G")
    save("h200", "open_llama_7b", "NVIDIA H200")
    save("fp32", "open_llama_7b", "NVIDIA A10G", precision="32-true")
    a10g = hardware.lookup("A10G")
    planned = plan_recipe(resolve("open-llama-7b/lora"), [], gpu=a10g)
    proj = projection.project(planned.input, a10g, 1e6, tmp_path)
    assert (proj.mfu_low, proj.mfu_high, proj.power_w, proj.power_measured) == (0.25, 0.55, 300.0, False)
    assert "2 record(s) passed over: another model, method or precision" in proj.calibration
    assert "1 record(s) passed over: measured on another GPU than A10G" in proj.calibration
    assert "--calibrate: no usable record under" in render_answer(planned, proj)
    save("mine", "open_llama_7b", "NVIDIA A10G", mfu=0.41)
    proj = projection.project(planned.input, a10g, 1e6, tmp_path)
    assert (proj.mfu_low, proj.power_w, proj.power_measured) == (0.41, 250.0, True)
    answer = render_answer(planned, proj)
    assert "--calibrate: run /mine" in answer and "measured MFU 41.0%" in answer and "250 W per GPU" in answer
    assert "(the power measured in a record)" in answer
    assert projection.project(planned.input, a10g, 1e6).calibration is None


def test_tune_batch_search_finds_the_largest_batch_without_allocator_retries(tmp_path, monkeypatch):
    """The search itself (records stand in for probes here; the tests above and the H100 run in
    reports/ probe for real): micro 47 fits with retries, 42-44 retry, 48 runs out: doubling, bisection to the
    largest fitting (47), then bisection below it to the largest without retries (41), the best; --also rows
    are probed first and reused by the search."""
    from tunelab import record as record_mod
    from tunelab.recipes import resolve
    from tunelab.tune import batch as tune_batch

    calls = []

    def fake_run(recipe, overrides, run_dir, options):
        m = int(overrides[overrides.index("--train.micro_batch_size") + 1])
        calls.append(m)
        fits, retries = m <= 47, (0 if m <= 41 else 26 if m == 47 else 2)
        return record_mod.RunRecord(
            status="ok" if fits else "oom",
            tok_s_padded=1000.0 * m if fits else None,
            num_alloc_retries=retries,
            error=None if fits else "CUDA out of memory",
        )

    monkeypatch.setattr(tune_batch, "run", fake_run)
    res = tune_batch.tune(
        resolve("tiny-llama-1.1b/full"),
        [],
        tmp_path,
        probes=tune_batch.Probes(max_micro=128, also=[8, 16, 32], stream=open(os.devnull, "w")),
        start=47,
    )
    assert calls[:4] == [8, 16, 32, 47] and len(calls) == len(set(calls))  # each micro batch probed once
    assert res.largest_fitting == 47 and res.best == 41
    assert 42 in calls and 48 in calls  # both edges were probed, not guessed

    # a cap that doubling would overshoot is itself probed, then bisected below it
    calls.clear()
    res = tune_batch.tune(
        resolve("tiny-llama-1.1b/full"),
        [],
        tmp_path / "capped",
        probes=tune_batch.Probes(max_micro=60, stream=open(os.devnull, "w")),
        start=32,
    )
    assert calls[:2] == [32, 60] and res.largest_fitting == 47 and 48 in calls
    calls.clear()
    res = tune_batch.tune(
        resolve("tiny-llama-1.1b/full"),
        [],
        tmp_path / "capped-fits",
        probes=tune_batch.Probes(max_micro=45, stream=open(os.devnull, "w")),
        start=30,
    )
    assert calls[:2] == [30, 45] and res.largest_fitting == 45

    # the data caps the search: a probe's micro batch on one device is at most the 200 training samples (400, half
    # held out), and each probe spans enough epochs for its steps (one step an epoch at micro 200: litgpt's schedule
    # of one step under one warm-up step divided by zero)
    seen = []

    def every_fits(recipe, overrides, run_dir, options):
        seen.append(overrides)
        return record_mod.RunRecord(status="ok", tok_s_padded=1.0, num_alloc_retries=0)

    monkeypatch.setattr(tune_batch, "run", every_fits)
    res = tune_batch.tune(
        resolve("tiny-llama-1.1b/full"),
        [],
        tmp_path / "data-capped",
        probes=tune_batch.Probes(max_micro=1024, steps=3, stream=open(os.devnull, "w")),
        start=128,
    )
    micro = [int(o[o.index("--train.micro_batch_size") + 1]) for o in seen]
    assert (
        max(micro) == 200
        and res.largest_fitting == 200
        and res.capped.startswith("capped at 200: 200 training samples on 1 device(s)")
    )
    assert all(o[o.index("--train.epochs") + 1] == "3" for o in seen) and "search capped at 200" in tune_batch.render(
        res
    )


def test_a_compiled_block_keeps_what_the_partitioner_saves_linear_in_tokens():
    """tunelab/plan/trace/compiled.py: the trace is torch.compile's own partitioner on one block (full and LoRA), less than
    eager autograd keeps, the same bytes per token at any shape (so one trace at 64 tokens serves every plan), the
    block's weights left out and its input kept; mixed precision and activation checkpointing stay eager."""

    from litgpt import Config
    from litgpt.lora import Config as LoRAConfig

    from tunelab.plan.model import activations, memory
    from tunelab.plan.trace import compiled
    from tunelab.settings import LORA_TARGETS

    c = Config.from_name("tiny-llama-1.1b")
    full = compiled.saved_bytes_per_token(c, "full", "bf16-true")
    at = lambda tokens: compiled.trace_block(dataclasses.asdict(c), "full", "bf16-true", 0, (), True, 3, tokens)  # noqa: E731
    assert at(192) - at(64) == full * 3 * 128  # linear in tokens, at any batch
    # the block's input (n_embd, 2 bytes) is among what it keeps; its 22 M weights (44 MB) are not
    assert 2 * c.n_embd < full < 44e6 / 64
    lora = compiled.saved_bytes_per_token(c, "lora", "bf16-true", 32, LORA_TARGETS)
    lora_config = LoRAConfig.from_name("tiny-llama-1.1b", lora_r=8, lora_query=True)  # a plan's LoRA Config: its own
    assert compiled.saved_bytes_per_token(lora_config, "lora", "bf16-true", 32, LORA_TARGETS) == lora  # r/targets win
    for method, per_token in (("full", full), ("lora", lora)):
        eager = activations.saved_bytes(activations.Forward(c, method, 2, 1, 512, LORA_TARGETS)).per_layer / 512
        assert 0.5 * eager < per_token < eager, (method, per_token, eager)
    x = memory.PlanInput.of(
        config=c, precision="bf16-true", micro_batch_size=8, seq_len=512, compiled=True, tables=TRACED
    )
    plan = memory.predict(x)
    assert plan.breakdown_bytes["activations"] == pytest.approx(full * 8 * 512 * c.n_layer)
    assert any("partitioner" in n for n in plan.notes)
    eager_plan = memory.predict(x.changed(compiled=False)).breakdown_bytes["activations"]
    for other in (
        dataclasses.replace(x, precision="bf16-mixed"),
        dataclasses.replace(x, activation_checkpointing=True),
    ):
        y = memory.predict(other)
        assert any("planned as eager" in n for n in y.notes)
    assert (
        memory.predict(dataclasses.replace(x, precision="bf16-mixed")).breakdown_bytes["activations"]
        > eager_plan * 0.99
    )


def test_a_records_strategy_settings_are_checked_as_a_strategy_file_is(tmp_path):
    """own_rows plans a record under the strategy keys it kept; a key no strategy has (an edited or foreign record)
    is one line naming the archive, the record and the key, not an internal error."""
    import io
    import tarfile

    from tunelab.record import RunRecord
    from tunelab.report import evidence
    from tunelab.strategies import StrategyError, load_strategy

    rec = RunRecord(
        recipe="tiny-llama-1.1b/full",
        status="ok",
        peak_allocated_bytes=10**9,
        strategy_file="fast",
        strategy_settings={**load_strategy("fast").settings(), "bogus": 1},
    )
    folder = tmp_path / evidence.with_role("memory")[0].folder
    folder.mkdir()
    data = json.dumps(rec.to_dict()).encode()
    with tarfile.open(folder / "records.tgz", "w:gz") as tar:
        info = tarfile.TarInfo("row/record.json")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    with pytest.raises(StrategyError, match=r"row/record.json: strategy_settings: unknown key\(s\) \['bogus'\]"):
        own_rows(tmp_path)


def test_planning_a_run_never_costs_the_run(monkeypatch):
    """The runner's plan before launch: a configuration the planner refuses, or a fault in the planner itself, is
    kept as the record's ``plan_error`` (its type and message), and the run goes on without a plan."""
    from tunelab import settings
    from tunelab.plan import recipe as recipe_mod
    from tunelab.plan import stored

    s = settings.resolve(resolve("tiny-llama-1.1b/lora"), [])
    plan, error = stored.for_run(s, None, "NVIDIA H100 80GB HBM3", "tunelab test")
    assert error is None and plan.gpu == "H100-SXM" and plan.seconds > 0 and plan.fits
    assert sum(plan.seconds_by_cause.values()) == pytest.approx(plan.seconds)
    for raised, words in (
        (ValueError("train.micro_batch_size: 0 must be"), "ValueError: train.micro_batch_size: 0 must be"),
        (RuntimeError("boom"), "planner fault, not the run's: RuntimeError: boom"),
    ):
        monkeypatch.setattr(recipe_mod, "plan_settings", lambda *a, raised=raised, **k: (_ for _ in ()).throw(raised))
        assert stored.for_run(s, None, None, "tunelab test") == (None, words)


def test_fsdp2_adds_the_logits_to_the_regathered_root_only_where_the_loop_holds_them():
    """FSDP2 gathers the root again at the backward's start. tunelab's loop has dropped the logits by then (the plan
    takes the larger of the two moments); litgpt's loop still holds them (the two add up)."""
    from litgpt import Config

    from tunelab.plan.model import memory
    from tunelab.plan.model.strategies import fsdp2

    def plan(fabric):
        x = memory.PlanInput.of(
            config=Config.from_name("tiny-llama-1.1b"),
            method="lora",
            precision="bf16-true",
            micro_batch_size=2,
            seq_len=512,
            devices=4,
            strategy="fsdp",
            fabric=fabric,
            tables=TRACED,
        )
        return memory.predict(x).breakdown_bytes

    tunelab, litgpt = plan(False), plan(True)
    assert tunelab["logits_and_loss"] == 0 and tunelab["sharding_buffers"] >= fsdp2.root_regathered(
        memory.PlanInput(
            config=Config.from_name("tiny-llama-1.1b"),
            method="lora",
            micro_batch_size=2,
            seq_len=512,
            devices=4,
            strategy="fsdp",
            tables=TRACED,
        )
    )
    assert litgpt["logits_and_loss"] > 0 and litgpt["sharding_buffers"] == tunelab["sharding_buffers"]


def test_a_finished_run_is_planned_with_its_own_loops_reads_of_the_fused_loss():
    """The fast path's loss read its count back twice a micro batch until it was recorded (``fused_loss_reads``
    None: Liger's own wrapper); today's plan of a finished run times that loop, and a recorded figure as it is."""
    from tunelab.plan import stored
    from tunelab.plan.model import fast_step
    from tunelab.record import RunRecord

    def reads(strategy_file, recorded):
        rec = RunRecord(recipe="tiny-llama-1.1b/lora", strategy_file=strategy_file, fused_loss_reads=recorded)
        return stored.todays_plan(rec, None).input.loop.fused_loss_reads

    assert reads("fast", None) == fast_step.LIGER_WRAPPER_READS == 2
    assert reads("fast", 0) == 0 and reads("fast", 3) == 3
    assert reads(None, None) == 0  # litgpt's own loss: nothing fused
