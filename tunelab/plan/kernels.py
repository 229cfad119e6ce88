"""The simulated step's kernels, timed one by one on a named GPU: the first piece of the runtime model by cause.

The step of :mod:`tunelab.plan.simulate` (litgpt's model, loss and optimizer on fake tensors, at full width) runs
under a ``TorchDispatchMode`` that records every ATen op it dispatches in the forward pass and the loss, the
backward pass and the optimizer step: its category, its FLOPs (matmuls and attention) and the bytes it reads and
writes (every tensor argument and result that is not a view). Ops that only make views launch no kernel and are
not counted. The step is traced with one and with two blocks and extrapolated by block to the model's ``n_layer``,
as the memory simulation does.

Each kernel gets a time on the GPU (``configs/hardware/gpus.yaml``):

* matmul: FLOPs / (dense peak of the compute dtype x :data:`MATMUL_EFFICIENCY` x the share of the GPU's SMs its
  output tiles keep busy over its waves (:func:`wave_efficiency`: tiles of :data:`TILE` x :data:`TILE`, one wave
  per SM count));
* attention (flash): FLOPs / (dense peak x :data:`ATTENTION_EFFICIENCY`), causal (half the score blocks);
* everything else (norms, RoPE, SwiGLU, casts, copies, the loss, the optimizer's for-each ops): bytes / (HBM
  bandwidth x :data:`MEMORY_EFFICIENCY`);
* every kernel at least :data:`MIN_KERNEL_S`.

The host launches the kernels one after another: :data:`HOST_S_PER_OP` per dispatched op (Python, the dispatcher,
the launch). The step takes ``max(GPU time, host time)``: a small model with many small kernels (LoRA on 1B) waits
on the host, a large one on the GPU.

What this is not yet: the run around the step (padding from the data, validations, saves), communication, fused
optimizer and compiled kernels, QLoRA's dequantization; the constants are fitted on one profile (our H100's, TinyLlama
full and LoRA, ``reports/2026-11-23-lab-part1-h100/profile.md``) and checked nowhere else yet. ``tunelab plan`` still
uses :mod:`tunelab.plan.runtime`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import warnings
from dataclasses import dataclass, field

CATEGORIES = ("matmul", "attention", "elementwise", "loss", "optimizer")
"""Kernel categories, as the H100 profile groups CUDA kernels (norm/rope/elementwise, cross-entropy/softmax, ...)."""

MATMUL_EFFICIENCY = 0.85
"""Fraction of the dense peak a large, well-shaped matmul reaches (cuBLAS on H100/A100 reaches 70-90%); fitted on
the H100 profile's matmul time (TinyLlama full, 29.1 ms)."""
ATTENTION_EFFICIENCY = 0.19
"""Fraction of the dense peak the flash kernels reach at fine-tuning lengths (437 tokens, head size 64: short rows,
few tiles); fitted on the H100 profile's attention time (3.0 ms)."""
MEMORY_EFFICIENCY = 0.75
"""Fraction of the HBM bandwidth an eager elementwise kernel reaches; fitted on the H100 profile's elementwise,
loss and copy time (TinyLlama full, 40.4 ms)."""
FOREACH_EFFICIENCY = 0.56
"""Fraction of the HBM bandwidth torch's for-each optimizer kernels reach (many tensors per launch, bf16 math in
fp32); fitted on the H100 profile's optimizer phase (TinyLlama full, AdamW for-each, 16.4 ms)."""
MIN_KERNEL_S = 3e-6
"""The shortest a kernel takes on the GPU (launch latency and a tail): seconds."""
HOST_S_PER_OP = 35e-6
"""Host time per dispatched op in eager PyTorch (Python module code, the dispatcher, autograd's bookkeeping, the
launch); fitted on the H100 profile's two steps (full 97.6 ms, GPU-bound; LoRA 160.7 ms, host-bound: its kernels
keep the GPU busy 89 ms)."""
TILE = 128
"""Output tile edge of a tensor-core matmul kernel (cuBLAS's common 128 x 128 / 128 x 256 tiles)."""
NOT_KERNELS = frozenset(
    "device _record_function_enter_new _record_function_exit empty empty_like empty_strided new_empty "
    "new_empty_strided _unsafe_view detach alias lift_fresh is_same_size sym_size sym_numel sym_stride stride dim "
    "is_contiguous _has_compatible_shallow_copy_type".split()
)
"""Ops that launch no GPU kernel: queries, allocations, views without alias annotations."""
SMS = {"H100-SXM": 132, "H100-PCIe": 114, "H200": 132, "A100-80GB": 108, "A100-40GB": 108}
"""Streaming multiprocessors per GPU (NVIDIA's H100 and A100 whitepapers); others: 108."""


@dataclass
class Kernel:
    """One dispatched op: its phase, category, FLOPs, bytes moved, and the matmul's output shape."""

    phase: str
    op: str
    category: str
    flops: float = 0.0
    bytes: float = 0.0
    tiles: int = 0
    dtype: str = "bf16"


@dataclass
class StepTime:
    """A step's time by cause on one GPU (seconds; ``gpu_by_category`` sums to ``gpu_s``)."""

    gpu: str
    ops: int
    gpu_s: float
    host_s: float
    gpu_by_category: dict = field(default_factory=dict)
    gpu_by_phase: dict = field(default_factory=dict)
    ops_by_phase: dict = field(default_factory=dict)

    def phase_s(self, phase: str) -> float:
        """A phase's time: its kernels or its launches, whichever is longer."""
        return max(self.gpu_by_phase.get(phase, 0.0), self.ops_by_phase.get(phase, 0) * HOST_S_PER_OP)

    @property
    def step_s(self) -> float:
        """The step: the GPU's kernels or the host's launches, whichever is longer."""
        return max(self.gpu_s, self.host_s)


def wave_efficiency(tiles: int, sms: int) -> float:
    """The share of SM slots a matmul's ``tiles`` output tiles keep busy: the last wave is partly empty."""
    if tiles <= 0:
        return 1.0
    return tiles / (math.ceil(tiles / sms) * sms)


def _category(name: str) -> str:
    if name in ("mm", "addmm", "bmm", "baddbmm", "convolution", "convolution_backward"):
        return "matmul"
    if "attention" in name:
        return "attention"
    if name.startswith("_foreach") or name.startswith("_fused_adam"):
        return "optimizer"
    if "log_softmax" in name or "nll_loss" in name:
        return "loss"
    return "elementwise"


def _matmul_flops_tiles(name: str, args, out) -> tuple[float, int]:
    """(FLOPs, output tiles) of a matmul-like op from its operand shapes."""
    if name in ("mm", "addmm"):
        a, b = (args[0], args[1]) if name == "mm" else (args[1], args[2])
        m, k = a.shape
        n = b.shape[1]
        return 2.0 * m * n * k, math.ceil(m / TILE) * math.ceil(n / TILE)
    if name in ("bmm", "baddbmm"):
        a, b = (args[0], args[1]) if name == "bmm" else (args[1], args[2])
        bs, m, k = a.shape
        n = b.shape[2]
        return 2.0 * bs * m * n * k, bs * math.ceil(m / TILE) * math.ceil(n / TILE)
    if name in ("convolution", "convolution_backward"):  # litgpt's LoRA: a grouped 1-D conv over tokens
        o = out[0] if isinstance(out, (tuple, list)) else out
        w = args[1] if name == "convolution" else args[2]
        flops = 2.0 * o.numel() * math.prod(w.shape[1:])
        return flops * (2 if name == "convolution_backward" else 1), math.ceil(o.numel() / TILE**2)
    return 0.0, 0


def _attention_flops(name: str, args) -> float:
    """Causal attention FLOPs: 4 B H T^2 D forward (halved: blocks above the diagonal are skipped), 2.5x backward."""
    q, k = args[0], args[1]
    if q.dim() != 4:
        return 0.0
    b, h, t, d = q.shape
    forward = 4.0 * b * h * t * k.shape[2] * d / 2
    return forward * (2.5 if "backward" in name else 1.0)


def _nbytes(tensors) -> float:
    import torch

    return float(sum(t.numel() * t.element_size() for t in tensors if isinstance(t, torch.Tensor)))


def _flat(x) -> list:
    """The tensors in an op's arguments or results (nested lists and tuples included)."""
    import torch
    from torch.utils._pytree import tree_leaves

    return [t for t in tree_leaves(x) if isinstance(t, torch.Tensor)]


def _recorder(kernels: list, state: dict):
    from torch.utils._python_dispatch import TorchDispatchMode

    class Recorder(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            schema = func._schema
            name = schema.name.split("::")[-1]
            views = all(r.alias_info is not None and not r.alias_info.is_write for r in schema.returns)
            if (views and schema.returns) or name in NOT_KERNELS:
                return out  # a view, a query or an allocation: no kernel
            if name == "_local_scalar_dense":  # .item(): a copy to the host, no kernel of its own
                return out
            cat = _category(name)
            k = Kernel(state["phase"], name, cat)
            ins, outs = _flat(args) + _flat(list((kwargs or {}).values())), _flat(out)
            if cat == "matmul":
                k.flops, k.tiles = _matmul_flops_tiles(name, args, out)
            elif cat == "attention":
                k.flops = _attention_flops(name, args)
            if schema.returns and all(r.alias_info is not None for r in schema.returns):
                k.bytes = _nbytes(ins)  # in place: read and written once (the outputs are the inputs)
            else:
                k.bytes = _nbytes(ins) + _nbytes(outs)
            dt = next((t.dtype for t in ins + outs if t.is_floating_point()), None)
            k.dtype = str(dt).removeprefix("torch.") if dt is not None else "bf16"
            kernels.append(k)
            return out

    return Recorder()


def trace_step(config, method: str, precision: str, micro: int, seq_len: int, optimizer: str = "AdamW") -> list:
    """Every kernel of one training step (the second: the optimizer's states exist) of ``config`` as built, as
    litgpt's finetune script runs it (:func:`tunelab.plan.simulate._one_step`'s step, without the memory tracker)."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    from tunelab.plan.measure import cuda_dropout, model_logits, training_loss
    from tunelab.plan.simulate import setup_step
    from tunelab.settings import LITGPT_LORA_R, LORA_TARGETS

    kernels: list = []
    state = {"phase": "forward"}
    with FakeTensorMode(), cuda_dropout(), warnings.catch_warnings():
        warnings.filterwarnings("ignore")
        model, opt, _ = setup_step(config, method, precision, seq_len, False, LITGPT_LORA_R, LORA_TARGETS, optimizer)
        x = torch.zeros(micro, seq_len, dtype=torch.long)
        for step in range(2):
            record = step == 1
            with _recorder(kernels, state) if record else contextlib.nullcontext():
                state["phase"] = "forward"
                logits = model_logits(model, x, method, precision)
                loss = training_loss(logits, x, method)
                state["phase"] = "backward"
                loss.backward()
                state["phase"] = "optimizer"
                opt.step()
                opt.zero_grad()
            del logits, loss
    return kernels


def kernel_seconds(k: Kernel, gpu, sms: int) -> float:
    """One kernel's time on ``gpu`` (a :class:`tunelab.hardware.GPU`), by its category."""
    peaks = gpu.peak_tflops
    bandwidth = gpu.bandwidth_gbs * 1e9 * (FOREACH_EFFICIENCY if k.category == "optimizer" else MEMORY_EFFICIENCY)
    if k.category in ("matmul", "attention") and k.flops:
        peak = (peaks.get("tf32") if k.dtype == "float32" else peaks.get("bf16") or peaks.get("fp16")) or peaks["fp32"]
        if k.category == "matmul":
            eff = MATMUL_EFFICIENCY * wave_efficiency(k.tiles, sms)
        else:
            eff = ATTENTION_EFFICIENCY
        t = k.flops / (peak * 1e12 * eff)
        t = max(t, k.bytes / bandwidth)
    else:
        t = k.bytes / bandwidth
    return max(t, MIN_KERNEL_S)


def step_time(
    config, method: str, precision: str, micro: int, seq_len: int, gpu_name: str, optimizer: str = "AdamW"
) -> StepTime:
    """A step's time by cause on ``gpu_name``: kernels traced with one and two blocks, extrapolated by block."""
    from tunelab import hardware

    gpu = hardware.lookup(gpu_name)
    sms = SMS.get(gpu_name, 108)
    small = 1  # one and two blocks; one block more adds the same kernels
    totals = []
    for n in (small, small + 1):
        ks = trace_step(dataclasses.replace(config, n_layer=n), method, precision, micro, seq_len, optimizer)
        by_cat: dict = {}
        by_phase: dict = {}
        for k in ks:
            by_phase["ops:" + k.phase] = by_phase.get("ops:" + k.phase, 0) + 1
            t = kernel_seconds(k, gpu, sms)
            by_cat[k.category] = by_cat.get(k.category, 0.0) + t
            by_phase[k.phase] = by_phase.get(k.phase, 0.0) + t
        totals.append((len(ks), by_cat, by_phase))
    grown = config.n_layer - (small + 1)
    (n_a, cat_a, ph_a), (n_b, cat_b, ph_b) = totals

    def extra(a: dict, b: dict) -> dict:
        return {key: b.get(key, 0.0) + grown * (b.get(key, 0.0) - a.get(key, 0.0)) for key in set(a) | set(b)}

    by_cat, by_phase = extra(cat_a, cat_b), extra(ph_a, ph_b)
    ops_by_phase = {k.removeprefix("ops:"): round(v) for k, v in by_phase.items() if k.startswith("ops:")}
    by_phase = {k: v for k, v in by_phase.items() if not k.startswith("ops:")}
    ops = n_b + grown * (n_b - n_a)
    gpu_s = sum(by_cat.values())
    return StepTime(gpu_name, ops, gpu_s, ops * HOST_S_PER_OP, by_cat, by_phase, ops_by_phase)


def for_plan(x, gpu) -> StepTime | str:
    """The step by kernel of a planned configuration (:class:`tunelab.plan.memory.PlanInput`) on ``gpu``, or why it
    is not modelled (a sentence): litgpt's own script on one device, full fine-tuning or LoRA."""
    from tunelab.plan.simulate import optimizer_of

    if x.world > 1 or not x.fabric:
        return "not modelled yet for several devices or tunelab's loop (a strategies file)"
    if x.method == "qlora":
        return "not modelled yet for QLoRA (its dequantization kernels)"
    return step_time(x.config, x.method, str(x.precision), x.micro_batch_size, x.seq_len, gpu.name, optimizer_of(x))


def to_json(st) -> dict:
    """``plan --simulate --gpu --json``: the step by kernel, or ``{"not_modelled": why}``."""
    return {"not_modelled": st} if isinstance(st, str) else {**dataclasses.asdict(st), "step_s": st.step_s}


def render(st) -> str:
    """``plan --simulate --gpu``: the step by kernel, in lines."""
    if isinstance(st, str):
        return f"\nstep by kernel: {st}"
    cats = ", ".join(f"{k} {v:.4f}" for k, v in sorted(st.gpu_by_category.items(), key=lambda kv: -kv[1]))
    bound = "the host's launches" if st.host_s > st.gpu_s else "the GPU's kernels"
    return (
        f"\nstep by kernel on {st.gpu} (tunelab/plan/kernels.py; constants fitted on one H100 profile): "
        f"{st.step_s:.4f} s for one micro batch and an optimizer step, bound by {bound}\n"
        f"  GPU {st.gpu_s:.4f} s: {cats}\n"
        f"  host {st.host_s:.4f} s: {st.ops:,} ops x {HOST_S_PER_OP * 1e6:.0f} us"
    )


PROFILE = "reports/2026-11-23-lab-part1-h100/profile.md"
"""Our H100 profile (TinyLlama 1.1B, bf16-true, micro 8 x 437 tokens; full and LoRA): phase times by CUDA events
and kernel self times by category, one profiled step. The constants above are fitted on it."""
PROFILE_SHAPE = ("tiny-llama-1.1b", "bf16-true", 8, 437, "H100-SXM")
"""(model, precision, micro batch, tokens, GPU) of :data:`PROFILE`."""


def read_profile(path) -> dict:
    """{method: {"step": s, "forward": s, "loss": s, "backward": s, "optimizer": s, "kernel:<category>": s}} from
    :data:`PROFILE`'s two tables (seconds)."""
    import re

    from tunelab import files

    text = files.read_text(path, 1 << 20, "profile")
    out: dict = {"full": {}, "lora": {}}
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if cells[0] in out and len(cells) == 9:  # method | step s | tok/s | TFLOP/s | MFU | four phases
            out[cells[0]]["step"] = float(cells[1])
            for phase, cell in zip(("forward", "loss", "backward", "optimizer"), cells[5:]):
                out[cells[0]][phase] = float(cell.split()[0])
        elif len(cells) == 3 and cells[1].endswith("%)") and "ms" in cells[1]:
            for method, cell in zip(("full", "lora"), cells[1:]):
                out[method]["kernel:" + cells[0]] = float(re.match(r"([\d.]+) ms", cell).group(1)) / 1e3
    return out


def profile_rows(root) -> list[dict]:
    """The model against :data:`PROFILE`: per method, the step, the phases and the kernel categories, predicted and
    measured (seconds), with the relative error."""
    from litgpt import Config

    name, precision, micro, tokens, gpu = PROFILE_SHAPE
    measured = read_profile(root / PROFILE)
    rows = []
    for method in ("full", "lora"):
        st = step_time(Config.from_name(name), method, precision, micro, tokens, gpu)
        m, cat = measured[method], st.gpu_by_category
        pairs = [
            ("step (max of GPU and host)", st.step_s, m["step"]),
            ("phase: forward + loss", st.phase_s("forward"), m["forward"] + m["loss"]),
            ("phase: backward", st.phase_s("backward"), m["backward"]),
            ("phase: optimizer", st.phase_s("optimizer"), m["optimizer"]),
            ("kernels: matmul", cat.get("matmul", 0.0), m["kernel:matmul"]),
            ("kernels: attention", cat.get("attention", 0.0), m["kernel:attention"]),
            (
                "kernels: elementwise, loss, copies",
                cat.get("elementwise", 0.0) + cat.get("loss", 0.0),
                m["kernel:norm/rope/elementwise"]
                + m["kernel:cross-entropy/softmax"]
                + m["kernel:other (copies, casts, ...)"],
            ),
            ("kernels: optimizer", cat.get("optimizer", 0.0), m["kernel:optimizer"]),
            ("kernels: all (GPU busy)", st.gpu_s, sum(v for k, v in m.items() if k.startswith("kernel:"))),
        ]
        for what, predicted, value in pairs:
            rows.append(
                {"method": method, "what": what, "predicted_s": predicted, "measured_s": value,
                 "rel_error": predicted / value - 1 if value else None, "ops": st.ops, "host_s": st.host_s}
            )  # fmt: skip
    return rows


def write_report(path, root) -> None:
    """``kernels.md``: :func:`profile_rows` as a table, with what was fitted and what was not."""
    from tunelab.files import write_text_atomic

    rows = profile_rows(root)
    lines = [
        "# The kernel-level step model against our H100 profile",
        "",
        "Regenerate with `tunelab plan-accuracy`. Model: `tunelab/plan/kernels.py` (every ATen op of litgpt's "
        "simulated step, timed by category on the GPU; the step is the longer of the GPU's kernels and the host's "
        "launches; a phase likewise). Measured: `"
        + PROFILE
        + "` (TinyLlama 1.1B, bf16-true, micro 8 x 437 tokens, NVIDIA H100 80GB "
        "HBM3, torch 2.11; phases by CUDA events, kernels by the profiler's self time). Seconds per optimizer step.",
        "",
        "**In sample**: the constants were fitted on the full rows (matmul, attention, elementwise kernels, the "
        "optimizer phase) and on both steps (host time per op). The LoRA kernel rows are out of sample. Nothing else is checked yet: "
        "the lab's A100 rows, the micro-batch curve and other models wait for this model to replace "
        "`tunelab/plan/runtime.py` in `plan` and `advise`.",
        "",
        "| method | what | predicted s | measured s | error |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        err = f"{r['rel_error']:+.1%}" if r["rel_error"] is not None else ""
        lines.append(f"| {r['method']} | {r['what']} | {r['predicted_s']:.4f} | {r['measured_s']:.4f} | {err} |")
    host = {r["method"]: (r["ops"], r["host_s"]) for r in rows}
    lines += [
        "",
        "Ops dispatched per step (extrapolated from one and two blocks) and the host time they take at "
        f"{HOST_S_PER_OP * 1e6:.0f} us each: "
        + "; ".join(f"{m} {ops:,} ops, {s:.4f} s" for m, (ops, s) in host.items())
        + ". Known misses: the optimizer's kernels (the profiled step's 32.1 ms for full, twice its phase's 16.4 ms "
        "by CUDA events; LoRA's 3.8 ms for 26M trainable parameters, far above their bytes), and the full "
        "forward phase (the host's share of it is not one figure per op).",
        "",
    ]
    write_text_atomic(path, "\n".join(lines))
