#!/usr/bin/env python
"""Measure what an FSDP or DDP wrapper costs the host per unit, in ops of the plain model's own loop, on this CPU.

The planner times a host-bound step as its dispatched ops at the host's time per op; an FSDP wrapper adds work per
unit (its pre- and post-forward and backward hooks, the flat parameter's views, the unshard and reshard, the
collectives' launches), DDP its reducer (a hook per parameter, the bucket copies, the all-reduce's launch; under
``no_sync()`` almost nothing), mostly Python and views, not ops of the model. This script measures that work as a
number of the model's own ops, so the planner can charge it at any host's time per op:

  * the project's tiny model (litgpt's LLaMA, 64 wide), real tensors on this CPU, one thread, so the step is host
    work;
  * the same loop (litgpt's forward and loss, backward, torch's AdamW) plain and wrapped, at 2 and 8 blocks, each
    timed as the median of ``--iters`` iterations after ``--warmup``, the models of a rep taking their iterations
    in turn (a slow spell of the machine falls on all alike);
  * the plain loop's seconds per op: its time's growth from 2 to 8 blocks over its op count's (ops as the kernel
    trace counts them: no views, no allocations), without activation checkpointing, as litgpt's host time per op
    was fitted (a checkpointed wrapper is compared with the plain loop checkpointed alike, and its seconds are
    converted at the unchecked loop's time per op);
  * the wrapper's seconds per unit: the wrapped growth less the plain growth over 6 blocks; fixed: the rest;
  * op-equivalents = those seconds over the plain loop's seconds per op, forward and backward apart.

A world of 1 runs on a gloo group of one rank (FSDP1 then runs its NO_SHARD path, as on one GPU); a larger world
runs as rank 0 of torch's fake process group (every collective issued, nothing moved: its host cost only). Each case
runs in its own process. The JSON holds every rep and the medians with their spread.

Usage: python scripts/bench_wrapper_host.py [--reps 5] [--iters 40] [--warmup 10] [--cases litgpt-fsdp1:1,...]
                                           [--json-out FILE]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import host_bench  # noqa: E402
from host_bench import add_rep_args, check_rep_args, measured_on  # noqa: E402

from tunelab.checkpoints import TINY_CONFIG  # noqa: E402

CASES = {
    "litgpt-fsdp1": (
        "full",
        "bf16-mixed",
        "litgpt's full fine-tuning: Lightning's FSDPStrategy, Block units, checkpointed",
    ),
    "litgpt-fsdp2": ("lora", "bf16-true", "litgpt's LoRA: its parallelize_fn (fully_shard per block, checkpointed)"),
    "fsdp": ("full", "bf16-true", "tunelab's fsdp file: FSDP1, FULL_SHARD, Block units"),
    "fsdp2": ("full", "bf16-true", "tunelab's fsdp2 file: fully_shard per block, then the root"),
    "ddp": ("full", "bf16-true", "tunelab's ddp file: torch DDP with its buckets, every micro batch all-reducing"),
    "ddp-no-sync": ("full", "bf16-true", "the same inside DDP's no_sync(): a micro batch that accumulates"),
}
"""Wrapper name: (method, precision, what it is)."""
DEFAULT_CASES = "litgpt-fsdp1:1,litgpt-fsdp1:2,litgpt-fsdp1:4,fsdp:4,fsdp2:4,litgpt-fsdp2:4,ddp:1,ddp-no-sync:1"
BLOCKS = (2, 8)


def _config(n_layer: int):
    """The project's embedded tiny model (64 wide, grouped-query attention) at ``n_layer`` blocks."""
    from litgpt import Config

    return Config(**dict(TINY_CONFIG, n_layer=n_layer))


def _model(wrapper: str | None, name: str, world: int, n_layer: int, checkpointed: bool = True):
    """(model, optimizer, case) on this CPU: litgpt's model at ``n_layer`` blocks, plain (checkpointed as the
    wrapper would, unless not ``checkpointed``) or wrapped."""
    import torch

    from tunelab.plan.model.case import PlanInput
    from tunelab.plan.trace import ranks
    from tunelab.plan.trace.simulate import checkpoint_blocks, make_optimizer
    from tunelab.strategies import load_strategy

    method, precision, _ = CASES[name]
    case = PlanInput.of(config=_config(n_layer), method=method, precision=precision, seq_len=64, devices=world)
    model = host_bench.cpu_model(case, 64)
    if wrapper is None:
        if checkpointed and name.startswith("litgpt"):
            checkpoint_blocks(model)
    elif name == "litgpt-fsdp1":
        model = ranks.lightning_fsdp(model, precision)
    elif name == "litgpt-fsdp2":
        from torch.distributed.device_mesh import init_device_mesh

        mesh = init_device_mesh("cpu", (world, 1), mesh_dim_names=("data_parallel", "tensor_parallel"))
        model = ranks.litgpt_parallelize(model, mesh)
    elif name.startswith("ddp"):  # tunelab does not wrap one rank in DDP; here it is, to time its reducer
        from torch.nn.parallel import DistributedDataParallel

        config = load_strategy("ddp")
        model = DistributedDataParallel(
            model, bucket_cap_mb=config.bucket_cap_mb, gradient_as_bucket_view=config.gradient_as_bucket_view
        )
        model.tunelab_no_sync = name == "ddp-no-sync"
    else:
        from tunelab.parallel import wrap

        model = wrap(model, load_strategy(name), torch.device("cpu"), world)
    return model, make_optimizer("AdamW", [p for p in model.parameters() if p.requires_grad]), case


def _iteration(model, opt, case, x) -> tuple[float, float]:
    """One iteration of the loop: (forward through the loss, backward) seconds; the optimizer step untimed."""
    from tunelab.plan.trace.measure import model_logits, training_loss

    with model.no_sync() if getattr(model, "tunelab_no_sync", False) else contextlib.nullcontext():
        t0 = time.perf_counter()
        loss = training_loss(model_logits(model, x, case.method, str(case.precision)), x, case.method)
        t1 = time.perf_counter()
        loss.backward()
        t2 = time.perf_counter()
    opt.step()
    opt.zero_grad()
    return t1 - t0, t2 - t1


def _ops(model, opt, case, x) -> dict:
    """The ops of one forward and backward, as the kernel trace counts them."""
    from tunelab.plan.trace import kernel_trace
    from tunelab.plan.trace.measure import model_logits, training_loss

    ops: list = []
    state = {"phase": "forward"}
    with kernel_trace.recorder(ops, state):
        loss = training_loss(model_logits(model, x, case.method, str(case.precision)), x, case.method)
        state["phase"] = "backward"
        loss.backward()
    opt.zero_grad()
    return {p: sum(o.phase == p for o in ops) for p in ("forward", "backward")}


def _timed(built: dict, iters: int, warmup: int) -> dict:
    """{label: median forward and backward seconds, and the ops} of every built (model, optimizer, case), their
    iterations taken in turn (one of each, then again), so that a slow spell of the machine falls on all alike."""
    import torch

    x = torch.randint(0, TINY_CONFIG["vocab_size"], (1, 64))
    times: dict = {label: [] for label in built}
    for i in range(warmup + iters):
        for label, (model, opt, case) in built.items():
            forward, backward = _iteration(model, opt, case, x)
            if i >= warmup:
                times[label].append((forward, backward))
    return {
        label: {
            "forward_s": statistics.median(f for f, _ in times[label]),
            "backward_s": statistics.median(b for _, b in times[label]),
            "ops": _ops(*built[label], x),
        }
        for label in built
    }


def child(name: str, world: int, reps: int, iters: int, warmup: int) -> dict:
    """Every rep of one case, in this process."""
    import torch
    import torch.distributed as dist

    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    if world == 1:
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(29400 + os.getpid() % 1000))
        dist.init_process_group("gloo", rank=0, world_size=1)
    else:
        from torch.testing._internal.distributed.fake_pg import FakeStore

        dist.init_process_group("fake", rank=0, world_size=world, store=FakeStore())
    out = []
    runs = [("plain", None, True), ("wrapped", name, True)]
    if name.startswith("litgpt"):  # checkpointed: the time per op of the loop without checkpointing, apart
        runs.append(("reference", None, False))
    for _ in range(reps):
        built = {
            f"{label}-{n}": _model(wrapper, name, world, n, checkpointed)
            for label, wrapper, checkpointed in runs
            for n in BLOCKS
        }
        out.append(_timed(built, iters, warmup))
    dist.destroy_process_group()
    return {"reps": out}


def derived(rep: dict) -> dict:
    """One rep's op-equivalents: per unit and fixed, forward and backward (see the module docstring)."""
    lo, hi = BLOCKS
    grown = hi - lo
    out = {}
    ref = "reference" if f"reference-{lo}" in rep else "plain"
    for phase in ("forward", "backward"):
        plain_s = rep[f"plain-{hi}"][f"{phase}_s"] - rep[f"plain-{lo}"][f"{phase}_s"]
        ref_s = rep[f"{ref}-{hi}"][f"{phase}_s"] - rep[f"{ref}-{lo}"][f"{phase}_s"]
        per_op = ref_s / (rep[f"{ref}-{hi}"]["ops"][phase] - rep[f"{ref}-{lo}"]["ops"][phase])
        wrapped_s = rep[f"wrapped-{hi}"][f"{phase}_s"] - rep[f"wrapped-{lo}"][f"{phase}_s"]
        per_unit = (wrapped_s - plain_s) / grown
        fixed = rep[f"wrapped-{lo}"][f"{phase}_s"] - rep[f"plain-{lo}"][f"{phase}_s"] - lo * per_unit
        out[phase] = {"us_per_op": per_op * 1e6, "ops_per_unit": per_unit / per_op, "ops_fixed": fixed / per_op}
    return out


def summary(reps: list[dict]) -> dict:
    """Medians and ranges over the reps of :func:`derived`."""
    each = [derived(r) for r in reps]
    out = {}
    for phase in ("forward", "backward"):
        for key in ("us_per_op", "ops_per_unit", "ops_fixed"):
            values = [e[phase][key] for e in each]
            out[f"{phase}_{key}"] = {"median": statistics.median(values), "min": min(values), "max": max(values)}
    units = [e["forward"]["ops_per_unit"] + e["backward"]["ops_per_unit"] for e in each]
    out["ops_per_unit"] = {"median": statistics.median(units), "min": min(units), "max": max(units)}
    return out


def markdown(result: dict) -> str:
    """The cases as a table: op-equivalents per unit and fixed, forward and backward, median (range) over reps."""

    def cell(stat: dict) -> str:
        return f"{stat['median']:.0f} ({stat['min']:.0f} to {stat['max']:.0f})"

    lines = [
        "# A wrapper's host work (FSDP, DDP), in ops of the plain loop (CPU)",
        "",
        f"{result['what']}. CPU {result['cpu']}, Python {result['python']}, torch {result['torch']}, litgpt "
        f"{result['litgpt']}; {result['settings']['reps']} reps of {result['settings']['iters']} timed iterations "
        f"after {result['settings']['warmup']}, at {' and '.join(map(str, result['settings']['blocks']))} blocks. "
        "Median (range) over the reps. A unit is one block; 'fixed' is the rest per micro batch (the root unit, "
        "the wrapper's own).",
        "",
        "| wrapper | world | method | precision | ops per unit | forward per unit | backward per unit | forward fixed "
        "| backward fixed | plain loop us/op |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for c in result["cases"].values():
        s = c["summary"]
        lines.append(
            f"| {c['wrapper']} | {c['world']} | {c['method']} | {c['precision']} | {cell(s['ops_per_unit'])} | "
            f"{cell(s['forward_ops_per_unit'])} | {cell(s['backward_ops_per_unit'])} | {cell(s['forward_ops_fixed'])} "
            f"| {cell(s['backward_ops_fixed'])} | {s['forward_us_per_op']['median']:.1f} |"
        )
    described = {c["wrapper"]: c["what"] for c in result["cases"].values()}
    lines += ["", *(f"- {wrapper}: {what}" for wrapper, what in described.items()), ""]
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_rep_args(ap, reps=5, iters=40, warmup=10)
    ap.add_argument("--cases", default=DEFAULT_CASES, help="wrapper:world, comma-separated (default %(default)s)")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    check_rep_args(ap, args)
    if args.child:
        name, world = args.child.split(":")
        print(json.dumps(child(name, int(world), args.reps, args.iters, args.warmup)))
        return 0
    cases = []
    for item in args.cases.split(","):
        name, _, world = item.partition(":")
        if name not in CASES or not world.isdigit() or not 1 <= int(world) <= 64:
            ap.error(f"--cases: {item!r}; each wrapper:world, wrapper one of {', '.join(CASES)}, world 1-64")
        cases.append((name, int(world)))
    result = {
        "what": "A wrapper's host work per unit (FSDP, DDP), in ops of the plain loop (scripts/bench_wrapper_host.py)",
        **measured_on(args, BLOCKS),
        "cases": {},
    }
    for i, (name, world) in enumerate(cases, 1):
        print(f"[{i}/{len(cases)}] {name} on {world} ...", file=sys.stderr, flush=True)
        cmd = [sys.executable, __file__, "--child", f"{name}:{world}", "--reps", str(args.reps)]
        cmd += ["--iters", str(args.iters), "--warmup", str(args.warmup)]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=3600)
        if proc.returncode != 0:
            print(f"{name} on {world}: failed: {(proc.stderr.strip().splitlines() or ['?'])[-1]}", file=sys.stderr)
            return 1
        reps = json.loads(proc.stdout.strip().splitlines()[-1])["reps"]
        method, precision, what = CASES[name]
        s = summary(reps)
        result["cases"][f"{name}:{world}"] = {
            "wrapper": name,
            "world": world,
            "method": method,
            "precision": precision,
            "what": what,
            "summary": s,
            "reps": reps,
        }
        print(
            f"  {s['ops_per_unit']['median']:.0f} ops per unit ({s['ops_per_unit']['min']:.0f}-"
            f"{s['ops_per_unit']['max']:.0f}); forward {s['forward_ops_per_unit']['median']:.0f}, backward "
            f"{s['backward_ops_per_unit']['median']:.0f}; plain loop {s['forward_us_per_op']['median']:.1f} us/op",
            file=sys.stderr,
            flush=True,
        )
        host_bench.write(args, result, markdown)
    return host_bench.finish(args, result)


if __name__ == "__main__":
    sys.exit(main())
