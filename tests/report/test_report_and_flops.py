"""Report columns and units from a real (small) sweep with an OOM row; FLOPs and MFU against hand arithmetic."""

from __future__ import annotations

import pytest

from tunelab import hardware
from tunelab.models import lora_param_count
from tunelab.plan.model.flops import flops_per_token, mfu


def test_flops_per_token_by_hand():
    from litgpt import Config

    c = Config.from_name("tiny-llama-1.1b")
    # TinyLlama: 1,100,048,384 parameters, of which the embedding is 32,000 x 2,048 = 65,536,000
    n = 1_100_048_384 - 65_536_000
    attention = 12 * 22 * 32 * 64 * 512  # 12 x layers x heads x head size x T
    full = flops_per_token(c, 512, "full")
    assert full.matmul_params == n and full.attention == attention == 276_824_064
    assert full.total == 6 * n + attention == 6_483_898_368
    lora = flops_per_token(c, 512, "lora", lora_params=1_000)
    assert lora.total == 4 * n + 6 * 1_000 + attention


def test_lora_param_count_matches_litgpt():
    """Our count of LoRA parameters equals the trainable parameters litgpt's LoRA model has."""
    import torch
    from litgpt.lora import GPT, Config, mark_only_lora_as_trainable

    targets = dict(query=True, key=True, value=True, projection=True, mlp=True, head=True)
    config = Config.from_name("tiny-llama-1.1b", lora_r=32, **{f"lora_{k}": v for k, v in targets.items()})
    with torch.device("meta"):
        model = GPT(config)
    mark_only_lora_as_trainable(model)
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    assert lora_param_count(config, 32, tuple(targets)) == trainable


def test_mfu_by_hand():
    h100 = hardware.lookup("H100-SXM")
    peak = h100.peak_flops("bf16-true")
    assert (
        peak == 989.4e12
        and h100.peak_flops("bf16-mixed") == 989.4e12
        and h100.peak_flops("32-true") == pytest.approx(66.9e12)
    )
    # 6,483,898,368 FLOPs/token x 10,000 tokens/s / 989.4e12 FLOP/s = 0.065533...
    assert mfu(6_483_898_368, 10_000, peak) == pytest.approx(0.0655336, rel=1e-5)
    assert mfu(6_483_898_368, 10_000, hardware.lookup("V100-32GB").peak_flops("bf16-true")) is None  # no bf16
    assert hardware.identify("Intel Xeon") is None and mfu(1.0, 1.0, None) is None  # unknown device: no guess
    assert hardware.identify("NVIDIA H100 80GB HBM3").name == "H100-SXM"
    assert hardware.identify("NVIDIA A100-SXM4-40GB").name == "A100-40GB"
    assert hardware.identify("NVIDIA A100-SXM4-80GB").name == "A100-80GB"
    assert hardware.identify("Tesla V100-SXM2-16GB").name == "V100-16GB"


def test_gpu_table_covers_the_named_gpus():
    names = set(hardware.table())
    assert {
        "V100-16GB",
        "V100-32GB",
        "T4",
        "A10G",
        "L4",
        "RTX-4090",
        "A100-40GB",
        "A100-80GB",
        "H100-PCIe",
        "H100-SXM",
        "H200",
    } <= names


@pytest.mark.parametrize(
    ("old", "new", "fragment"),
    [
        ("    tdp_w: 400\n", "    tdp_watts: 400\n", "unknown key(s) ['tdp_watts']"),
        ("    tdp_w: 400\n", '    tdp_w: "400"\n', "tdp_w: '400' is not a positive number"),
        ("    cuda_total_gib: 79.15\n", "    cuda_total_gib: -1\n", "cuda_total_gib: -1"),
        ("bf16: 312}", "bf16: .nan}", "peak_tflops: bf16: nan"),
        ("bf16: 312}", "bf16: 0}", "peak_tflops: bf16: 0"),
        ("    bandwidth_gbs: 2039\n", "    bandwidth_gbs: -5\n", "bandwidth_gbs: -5"),
        ("  H100-SXM:\n", "  A100-80GB:\n", "'A100-80GB' is given twice"),
        ("    boost_mhz: 1410\n", "    boost_mhz: .nan\n", "boost_mhz: nan is not a positive number"),
        ("    boost_mhz: 1410\n", '    boost_mhz: "fast"\n', "boost_mhz: 'fast' is not a positive number"),
        (
            '    bandwidth_source: "NVIDIA A100 datasheet (2021): 40GB HBM2 1555 GB/s"\n',
            "    bandwidth_source: 12\n",
            "bandwidth_source: '12' is not text; fix: quote it",
        ),
    ],
)
def test_an_edited_gpu_table_row_is_refused_naming_file_row_and_key(monkeypatch, tmp_path, old, new, fragment):
    """The GPU table a user edits is checked when read: each defect is one InputError naming the table, the row
    and the key (a duplicated row: the line), never planned with or an internal error."""
    from tunelab.errors import InputError

    text = hardware.GPU_TABLE.read_text()
    assert old in text, old
    edited = tmp_path / "gpus.yaml"
    edited.write_text(text.replace(old, new, 1))
    monkeypatch.setattr(hardware, "GPU_TABLE", edited)
    hardware.table.cache_clear()
    try:
        with pytest.raises(InputError) as e:
            hardware.table()
        assert "gpus.yaml" in str(e.value) and fragment in str(e.value)
    finally:
        hardware.table.cache_clear()


def test_the_environment_says_the_host_and_the_clock_where_records_have_them():
    """A report names the host's CPU and eager dispatch speed (a host-bound step follows it) and the steady SM clock
    with how often power or heat held it down (a GPU-bound step follows that); records without them add no line."""
    from tunelab.record import RunRecord
    from tunelab.report.sweep import environment

    base = dict(device_name="NVIDIA H200", device_type="cuda", device_count=1, versions={})
    old = environment([RunRecord(**base)])
    assert not any(line.startswith(("- host", "- SM clock")) for line in old)
    recs = [
        RunRecord(
            **base,
            host_cpu="Some CPU",
            host_op_us=2.5,
            sm_clock_steady_mhz=1590.0,
            sm_clock_max_mhz=1980.0,
            clock_capped_steady_share=0.9,
        ),
        RunRecord(
            **base,
            host_cpu="Some CPU",
            host_op_us=3.0,
            sm_clock_steady_mhz=1980.0,
            sm_clock_max_mhz=1980.0,
            clock_capped_steady_share=0.0,
            device_op_us=10.1,
        ),
    ]
    lines = environment(recs)
    assert "- host: Some CPU; eager dispatch 2.50-3.00 us per op" in "\n".join(lines)
    assert "on GPU 0 with its launch 10.10-10.10 us" in "\n".join(lines)
    assert "on GPU 0" not in "\n".join(environment(recs[:1]))  # a record from before the probe, or no CUDA
    assert any(
        line.startswith("- SM clock, steady window: 1,590-1,980 MHz (max 1,980)") and "0%-90%" in line for line in lines
    ), lines


def test_the_report_prints_the_plan_its_record_stored_and_says_when_it_plans_again():
    """A GPU row's plan column is the plan its record stored before the run, however the planner has changed since;
    a record from before plans were stored is planned now and marked (†, ``planner_source``); a plan for another
    board is not this run's; a recipe today's planner refuses is an empty cell that says why, never a lost report."""
    from tunelab.plan import stored
    from tunelab.plan.recipe import plan_recipe
    from tunelab.recipes import resolve
    from tunelab.record import RunRecord, StoredPlan
    from tunelab.report.sweep import markdown, planner_columns, row_of

    def rec(plan=None, recipe="tiny-llama-1.1b/lora"):
        return RunRecord(
            row_id="r",
            recipe=recipe,
            device_type="cuda",
            device_name="NVIDIA H100 80GB HBM3",
            status="ok",
            peak_allocated_bytes=5_000_000_000,
            plan=plan,
        )

    kept = StoredPlan(planner="tunelab 0.1.0, git abc", gpu="H100-SXM", peak_allocated_bytes=4_000_000_000, fits=True)
    cols = planner_columns(rec(kept))
    assert cols["planner_source"] == stored.STORED and cols["planner_peak_gb"] == 4.0
    assert cols["planner_error_pct"] == pytest.approx(-20.0)
    today = plan_recipe(resolve("tiny-llama-1.1b/lora"), [], gpu=hardware.lookup("H100-SXM")).plan
    for old in (rec(), rec(StoredPlan(gpu="A100-80GB", peak_allocated_bytes=1))):
        cols = planner_columns(old)
        assert cols["planner_source"] == stored.TODAYS
        assert cols["planner_peak_gb"] == pytest.approx(today.peak_allocated_bytes / 1e9)
    refused = planner_columns(rec(recipe="no-such/model"))
    assert "planner_peak_gb" not in refused and refused["planner_source"].startswith("not planned (")
    records = [rec(kept), rec()]
    text = markdown({"name": "s"}, records, [row_of(r, {}, "") for r in records])
    assert "4.00 (-20.0%) |" in text and "†" in text and "planned now" in text


def test_a_cpu_report_leaves_out_what_the_device_cannot_measure_and_names_a_refused_rows_settings():
    """On a CPU the GPU's columns (reserved, retries, MFU, utilisation, power, energy) are empty in every row: they
    are left out of the table and named once above it; a row refused before it ran (QLoRA on a CPU) shows its
    recipe's precision and batch sizes, not None/None; the model source names the rows that chose none."""
    from tunelab.record import RunRecord
    from tunelab.report.sweep import environment, markdown, row_of

    ok = RunRecord(
        row_id="s1",
        recipe="tiny-llama-1.1b/full",
        device_type="cpu",
        device_name="Some CPU",
        status="ok",
        precision="32-true",
        micro_batch_size=8,
        global_batch_size=32,
        peak_rss_bytes=5e8,
        tok_s_padded=40_000.0,
        tok_s_real=25_000.0,
        step_time_s=0.3,
        model_source="tiny",
    )
    refused = RunRecord(
        row_id="s13",
        recipe="open-llama-7b/qlora",
        device_type="cpu",
        device_name="Some CPU",
        status="refused",
        overrides=["--train.micro_batch_size", "2"],
    )
    records = [ok, refused]
    text = markdown({"name": "lab-part1"}, records, [row_of(r, {}, "") for r in records])
    table = [ln for ln in text.splitlines() if ln.startswith("| ")]
    header = table[0]
    assert "MFU" not in header and "power W" not in header and "reserved GB" not in header
    assert "tok/s padded" in header and "RSS GB" in header
    assert "Left out, empty in every row here:" in text and "MFU (padded)" in text.split("| row |")[0]
    s13 = next(ln for ln in table if ln.startswith("| s13 "))
    assert "None" not in s13 and "bf16-true" in s13 and "| 2/16 |" in s13
    assert any("model source: tiny (1 row(s) refused before a model was chosen)" in ln for ln in environment(records))


def test_the_bench_says_from_which_step_the_fast_path_pays_end_to_end():
    """Start-up is the wall time less litgpt's Training Time; the fast arm's spans its warmest to its coldest run;
    break-even is the extra start-up over the time each optimizer step saves; nothing where no step is saved."""
    from tunelab.record import RunRecord
    from tunelab.report.bench import whole_cost, whole_cost_line

    def run(start: float, train: float) -> RunRecord:  # 40 iterations at accumulation 4: 10 optimizer steps
        return RunRecord(status="ok", wall_s=start + train, litgpt_training_time_s=train, iters=40, accumulation=4)

    fast, litgpt = [run(40.0, 10.0), run(100.0, 10.0)], [run(30.0, 30.0), run(30.0, 30.0)]
    cost = whole_cost(fast, litgpt)
    assert cost["fast_start_s"] == (40.0, 100.0) and cost["litgpt_start_s"] == 30.0
    assert cost["saved_per_step_s"] == 2.0 and cost["break_even_steps"] == (5.0, 35.0)
    assert "ahead from about 5 to 35 optimizer steps" in whole_cost_line(cost)[1]
    assert whole_cost(fast, [run(30.0, 5.0)]) is None and whole_cost([], litgpt) is None


@pytest.mark.parametrize(
    "changes",
    [
        {},  # Mixtral's layout: experts as wide as intermediate_size
        {"moe_intermediate_size": 48, "n_shared_expert": 1, "first_k_dense_replace": 1},  # own width, shared, dense
        {"bias": True, "n_expert_per_token": 3},
    ],
)
def test_an_moe_token_counts_the_experts_it_reaches(changes):
    """A mixture of experts' FLOPs per token count its active parameters: every parameter of litgpt's model built on
    the meta device but the embedding and, in each MoE layer, the routed experts beyond ``n_expert_per_token`` (the
    whole model's 6N counted Mixtral's eight experts for the two a token reaches: 3.6x its active parameters)."""
    import dataclasses

    import torch
    from litgpt import Config
    from litgpt.model import GPT

    from tunelab.models import count_params, inactive_expert_params
    from tunelab.plan.model.flops import flops_per_token

    base = Config.from_name("Mixtral-8x7B-v0.1")
    config = dataclasses.replace(
        base,
        n_layer=3,
        n_embd=64,
        head_size=16,
        n_head=4,
        n_query_groups=2,
        intermediate_size=96,
        padded_vocab_size=128,
        vocab_size=128,
        **changes,
    )
    with torch.device("meta"):
        model = GPT(config)
    skipped = 0
    for block in model.transformer.h:
        experts = getattr(block.mlp, "experts", None)
        if experts is not None:
            skipped += (len(experts) - config.n_expert_per_token) * sum(p.numel() for p in experts[0].parameters())
    assert skipped and inactive_expert_params(config) == skipped
    total, emb = count_params(config)
    assert flops_per_token(config, 32).matmul_params == total - emb - skipped
    assert inactive_expert_params(Config.from_name("tiny-llama-1.1b")) == 0
    mixtral = flops_per_token(base, 512)
    assert 12.5e9 < mixtral.matmul_params < 13e9 and "in experts a token skips excluded" in mixtral.formula


def test_report_on_one_runs_folder_says_which_folder_to_give(tmp_path):
    """`tunelab run --out DIR` leaves DIR/record.json; `tunelab report DIR` reads */record.json under it and found
    none: it says so and names the folder above, where the run's record is one of */record.json."""
    from tunelab import record
    from tunelab.report.sweep import write_report

    record.save(record.RunRecord(status="ok", row_id="one"), tmp_path / "run" / "record.json")
    with pytest.raises(FileNotFoundError, match=f"fix: tunelab report {tmp_path} "):
        write_report(tmp_path / "run", out_dir=tmp_path / "rep")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(FileNotFoundError) as refused:
        write_report(empty, out_dir=tmp_path / "rep")
    assert str(refused.value).endswith("fix: give the folder `tunelab sweep` or `tune-study` wrote")  # no folder above
    assert write_report(tmp_path, out_dir=tmp_path / "rep") == tmp_path / "rep"
