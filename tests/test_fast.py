"""tunelab's fast path (configs/strategies/fast.yaml) on CPU: the same loss as litgpt with batching unchanged
(compiled blocks and the fused optimizer included, inductor on this CPU), length grouping that keeps every sample once
per epoch and cuts the padding, no host synchronisation between log intervals, and the printed command's record."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests import printed
from tests.conftest import ROOT, cpu_env, equal_length_dataset
from tests.test_distributed import common, run_cli, step_losses
from tunelab.run import batching

FAST = "tunelab run tiny-llama-1.1b/full --strategy fast --devices 1"
PRINTED = {FAST}
"""The README's fast-path line: run here as printed on the tiny model (a few steps)."""


def fast_variant(tmp: Path, **changes) -> Path:
    """configs/strategies/fast.yaml with some keys changed, written to ``tmp``."""
    cfg = yaml.safe_load((ROOT / "configs" / "strategies" / "fast.yaml").read_text())
    cfg.update(changes)
    path = tmp / "fast-variant.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


@pytest.mark.parametrize("method", ["full", "lora"])
def test_fast_path_gives_litgpts_loss_curve(method, tiny_ckpt, tmp_path):
    """Batching unchanged (no length grouping; the loss read every iteration to compare it): litgpt's own
    `finetune_*` on one process and tunelab's loop with compiled blocks, the fused AdamW, tokenisation once and
    prefetch give the same per-step losses within 1e-4 (fp32, equal-length samples, micro 4 x accumulation 2).
    LoRA's dropout is off: a compiled kernel draws its random mask differently from eager PyTorch."""
    data_file = equal_length_dataset(tiny_ckpt, tmp_path / "equal.json", n=64)
    extra = [*common(data_file, tiny_ckpt), "--train.micro_batch_size", "4"]
    if method == "lora":
        extra += ["--lora_dropout", "0"]
    recipe = f"tiny-llama-1.1b/{method}"
    ref = run_cli(["run", recipe, *extra], tmp_path / "litgpt")
    assert ref.status == "ok", ref.error
    strategy = fast_variant(tmp_path, length_grouping=None, log_interval=1)
    rec = run_cli(
        ["run", recipe, "--strategy", str(strategy), "--devices", "1", *extra, "--timeout", "600"], tmp_path / "fast"
    )
    assert rec.status == "ok", (rec.error, (tmp_path / "fast" / "stderr.log").read_text()[-3000:])
    assert "compiled blocks" in rec.strategy and "fused optimizer" in rec.strategy and rec.first_iteration_s > 0
    reference, fast = step_losses(tmp_path / "litgpt", 2), step_losses(tmp_path / "fast", 2)
    assert len(reference) == 3 and reference[0] != reference[-1]
    assert fast == pytest.approx(reference, rel=1e-4, abs=1e-5)


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


SYNC_COUNTER = r"""
import collections, json, os, sys
import torch, torch.distributed as dist
from tunelab.recipes import resolve
from tunelab.run import loop, rank_stats
from tunelab.strategies import load_strategy
from tunelab.validate import parse

counts, current = collections.Counter(), [0]
original_record = rank_stats.record_iteration
def record_iteration(*a):
    current[0] += 1
    original_record(*a)
rank_stats.record_iteration = record_iteration
def counting(name, fn):
    def wrapper(*a, **k):
        counts[(current[0], name)] += 1
        return fn(*a, **k)
    return wrapper
for name in ("item", "tolist", "cpu", "numpy", "__int__", "__float__", "__bool__", "__index__"):
    setattr(torch.Tensor, name, counting(name, getattr(torch.Tensor, name)))
torch.cuda.synchronize = counting("cuda.synchronize", torch.cuda.synchronize)
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=sys.argv[3], RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
dist.init_process_group("gloo")
recipe = resolve("tiny-llama-1.1b/full")
args = parse(recipe, sys.argv[4:])
loop.fit(args, "full", load_strategy(sys.argv[1]))
dist.destroy_process_group()
json.dump([[i, name, c] for (i, name), c in counts.items()], open(sys.argv[2], "w"))
"""


def test_no_host_synchronisation_between_log_intervals(tiny_ckpt, tmp_path):
    """fast.yaml's loop, 14 iterations with the loss read every 5: counting every tensor-to-Python read (`.item()`,
    `.tolist()`, `.cpu()`, `.numpy()`, int/float/bool/index of a tensor) and device synchronisations per iteration,
    the steady iterations that are not a log interval have none (the first three: compilation, excluded)."""
    from tunelab.run.runner import _free_port

    strategy = fast_variant(tmp_path, log_interval=5)
    out = tmp_path / "counts.json"
    overrides = [
        "--precision",
        "32-true",
        "--train.micro_batch_size",
        "2",
        "--train.global_batch_size",
        "2",
        "--train.max_steps",
        "14",
        "--train.lr_warmup_steps",
        "1",
        "--eval.final_validation",
        "false",
        "--data.num_workers",
        "0",
        "--checkpoint_dir",
        str(tiny_ckpt),
        "--out_dir",
        str(tmp_path / "o"),
    ]
    p = subprocess.run(
        [sys.executable, "-c", SYNC_COUNTER, str(strategy), str(out), str(_free_port()), *overrides],
        cwd=ROOT,
        env=cpu_env(),
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    counts = json.loads(out.read_text())
    assert sum(c for i, _, c in counts if i in (5, 10, 14)) > 0  # the reads are there, at the log intervals
    steady = [(i, name, c) for i, name, c in counts if 4 <= i <= 13 and i not in (5, 10)]
    assert not steady, f"host reads in steady iterations: {steady}"


def test_the_printed_fast_command_trains_and_records(tiny_ckpt, tmp_path):
    """The README's line, on the tiny model for a few steps: a record with the fast strategy, its first iteration
    (compilation) apart, every sample of the steps counted."""
    assert FAST in {p.command for p in printed.readme()}
    argv = shlex.split(FAST)[1:]
    rec = run_cli(
        [
            *argv,
            "--train.max_steps",
            "6",
            "--precision",
            "32-true",
            "--data.num_workers",
            "0",
            "--checkpoint_dir",
            str(tiny_ckpt),
            "--eval.max_iters",
            "2",
        ],
        tmp_path / "run",
    )
    assert rec.status == "ok", rec.error
    assert rec.strategy.startswith("single (") and "length-grouped" in rec.strategy
    assert rec.optimizer_steps == 6 and rec.first_iteration_s > 0 and rec.tok_s_real > 0
    assert rec.tokens_padded > rec.tokens_real > 0
