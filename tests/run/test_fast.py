"""tunelab's fast path (configs/strategies/fast.yaml) on CPU: the same loss as litgpt with batching unchanged
(compiled blocks and the fused optimizer included, inductor on this CPU), length grouping that keeps every sample once
per epoch and cuts the padding, no host synchronisation between log intervals, and the printed command's record."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tests.conftest import ROOT
from tunelab.run import batching


def benchmark_lengths(tmp: Path, micro: int = 8) -> list[int]:
    """Token counts of the benchmark dataset's training split (the lab's shapes), tokenised by litgpt's own data
    module with the benchmark tokenizer, as a random-weight run reads them."""
    from litgpt.data import JSON
    from litgpt.tokenizer import Tokenizer

    from tunelab.data import benchmark

    ckpt = tmp / "tok"
    ckpt.mkdir()
    benchmark.write_tokenizer(ckpt)
    data = JSON(json_path=benchmark.ensure(), val_split_fraction=0.5, num_workers=0)
    data.connect(tokenizer=Tokenizer(ckpt), batch_size=micro, max_seq_length=512)
    data.setup()
    return batching.Tokenized.of(data.train_dataloader().dataset).lengths


def test_length_grouping_keeps_every_sample_once_and_cuts_the_padding(tmp_path):
    """On the benchmark data at micro batch 8: litgpt's order pads 40-45% of the computed tokens (the lab's ~43%),
    fast.yaml's length grouping under 5%; every training sample is in exactly one micro batch of every epoch, on
    one rank and dealt to two."""
    lengths = benchmark_lengths(tmp_path)
    n = len(lengths)
    assert n == 1000
    group = yaml.safe_load((ROOT / "configs" / "strategies" / "fast.yaml").read_text())["length_grouping"]
    for epoch in range(3):
        order = batching.litgpt_order(n, 42, epoch)
        plain = batching.plan_epoch(order, 8)
        grouped = batching.plan_epoch(order, 8, lengths, group, seed=42, epoch=epoch)
        assert sorted(i for b in grouped for i in b) == list(range(n))
        assert 0.40 < batching.padding_fraction(plain, lengths) < 0.46
        assert batching.padding_fraction(grouped, lengths) < 0.05
        shares = [batching.rank_batches(grouped, r, 2) for r in (0, 1)]
        assert len(shares[0]) == len(shares[1]) and {i for s in shares for b in s for i in b} == set(range(n))
    assert batching.plan_epoch(order, 8, lengths, group, 42, 1) != batching.plan_epoch(order, 8, lengths, group, 42, 2)


def test_the_fast_loop_builds_litgpts_optimizer_with_every_hyperparameter():
    """tunelab's loop (fused, as the fast path runs it, and unfused) builds the recipe's optimizer with every
    hyperparameter litgpt's own ``instantiate_torch_optimizer`` gives it: learning rate, weight decay, betas, eps
    (an optimizer that kept only the learning rate would train otherwise and pass a loss comparison of a few steps);
    the schedule starts at litgpt's warm-up; the run's arguments, saved as hyperparameters.yaml, are left as they
    were (litgpt's helper adds ``fused`` to the init_args it is given)."""
    import copy

    import torch
    from litgpt.utils import instantiate_torch_optimizer

    from tunelab.recipes import resolve
    from tunelab.run.loop import _setup_optimizer
    from tunelab.settings import resolve_args
    from tunelab.strategies import load_strategy

    recipe = resolve("tiny-llama-1.1b/full")
    optimizer = {
        "class_path": "torch.optim.AdamW",
        "init_args": {"lr": 3e-4, "weight_decay": 0.05, "betas": [0.8, 0.95], "eps": 1e-7},
    }
    args = {**resolve_args(recipe, []), "optimizer": optimizer}
    pristine = copy.deepcopy(optimizer)
    model = torch.nn.Linear(4, 4)
    wanted = instantiate_torch_optimizer(optimizer, list(model.parameters())).defaults
    for name in ("fast", "ddp"):
        strategy = load_strategy(name)
        _, built, scheduler, _ = _setup_optimizer(args, model, strategy, torch.device("cpu"), "32-true", 4, 1, 10)
        assert args["optimizer"] == pristine, (name, args["optimizer"])  # not mutated
        for key in ("lr", "weight_decay", "betas", "eps", "amsgrad"):
            assert built.defaults[key] == wanted[key], (name, key, built.defaults[key], wanted[key])
        assert bool(built.defaults.get("fused")) == strategy.fused_optimizer, name
        assert scheduler.get_last_lr()[0] < 3e-4  # litgpt's linear warm-up starts below the peak


def test_the_loop_takes_the_loss_on_float32_logits_as_litgpt_does(monkeypatch):
    """Fabric hands litgpt's loss float32 logits under every precision: the loop's loss (full fine-tuning's whole
    head, LoRA's chunked head) reads the logits in float32 from a bfloat16 model too."""
    import litgpt.utils
    import torch
    from litgpt import GPT, Config

    from tunelab.run import loop
    from tunelab.strategies import StrategyConfig

    seen = []
    real = litgpt.utils.chunked_cross_entropy

    def spy(logits, targets, **kw):
        seen.append({t.dtype for t in (logits if isinstance(logits, list) else [logits])})
        return real(logits, targets, **kw)

    monkeypatch.setattr(litgpt.utils, "chunked_cross_entropy", spy)
    config = Config(n_layer=1, n_head=2, n_embd=16, block_size=32, vocab_size=64, padded_vocab_size=64)
    model = GPT(config).to(torch.bfloat16)
    ids = torch.randint(0, 64, (2, 12))
    for method in ("full", "lora"):
        loss = loop.litgpt_loss(model, ids, ids, method, StrategyConfig(name="single"))
        assert loss.dtype == torch.float32 and seen[-1] == {torch.float32}, (method, seen[-1])


def test_the_loops_validation_is_litgpts_eval_mode_without_a_graph_over_max_iters():
    """litgpt's ``validate`` (``@torch.no_grad``, ``model.eval()``): the mean of the first ``max_iters`` batches'
    losses, no autograd graph kept across them, the model back in train mode after."""
    import contextlib

    import torch
    from litgpt import GPT, Config

    from tunelab.run import loop
    from tunelab.strategies import StrategyConfig

    config = Config(n_layer=1, n_head=2, n_embd=16, block_size=32, vocab_size=64, padded_vocab_size=64)
    model = GPT(config)
    calls = []
    model.register_forward_hook(lambda m, a, out: calls.append((m.training, torch.is_grad_enabled())))
    torch.manual_seed(0)
    batches = [{"input_ids": (ids := torch.randint(0, 64, (2, 12))), "labels": ids} for _ in range(5)]
    model.train()
    got = loop.validate(model, batches, torch.device("cpu"), contextlib.nullcontext(), 3, 1)
    assert calls == [(False, False)] * 3 and model.training
    model.eval()
    with torch.no_grad():
        single = StrategyConfig(name="single")
        want = [loop.litgpt_loss(model, b["input_ids"], b["labels"], "full", single).item() for b in batches[:3]]
    assert got == pytest.approx(sum(want) / 3, rel=1e-6)


def test_the_loop_builds_litgpts_lora_model_with_the_recipes_adapters_and_dropout(tiny_ckpt):
    """The LoRA model the loop trains: the recipe's rank, alpha and dropout on every adapted layer (the recipes'
    0.05: dropout on in training, as litgpt's; a loop that built its adapters without it would train otherwise
    and still pass a loss comparison run with ``--lora_dropout 0``), only the adapters trainable."""
    import torch

    from tunelab.recipes import resolve
    from tunelab.run.loop import build_model
    from tunelab.settings import resolve_args

    args = {**resolve_args(resolve("tiny-llama-1.1b/lora"), []), "checkpoint_dir": str(tiny_ckpt)}
    model, config = build_model(args, "lora", torch.device("cpu"), "32-true")
    layers = [m for m in model.modules() if hasattr(m, "lora_A")]
    assert layers and (config.lora_r, config.lora_alpha) == (args["lora_r"], args["lora_alpha"]) == (32, 16)
    assert {m.lora_dropout.p for m in layers} == {args["lora_dropout"]} == {0.05}
    trainable = {n.rsplit(".", 1)[-1] for n, p in model.named_parameters() if p.requires_grad}
    assert trainable == {"lora_A", "lora_B"}


def test_grouping_keeps_a_short_micro_batch_and_filler_rows_count_as_padding_only():
    """A sample count that is no multiple of the micro batch: every sample in one micro batch of the epoch, the short
    one kept (plain and length-grouped); a short micro batch filled up to the static row count: the filler rows are
    litgpt's padding (pad id, ignored labels), counted as padded tokens, never as real ones nor as the loss's
    targets."""
    import math

    import torch
    from litgpt.data.base import get_sft_collate_fn

    n, micro = 37, 8
    lengths = [5 + (7 * i) % 23 for i in range(n)]
    order = batching.litgpt_order(n, 42, 0)
    for group in (None, 2):
        plan = batching.plan_epoch(order, micro, lengths, group, seed=42, epoch=0)
        assert sorted(i for b in plan for i in b) == list(range(n)) and len(plan) == math.ceil(n / micro)
    samples = [
        {
            "input_ids": torch.arange(1, k + 1),
            "labels": torch.arange(1, k + 1),
            "token_counts": {"raw": k - 2, "raw_plus_prompt_template": k},
        }
        for k in (5, 9)
    ]
    fn = get_sft_collate_fn(max_seq_length=64, pad_id=0, ignore_index=-100)
    batch = batching.collate(batching.Tokenized(samples), [0, 1], fn, rows=4, multiple=8, cap=64)
    assert tuple(batch["input_ids"].shape) == (4, 16) and batch["padded"] == 64
    assert batch["real"] == 14 and batch["raw"] == 10  # the two samples' tokens only
    assert batch["counted"] == 4 + 8  # the loss's targets, read on the host: each sample's labels after the first
    assert batch["counted"] == batching.counted_targets(batch["labels"])  # summed per sample, as in the batch
    assert (batch["labels"][2:] == -100).all() and (batch["input_ids"][2:] == 0).all()


def test_compiling_the_shapes_ahead_leaves_the_random_state_and_no_gradients():
    """The pass that compiles every static shape before training runs a forward and backward per shape through
    LoRA's dropout, which draws random numbers: the random state after it is the one before (the run's dropout masks
    stay litgpt's), and no gradient is left behind."""
    import contextlib

    import torch
    from litgpt.lora import GPT, Config

    from tunelab.run import loop
    from tunelab.strategies import StrategyConfig

    config = Config(
        n_layer=1,
        n_head=2,
        n_embd=16,
        block_size=32,
        vocab_size=64,
        padded_vocab_size=64,
        lora_r=4,
        lora_alpha=8,
        lora_dropout=0.5,
        lora_query=True,
        lora_value=True,
    )
    model = GPT(config).train()
    strategy = StrategyConfig(name="single", compile="blocks")
    torch.manual_seed(3)
    before = torch.get_rng_state()
    model(torch.zeros((2, 8), dtype=torch.long))
    assert not torch.equal(torch.get_rng_state(), before)  # a forward in training draws (dropout)
    torch.set_rng_state(before)
    loop._compile_shapes(
        model, [(2, 8), (2, 16)], torch.device("cpu"), "lora", strategy, contextlib.nullcontext(), None
    )
    assert torch.equal(torch.get_rng_state(), before)
    assert all(p.grad is None for p in model.parameters())


def test_the_final_validation_runs_over_the_whole_validation_set(tmp_path):
    """litgpt's final validation takes every validation batch (``max_iters=len(val_dataloader)``), not
    ``eval.max_iters``: the loop's end asks for as many as the split holds, then saves the final checkpoint."""
    from types import SimpleNamespace

    import torch

    from tunelab.run import loop

    asked, saved = [], []
    run = SimpleNamespace(
        token_counts={"raw": 1, "raw_plus_prompt_template": 2, "padded": 3},
        device=torch.device("cpu"),
        world=1,
        rank=0,
        eval_args=SimpleNamespace(final_validation=True, max_iters=1),
        data=SimpleNamespace(val=[object()] * 5),
        validate=lambda n: asked.append(n) or 2.0,
        log=SimpleNamespace(row=lambda row: None, close=lambda: None),
        _write_iterations=lambda: None,
        save=lambda directory, *a: saved.append(directory.name),
        out_dir=tmp_path,
        method="full",
    )
    loop._Loop.finish(run, 1.0, 3)
    assert asked == [5] and saved == ["final"]


def test_the_loop_trains_at_litgpts_precision_where_the_recipe_sets_none(monkeypatch):
    """A recipe without a precision: tunelab's loop trains at what litgpt picks on the device (bf16-mixed on a CPU
    or a GPU with bfloat16; a GPU without it gets 16-mixed, which the loop refuses in one line), and a set
    precision is kept as set."""
    import torch

    from tunelab.run import loop
    from tunelab.strategies import StrategyError

    assert loop.loop_precision({"precision": None}) == "bf16-mixed"  # this CPU
    assert loop.loop_precision({"precision": "32-true"}) == "32-true"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    assert loop.loop_precision({}) == "bf16-mixed"
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: False)
    with pytest.raises(StrategyError, match="16-mixed.*fix: --precision 32-true"):
        loop.loop_precision({"precision": None})
    assert loop.loop_precision({"precision": "16-true"}) == "16-true"
