"""Run under torchrun (gloo, CPU): DeepSpeed's own ZeRO-2 and ZeRO-3 on small litgpt models, three steps of tunelab's
loss and foreach AdamW (the default on CUDA) each, under torch's MemTracker or (``"measure": "profiler"``) torch's
profiler, whose memory events report each CPU allocation and free without holding a tensor (MemTracker keeps
ZeRO-3's released parameter storages alive); rank 0 writes what it measured as JSON to the path in argv[1]. The
cases come in the TUNELAB_DS_CASES environment variable (JSON: stage, reduce bucket, and either a family's litgpt
name, shrunk by :func:`scaled` (``family``, ``scale``), or the model's sizes: layers,
width, MLP width, vocabulary, heads; ZeRO-3 settings). Read by ``tunelab plan-strategies --deepspeed``
(:mod:`tunelab.report.strategy_checks`) and tests/e2e/test_deepspeed_memory.py."""

import contextlib
import dataclasses
import gc
import json
import os
import sys
import tempfile

import torch

from tunelab import files
from tunelab.strategies import StrategyConfig


def scaled(name: str, scale: int):
    """litgpt's config ``name`` with its width, MLP width and vocabulary / ``scale`` and its heads / 4 (each at least
    one; the head size follows), every block kept: the family's shape (attention groups, norms, MLP, biases,
    partial rotary) at a size DeepSpeed runs on a CPU."""

    from litgpt.model import Config

    c = Config.from_name(name)
    n_embd, n_head = c.n_embd // scale, max(1, c.n_head // 4)
    return dataclasses.replace(
        c,
        n_embd=n_embd,
        n_head=n_head,
        n_query_groups=max(1, c.n_query_groups // 4),
        head_size=n_embd // n_head,
        intermediate_size=c.intermediate_size // scale,
        vocab_size=c.padded_vocab_size // scale,
        padded_vocab_size=c.padded_vocab_size // scale,
        block_size=256,
    )


def config_of(case):
    """The case's litgpt Config (the caller plans the same model): a family shrunk by :func:`scaled`, or a LLaMA-like
    model of the case's sizes."""
    from litgpt.model import Config

    if "family" in case:
        return scaled(case["family"], case.get("scale", 16))
    return Config(
        n_layer=case["layers"],
        n_embd=case["embd"],
        n_head=case["heads"],
        n_query_groups=case["heads"],
        vocab_size=case["vocab"],
        padded_vocab_size=case["vocab"],
        block_size=256,
        bias=False,
        norm_class_name="RMSNorm",
        mlp_class_name="LLaMAMLP",
        intermediate_size=case["inter"],
        rotary_percentage=1.0,
        parallel_residual=False,
    )


def _run(case, rank):
    import deepspeed
    from deepspeed.runtime.zero.partition_parameters import ZeroParamStatus
    from litgpt.model import GPT
    from torch.distributed._tools.mem_tracker import MemTracker

    from tunelab.run.loop import deepspeed_config, litgpt_loss

    cfg = config_of(case)
    torch.manual_seed(0)
    model = GPT(cfg).to(torch.bfloat16)
    bucket = int(case["bucket"])
    strategy = StrategyConfig(
        name="deepspeed", zero_stage=case["stage"], reduce_bucket_size=bucket, allgather_bucket_size=bucket
    )
    conf = deepspeed_config(strategy, case.get("micro", 2), 1, "bf16-true")
    conf["zero_optimization"].update({k: int(v) for k, v in case.get("zero", {}).items()})
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True)
    tracker = MemTracker()
    tracker.track_external(model)
    held: list = []

    def gathered(module, args, output):  # what ZeRO-3 holds gathered when the forward reaches the head
        held.append(
            sum(
                p.ds_numel
                for p in engine.module.parameters()
                if p.ds_status != ZeroParamStatus.NOT_AVAILABLE and not p.ds_persist
            )
        )

    x = torch.randint(0, cfg.vocab_size, (case.get("micro", 2), case.get("tokens", 128)))
    profiled = case.get("measure") == "profiler"
    track = case.get("track", True) and not profiled
    prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True)
    with tracker if track else contextlib.nullcontext(), prof if profiled else contextlib.nullcontext():
        engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer, config=conf)
        if case["stage"] == 3:
            engine.module.lm_head.register_forward_hook(gathered)
        with torch.profiler.record_function(STEPS_MARK):
            for _ in range(3):
                tracker.reset_mod_stats()
                engine.backward(litgpt_loss(engine, x, x, "full", strategy))
                engine.step()
        peak = tracker.get_tracker_snapshot("peak")
        now = tracker.get_tracker_snapshot()
    cpu = torch.device("cpu")
    if profiled:
        peak, now = profiled_peak(prof)
    else:
        peak, now = peak.get(cpu, {}).get("Total"), now.get(cpu, {}).get("Total")
    return {
        "peak": peak,
        "at_rest": now,
        "gathered_at_head": held[-1] if held else None,
        "params": sum(p.ds_numel if hasattr(p, "ds_numel") else p.numel() for p in engine.module.parameters()),
    }


STEPS_MARK = "tunelab-steps"
"""The profiler range around the training steps (the peak is taken there, not in DeepSpeed's set-up)."""


def profiled_peak(prof) -> tuple[int, int]:
    """(peak, at the end) of the bytes alive that were allocated while ``prof`` ran, over its training steps
    (:data:`STEPS_MARK`), from the allocations and frees its memory events report (:func:`alive_bytes`)."""
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "trace.json")
        prof.export_chrome_trace(path)
        events = json.loads(files.read_text(path, 1 << 31, "profiler trace"))["traceEvents"]
    return alive_bytes(events)


def alive_bytes(events: list[dict]) -> tuple[int, int]:
    """(peak over the :data:`STEPS_MARK` range, at the end) of the bytes alive in a chrome trace's ``[memory]``
    events, followed block by block: a block lives from its allocation to its free, or to the next allocation at its
    address (an allocator never hands out a live address, so that allocation proves a free the profiler did not
    see). Not the profiler's running total ("Total Allocated"): c10 reports a free only on a thread the profiler
    covers, so a block freed on another thread stays in that total for good: under ZeRO-3 on 2 ranks (TinyLlama /
    16), 51 gathered parameters' blocks, 4.9-6.3 MB over the blocks alive at the peak."""
    start = min(e["ts"] for e in events if e.get("name") == STEPS_MARK and e.get("ph") == "X")
    memory = sorted((e["ts"], e["args"]["Addr"], e["args"]["Bytes"]) for e in events if e.get("name") == "[memory]")
    alive: dict[int, int] = {}
    total = peak = 0
    for ts, addr, size in memory:
        total -= alive.pop(addr, 0)  # its free (size < 0), or one not seen before this allocation (size > 0)
        if size > 0:
            alive[addr] = size
            total += size
        if ts >= start:
            peak = max(peak, total)
    return peak, total


def main():
    """Every case of TUNELAB_DS_CASES on this rank; rank 0 writes the results to argv[1]."""
    import deepspeed

    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False  # gloo's all-reduce, no JIT-built op
    rank = int(os.environ["RANK"])
    results = []
    for case in json.loads(os.environ["TUNELAB_DS_CASES"]):
        gc.collect()  # an earlier case's engine (reference cycles) gone before this one is measured
        results.append(_run(case, rank))
    if rank == 0:
        with open(sys.argv[1], "w") as f:
            json.dump(results, f)
    # leave together, then without running C++ destructors: a rank's exit through them sometimes ends in
    # "terminate called without an active exception" (SIGABRT) after its work is done (seen in CI, 1 in ~5 runs)
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
