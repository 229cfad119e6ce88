"""`tunelab plan --json` (run in-process) carries the runtime estimate (tunelab/plan/model/runtime.py) by cause, the step
by kernel under --simulate, and the fast path's padding as its loop forms its batches."""

from __future__ import annotations

import json
import re

import pytest

from tests.conftest import ROOT, tunelab_here
from tunelab.plan.model import kernels, runtime
from tunelab.plan.trace.tables import TRACED


def test_plan_json_has_the_time_by_cause_summing_to_its_point_estimate():
    """`tunelab plan --json`: where the kernel model applies (LoRA, QLoRA through litgpt) the point estimate is its
    causes summed, inside the stated band; QLoRA adds its dequantization; an offloaded optimizer step falls back to
    the fitted curve and says why. A plan mostly spent on the host's launches (TinyLlama LoRA) says it is
    host-bound, by how much, and that this follows the CPU; one that is not (OpenLLaMA 7B LoRA at micro 16) says
    nothing of it."""
    from tunelab.plan import projection as projection_mod

    def projection(recipe, *overrides):
        code, out, err = tunelab_here("plan", recipe, "--gpu", "H100-SXM", "--json", *overrides)
        assert code == 0, err
        return json.loads(out)["projection"]

    bound = {}
    micro16 = ("--train.micro_batch_size", "16", "--train.global_batch_size", "16")
    for recipe, overrides in (
        ("open-llama-7b/lora", micro16),
        ("tiny-llama-1.1b/qlora", ()),
        ("tiny-llama-1.1b/lora", ()),
    ):
        proj = projection(recipe, *overrides)
        causes = proj["seconds_by_cause"]
        assert set(causes) == set(runtime.CAUSES) and min(causes.values()) >= 0
        assert proj["seconds"] == pytest.approx(sum(causes.values()), rel=1e-12)
        lo, hi = proj["seconds_band"]  # the model's error, widened where the hosts we measured reach beyond it
        model = (proj["seconds"] * (1 - runtime.KERNEL_MODEL_ERROR), proj["seconds"] * (1 + runtime.KERNEL_MODEL_ERROR))
        assert lo <= model[0] * (1 + 1e-12) and hi >= model[1] * (1 - 1e-12)
        assert ("widened to the host's" in proj["seconds_source"]) == ((lo, hi) != pytest.approx(model))
        assert (causes["dequantization"] > 0) == recipe.endswith("qlora")
        assert 0 < proj["mfu_predicted_real"] < proj["mfu_predicted_padded"] < 1  # padding computes, not learns
        share = causes["host launches"] / proj["seconds"]  # a host-bound plan says so, and what it follows
        bound[recipe] = "Host-bound: " in proj["seconds_by_cause_source"]
        if recipe.endswith("qlora"):
            qlora_source = proj["seconds_by_cause_source"]
        assert bound[recipe] == (share >= projection_mod.HOST_BOUND_SHARE), (recipe, share)
        assert (
            not bound[recipe] or f"{share:.0%} of it is the host launching kernels" in proj["seconds_by_cause_source"]
        )
    assert bound["tiny-llama-1.1b/lora"] and not bound["open-llama-7b/lora"]  # both sides seen
    # what shortens it: QLoRA's host time is largely bitsandbytes' own Python, and the fast path takes no QLoRA
    assert "fast.yaml" in proj["seconds_by_cause_source"]  # the last: TinyLlama LoRA
    assert bound["tiny-llama-1.1b/qlora"] and "bitsandbytes' Python" in qlora_source and "fast.yaml" not in qlora_source

    from tunelab import hardware
    from tunelab.plan.recipe import plan_recipe
    from tunelab.recipes import resolve

    x = plan_recipe(resolve("tiny-llama-1.1b/full"), [], gpu=hardware.lookup("H100-SXM")).input
    args = {"train": {"global_batch_size": 16, "epochs": 1}, "eval": {"interval": None}}
    t = runtime.terms(x.changed(offload_optimizer=True), args, 1000, 0, 437.0)
    assert "offloaded" in t.kernels
    assert t.seconds_on(hardware.lookup("H100-SXM"), 989e12) == t.seconds(989e12, 3350e9)


def test_plan_simulate_prints_the_step_by_kernel():
    """`tunelab plan --simulate --gpu` carries the step by kernel (its categories sum to the GPU time; the step is
    the longer of GPU and host) and says where it is not modelled (tunelab's loop)."""

    def plan(*extra):
        code, out, err = tunelab_here(
            "plan", "tiny-llama-1.1b/lora", "--gpu", "H100-SXM", "--simulate", "--json", *extra
        )
        assert code == 0, err
        return json.loads(out)["step_by_kernel"]

    st = plan()
    assert st["gpu"] == "H100-SXM" and st["ops"] > 1000
    assert sum(st["gpu_by_category"].values()) == pytest.approx(st["gpu_s"])
    assert st["step_s"] == max(st["gpu_s"], st["host_s"])
    from litgpt import Config

    from tunelab import hardware
    from tunelab.plan.model import memory
    from tunelab.plan.model.tables import optimizer_of
    from tunelab.plan.recipe import plan_recipe
    from tunelab.recipes import resolve
    from tunelab.settings import LITGPT_LORA_R

    x = plan_recipe(resolve("tiny-llama-1.1b/lora"), [], gpu=hardware.lookup("H100-SXM")).input
    assert x.lora_r != LITGPT_LORA_R  # the recipe's rank, which the step is traced with (not litgpt's default)
    assert st == kernels.to_json(
        kernels.step_time(
            kernels.Step(
                x.config,
                x.method,
                str(x.precision),
                x.micro_batch_size,
                x.seq_len,
                optimizer_of(x),
                (x.lora_r, tuple(x.lora_targets)),
                accumulation=x.accumulation,
            ),
            "H100-SXM",
            tables=TRACED,
        )
    )
    assert x.accumulation > 1
    x = memory.PlanInput.of(
        config=Config.from_name("tiny-llama-1.1b"), fabric=False, tables=TRACED
    )  # a strategies file's loop
    assert "tunelab's loop" in kernels.to_json(kernels.for_plan(x, hardware.lookup("H100-SXM")))["not_modelled"]


def test_the_fast_paths_padding_is_planned_from_its_own_batches_and_matches_the_h100_bench():
    """--strategy fast plans the micro batches its loop forms (length-grouped windows, padded to a multiple: the
    loop's own functions), litgpt's plan pads each micro batch to its longest sample. Against the H100 bench's
    records (reports/2026-11-25-bench-tiny-llama-1.1b-full-h100, the benchmark data at micro 8): padded / real
    tokens measured 1.754 (litgpt) and 1.130 (fast); planned from the default length distribution within 2%."""
    import statistics
    import tarfile

    from tunelab.data.lengths import default_lengths, grouped_padded_per_sample, padded_per_sample

    lengths = list(default_lengths(512))
    real = statistics.fmean(lengths)
    planned = {
        "litgpt": padded_per_sample(lengths, 8) / real,
        "fast": grouped_padded_per_sample(lengths, 8, 64, 64, 512) / real,
    }
    with tarfile.open(ROOT / "reports" / "2026-11-25-bench-tiny-llama-1.1b-full-h100" / "records.tgz") as tar:
        for arm in ("litgpt", "fast"):
            for pair in range(3):
                rec = json.loads(tar.extractfile(f"bench/tiny-llama-1.1b-full/{arm}-{pair}/record.json").read())
                measured = rec["tokens_padded"] / rec["tokens_real"]
                assert planned[arm] == pytest.approx(measured, rel=0.02), (arm, planned[arm], measured)

    def tokens(*strategy):
        code, out, err = tunelab_here(
            "plan",
            "tiny-llama-1.1b/full",
            "--gpu",
            "H100-SXM",
            "--json",
            "--train.micro_batch_size",
            "8",
            "--train.global_batch_size",
            "32",
            *strategy,
        )
        assert code == 0, err
        return json.loads(out)["projection"]

    from tunelab.plan.recipe import data_lengths
    from tunelab.recipes import resolve
    from tunelab.settings import resolve as settings

    own = data_lengths(settings(resolve("tiny-llama-1.1b/full"), []), 32000)[0]  # the recipe's file's lengths
    fast, litgpt = tokens("--strategy", "fast"), tokens()
    ratio = grouped_padded_per_sample(own, 8, 64, 64, 512) / padded_per_sample(own, 8)
    assert fast["tokens"] / litgpt["tokens"] == pytest.approx(ratio, rel=0.02) and ratio < 0.9
    assert "length-grouped in windows of 64" in fast["tokens_source"]


def test_plan_prints_the_communication_over_the_link_asked():
    """DDP on 4 A100s: the same bytes per step over PCIe 4 as over the GPU's own NVLink 3, a longer step."""

    def plan(*args):
        code, out, err = tunelab_here("plan", "open-llama-7b/full", "--gpu", "A100-80GB", *args)
        assert code == 0, err
        return json.loads(out)["projection"]

    slow = plan("--strategy", "ddp", "--devices", "4", "--interconnect", "pcie4", "--json")
    fast = plan("--strategy", "ddp", "--devices", "4", "--json")
    assert slow["comm_bytes_per_step"]["gpu"] == pytest.approx(fast["comm_bytes_per_step"]["gpu"])
    assert slow["seconds"] > fast["seconds"]
    assert "nvlink3" in fast["comm_source"]


def test_plan_simulate_prints_beside_the_plan():
    """`tunelab plan --simulate`: the simulated step beside the plan, in words and in JSON (its peak within 3% of
    the plan's at bf16-true)."""
    code, out, err = tunelab_here("plan", "tiny-llama-1.1b/lora", "--gpu", "A100-80GB", "--simulate")
    assert code == 0, err[-2000:]
    assert "simulated step" in out and "peak: " in out and "planned" in out
    # bf16: CUDA's flash kernel, which keeps what torch's CPU kernel keeps (at 32-true CUDA runs the memory-efficient
    # kernel, whose output the projection reads as a view: the plan counts one copy per block less than the CPU)
    code, out, err = tunelab_here("plan", "tiny-llama-1.1b/full", "--precision", "bf16-true", "--simulate", "--json")
    js = json.loads(out)
    assert js["simulated"]["peak_phase"] in ("forward", "backward", "optimizer step")
    assert js["simulated"]["peak_bytes"] == pytest.approx(js["peak_memory_gb"] * 1e9, rel=0.03)
    # compiled blocks are not simulated: the step is compared with the same step planned eagerly, which it matches
    code, out, err = tunelab_here("plan", "tiny-llama-1.1b/lora", "--strategy", "fast", "--simulate", "--json")
    js = json.loads(out)
    (eager,) = [float(m) for n in js["simulated"]["notes"] for m in re.findall(r"planned eagerly, ([\d.]+) GB", n)]
    assert eager * 1e9 == pytest.approx(js["simulated"]["peak_bytes"], rel=0.03) and eager > js["peak_memory_gb"]


def test_the_plan_answers_first_in_at_most_15_lines_with_no_third_party_warning(tmp_path, monkeypatch):
    """`tunelab plan RECIPE --gpu GPU`: the verdict with its margin and largest micro batch, the peak, the time with
    its band, energy and price in at most 15 lines, no warning of torch or bitsandbytes raised while it traces (a
    cold trace cache: the fast path's compiled blocks, QLoRA's 4-bit layers); `--verbose` keeps the whole plan."""
    import logging
    import warnings

    monkeypatch.setenv("TUNELAB_HOME", str(tmp_path))
    logged = []
    handler = logging.Handler()
    handler.emit = lambda record: logged.append(record.getMessage())
    logging.getLogger().addHandler(handler)
    try:
        for recipe, extra in (("tiny-llama-1.1b/full", ["--strategy", "fast"]), ("tiny-llama-1.1b/qlora", [])):
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                code, out, err = tunelab_here("plan", recipe, "--gpu", "H100-SXM", *extra)
            assert code == 0, err
            assert not [w for w in caught if not issubclass(w.category, DeprecationWarning)], [
                str(w.message) for w in caught
            ]
            lines = out.strip().splitlines()
            assert len(lines) <= 15 and lines[1].startswith("FITS on H100-SXM: needs"), lines
            assert "largest micro batch that fits" in lines[1] and "peak allocated per device" in lines[2]
            assert any(ln.startswith("time: ") and "band" in ln and " M padded tokens;" in ln for ln in lines), lines
            assert any(ln.startswith("energy: ") and "USD" in ln for ln in lines)
    finally:
        logging.getLogger().removeHandler(handler)
    assert not [m for m in logged if "gemm_4bit" in m]
    code, out, _ = tunelab_here("plan", "tiny-llama-1.1b/qlora", "--gpu", "H100-SXM", "--verbose")
    assert "= peak allocated" in out and "point estimate of the training time" in out and len(out.splitlines()) > 15


def test_a_known_host_sets_litgpts_launch_time_and_narrows_the_band():
    """`--host-us-per-op`: where the launching host's figure is known, a launch-bound plan (OpenLLaMA 3B LoRA on an
    H100) follows it (half the figure: the host's launches halve) and its band is the kernel model's error alone, not
    the spread of the hosts we measured; the fast path and a plan without --gpu refuse it in one line."""
    from tunelab.plan.model import runtime

    def projection(*extra):
        code, out, err = tunelab_here("plan", "open-llama-3b/lora", "--gpu", "H100-SXM", "--json", *extra)
        assert code == 0, err
        return json.loads(out)["projection"]

    default, fast_host, slow_host = (
        projection(),
        projection("--host-us-per-op", "30"),
        projection("--host-us-per-op", "120"),
    )
    host = default["seconds_by_cause"]["host launches"]
    assert host > 0 and fast_host["seconds"] < default["seconds"] < slow_host["seconds"]
    assert slow_host["seconds_by_cause"]["host launches"] > 2 * host  # 120 us against the fitted 60
    e = runtime.KERNEL_MODEL_ERROR
    assert fast_host["seconds_band"] == pytest.approx([fast_host["seconds"] * (1 - e), fast_host["seconds"] * (1 + e)])
    assert "--host-us-per-op" in fast_host["seconds_source"] and "30 us an op" in fast_host["seconds_source"]
    assert (
        default["seconds_band"][1] - default["seconds_band"][0]
        > (1 + e) * default["seconds"] - (1 - e) * default["seconds"]
    )
    for argv, fragment in (
        (["tiny-llama-1.1b/full", "--gpu", "H100-SXM", "--strategy", "fast"], "own launch model"),
        (["tiny-llama-1.1b/full"], "needs --gpu"),
    ):
        code, out, err = tunelab_here("plan", *argv, "--host-us-per-op", "30")
        assert code == 2 and len(err.strip().splitlines()) == 1 and fragment in err, err
    # tunelab's loop without a speed switch launches as litgpt's does: it takes the figure
    ddp = ("plan", "tiny-llama-1.1b/lora", "--gpu", "H100-SXM", "--devices", "2", "--strategy", "ddp", "--json")
    given, median = (json.loads(tunelab_here(*ddp, *extra)[1])["projection"] for extra in (["--host", "120"], []))
    assert given["host_source"] == "120 us an op, as given (--host-us-per-op)" and given["seconds"] > median["seconds"]


def test_a_token_budget_times_that_many_tokens():
    """`--tokens N`: the point estimate and its causes are for N padded tokens, not the recipe's own run (the kernel
    model timed the recipe's 12 steps whatever N was: "11 s for 1000 M tokens" beside an MFU range of hours); ten
    times the tokens, ten times the training kernels; fewer tokens than one optimizer step refused in one line."""

    def projection(*tokens: str) -> dict:
        code, out, err = tunelab_here("plan", "tiny-llama-1.1b/lora", "--gpu", "H100-SXM", "--json", *tokens)
        assert code == 0, err
        return json.loads(out)["projection"]

    recipes, small, large = projection(), projection("--tokens", "1e6"), projection("--tokens", "1e7")
    for cause in ("matmul", "elementwise", "host launches"):
        assert large["seconds_by_cause"][cause] == pytest.approx(10 * small["seconds_by_cause"][cause], rel=0.01)
        per_token = recipes["seconds_by_cause"][cause] / recipes["tokens"]  # the recipe's 12 steps
        assert small["seconds_by_cause"][cause] == pytest.approx(per_token * 1e6, rel=0.01)
    assert large["seconds_low"] == pytest.approx(10 * small["seconds_low"])
    capped = projection("--tokens", "1e6", "--train.epochs", "3", "--train.max_steps", "5")  # the budget decides
    assert capped["seconds"] == pytest.approx(small["seconds"])
    assert 9 < large["seconds"] / small["seconds"] < 11.5  # the validations at the recipe's interval come along
    code, out, err = tunelab_here("plan", "tiny-llama-1.1b/lora", "--gpu", "H100-SXM", "--tokens", "100")
    assert code == 2 and len(err.strip().splitlines()) == 1 and "fewer than one optimizer step" in err, err
    code, out, err = tunelab_here("plan", "tiny-llama-1.1b/lora", "--gpu", "H100-SXM", "--tokens", "0.5")
    assert code == 2 and "--tokens 0.5: fewer" in err, err  # the figure given, not rounded to 0


def test_energy_is_the_power_over_the_time_the_plan_prints():
    """Energy is power x devices x the point estimate's band, as the price and advise take the time: it was the MFU
    range's times, 8-18x short of the printed time for a host-bound run (TinyLlama LoRA, 1e9 tokens: "42.3 h" beside
    "1.6-3.6 kWh"); at the edge of memory its high end stretches with the band's."""
    for argv in (
        ["tiny-llama-1.1b/lora", "--gpu", "H100-SXM", "--tokens", "1e9"],
        ["open-llama-7b/full", "--gpu", "H100-SXM", "--devices", "4", "--strategy", "ddp"],  # at the edge
    ):
        code, out, err = tunelab_here("plan", *argv, "--json")
        assert code == 0, err
        plan = json.loads(out)
        p, devices = plan["projection"], plan["devices"]
        low, high = p["seconds_band"]
        assert p["energy_j_low"] == pytest.approx(p["power_w"] * devices * low)
        assert p["energy_j_high"] == pytest.approx(p["power_w"] * devices * high)
        assert p["energy_j_per_million_tokens_high"] == pytest.approx(p["energy_j_high"] / p["tokens"] * 1e6)
    assert "at the edge" in p["seconds_source"]


def test_a_calibrated_energy_says_its_power_was_measured(tmp_path):
    """--calibrate takes a record's measured power: the answer's energy says so (it said "board power, an upper
    bound" over 248 W measured), and --verbose writes a small energy in Wh, not "0.000-0.000 kWh"."""
    import tarfile

    with tarfile.open(ROOT / "reports" / "2026-11-23-lab-part1-h100" / "records.tgz") as tgz:
        tgz.extractall(tmp_path, filter="data")
    argv = ("plan", "tiny-llama-1.1b/full", "--gpu", "H100-SXM", "--precision", "bf16-true", "--calibrate", tmp_path)
    code, out, err = tunelab_here(*argv)
    assert code == 0, err
    energy = next(ln for ln in out.splitlines() if ln.startswith("energy: "))
    assert "(the power measured in a record)" in energy and "board power" not in energy
    code, out, err = tunelab_here(*argv, "--verbose")
    verbose = next(ln for ln in out.splitlines() if ln.startswith("  energy: "))
    assert " Wh to " in verbose and "0.000" not in verbose and "power: measured mean" in verbose, verbose
    assert "(board power, an upper bound)" in tunelab_here(*argv[:6])[1]


def test_host_auto_plans_with_the_figure_measured_here_and_says_so(monkeypatch):
    """`--host auto` (`--host` for short): the plan takes the host figure measured on this machine as it takes a
    given one, its answer and JSON saying it was measured here; without CUDA it refuses in one line before timing."""
    import torch

    from tunelab.plan.trace import host_probe

    code, given, err = tunelab_here("plan", "open-llama-3b/lora", "--gpu", "H100-SXM", "--json", "--host", "30")
    assert code == 0, err
    if not torch.cuda.is_available():
        code, out, err = tunelab_here("plan", "open-llama-3b/lora", "--gpu", "H100-SXM", "--host", "auto")
        assert code == 2 and len(err.strip().splitlines()) == 1 and "no CUDA device here" in err, err
    probe = host_probe.HostProbe(30.0, 29.0, 31.5, 4000.0, 5, "cuda")
    monkeypatch.setattr(host_probe, "measure_here", lambda case: probe)
    code, out, err = tunelab_here("plan", "open-llama-3b/lora", "--gpu", "H100-SXM", "--json", "--host", "auto")
    assert code == 0, err
    measured, given = json.loads(out)["projection"], json.loads(given)["projection"]
    assert measured["seconds"] == given["seconds"] and measured["seconds_band"] == given["seconds_band"]
    assert measured["host_source"] == probe.source() and "--host auto" in measured["seconds_source"]
    assert given["host_source"] == "30 us an op, as given (--host-us-per-op)"


def test_the_plan_and_advise_say_where_the_host_and_the_link_came_from():
    """The host's time per op: the hosts we measured, or the figure given; the link between the GPUs: the GPU's own,
    or the one given; each in the answer's lines and the JSON; advise says both above its tables."""

    def plan(*extra):
        code, out, err = tunelab_here("plan", "open-llama-7b/full", "--gpu", "A100-80GB", *extra)
        assert code == 0, err
        return out

    text = plan("--devices", "4", "--strategy", "fsdp")
    low, high = (round(h * 1e6) for h in runtime.LITGPT_HOST_S_PER_OP_RANGE)
    assert f"host: {low}-{high} us an op, as on the machines we measured" in text
    # which side of the band a faster CPU falls, where the host moves the run at all
    lora = tunelab_here("plan", "tiny-llama-1.1b/lora", "--gpu", "H100-SXM")[1]
    full = tunelab_here("plan", "tiny-llama-1.1b/full", "--gpu", "H100-SXM", "--tokens-per-sample", "440")[1]
    assert "a faster CPU nears the band's low end" in lora and "the GPU bounds this run" in full
    assert "link: nvlink3 between the GPUs, the A100-80GB's own" in text
    p = json.loads(plan("--devices", "4", "--strategy", "fsdp", "--interconnect", "pcie4", "--json"))["projection"]
    assert p["link_source"].startswith("pcie4 between the GPUs, as given (--interconnect)")
    p = json.loads(plan("--host-us-per-op", "45", "--json"))["projection"]
    assert p["host_source"] == "45 us an op, as given (--host-us-per-op)" and not p["link_source"]
    code, out, err = tunelab_here("advise", "open-llama-7b", "--gpus", "A100-80GB", "--tokens", "5e7")
    assert code == 0, err
    assert f"the machines we measured took {low}-{high}" in out and "links (between the GPUs" in out


def test_the_plan_names_its_data_file_as_typed_from_the_repository_not_this_machines_path():
    """The time line's sample count names the recipe's data file relative to the repository (what a user types),
    never the absolute path of the machine that planned it."""
    code, out, err = tunelab_here("plan", "tiny-llama-1.1b/lora", "--gpu", "A10G", "--verbose")
    assert code == 0, err
    assert "records of data/alpaca_tunelab.json)" in out
    assert str(ROOT) not in out


def test_a_precision_the_gpu_has_no_peak_for_is_planned_for_memory_and_says_why_it_is_not_timed():
    """bfloat16 on a T4 (torch emulates it): the memory plan and verdict stand; the time is one line naming the
    GPU table and the fix, never 'inf h' nor a time by cause timed at another dtype's peak; --json stays strict JSON
    (no Infinity) and says the same; the fix it names plans a time."""

    def strict(text):
        return json.loads(text, parse_constant=lambda c: pytest.fail(f"{c} in plan --json"))

    code, out, err = tunelab_here("plan", "tiny-llama-1.1b/lora", "--gpu", "T4")
    assert code == 0, err
    lines = out.strip().splitlines()
    assert lines[1].startswith("FITS on T4") and "inf" not in out and "by cause" not in out, lines
    said = [ln for ln in lines if "not estimated" in ln]
    assert len(said) == 1 and "gpus.yaml" in said[0] and "no bf16 peak" in said[0] and "--precision 16-mixed" in said[0]
    code, out, err = tunelab_here("plan", "tiny-llama-1.1b/lora", "--gpu", "T4", "--verbose")
    assert code == 0 and "verdict: FITS on T4" in out and "inf" not in out and "time by cause" not in out
    assert said[0].split(": ", 1)[1] in out
    code, out, err = tunelab_here("plan", "tiny-llama-1.1b/lora", "--gpu", "T4", "--json")
    projection = strict(out)["projection"]
    assert projection["seconds_high"] is None and projection["energy_j_high"] is None
    assert projection["seconds"] is None and not projection["seconds_by_cause"]
    assert projection["seconds_source"] == said[0].split(": ", 1)[1]
    code, out, _ = tunelab_here("plan", "tiny-llama-1.1b/lora", "--gpu", "T4", "--precision", "16-mixed", "--json")
    projection = strict(out)["projection"]
    assert code == 0 and projection["seconds"] > 0 and projection["energy_j_high"] > 0


def test_a_plan_names_the_strategy_file_it_planned():
    """Two strategy files of one kind plan differently (FSDP2 against FSDP1's sharding variants, ZeRO-2 against
    ZeRO-3): the plan's first line and its JSON name which was planned, not only its kind."""
    seen = {}
    for name, words in (
        ("fsdp2", "FSDP2 fully_shard (reshard_after_forward=True)"),
        ("fsdp-shard-grad-op", "FSDP SHARD_GRAD_OP, wrap block"),
        ("deepspeed-zero3", "DeepSpeed ZeRO-3"),
        ("deepspeed-zero2", "DeepSpeed ZeRO-2"),
    ):
        argv = ("plan", "open-llama-7b/lora", "--gpu", "H100-SXM", "--devices", "4", "--strategy", name)
        code, out, err = tunelab_here(*argv)
        assert code == 0, err
        assert out.splitlines()[0].startswith(f"open_llama_7b lora (4 device(s), {words}, bf16-true"), out
        code, out, err = tunelab_here(*argv, "--json")
        assert code == 0, err
        seen[name] = json.loads(out)["strategy_described"]
        assert seen[name].startswith(words)
    assert len(set(seen.values())) == len(seen)
    code, out, _ = tunelab_here("plan", "tiny-llama-1.1b/full", "--gpu", "H100-SXM", "--strategy", "fast")
    assert "(1 device(s), single, fast path, 32-true" in out.splitlines()[0]
    for method, kind in (("lora", "FSDP2"), ("full", "FSDP1")):  # litgpt's own choice on several devices
        code, out, _ = tunelab_here("plan", f"open-llama-7b/{method}", "--gpu", "H100-SXM", "--devices", "4")
        assert f"(4 device(s), litgpt's {kind}, blocks checkpointed, bf16-true" in out.splitlines()[0]


def test_an_offloaded_run_is_timed_as_a_lower_bound_and_says_so():
    """An offloaded optimizer step runs on the CPU, which nothing times yet: the plan's time (the fitted curve's)
    leaves it out, so it says the time is a lower bound, in its answer and its JSON; a plan without offload says
    nothing of it."""
    argv = ("plan", "open-llama-13b/full", "--gpu", "A100-40GB", "--devices", "4")
    for strategy in ("deepspeed-zero3-offload", "fsdp-offload"):
        code, out, err = tunelab_here(*argv, "--strategy", strategy)
        assert code == 0, err
        assert "(a lower bound: the optimizer step on the CPU (offload) is not timed)" in out.splitlines()[3], out
        code, out, err = tunelab_here(*argv, "--strategy", strategy, "--json")
        proj = json.loads(out)["projection"]
        assert proj["lower_bound"] == "the optimizer step on the CPU (offload) is not timed"
        # the fitted curve's band: its leave-one-out extremes over the lab's rows, measured over estimated
        low, high = runtime.LOO_BAND
        assert proj["seconds_band"] == pytest.approx([proj["seconds"] * (1 + low), proj["seconds"] * (1 + high)])
    code, out, err = tunelab_here(*argv, "--strategy", "deepspeed-zero3", "--json")
    assert code == 0 and json.loads(out)["projection"]["lower_bound"] == ""


def test_a_lora_recipe_given_quantize_is_planned_as_qlora():
    """litgpt's ``finetune_lora`` with ``--quantize bnb.nf4`` is QLoRA (the LoRA recipe says so): its plan is the
    QLoRA recipe's, bitsandbytes' dequantization and host work timed, not LoRA's step with 4-bit weights; and
    ``--quantize null`` on the QLoRA recipe plans LoRA."""
    from tunelab import settings
    from tunelab.recipes import resolve

    def plan(recipe, *overrides):
        code, out, err = tunelab_here("plan", recipe, "--gpu", "H100-SXM", "--json", *overrides)
        assert code == 0, err
        return json.loads(out)

    quantized, qlora = plan("tiny-llama-1.1b/lora", "--quantize", "bnb.nf4"), plan("tiny-llama-1.1b/qlora")
    assert quantized["projection"]["seconds_by_cause"] == qlora["projection"]["seconds_by_cause"]
    assert quantized["projection"]["seconds_by_cause"]["dequantization"] > 0
    assert (quantized["method"], quantized["breakdown_bytes"]) == ("qlora", qlora["breakdown_bytes"])
    unquantized = plan("tiny-llama-1.1b/qlora", "--quantize", "null")["projection"]["seconds_by_cause"]
    assert unquantized == plan("tiny-llama-1.1b/lora")["projection"]["seconds_by_cause"]
    assert settings.resolve(resolve("tiny-llama-1.1b/lora"), ["--quantize", "bnb.nf4"]).method == "qlora"
    assert settings.resolve(resolve("tiny-llama-1.1b/qlora"), ["--quantize", "null"]).method == "lora"
