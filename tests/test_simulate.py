"""The simulated step (litgpt's model on fake tensors under torch's MemTracker) and the planner terms named from it:
the fast CPU subset of `tunelab plan-families --simulate` (TinyLlama and Llama 3.2 1B: a 32k and a 128k vocabulary),
the CLI, and QLoRA's terms against our H100 runs."""

from __future__ import annotations

import json

import pytest

from tests.conftest import ROOT, one_line_problems, tunelab_cli
from tunelab.models import count_params, lora_param_count
from tunelab.plan import memory
from tunelab.plan.simulate import simulate


@pytest.fixture(scope="module")
def configs():
    from litgpt import Config

    return {name: Config.from_name(name) for name in ("tiny-llama-1.1b", "Llama-3.2-1B")}


@pytest.mark.parametrize("name", ["tiny-llama-1.1b", "Llama-3.2-1B"])
@pytest.mark.parametrize(
    "method,precision,accumulation",
    [
        ("full", "bf16-true", 1),
        ("full", "bf16-true", 2),
        ("full", "bf16-mixed", 2),
        ("lora", "bf16-true", 1),
        ("lora", "bf16-mixed", 1),
        ("qlora", "bf16-true", 1),
    ],  # fmt: skip
)
def test_the_plan_is_within_1_percent_of_the_simulated_step(configs, name, method, precision, accumulation):
    _plan_against_simulation(configs[name], method, precision, accumulation, rel=0.01)


@pytest.mark.parametrize("method", ["full", "lora"])
@pytest.mark.parametrize("accumulation", [1, 2])
def test_tunelabs_loop_is_planned_within_1_percent(configs, method, accumulation):
    """tunelab's loop (a strategy file without Liger's loss): its loss function returns before backward, so nothing
    holds the logits there; its peak is the loss itself (the logits, what cross-entropy saved, and the copy
    ``reshape`` makes of the shifted slice), not litgpt's logits held beside the backward's temporaries (a 128k
    vocabulary: +2-5% if the simulation held them)."""
    _plan_against_simulation(configs["Llama-3.2-1B"], method, "bf16-true", accumulation, rel=0.01, fabric=False)


def _plan_against_simulation(c, method, precision, accumulation=1, rel=0.01, fabric=True):
    """The analytic plan's peak against the simulated step (``fabric``: litgpt's loop; False: tunelab's)."""
    optimizer = "PagedAdamW" if method == "qlora" else "AdamW"
    x = memory.PlanInput(
        config=c, method=method, precision=precision, micro_batch_size=4, seq_len=512, accumulation=accumulation,
        quantize="bnb.nf4" if method == "qlora" else None, optimizer=optimizer, fabric=fabric,
    )  # fmt: skip
    plan = memory.predict(x)
    planned = plan.peak_allocated_bytes
    sim = simulate(c, method, precision, 4, 512, accumulation=accumulation, optimizer=optimizer, fabric=fabric)
    assert set(sim.phases) == {"forward", "backward", "optimizer step"}
    assert planned == pytest.approx(sim.peak_bytes, rel=rel), (sim.peak_phase, sim.phases[sim.peak_phase])


@pytest.mark.parametrize(
    "name,method,precision",
    [
        ("phi-2", "lora", "bf16-mixed"),  # LayerNorm, parallel residual with a shared norm, GELU MLP
        ("gemma-2-2b", "lora", "bf16-mixed"),  # post-norms, softcapping, 256k vocabulary
        ("gemma-2-2b", "qlora", "bf16-true"),  # the dequantized lm_head beside a softcapped chunk's gradients
    ],
)
def test_mixed_precision_and_qlora_are_derived_for_other_families(name, method, precision):
    """Mixed precision derived per tensor dtype (fp32 residual stream and norms, 16-bit matmuls, fp32 logits) and
    QLoRA's backward dequantization hold beyond LLaMA's shape (the old approximation was +11% for Phi-2 and -9%
    for Gemma 2 under bf16-mixed LoRA)."""
    from litgpt import Config

    _plan_against_simulation(Config.from_name(name), method, precision, rel=0.01)


def test_the_simulation_counts_what_the_step_holds(configs):
    """Weights, gradients and AdamW's states are exactly the model's sizes; the states exist from the first step,
    so the second step's forward holds them; the logits stay alive through the optimizer step (litgpt's loop)."""
    c = configs["Llama-3.2-1B"]
    total, _ = count_params(c)
    sim = simulate(c, "full", "bf16-true", 2, 256)
    step = sim.phases["optimizer step"]
    assert step["Parameter"] == pytest.approx(2 * total, rel=1e-3)
    assert step["Gradient"] == pytest.approx(2 * total, rel=1e-3)
    assert step["Optstate"] == pytest.approx(3 * 2 * total, rel=1e-3)  # two moments + foreach's temporary
    assert step["Activation"] == pytest.approx(memory.logits_held_at_step(
        memory.PlanInput(config=c, micro_batch_size=2, seq_len=256)), rel=0.01)  # fmt: skip
    assert sim.phases["forward"]["Optstate"] == pytest.approx(2 * 2 * total, rel=1e-3)


def test_extrapolation_by_block_is_linear(configs):
    """Built with 1+2 or with 2+3 blocks, the extrapolated step is the same: one block more adds the same bytes."""
    c = configs["tiny-llama-1.1b"]
    a = simulate(c, "lora", "bf16-true", 2, 256, layers=1)
    b = simulate(c, "lora", "bf16-true", 2, 256, layers=2)
    assert b.layers_built == (2, 3)
    for phase in a.phases:
        assert a.phases[phase]["Total"] == pytest.approx(b.phases[phase]["Total"], rel=0.005)


def test_autocast_copies_are_the_difference_between_mixed_and_true_lora(configs):
    """bf16-mixed LoRA keeps 16-bit copies of every frozen block weight and one of lm_head per 128-token chunk:
    the simulated difference to bf16-true is that term, give or take what the activations differ by (the logits
    are fp32 in both: Fabric converts the model's outputs under every precision)."""
    c = configs["tiny-llama-1.1b"]
    mixed = simulate(c, "lora", "bf16-mixed", 1, 256).phases["forward"]
    true = simulate(c, "lora", "bf16-true", 1, 256).phases["forward"]
    copies = memory.autocast_weight_copies(
        memory.PlanInput(config=c, method="lora", precision="bf16-mixed", seq_len=256)
    )
    extra = mixed["Activation"] - true["Activation"]
    assert copies * 0.99 <= extra <= copies * 1.10


def test_qlora_follows_bitsandbytes_storage(configs):
    """NF4 weights (half a byte and an fp32 absmax per 64) for every linear; the paged optimizer keeps two fp32
    states of every tensor under 1e5 elements on the device (at rank 8 every adapter but lm_head's B) and pages the
    rest; the adapters take gradients, and so does the StableEmbedding litgpt swaps in."""
    c = configs["tiny-llama-1.1b"]
    q = simulate(c, "qlora", "bf16-true", 2, 256, optimizer="PagedAdamW")
    lo = simulate(c, "lora", "bf16-true", 2, 256)
    total, emb = count_params(c)
    linear = total - emb  # every Linear, lm_head's included (Lightning converts them all)
    saved = lo.phases["forward"]["Parameter"] - q.phases["forward"]["Parameter"]
    swap = emb + 2 * c.n_embd  # litgpt's StableEmbedding: the old embedding stays referenced, + a LayerNorm
    assert saved == pytest.approx(linear * (2 - 0.5 - 4 / 64) - 2 * swap, rel=0.01)
    lora = memory.PlanInput(config=c, method="lora", lora_r=8, optimizer="bitsandbytes.optim.PagedAdamW")
    resident = memory.paged_optimizer_device_states(lora)
    assert resident == 8 * (lora_param_count(c, 8) - 8 * c.padded_vocab_size)  # lm_head's B: 8 x 32000, paged
    assert q.phases["optimizer step"]["Optstate"] == pytest.approx(resident, rel=1e-3) and "paged" in " ".join(q.notes)
    # the adapters' gradients, and the StableEmbedding's, which no zero_grad frees (it is not in the optimizer)
    assert q.phases["forward"]["Gradient"] == lo.phases["forward"]["Gradient"] + 2 * swap
    assert lo.phases["forward"]["Gradient"] < 0.01 * total


def test_plan_simulate_prints_beside_the_plan_and_refuses_sharding():
    proc = tunelab_cli("plan", "tiny-llama-1.1b/lora", "--gpu", "A100-80GB", "--simulate", timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "simulated step" in proc.stdout and "peak: " in proc.stdout and "planned" in proc.stdout
    # bf16: CUDA's flash kernel, which keeps what torch's CPU kernel keeps (at 32-true CUDA runs the memory-efficient
    # kernel, whose output the projection reads as a view: the plan counts one copy per block less than the CPU)
    js = json.loads(
        tunelab_cli(
            "plan", "tiny-llama-1.1b/full", "--precision", "bf16-true", "--simulate", "--json", timeout=300
        ).stdout
    )
    assert js["simulated"]["peak_phase"] in ("forward", "backward", "optimizer step")
    assert js["simulated"]["peak_bytes"] == pytest.approx(js["peak_memory_gb"] * 1e9, rel=0.03)
    argv = ["plan", "tiny-llama-1.1b/full", "--simulate", "--devices", "2"]  # litgpt's own choice: not per rank
    problem = one_line_problems(" ".join(argv), tunelab_cli(*argv), "not simulated")
    assert problem is None, problem


def test_no_quantization_specific_residual_is_left_on_the_h100_runs():
    """Every QLoRA run of reports/2026-11-23-qlora-memory-h100 beside its twin without quantization (same model,
    micro batch and targets): the derived QLoRA terms (dequantized copies, paged states, litgpt's StableEmbedding
    swap) leave the same residual with bitsandbytes as without. The fitted constant they replace was 0.59 GB;
    before the StableEmbedding swap was modelled the QLoRA residuals were 0.37-0.81 GB against the twins'
    0.03-0.16."""
    from tunelab.plan.accuracy import own_rows, quantization_twins

    rows = own_rows()
    twins = quantization_twins(rows)
    assert len(twins) >= 5, [r["row"] for r in rows]
    for q, lo in twins:
        assert abs(q["residual_gb"] - lo["residual_gb"]) <= 0.15, (q, lo)
    for r in rows:
        if r["method"] in ("lora", "qlora"):
            assert abs(r["rel_error"]) <= 0.05, r


def test_the_caching_allocator_rounds_splits_and_merges_as_cudas_does():
    """c10's rules: 512-byte rounding; from 10 MiB a segment of its own rounded to 2 MiB, handed out whole when 1 MiB
    or less would remain (allocated then exceeds the request); the smallest cached block that fits is reused, split
    when more than 1 MiB remains (large pool); small requests from 2 MiB segments; a freed block merges back."""
    from tunelab.plan.allocator import CachingAllocator

    mib = 1 << 20
    a = CachingAllocator()
    whole = a.malloc(11 * mib + 600 * 1024)  # a 12 MiB segment; 424 KiB would remain: not split
    assert (a.allocated, a.reserved, a.requested) == (12 * mib, 12 * mib, 11 * mib + 600 * 1024)
    a.free(whole, 11 * mib + 600 * 1024)
    again = a.malloc(11 * mib + 700 * 1024)  # the cached block, reused whole: no new segment
    assert (a.allocated, a.reserved) == (12 * mib, 12 * mib)
    a.free(again, 11 * mib + 700 * 1024)
    small = a.malloc(100)  # the small pool: a 2 MiB segment, 512 bytes handed out
    assert (a.allocated, a.reserved) == (512, 14 * mib)
    mid = a.malloc(mib + 1)  # the cached 12 MiB block, split: 1 MiB + 512 handed out
    assert (a.allocated, a.reserved) == (512 + mib + 512, 14 * mib)
    a.free(mid, mib + 1)
    last = a.malloc(11 * mib + 600 * 1024)  # the split merged back: the whole 12 MiB block again
    assert (a.allocated, a.reserved) == (512 + 12 * mib, 14 * mib)
    a.free(last, 11 * mib + 600 * 1024)
    a.free(small, 100)
    assert (a.allocated, a.requested) == (0, 0)
    assert (a.peaks.allocated, a.peaks.reserved) == (512 + 12 * mib, 14 * mib)


def test_a_replayed_run_is_the_simulated_step_plus_the_allocators_blocks(configs):
    """litgpt's loop over a run's sequence lengths at full depth: with one length throughout it holds what the
    simulated step (built with 1 and 2 blocks, extrapolated) holds; the allocator's blocks are at least the requests
    and its segments at least the blocks."""
    import dataclasses

    from tunelab.plan.simulate import replay_run

    c = dataclasses.replace(configs["tiny-llama-1.1b"], n_layer=3)
    same = replay_run(c, "lora", "bf16-true", 2, [64] * 4, accumulation=2)["end"]
    assert same.requested == pytest.approx(simulate(c, "lora", "bf16-true", 2, 64, accumulation=2).peak_bytes, abs=64)
    varied = replay_run(c, "lora", "bf16-true", 2, [64, 32, 128, 16], accumulation=2)["end"]
    assert varied.requested <= varied.allocated <= varied.reserved


def test_the_replayed_sanity_validation_uses_the_runs_own_validation_batches(tmp_path):
    """scripts/replay_allocator.py rebuilds the two batches litgpt validated on before training from the archived
    run's tokenizer and data settings: consecutive batches of the unshuffled validation split, so micro batch 4's
    first batch is micro batch 2's first two, padded to the longer; data it cannot rebuild is said, not guessed."""
    import importlib.util
    import tarfile

    spec = importlib.util.spec_from_file_location("replay_allocator", ROOT / "scripts" / "replay_allocator.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    with tarfile.open(ROOT / "reports" / "2026-11-23-qlora-memory-h100" / "records.tgz") as tar:
        names = {m.name.split("/", 1)[-1]: m for m in tar.getmembers()}
        two, source = script.validation_lengths(tar, names, "tiny-lora-all-mb2", 2)
        four, _ = script.validation_lengths(tar, names, "tiny-lora-all-mb4", 4)
        missing = script.validation_lengths(tar, names, "no-such-row", 2)
    assert len(two) == len(four) == script.SANITY_BATCHES and source == "the run's validation split and tokenizer"
    assert four[0] == max(two) and all(0 < n <= 512 for n in two + four)  # 512: the recipe's max_seq_length
    assert missing == ([], "no hyperparameters.yaml in the archive")
    # an archive whose settings are broken: the reason, never a traceback (the replay then validates at the longest)
    import io

    from tunelab.data import benchmark

    broken = {
        "list": b"[1, 2]\n",
        "yaml": b"data: {unclosed\n",
        "type": (
            f"data: {{class_path: litgpt.data.JSON, init_args: {{json_path: {benchmark.default_path().name}, "
            "val_split_fraction: many}}\n"
        ).encode(),
    }
    archive = tmp_path / "broken.tgz"
    with tarfile.open(archive, "w:gz") as tar:
        for row, text in broken.items():
            for name, data in (
                ("hyperparameters.yaml", text),
                ("tokenizer.json", b"{}"),
                ("tokenizer_config.json", b"{}"),
            ):
                info = tarfile.TarInfo(f"sweep/{row}/litgpt/final/{name}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    with tarfile.open(archive) as tar:
        names = {m.name.split("/", 1)[-1]: m for m in tar.getmembers()}
        said = {row: script.validation_lengths(tar, names, row, 2) for row in broken}
    assert said["list"] == ([], "its data (None) is not the benchmark dataset")
    assert said["yaml"] == ([], "hyperparameters.yaml is not valid YAML")
    assert said["type"][0] == [] and said["type"][1].startswith("its data settings could not be rebuilt")


def test_the_replay_script_refuses_bad_archives_and_outputs_in_one_line_before_replaying(tmp_path):
    """scripts/replay_allocator.py: a file that is not a tar, a record that is not JSON, a rank file without
    iterations, an unknown recipe, and an --out whose folder is missing are each one line and exit 2, the output
    checked before any replay (a replay takes minutes)."""
    import io
    import subprocess
    import sys
    import tarfile

    def archive(members: dict):
        path = tmp_path / f"a{len(list(tmp_path.iterdir()))}.tgz"
        with tarfile.open(path, "w:gz") as tar:
            for name, text in members.items():
                data = text.encode()
                info = tarfile.TarInfo(f"records/{name}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
        return path

    rec = '{"status": "ok", "row_id": "r", "recipe": "%s", "overrides": []}'
    not_tar = tmp_path / "x.tgz"
    not_tar.write_text("not a tar")
    cases = [
        ([not_tar, "r"], "not a tar archive"),
        ([archive({"r/record.json": "{not json"}), "r"], "row r"),
        ([archive({"r/record.json": rec % "tiny-llama-1.1b/lora", "r/stats/rank0.json": '{"iters": []}'}), "r"],
         "no iterations"),
        ([archive({"r/record.json": rec % "no/such", "r/stats/rank0.json": '{"iters": [[1, 2, 3]]}'}), "r"],
         "no/such"),
        ([not_tar, "r", "--out", tmp_path / "missing" / "t.md"], "--out"),
    ]  # fmt: skip
    for argv, fragment in cases:
        proc = subprocess.run(
            [sys.executable, str(ROOT / "scripts" / "replay_allocator.py"), *map(str, argv)],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        lines = (proc.stdout + proc.stderr).strip().splitlines()
        assert proc.returncode == 2 and len(lines) == 1 and fragment in lines[0], (argv, lines)
        assert "Traceback" not in proc.stderr
