"""One resolver for litgpt's arguments (tunelab.settings), checked against litgpt's own parser; the derived
figures (world size, accumulation) computed in one place; strategy files that say they offload do."""

from __future__ import annotations

import dataclasses
import time

import pytest

from tunelab import litgpt_source, settings
from tunelab.recipes import discover, resolve
from tunelab.sweep_file import load
from tunelab.validate import parse

VARIANTS = [
    [],
    [
        "--data",
        "Alpaca",
        "--train.micro_batch_size=2",
        "--optimizer",
        "SGD",
        "--devices",
        "2",
        "--checkpoint_dir",
        "checkpoints/meta-llama/Llama-2-7b-hf",
    ],
    [
        "--data",
        "Alpaca2k",
        "--data.val_split_fraction",
        "0.1",
        "--precision",
        "16-true",
        "--num_nodes",
        "2",
        "--train.max_steps",
        "null",
        "--train.epochs",
        "3",
    ],
    # a whole group given as a mapping: into the group's values, as jsonargparse does (tunelab replaced the group,
    # and planned `--train '{micro_batch_size: 2}'` without the recipe's global batch: refused as None)
    ["--train", "{micro_batch_size: 2, epochs: 2}", "--eval", "{interval: 7}"],
]


def cases():
    recipes = discover()
    one_per_method = {r.method: r for r in recipes}.values()
    out = [(r, []) for r in recipes] + [(r, v) for r in one_per_method for v in VARIANTS[1:]]
    for name in ("lab-part1", "lab-part2", "qlora-memory"):
        out += [(row.recipe, row.overrides()) for row in load(name).rows]
    return out


def test_fast_resolver_equals_litgpts_parser_on_every_recipe_and_sweep_row():
    """The planner's resolver (litgpt's defaults read from its source, no import) gives the same Settings as
    litgpt's jsonargparse parser, for every recipe (with overrides of every form) and every sweep row."""
    checked, t_fast = 0, 0.0
    for recipe, overrides in cases():
        t0 = time.perf_counter()
        fast = settings.resolve(recipe, overrides)
        t_fast += time.perf_counter() - t0
        slow = settings.from_args(recipe, parse(recipe, overrides))
        diff = {
            f.name: (getattr(fast, f.name), getattr(slow, f.name))
            for f in dataclasses.fields(fast)
            if f.compare and getattr(fast, f.name) != getattr(slow, f.name)
        }
        assert not diff, (recipe.key, overrides, diff)
        checked += 1
    assert checked > 45


def test_world_size_and_accumulation_are_litgpts():
    assert settings.world_size(4, 2) == 8
    assert settings.accumulation(16, 4, 1) == 4
    assert settings.accumulation(10, 1, 4) == 2  # floored, as litgpt does (validate refuses it)
    assert settings.accumulation(2, 4, 1) == 1  # litgpt would assert; never 0 here
    s = settings.resolve(resolve("open-llama-13b/full"))
    assert (s.world_size, s.accumulation) == (4, 4)
    s = settings.resolve(resolve("open-llama-13b/full"), ["--devices", "2", "--train.micro_batch_size", "2"])
    assert (s.world_size, s.accumulation) == (2, 4)


def test_data_module_defaults_come_from_litgpt():
    """Alpaca2k holds 5% out for validation by default (its own field, inherited fields from Alpaca)."""
    d = litgpt_source.data_defaults("litgpt.data.Alpaca2k")
    assert d["val_split_fraction"] == 0.05 and d["mask_prompt"] is False and "tokenizer" not in d
    s = settings.resolve(resolve("tiny-llama-1.1b/lora"), ["--data", "Alpaca2k"])
    assert s.data_class == "litgpt.data.Alpaca2k" and s.data_path is None


@pytest.mark.parametrize("name", ["deepspeed-zero3-offload", "fsdp-offload"])
def test_strategy_files_that_say_offload_do(name):
    from tunelab.strategies import load_strategy

    st = load_strategy(name)
    assert st.offload_optimizer or st.offload_params or st.cpu_offload


def test_data_size_from_the_file_or_the_known_module():
    """The warm-up check and the runtime projection know the data's size for JSON files and litgpt's modules."""
    from tunelab.validate import check

    n, src = settings.data_size(settings.resolve_args(resolve("tiny-llama-1.1b/full"), []))
    assert n == 400 and "data/alpaca_tunelab.json" in src
    n, src = settings.data_size(settings.resolve_args(resolve("tiny-llama-1.1b/full"), ["--data", "Alpaca2k"]))
    assert n == 2000 and "alpaca_2k" in src
    # the lab's full YAMLs warm up for 100 steps of a 63-step epoch (Alpaca2k, val split 0.5: 1,000 samples in micro
    # batches of 16, the last one of 8, and a step each): warned
    result = check(resolve("tiny-llama-1.1b/full"), ["--data", "Alpaca2k", "--train.lr_warmup_steps", "100"])
    assert any(
        p.key == "train.lr_warmup_steps" and p.severity == "warning" and "63 optimizer steps" in p.message
        for p in result.problems
    )


def test_split_sizes_are_torchs_random_split_as_litgpts_data_modules_call_it():
    """The validation share's sample count (``settings.split_sizes``) equals torch's ``random_split`` into
    ``[1 - f, f]`` (floored shares, the remainder dealt from the first), small shares and odd counts included."""
    import warnings

    from torch.utils.data import random_split

    from tunelab.settings import split_sizes

    for n in (1, 2, 3, 7, 400, 999, 1000, 52002):
        for f in (0.0, 0.0001, 0.002, 0.003, 0.05, 0.1, 1 / 3, 0.5, 0.999):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # torch warns about an empty share
                want = tuple(len(part) for part in random_split(range(n), [1 - f, f]))
            assert split_sizes(n, f) == want, (n, f)


def test_litgpt_schedule_counts_micro_batches_samples_and_steps_as_litgpts_loop():
    """``settings.litgpt_schedule`` against torch's DistributedSampler and DataLoader (as Fabric sets them up: each
    rank's padded share, the last micro batch short) under litgpt's CycleIterator and its fit loop's count: the
    epoch checked after each fetch, a step every accumulation-th micro batch counted on across epochs, the loop
    stopped at max_steps. A short last micro batch that completes an accumulation makes a step (200 samples on 4
    devices at micro 4: 13 steps, not 200 // 16 = 12)."""
    import itertools

    from litgpt.utils import CycleIterator
    from torch.utils.data import DataLoader, DistributedSampler

    from tunelab.settings import accumulation, litgpt_schedule

    cases = itertools.product((1, 7, 40, 150, 200, 1000), (1, 2, 4), (1, 3, 4, 16), (1, 2, 4), (1, 2, 3), (None, 5))
    for n, world, micro, acc, epochs, max_steps in cases:
        gbs = micro * acc * world
        loaders = [
            DataLoader(range(n), micro, sampler=DistributedSampler(range(n), world, r, shuffle=False))
            for r in range(world)
        ]
        it, iters, trained, samples, steps = CycleIterator(loaders[0]), 0, 0, 0, 0
        while steps < (max_steps or float("inf")):
            iters += 1
            batch = next(it)
            if it.epoch >= epochs:
                break
            trained, samples = trained + 1, samples + len(batch)
            steps += iters % accumulation(gbs, world, micro) == 0
        got = litgpt_schedule(n, world, micro, gbs, epochs, max_steps)
        case = (n, world, micro, gbs, epochs, max_steps)
        assert (got.micro_batches, got.samples, got.steps) == (trained, world * samples, steps), case
        spe = len(loaders[-1]) // accumulation(gbs, world, micro)
        assert got.steps_per_epoch == spe and got.span == min(epochs * spe, max_steps or epochs * spe), case
    run = litgpt_schedule(200, 4, 4, 16, 1, None)
    assert run.steps == 13 and run.samples == 200 and run.micro_batches == 13


def test_devices_are_unfed_only_when_they_outnumber_the_training_samples():
    """As many devices as samples: one each (the sampler repeats none). One more: a device trains only on another's
    sample. Fewer samples than devices x micro batch is no reason: the micro batches are shorter."""
    assert settings.unfed_devices(4, 4) is None and settings.unfed_devices(0, 8) is None
    assert settings.unfed_devices(4, 1) is None
    what, fix = settings.unfed_devices(4, 5)
    assert "5 devices, more than the 4 training samples" in what and fix.startswith("at most 4 devices")


def test_an_override_without_a_value_is_shown_with_the_value_it_has_now():
    """``--precision`` at the end of a command line: the fix gave ``--precision 8`` as its example, a value no
    precision takes; it now shows the key's resolved value (or VALUE where it is a group)."""
    from tunelab.errors import InputError

    recipe = resolve("tiny-llama-1.1b/lora")
    for key, example in (("precision", "bf16-true"), ("train.micro_batch_size", "4"), ("optimizer", "VALUE")):
        with pytest.raises(InputError) as refused:
            settings.resolve_args(recipe, [f"--{key}"])
        assert str(refused.value).endswith(f"has no value; fix: give one, e.g. --{key} {example}") or str(
            refused.value
        ).endswith(f"e.g. --{key} {example} (its value now)"), refused.value
