"""The simulated step (litgpt's model on fake tensors under torch's MemTracker) and the planner terms named from it:
the fast CPU subset of `tunelab plan-families --simulate` (TinyLlama and Llama 3.2 1B: a 32k and a 128k vocabulary),
the CLI, and QLoRA's terms against our H100 runs."""

from __future__ import annotations

import pytest

from tests.conftest import ROOT
from tunelab.models import count_params, lora_param_count
from tunelab.plan.model import memory
from tunelab.plan.trace.simulate import simulate
from tunelab.plan.trace.tables import TRACED


def case(config, method: str, precision: str, micro: int, seq_len: int, **fields) -> memory.PlanInput:
    """The one-device case the simulation runs: ``config`` at micro x seq_len tokens, litgpt's loop."""
    return memory.PlanInput.of(
        config=config, method=method, precision=precision, micro_batch_size=micro, seq_len=seq_len, **fields
    )


def test_the_simulation_counts_what_the_step_holds(configs):
    """Weights, gradients and AdamW's states are exactly the model's sizes; the states exist from the first step,
    so the second step's forward holds them; the logits stay alive through the optimizer step (litgpt's loop)."""
    c = configs["Llama-3.2-1B"]
    total, _ = count_params(c)
    sim = simulate(case(c, "full", "bf16-true", 2, 256))
    step = sim.phases["optimizer step"]
    assert step["Parameter"] == pytest.approx(2 * total, rel=1e-3)
    assert step["Gradient"] == pytest.approx(2 * total, rel=1e-3)
    assert step["Optstate"] == pytest.approx(3 * 2 * total, rel=1e-3)  # two moments + foreach's temporary
    assert step["Activation"] == pytest.approx(
        memory.logits_held_at_step(memory.PlanInput(config=c, micro_batch_size=2, seq_len=256, tables=TRACED)), rel=0.01
    )
    assert sim.phases["forward"]["Optstate"] == pytest.approx(2 * 2 * total, rel=1e-3)


def test_extrapolation_by_block_is_linear(configs):
    """Built with 1+2 or with 2+3 blocks, the extrapolated step is the same: one block more adds the same bytes."""
    c = configs["tiny-llama-1.1b"]
    a = simulate(case(c, "lora", "bf16-true", 2, 256), layers=1)
    b = simulate(case(c, "lora", "bf16-true", 2, 256), layers=2)
    assert b.layers_built == (2, 3)
    for phase in a.phases:
        assert a.phases[phase]["Total"] == pytest.approx(b.phases[phase]["Total"], rel=0.005)


def test_autocast_copies_are_the_difference_between_mixed_and_true_lora(configs):
    """bf16-mixed LoRA keeps 16-bit copies of every frozen block weight and one of lm_head per 128-token chunk:
    the simulated difference to bf16-true is that term, give or take what the activations differ by (the logits
    are fp32 in both: Fabric converts the model's outputs under every precision)."""
    c = configs["tiny-llama-1.1b"]
    mixed = simulate(case(c, "lora", "bf16-mixed", 1, 256)).phases["forward"]
    true = simulate(case(c, "lora", "bf16-true", 1, 256)).phases["forward"]
    copies = memory.autocast_weight_copies(
        memory.PlanInput(config=c, method="lora", precision="bf16-mixed", seq_len=256, tables=TRACED)
    )
    extra = mixed["Activation"] - true["Activation"]
    assert copies * 0.99 <= extra <= copies * 1.10


def test_qlora_follows_bitsandbytes_storage(configs):
    """NF4 weights (half a byte and an fp32 absmax per 64) for every linear; the paged optimizer keeps two fp32
    states of every tensor under 1e5 elements on the device (at rank 8 every adapter but lm_head's B) and pages the
    rest; the adapters take gradients, and so does the StableEmbedding litgpt swaps in."""
    c = configs["tiny-llama-1.1b"]
    q = simulate(case(c, "qlora", "bf16-true", 2, 256, optimizer="PagedAdamW"))
    lo = simulate(case(c, "lora", "bf16-true", 2, 256))
    total, emb = count_params(c)
    linear = total - emb  # every Linear, lm_head's included (Lightning converts them all)
    saved = lo.phases["forward"]["Parameter"] - q.phases["forward"]["Parameter"]
    swap = emb + 2 * c.n_embd  # litgpt's StableEmbedding: the old embedding stays referenced, + a LayerNorm
    assert saved == pytest.approx(linear * (2 - 0.5 - 4 / 64) - 2 * swap, rel=0.01)
    lora = memory.PlanInput(config=c, method="lora", lora_r=8, optimizer="bitsandbytes.optim.PagedAdamW", tables=TRACED)
    resident = memory.paged_optimizer_device_states(lora)
    assert resident == 8 * (lora_param_count(c, 8) - 8 * c.padded_vocab_size)  # lm_head's B: 8 x 32000, paged
    assert q.phases["optimizer step"]["Optstate"] == pytest.approx(resident, rel=1e-3) and "paged" in " ".join(q.notes)
    # the adapters' gradients, and the StableEmbedding's, which no zero_grad frees (it is not in the optimizer)
    assert q.phases["forward"]["Gradient"] == lo.phases["forward"]["Gradient"] + 2 * swap
    assert lo.phases["forward"]["Gradient"] < 0.01 * total


def test_the_caching_allocator_rounds_splits_and_merges_as_cudas_does():
    """c10's rules: 512-byte rounding; from 10 MiB a segment of its own rounded to 2 MiB, handed out whole when 1 MiB
    or less would remain (allocated then exceeds the request); the smallest cached block that fits is reused, split
    when more than 1 MiB remains (large pool); small requests from 2 MiB segments; a freed block merges back."""
    from tunelab.plan.model.allocator import CachingAllocator

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
