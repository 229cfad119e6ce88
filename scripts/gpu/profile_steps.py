#!/usr/bin/env python
"""Where the time of a training step goes: TinyLlama (random weights, litgpt's own model classes), full fine-tuning,
LoRA and QLoRA (litgpt's --quantize bnb.nf4: Lightning's bitsandbytes plugin, PagedAdamW, the StableEmbedding
swap), bf16-true (or 32-true: fp32 weights, matmuls as TF32 as litgpt sets them; or bf16-mixed: fp32 weights and
optimizer, the forward under bf16 autocast, as Lightning's MixedPrecision runs it), the lab's micro batch, the
benchmark workload's padded length.

For each method: warm-up steps, then N timed steps with CUDA events around each phase (forward, loss, backward,
optimizer step; medians; the host's own clock per phase beside them, unsynchronised: what a launch-bound step
waits on), then one profiled step (torch.profiler) whose CUDA kernel time is split by kernel name
into dequantization (QLoRA), matmul, attention, cross-entropy/softmax, optimizer, normalisation/elementwise and
other. MFU of the step = 6N (full) or 4N + 6N_lora (LoRA, QLoRA) FLOPs per token plus attention, x tokens / step
time / the GPU's dense peak at that precision.
The machine's host speed (eager dispatch per op on the CPU and on the GPU, an nn.Module call) is measured once and
written with every line. Writes a Markdown summary (--out) and prints it.

    python scripts/gpu/profile_steps.py [--micro 8] [--seq 437] [--steps 10] [--out profile.md]
    python scripts/gpu/profile_steps.py --model tiny --steps 2      (CPU rehearsal: the embedded tiny model)
    python scripts/gpu/profile_steps.py --micro 1 --json grid.jsonl   (one line per method, for the time model)
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

CATEGORIES = [  # (category, substrings of CUDA kernel names, lower case); first match wins
    ("dequantization", ("dequantize",)),  # bitsandbytes' kDequantizeBlockwise (QLoRA's 4-bit weights)
    ("attention", ("flash", "fmha", "attention", "sdpa")),
    ("matmul", ("gemm", "xmma", "cutlass", "nvjet", "cublas", "wgmma", "matmul", "splitk")),
    ("cross-entropy/softmax", ("softmax", "nll", "cross_entropy", "logsumexp")),
    ("optimizer", ("adam", "multi_tensor", "foreach", "lerp", "_amp_", "optimizer32bit", "optimizer_update")),
    (
        "norm/rope/elementwise",
        ("norm", "rsqrt", "elementwise", "vectorized", "pow", "mul", "add", "silu", "cat", "index", "reduce", "fill"),
    ),
]


def categorize(name: str) -> str:
    low = name.lower()
    for cat, keys in CATEGORIES:
        if any(k in low for k in keys):
            return cat
    return "other (copies, casts, ...)"


def build(method: str, model_name: str, device: torch.device, dtype: torch.dtype):
    from litgpt import Config
    from litgpt.lora import GPT as LoRAGPT
    from litgpt.lora import mark_only_lora_as_trainable
    from litgpt.model import GPT

    from tunelab import checkpoints

    config = checkpoints.model_config(model_name) if model_name == "tiny" else Config.from_name(model_name)
    torch.set_default_dtype(dtype)
    with torch.device(device), quantized_init(method, dtype):
        if method in ("lora", "qlora"):  # the recipe's LoRA: r 32, alpha 16, dropout 0.05, every target
            import dataclasses

            from litgpt.lora import Config as LoRAConfig

            from tunelab.report.profiles import PROFILED_LORA

            r, targets = PROFILED_LORA  # what the kernel model's accuracy tables time these steps with
            cfg = LoRAConfig(
                **dataclasses.asdict(config),
                lora_r=r,
                lora_alpha=16,
                lora_dropout=0.05,
                **{f"lora_{t}": True for t in targets},
            )
            model = LoRAGPT(cfg)
            mark_only_lora_as_trainable(model)
        else:
            model = GPT(config)
    torch.set_default_dtype(torch.float32)
    if method == "qlora":
        quantize_on_cpu(model)
        qlora_plugin(dtype).convert_module(model)  # sets every Linear4bit's compute dtype, as Fabric's setup does
    return model


def qlora_plugin(dtype: torch.dtype):
    """litgpt's QLoRA (``--quantize bnb.nf4``): Lightning's bitsandbytes precision plugin, NF4 without nested
    statistics, computing in ``dtype``."""
    from lightning.fabric.plugins import BitsandbytesPrecision

    return BitsandbytesPrecision("nf4", dtype)


def quantized_init(method: str, dtype: torch.dtype):
    """What ``fabric.init_module`` adds under QLoRA: every ``torch.nn.Linear`` built is the plugin's 4-bit linear,
    quantized on the GPU as it is built (from a float16 copy, as Lightning does); a no-op for other methods."""
    import contextlib

    return qlora_plugin(dtype).module_init_context() if method == "qlora" else contextlib.nullcontext()


def quantize_on_cpu(model) -> None:
    """The CPU rehearsal only: Lightning quantizes on CUDA alone, so quantize what it left unquantized here the
    same way (a float16 copy, NF4, the layer's own block size and statistics)."""
    import bitsandbytes as bnb
    from lightning.fabric.plugins.precision.bitsandbytes import _replace_param

    for m in model.modules():
        if isinstance(m, bnb.nn.Linear4bit) and m.weight.dtype != torch.uint8:
            w = m.weight
            q, state = bnb.functional.quantize_4bit(
                w.data.to(torch.half),
                blocksize=w.blocksize,
                compress_statistics=w.compress_statistics,
                quant_type=w.quant_type,
                quant_storage=w.quant_storage,
            )
            m.weight = _replace_param(w, q, state)
            m.weight.bnb_quantized = True


def qlora_optimizer(model):
    """litgpt's QLoRA optimizer step and embedding: bitsandbytes' PagedAdamW over every parameter (the frozen ones have
    no gradient and are skipped), then the embedding swapped for bitsandbytes' StableEmbedding *after* the optimizer
    is built (litgpt 0.5.13's order: the new embedding and its norm train outside the optimizer, their gradients
    accumulate and are never freed)."""
    import bitsandbytes as bnb

    optimizer = bnb.optim.PagedAdamW(model.parameters(), lr=2e-4, betas=(0.9, 0.95), weight_decay=0.0)
    old = model.transformer.wte
    new = bnb.nn.StableEmbedding(old.num_embeddings, old.embedding_dim)
    with torch.no_grad():
        new.weight.copy_(old.weight)
    model.transformer.wte = new.to(device=old.weight.device, dtype=old.weight.dtype)
    return optimizer


def step_fn(model, optimizer, input_ids, targets, timers=None, forward_context=None, fp32_outputs=False):
    """One training step as litgpt's scripts take it; ``forward_context`` (a context manager factory) wraps the
    forward as Fabric's precision plugin does (QLoRA: the default dtype set to the compute dtype; bf16-mixed: bf16
    autocast); ``fp32_outputs``: the logits converted to fp32 after it, as that plugin's ``convert_output`` does."""
    import contextlib

    from litgpt.utils import chunked_cross_entropy

    def mark(name):
        if timers is not None:
            ev = torch.cuda.Event(enable_timing=True) if input_ids.is_cuda else None
            if ev is not None:
                ev.record()
            timers.append((name, ev, time.perf_counter()))

    mark("start")
    with (forward_context or contextlib.nullcontext)():
        logits = model(input_ids, lm_head_chunk_size=128)
    if fp32_outputs:
        logits = [t.float() for t in logits]
    mark("forward")
    logits[-1] = logits[-1][..., :-1, :]
    loss = chunked_cross_entropy(logits, targets[..., 1:])
    mark("loss")
    loss.backward()
    mark("backward")
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    mark("optimizer")
    return loss


def phase_times(timers) -> dict:
    out = {}
    for (_, a, ta), (name, b, tb) in zip(timers, timers[1:]):
        out[name] = a.elapsed_time(b) / 1000 if a is not None else tb - ta
    return out


def host_phase_times(timers) -> dict:
    """Seconds the host's clock spent issuing each phase (no synchronisation inside a step: while the GPU keeps up,
    this is the host's own time, Python, dispatcher and launches; a GPU-bound phase shows less, or the queue's
    waits when it fills)."""
    return {name: tb - ta for (_, _, ta), (name, _, tb) in zip(timers, timers[1:])}


def host_probes(device: torch.device) -> dict:
    """This machine's host speed, beside the steps it explains: eager dispatch per op on the CPU (what tunelab
    records with every run), the same op on the GPU (dispatch + launch, unsynchronised: also recorded), and one
    nn.Module call around it (the module's Python overhead). Microseconds, medians of 5 repeats of 2,000."""
    from tunelab.run.gpu_monitor import cpu_name, device_op_us, host_op_us, per_op_us

    x = torch.ones(16, device=device, requires_grad=True)
    lin = torch.nn.Identity()
    sync = torch.cuda.synchronize if device.type == "cuda" else None
    out = {"cpu": cpu_name(), "host_op_us": host_op_us()}
    out["device_op_us"] = device_op_us() if device.type == "cuda" else per_op_us(lambda y: x * 1.0, x)
    out["module_op_us"] = per_op_us(lambda y: lin(x * 1.0), x, sync)
    out["litgpt_step_op_us"] = litgpt_step_op_us()
    return out


def litgpt_step_op_us() -> float:
    """This CPU's time per dispatched op of litgpt's own training step at a toy width (the tiny model, 2 blocks, 8
    tokens, AdamW; on the CPU, so the kernels cost next to nothing): Python modules, dispatcher and autograd as the
    loop pays them. Beside each grid line's host clock per phase, the data to tell whether a CPU-side probe predicts
    a machine's loop (``plan --host auto``); the median of 5 repeats of 5 steps, the ops counted once."""
    from litgpt.model import GPT
    from torch.utils._python_dispatch import TorchDispatchMode

    from tunelab import checkpoints

    class Counted(TorchDispatchMode):
        ops = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops += 1
            return func(*args, **(kwargs or {}))

    torch.manual_seed(0)
    with torch.device("cpu"):
        model = GPT(checkpoints.model_config("tiny"))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    idx = torch.randint(0, model.config.vocab_size, (1, 8))

    def step() -> None:
        logits = model(idx)
        torch.nn.functional.cross_entropy(logits[0, :-1].float(), idx[0, 1:]).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    step()  # the optimizer's states made
    with Counted() as counted:
        step()
    times = []
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(5):
            step()
        times.append((time.perf_counter() - t0) / 5)
    return statistics.median(times) / counted.ops * 1e6


def cpu_ops(prof) -> dict:
    """The profiled step's host-side ops: {name: [calls, self host microseconds, GPU microseconds of the kernels
    under them]} (the profiler's own overhead included; an op's GPU time includes the ops nested in it), the 200
    most called."""
    rows = [
        (ev.key, ev.count, ev.self_cpu_time_total, getattr(ev, "device_time_total", 0.0))
        for ev in prof.key_averages()
        if ev.device_type == torch.autograd.DeviceType.CPU and ev.count
    ]
    rows.sort(key=lambda r: -r[1])
    return {k: [n, round(t, 1), round(g, 1)] for k, n, t, g in rows[:200]}


def line_decode(model, prompt: torch.Tensor, device: torch.device, method: str) -> dict | None:
    """A grid line's decoded token (:func:`decode_times`). QLoRA decodes through bitsandbytes' 4-bit inference call
    (``gemv_4bit``), whose Python the plan adds per matmul: timed on a GPU only (on a CPU bitsandbytes packs the
    weight for its own kernel, which the tiny model's widths do not divide), and, not yet run on a GPU, a failure
    there is the line's record of it ({"error": ...}) rather than the end of the grid."""
    if method != "qlora":
        return decode_times(model, prompt, device)
    if device.type != "cuda":
        return None
    try:
        return decode_times(model, prompt, device)
    except Exception as e:  # noqa: BLE001 - whatever fails, the line says what
        return {"error": f"{type(e).__name__}: {e}"[:300]}


DECODE_NEW = (8, 24)
"""New tokens of the two generations :func:`decode_times` times: their difference over the 16 tokens between them is
one decoded token, the prompt's prefill cancelled."""


def decode_times(model, prompt: torch.Tensor, device: torch.device) -> dict | None:
    """litgpt's generation as its finetune scripts run it after a validation (``litgpt.generate.base.generate`` at
    temperature 0.8, one sample, the KV cache set for it, the model in eval mode): generations of
    :data:`DECODE_NEW` new tokens after ``prompt``, each synchronised at its end, medians of three; the difference
    over the tokens between them is one decoded token (seconds, and ops dispatched, counted once per length by a
    dispatch mode outside the timing). None where the model's sequence leaves no room for the longer one."""
    from litgpt.generate.base import generate
    from torch.utils._python_dispatch import TorchDispatchMode

    class Counted(TorchDispatchMode):
        ops = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops += 1
            return func(*args, **(kwargs or {}))

    if prompt.numel() + DECODE_NEW[1] >= model.max_seq_length:
        return None
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    model.eval()
    model.set_kv_cache(batch_size=1, device=device)
    seconds, ops = {}, {}
    for new in DECODE_NEW:
        run = functools.partial(generate, model, prompt, prompt.numel() + new, temperature=0.8)
        run()  # warm-up
        with Counted() as counted:
            run()
        ops[new] = counted.ops
        walls = []
        for _ in range(3):
            sync()
            t0 = time.perf_counter()
            run()
            sync()
            walls.append(time.perf_counter() - t0)
        seconds[new] = statistics.median(walls)
    model.clear_kv_cache()
    model.train()
    a, b = DECODE_NEW
    return {
        "s": (seconds[b] - seconds[a]) / (b - a),
        "ops": (ops[b] - ops[a]) / (b - a),
        "new_tokens": list(DECODE_NEW),
    }


def profile_method(
    method: str, model_name: str, micro: int, seq: int, steps: int, device: torch.device, precision: str = "bf16-true"
) -> dict:
    from tunelab.models import lora_param_count
    from tunelab.plan.model.flops import flops_per_token
    from tunelab.report.profiles import PROFILED_LORA

    half = precision == "bf16-true" and device.type == "cuda"
    torch.set_float32_matmul_precision("highest" if half else "high")  # litgpt's CLI sets 'high': TF32 matmuls
    model = build(method, model_name, device, torch.bfloat16 if half else torch.float32)
    model.max_seq_length = seq
    step = step_fn
    if precision == "bf16-mixed":  # fp32 weights; Lightning's MixedPrecision: the forward under autocast
        autocast = functools.partial(torch.autocast, device.type, dtype=torch.bfloat16)
        step = functools.partial(step_fn, forward_context=autocast, fp32_outputs=True)
    if method == "qlora":
        optimizer = qlora_optimizer(model)
        plugin = qlora_plugin(torch.bfloat16 if half else torch.float32)
        step = functools.partial(step_fn, forward_context=plugin.forward_context)
    else:
        params = [p for p in model.parameters() if p.requires_grad]
        optimizer = torch.optim.AdamW(params, lr=2e-4, betas=(0.9, 0.95), weight_decay=0.0)
    gen = torch.Generator(device="cpu").manual_seed(0)
    vocab = model.config.vocab_size
    batch = torch.randint(0, vocab, (micro, seq), generator=gen).to(device)
    for _ in range(3):  # warm-up: allocator growth, kernel selection
        step(model, optimizer, batch, batch)
    if device.type == "cuda":
        torch.cuda.synchronize()
    per_phase: dict[str, list[float]] = {}
    per_host: dict[str, list[float]] = {}
    walls: list[float] = []  # host clock around each step, synchronised at its end (launch-bound steps show here)
    for _ in range(steps):
        timers: list = []
        t0 = time.perf_counter()
        step(model, optimizer, batch, batch, timers)
        if device.type == "cuda":
            torch.cuda.synchronize()
        walls.append(time.perf_counter() - t0)
        for k, v in phase_times(timers).items():
            per_phase.setdefault(k, []).append(v)
        for k, v in host_phase_times(timers).items():
            per_host.setdefault(k, []).append(v)
    medians = {k: statistics.median(v) for k, v in per_phase.items()}
    step_s = sum(medians.values())
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=acts) as prof:
        step(model, optimizer, batch, batch)
        if device.type == "cuda":
            torch.cuda.synchronize()
    by_cat: dict[str, float] = {}
    launches: dict[str, int] = {}
    names: list[tuple[str, int, float]] = []
    for ev in prof.key_averages():
        t = ev.self_device_time_total if device.type == "cuda" else ev.self_cpu_time_total
        if t <= 0 or (device.type == "cuda" and ev.device_type != torch.autograd.DeviceType.CUDA):
            continue
        names.append((ev.key[:160], ev.count, t))
        by_cat[categorize(ev.key)] = by_cat.get(categorize(ev.key), 0.0) + t / 1e6
        launches[categorize(ev.key)] = launches.get(categorize(ev.key), 0) + ev.count
    n_lora = lora_param_count(model.config, *PROFILED_LORA) if method != "full" else 0
    fpt = flops_per_token(model.config, seq, "full" if method == "full" else "lora", n_lora)
    peak = None
    if device.type == "cuda":
        from tunelab import hardware

        gpu = hardware.identify(torch.cuda.get_device_name(0))
        peak = gpu.training_peak(precision) if gpu else None
    tokens = micro * seq
    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=precision == "bf16-mixed"):  # as in training
        decode = line_decode(model, batch[0, : max(1, seq // 2)], device, method)
    del model, optimizer
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return {
        "method": method,
        "phases": medians,
        "step_s": step_s,
        "kernels": by_cat,
        "launches": launches,
        "wall_s": statistics.median(walls),
        "host_phases": {k: statistics.median(v) for k, v in per_host.items()},
        "cpu_ops": cpu_ops(prof),
        "kernel_names": {k: [n, round(t, 1)] for k, n, t in sorted(names, key=lambda r: -r[2])[:100]},
        "tok_s": tokens / step_s,
        "mfu": fpt.total * tokens / step_s / peak if peak else None,
        "tflops": fpt.total * tokens / step_s / 1e12,
        "flops_formula": fpt.formula,
        **({"decode": decode} if decode else {}),
    }


def render(results: list[dict], args, device_name: str) -> str:
    lines = [
        f"# Where the time goes: {args.model_name}, {args.precision}, micro batch {args.micro} x {args.seq} tokens",
        "",
        f"Device: {device_name}; torch {torch.__version__}. Random weights, litgpt's model classes, AdamW "
        "(torch default implementation; QLoRA: bitsandbytes' PagedAdamW), litgpt's chunked cross-entropy and "
        f"lm-head chunking as in its LoRA/full scripts. Phase times: medians of {args.steps} steps after 3 warm-up "
        "steps (CUDA events). Kernel shares: one profiled step, CUDA kernel self time grouped by kernel name.",
        "",
    ]
    lines += [
        "| method | step s | tok/s | TFLOP/s | MFU | forward | loss | backward | optimizer |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        ph = r["phases"]
        share = lambda k, ph=ph, r=r: f"{ph[k]:.4f} s ({ph[k] / r['step_s']:.0%})"  # noqa: E731
        lines.append(
            f"| {r['method']} | {r['step_s']:.4f} | {r['tok_s']:,.0f} | {r['tflops']:.1f} | "
            f"{'' if r['mfu'] is None else format(r['mfu'], '.1%')} | {share('forward')} | "
            f"{share('loss')} | {share('backward')} | {share('optimizer')} |"
        )
    cats = sorted({c for r in results for c in r["kernels"]})
    lines += [
        "",
        "| kernel category | " + " | ".join(r["method"] for r in results) + " |",
        "|---|" + "---|" * len(results),
    ]
    for c in cats:
        cells = []
        for r in results:
            tot = sum(r["kernels"].values()) or 1.0
            v = r["kernels"].get(c, 0.0)
            cells.append(f"{v * 1000:.1f} ms ({v / tot:.0%})")
        lines.append(f"| {c} | " + " | ".join(cells) + " |")
    lines += ["", "FLOPs: " + "; ".join(f"{r['method']}: {r['flops_formula']}" for r in results), ""]
    return "\n".join(lines)


def append_line(path: Path, row: dict) -> None:
    """One JSON line added to ``path``: what was there and the line, written atomically (a cut run keeps the lines
    before it; never through a link or a device: tunelab.files)."""
    from tunelab import files

    old = files.read_text(path, 1 << 24, "profile grid") if path.exists() else ""
    files.write_text_atomic(path, old + json.dumps(row) + "\n")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--model",
        dest="model_name",
        default="tiny-llama-1.1b",
        help="a litgpt config name, or 'tiny' (the embedded tiny model, for a CPU rehearsal)",
    )
    ap.add_argument("--micro", type=int, default=8)
    ap.add_argument("--seq", type=int, default=437, help="tokens per sample (the benchmark's padded mean)")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument(
        "--methods",
        default="full,lora",
        help="comma-separated: full, lora, qlora (LoRA on NF4 weights as litgpt's --quantize bnb.nf4 builds it: "
        "Lightning's bitsandbytes plugin, PagedAdamW, StableEmbedding; bf16-true only)",
    )
    ap.add_argument(
        "--precision",
        choices=("bf16-true", "32-true", "bf16-mixed"),
        default="bf16-true",
        help="bf16-true (default), or 32-true: fp32 weights and optimizer state, matmuls as TF32 (litgpt's 'high'), "
        "or bf16-mixed: fp32 weights and optimizer state, the forward under bf16 autocast (Lightning's MixedPrecision)",
    )
    ap.add_argument("--out", type=Path)
    ap.add_argument(
        "--json",
        type=Path,
        help="append one JSON line per method (model, micro, seq, device, torch, phases, kernel time and launches "
        "by category); a method that runs out of GPU memory is a line with its error",
    )
    args = ap.parse_args()
    from tunelab import files

    def refuse(message: str):  # one line, exit 2, before any model is built
        print(f"profile_steps: {message}", file=sys.stderr)
        raise SystemExit(2)

    for option, path in (("--out", args.out), ("--json", args.json)):  # checked before any measurement
        if path is not None and (why := files.unwritable(path)):
            refuse(f"{option} {path}: {why}")
    if args.micro < 1 or args.seq < 2 or args.steps < 1:
        refuse("--micro and --steps must be 1 or more, --seq 2 or more")
    if bad := [m for m in args.methods.split(",") if m not in ("full", "lora", "qlora")]:
        refuse(f"--methods: {', '.join(bad)} unknown; fix: a comma-separated list of full, lora, qlora")
    if "qlora" in args.methods.split(",") and args.precision != "bf16-true":
        refuse("--methods qlora: litgpt's QLoRA recipes run bf16-true; fix: --precision bf16-true")
    if args.model_name != "tiny":
        from litgpt import Config

        try:
            Config.from_name(args.model_name)
        except ValueError:
            refuse(f"--model {args.model_name}: not a litgpt config name (e.g. tiny-llama-1.1b, open_llama_3b)")
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    results = []
    device_name = torch.cuda.get_device_name(0) if device.type == "cuda" else "CPU"
    probes = host_probes(device)
    print(f"host: {probes}", flush=True)
    for method in args.methods.split(","):
        head = {"model": args.model_name, "method": method, "micro": args.micro, "seq": args.seq}
        head |= {"device": device_name, "torch": torch.__version__, "dtype": args.precision, "steps": args.steps}
        head |= {"host": probes}
        try:
            results.append(
                profile_method(method, args.model_name, args.micro, args.seq, args.steps, device, args.precision)
            )
        except torch.OutOfMemoryError as e:
            print(f"{method}: out of GPU memory ({str(e).splitlines()[0]})", flush=True)
            if args.json:
                with args.json.open("a") as f:
                    f.write(json.dumps(head | {"error": "out of memory"}) + "\n")
            torch.cuda.empty_cache()
            continue
        print(f"{method}: step {results[-1]['step_s']:.4f} s", flush=True)
        if args.json:
            append_line(args.json, head | results[-1])
    if not results:
        return 1
    text = render(results, args, device_name)
    print(text)
    if args.out:
        from tunelab.files import write_text_atomic

        write_text_atomic(args.out, text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
