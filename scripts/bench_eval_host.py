#!/usr/bin/env python
"""Measure the host's time per op of litgpt's validation batch and generated token against its training step, on
this CPU.

The planner times a host-bound step as its dispatched ops at the host's time per op, a constant fitted on litgpt's
training loop (forward with autograd recording, backward). A validation batch (``validate``: eval mode, no
gradients) and a generated token (``generate``: inference mode, a KV cache, one sample, ``.item()`` each token) run
the same modules without autograd's bookkeeping, so each of their ops may cost the host less. This script measures
that ratio, so the planner can charge evaluation at the loop's constant times it:

  * the project's tiny model (litgpt's LLaMA, 64 wide), real tensors on this CPU, one thread, so each op is host
    work; full fine-tuning and LoRA (litgpt's LoRA layers on every target, the head included), bf16-true;
  * at 2 and 8 blocks: the training step (forward and loss, backward; the optimizer step untimed), litgpt's
    validation batch (its ``validate`` body) and litgpt's decoded token (``next_token`` over a KV cache, as
    ``generate`` runs it) each timed as a median, the models and phases of a rep taking their turns in one loop
    (a slow spell of the machine falls on all alike);
  * per phase: the time's growth from 2 to 8 blocks over its op count's (ops as the kernel trace counts them: no
    views, no allocations), so what runs once per step (the head, the sampling) cancels;
  * the ratio: validation's and decode's seconds per op over the training step's.

The JSON holds every rep and the medians with their spread; the table is written beside it as .md.

Usage: python scripts/bench_eval_host.py [--reps 5] [--iters 30] [--warmup 5] [--json-out FILE]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import host_bench  # noqa: E402
from host_bench import add_rep_args, cell, check_rep_args, measured_on  # noqa: E402

from tunelab.checkpoints import TINY_CONFIG  # noqa: E402

METHODS = ("full", "lora")
PRECISION = "bf16-true"
BLOCKS = (2, 8)
PHASES = ("training", "validation", "decode")
SEQ = 64
"""Tokens per training and validation sample; the KV cache holds as many."""


def _model(method: str, n_layer: int):
    """(model, optimizer, case): litgpt's model of ``method`` at ``n_layer`` blocks on this CPU, random weights."""
    from litgpt import Config

    from tunelab.plan.model.case import PlanInput
    from tunelab.plan.trace.simulate import make_optimizer

    config = Config(**dict(TINY_CONFIG, n_layer=n_layer))
    case = PlanInput.of(config=config, method=method, precision=PRECISION, seq_len=SEQ)
    model = host_bench.cpu_model(case, SEQ)
    return model, make_optimizer("AdamW", [p for p in model.parameters() if p.requires_grad]), case


def _training(model, opt, case, x) -> float:
    """Seconds of one training step's forward, loss and backward (the optimizer step untimed)."""
    from tunelab.plan.trace.measure import model_logits, training_loss

    model.train()
    t0 = time.perf_counter()
    training_loss(model_logits(model, x, case.method, PRECISION), x, case.method).backward()
    seconds = time.perf_counter() - t0
    opt.step()
    opt.zero_grad()
    return seconds


def _validation(model, x) -> float:
    """Seconds of litgpt's validation batch: eval mode, no gradients, the loss over the whole head."""
    import torch
    from litgpt.utils import chunked_cross_entropy

    model.eval()
    t0 = time.perf_counter()
    with torch.no_grad():
        logits = model(x)
        chunked_cross_entropy(logits[..., :-1, :], x[..., 1:], chunk_size=0)
    return time.perf_counter() - t0


def _decode(model, tokens: int) -> float:
    """Median seconds of litgpt's decoded token over ``tokens`` of one sample, after its one-token prompt: its
    ``next_token`` at temperature 0.8 over a KV cache in inference mode, and the ``.item()`` ``generate`` reads."""
    import torch
    from litgpt.generate.base import next_token

    model.eval()
    model.set_kv_cache(batch_size=1)
    times = []
    with torch.inference_mode():
        token = next_token(model, torch.tensor([0]), torch.tensor([[1]]), input_pos_maxp1=1, temperature=0.8)
        for i in range(1, tokens + 1):
            t0 = time.perf_counter()
            token = next_token(model, torch.tensor([i]), token.view(1, -1), input_pos_maxp1=i + 1, temperature=0.8)
            token.item()
            times.append(time.perf_counter() - t0)
    model.clear_kv_cache()
    return statistics.median(times)


def _ops(model, opt, case, x) -> dict:
    """Each phase's ops as the kernel trace counts them (:func:`tunelab.plan.trace.kernel_trace.recorder`)."""
    import torch
    from litgpt.generate.base import next_token

    from tunelab.plan.trace.kernel_trace import recorder
    from tunelab.plan.trace.measure import model_logits, training_loss

    ops: list = []
    state = {"phase": "training"}
    model.train()
    with recorder(ops, state):
        training_loss(model_logits(model, x, case.method, PRECISION), x, case.method).backward()
    opt.zero_grad()
    state["phase"] = "validation"
    with recorder(ops, state):
        _validation(model, x)
    model.set_kv_cache(batch_size=1)
    with torch.inference_mode():
        state["phase"] = "not recorded"
        with recorder(ops, state):
            token = next_token(model, torch.tensor([0]), torch.tensor([[1]]), input_pos_maxp1=1, temperature=0.8)
            state["phase"] = "decode"
            next_token(model, torch.tensor([1]), token.view(1, -1), input_pos_maxp1=2, temperature=0.8)
    model.clear_kv_cache()
    return {p: sum(o.phase == p for o in ops) for p in PHASES}


def one_rep(iters: int, warmup: int) -> dict:
    """{method-blocks: {phase: median seconds}, ops} of one rep, every model and phase in turn."""
    import torch

    x = torch.randint(0, TINY_CONFIG["vocab_size"], (1, SEQ))
    built = {f"{m}-{n}": _model(m, n) for m in METHODS for n in BLOCKS}
    times: dict = {label: {p: [] for p in PHASES} for label in built}
    for i in range(warmup + iters):
        for label, (model, opt, case) in built.items():
            got = {
                "training": _training(model, opt, case, x),
                "validation": _validation(model, x),
                "decode": _decode(model, 8),
            }
            if i >= warmup:
                for p, s in got.items():
                    times[label][p].append(s)
    return {
        label: {**{f"{p}_s": statistics.median(times[label][p]) for p in PHASES}, "ops": _ops(*built[label], x)}
        for label in built
    }


def derived(rep: dict, method: str) -> dict:
    """One rep's seconds per op of each phase (growth over growth, :data:`BLOCKS`) and the ratios to training's."""
    lo, hi = (rep[f"{method}-{n}"] for n in BLOCKS)
    per_op = {p: (hi[f"{p}_s"] - lo[f"{p}_s"]) / (hi["ops"][p] - lo["ops"][p]) for p in PHASES}
    out = {f"{p}_us_per_op": per_op[p] * 1e6 for p in PHASES}
    out.update({f"{p}_ratio": per_op[p] / per_op["training"] for p in ("validation", "decode")})
    return out


def summary(reps: list[dict], method: str) -> dict:
    """Medians and ranges over the reps of :func:`derived`."""
    return host_bench.spreads([derived(r, method) for r in reps])


def markdown(result: dict) -> str:
    """The ratios by method as a table: median (range) over reps."""

    s = result["settings"]
    lines = [
        "# Evaluation's host time per op against the training step's (CPU)",
        "",
        f"{result['what']}. CPU {result['cpu']}, Python {result['python']}, torch {result['torch']}, litgpt "
        f"{result['litgpt']}, {PRECISION}; {s['reps']} reps of {s['iters']} timed turns after {s['warmup']}, at "
        f"{' and '.join(map(str, s['blocks']))} blocks. Per phase: the time's growth over its ops' growth; median "
        "(range) over the reps.",
        "",
        "| method | training us/op | validation us/op | decode us/op | validation / training | decode / training |",
        "|---|---|---|---|---|---|",
    ]
    for method, st in result["methods"].items():
        lines.append(
            f"| {method} | {cell(st['training_us_per_op'], 1)} | {cell(st['validation_us_per_op'], 1)} | "
            f"{cell(st['decode_us_per_op'], 1)} | {cell(st['validation_ratio'], 2)} | {cell(st['decode_ratio'], 2)} |"
        )
    ops = result["reps"][0]
    lines += [
        "",
        "Ops per phase (the kernel trace's count): "
        + "; ".join(f"{label}: " + ", ".join(f"{p} {n}" for p, n in v["ops"].items()) for label, v in ops.items()),
        "",
    ]
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_rep_args(ap, reps=5, iters=30, warmup=5)
    args = ap.parse_args(argv)
    check_rep_args(ap, args)
    import torch

    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    result = {
        "what": "Validation's and decode's host time per op against litgpt's training step "
        "(scripts/bench_eval_host.py)",
        **measured_on(args, BLOCKS),
        "reps": [],
        "methods": {},
    }

    def progress(methods: dict) -> str:
        return "\n".join(
            f"  {m}: validation / training {st['validation_ratio']['median']:.2f}, decode / training "
            f"{st['decode_ratio']['median']:.2f}"
            for m, st in methods.items()
        )

    def summarise(reps: list) -> dict:
        return {m: summary(reps, m) for m in METHODS}

    return host_bench.run_reps(args, result, one_rep, summarise, "methods", progress, markdown)


if __name__ == "__main__":
    sys.exit(main())
