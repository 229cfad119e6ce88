#!/usr/bin/env python
"""Measure bitsandbytes' Python per 4-bit matmul in a generated token and a validation batch against the training
forward's, on this CPU.

The planner charges each 4-bit matmul of litgpt's QLoRA step the host work bitsandbytes does around its kernel
(``Linear4bit.forward``, ``matmul_4bit``, the autograd function, the custom op's dispatch), in dispatched ops fitted
on a GPU's training forward. A validation batch runs the same calls without gradients; a generated token (one row,
inference mode) takes ``gemv_4bit`` instead of the dequantization and no autograd function. This script measures
how much of the forward's Python each of them keeps:

  * one 64-wide layer, bf16: ``torch.nn.Linear`` and bitsandbytes' ``Linear4bit`` holding the same weight in
    Lightning's ``nf4`` mode (litgpt's ``--quantize bnb.nf4``: NF4 without double quantization);
    bitsandbytes' two CPU kernels (``dequantize_4bit``, ``gemv_4bit``) replaced by an empty output of their shape,
    so what is left is Python and dispatch (on a GPU the kernel is launched and not waited for);
  * three phases: the training forward (gradients on, 64 rows), the validation batch (no gradients, 64 rows), the
    decoded token (inference mode, one row); per phase the median call of each layer over a rep's turns, the two
    layers and three phases taking their turns in one loop (a slow spell of the machine falls on all alike);
  * per phase the 4-bit layer's time over the plain layer's (the Python bitsandbytes adds), and each phase's
    over the forward's.

The JSON holds every rep and the medians with their spread; the table is written beside it as .md.

Usage: python scripts/bench_bnb_host.py [--reps 7] [--iters 2000] [--warmup 200] [--json-out FILE]

An older bitsandbytes (0.40 or 0.41, which litgpt's 2023 figures ran) is measured from a folder of its own:
  pip install --target DIR bitsandbytes==0.41.1 scipy && PYTHONPATH=DIR python scripts/bench_bnb_host.py ...
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

WIDTH = 64
ROWS = 64
PHASES = ("forward", "validation", "decode")
LAYERS = ("linear", "nf4")


def _legacy() -> bool:
    """Whether the bitsandbytes on the path is 0.40 or 0.41 (litgpt's pins of 2023), which calls its CUDA library
    through ctypes from Python instead of registering torch custom ops; 0.42 (a state object, ctypes) is refused."""
    from importlib.metadata import version

    from packaging.version import Version

    found = Version(version("bitsandbytes"))
    if Version("0.42") <= found < Version("0.43") or found < Version("0.40"):
        sys.exit(f"bench_bnb_host.py: error: bitsandbytes {found} is not measured here; fix: 0.40, 0.41 or 0.43 on")
    return found < Version("0.42")


class _NoKernels:
    """A stand-in for bitsandbytes' ctypes library before 0.43: every kernel a call that does nothing."""

    def __getattr__(self, name: str):
        return lambda *args: None


def _stub_kernels() -> None:
    """bitsandbytes' CPU ``dequantize_4bit`` and ``gemv_4bit`` replaced by an empty output of their shape; before
    0.43, its ctypes library by :class:`_NoKernels`, its CUDA device switch around each call (``pre_call``,
    ``post_call``: not timed) by nothing, and its on-GPU check by the same check for CPU tensors."""
    import torch

    if _legacy():
        sys.modules["triton"] = None  # 0.41's Triton kernels import triton.ops (gone in Triton 3): skipped, unused here
        import bitsandbytes.functional as F

        def is_on_gpu(tensors):  # bitsandbytes 0.41's check, its device type a CPU's
            ids = {t.device.index for t in tensors if t is not None and not getattr(t, "is_paged", False)}
            if any(t is not None and t.device.type != "cpu" for t in tensors) or len(ids) > 1:
                raise TypeError("tensors on several devices")
            return True

        F.lib, F.pre_call, F.post_call, F.is_on_gpu = _NoKernels(), lambda device: device, lambda prev: None, is_on_gpu
        return

    def dequantize(A, absmax, blocksize, quant_type, shape, dtype):
        return torch.empty(shape, dtype=dtype)

    def gemv(A, B, shapeB, absmax, code, blocksize):
        return torch.empty((*A.shape[:-1], shapeB[0]), dtype=A.dtype)

    torch.library.register_kernel("bitsandbytes::dequantize_4bit", "cpu", dequantize)
    torch.library.register_kernel("bitsandbytes::gemv_4bit", "cpu", gemv)


def _layers() -> dict:
    """{"linear": a bf16 ``torch.nn.Linear``, "nf4": bitsandbytes' ``Linear4bit`` quantized from its weight}."""
    import bitsandbytes as bnb
    import torch

    linear = torch.nn.Linear(WIDTH, WIDTH, bias=False).to(torch.bfloat16)
    kwargs = {"compress_statistics": False, "quant_type": "nf4"}  # Lightning's nf4 mode, litgpt's bnb.nf4
    nf4 = bnb.nn.Linear4bit(WIDTH, WIDTH, bias=False, compute_dtype=torch.bfloat16, **kwargs)
    if _legacy():  # quantized only on moving to CUDA: its packed weight and 0.41's state list, as quantize_4bit makes
        packed = torch.zeros(WIDTH * WIDTH // 2, 1, dtype=torch.uint8)
        absmax, code = torch.ones(WIDTH * WIDTH // 64), torch.zeros(16)
        nf4.weight = bnb.nn.Params4bit(packed, requires_grad=False, **kwargs)
        nf4.weight.quant_state = [absmax, torch.Size([WIDTH, WIDTH]), torch.bfloat16, 64, None, "nf4", code]
        return {"linear": linear, "nf4": nf4}
    nf4.load_state_dict(linear.state_dict())
    return {"linear": linear, "nf4": nf4.to("cpu")}


def _call(layer, phase: str, x) -> float:
    """Seconds of one call of ``layer`` as ``phase`` runs it."""
    import torch

    context = {"forward": torch.enable_grad, "validation": torch.no_grad, "decode": torch.inference_mode}[phase]
    with context():
        t0 = time.perf_counter()
        layer(x)
        return time.perf_counter() - t0


def one_rep(iters: int, warmup: int) -> dict:
    """{phase: {layer: median seconds a call}} of one rep, every layer and phase in turn."""
    import torch

    layers = _layers()
    inputs = {
        "forward": torch.randn(1, ROWS, WIDTH, dtype=torch.bfloat16, requires_grad=True),
        "validation": torch.randn(1, ROWS, WIDTH, dtype=torch.bfloat16),
        "decode": torch.randn(1, 1, WIDTH, dtype=torch.bfloat16),
    }
    times: dict = {p: {name: [] for name in LAYERS} for p in PHASES}
    for i in range(warmup + iters):
        for p in PHASES:
            for name in LAYERS:
                s = _call(layers[name], p, inputs[p])
                if i >= warmup:
                    times[p][name].append(s)
    return {p: {name: statistics.median(v) for name, v in by.items()} for p, by in times.items()}


def derived(rep: dict) -> dict:
    """One rep's Python bitsandbytes adds per call by phase (us) and each phase's over the forward's."""
    extra = {p: (rep[p]["nf4"] - rep[p]["linear"]) * 1e6 for p in PHASES}
    out = {f"{p}_extra_us": extra[p] for p in PHASES}
    out.update({f"{p}_ratio": extra[p] / extra["forward"] for p in ("validation", "decode")})
    return out


def summary(reps: list[dict]) -> dict:
    """Medians and ranges over the reps of :func:`derived`."""
    return host_bench.spreads([derived(r) for r in reps])


def markdown(result: dict) -> str:
    """The Python per 4-bit matmul by phase and its ratios to the forward's: median (range) over reps."""

    s, st = result["settings"], result["summary"]
    return "\n".join(
        [
            "# bitsandbytes' Python per 4-bit matmul by phase (CPU)",
            "",
            f"{result['what']}. CPU {result['cpu']}, Python {result['python']}, torch {result['torch']}, "
            f"bitsandbytes {result['bitsandbytes']}; one {WIDTH}-wide layer, bf16, NF4, its kernels stubbed; "
            f"{s['reps']} reps of {s['iters']} timed turns after {s['warmup']}. Per phase: the 4-bit layer's median "
            "call less the plain layer's, in us; median (range) over the reps.",
            "",
            "| forward us | validation us | decode us | validation / forward | decode / forward |",
            "|---|---|---|---|---|",
            f"| {cell(st['forward_extra_us'], 1)} | {cell(st['validation_extra_us'], 1)} | "
            f"{cell(st['decode_extra_us'], 1)} | {cell(st['validation_ratio'], 2)} | {cell(st['decode_ratio'], 2)} |",
            "",
        ]
    )


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_rep_args(ap, reps=7, iters=2000, warmup=200)
    args = ap.parse_args(argv)
    check_rep_args(ap, args)
    from importlib.metadata import version

    import torch

    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    _stub_kernels()
    result = {
        "what": "bitsandbytes' Python per 4-bit matmul by phase (scripts/bench_bnb_host.py)",
        **measured_on(args, ()),
        "bitsandbytes": version("bitsandbytes"),
        "reps": [],
        "summary": {},
    }

    def progress(st: dict) -> str:
        return (
            f"  validation / forward {st['validation_ratio']['median']:.2f}, decode / forward "
            f"{st['decode_ratio']['median']:.2f}"
        )

    return host_bench.run_reps(args, result, one_rep, summary, "summary", progress, markdown)


if __name__ == "__main__":
    sys.exit(main())
