"""The GPU measurements the kernel model (:mod:`tunelab.plan.model.kernels`) was fitted on and is checked against:
our H100 profile of litgpt's step and the H100/H200 profile grids, read from their report folders and planned
beside the model (``reports/planner-accuracy/kernels.md``)."""

from __future__ import annotations

import json
import re
import statistics

from tunelab import files
from tunelab.plan.model import bnb_kernels, kernels
from tunelab.plan.model.kernels import LORA_LIKE
from tunelab.plan.trace.tables import TRACED
from tunelab.report import evidence
from tunelab.settings import LORA_TARGETS

PROFILE = ("h100-part1", "profile")
"""Our H100 profile (an entry of :mod:`tunelab.report.evidence` and what it holds; TinyLlama 1.1B, bf16-true, micro 8 x 437 tokens; full and LoRA): phase times by CUDA events
and kernel self times by category, one profiled step. The constants above are fitted on it."""
PROFILE_SHAPE = ("tiny-llama-1.1b", "bf16-true", 8, 437, "H100-SXM")
"""(model, precision, micro batch, tokens, GPU) of :data:`PROFILE`."""
PROFILED_LORA = (32, LORA_TARGETS)
"""(rank, targets) of the LoRA the GPU profiles built (:data:`PROFILE`, :data:`GRID`; ``scripts/gpu/profile_steps.py``):
the recipes' r 32 on every target, not litgpt's default rank."""


PROFILE_ELEMENTWISE = ("norm/rope/elementwise", "cross-entropy/softmax", "other (copies, casts, ...)")
"""The profile's kernel categories (scripts/gpu/profile_steps.py) the model's elementwise and loss kernels answer."""


def read_profile(path) -> dict:
    """{method: {"step": s, "forward": s, "loss": s, "backward": s, "optimizer": s, "kernel:<category>": s}} from
    :data:`PROFILE`'s two tables (seconds)."""

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


def lora_profiled(method: str) -> tuple:
    """:data:`PROFILED_LORA` for LoRA and QLoRA, () for full fine-tuning."""
    return PROFILED_LORA if method in LORA_LIKE else ()


def profile_rows(root) -> list[dict]:
    """The model against :data:`PROFILE`: per method, the step, the phases and the kernel categories, predicted and
    measured (seconds), with the relative error."""
    from litgpt import Config

    name, precision, micro, tokens, gpu = PROFILE_SHAPE
    measured = read_profile(root / evidence.path(*PROFILE))
    rows = []
    for method in ("full", "lora"):
        step = kernels.Step(Config.from_name(name), method, precision, micro, tokens, lora=lora_profiled(method))
        st = kernels.step_time(step, gpu, tables=TRACED)
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
                sum(m["kernel:" + c] for c in PROFILE_ELEMENTWISE),
            ),
            ("kernels: optimizer", cat.get("optimizer", 0.0), m["kernel:optimizer"]),
            (  # the profiler's kernel time holds no gaps between kernels
                "kernels: all (GPU busy)",
                st.gpu_s - cat.get("gaps", 0.0),
                sum(v for k, v in m.items() if k.startswith("kernel:")),
            ),
        ]
        for what, predicted, value in pairs:
            rows.append(
                {
                    "method": method,
                    "what": what,
                    "predicted_s": predicted,
                    "measured_s": value,
                    "rel_error": predicted / value - 1 if value else None,
                    "ops": st.ops,
                    "host_s": st.host_s,
                }
            )
    return rows


GRID = ("h100-grid", "grid")
"""(An entry of :mod:`tunelab.report.evidence`, what it holds, as each grid here.) The same profile over other shapes (TinyLlama at micro 1, 4, 16, OpenLLaMA 3B at 1 and 4; full and LoRA; one JSON
line each, ``scripts/gpu/runbook.sh grid``): its full lines' elementwise kernels are in the memory constants' fit
(:data:`MEMORY_EFFICIENCY`), its steps, phases and LoRA lines out of sample."""
GRID_H200 = ("h200-grid", "grid")
"""The grid again on an H200 machine, over six models (TinyLlama, OpenLLaMA 3B and 7B, Llama 3.2 1B, Phi-2, Gemma
2B) at micro 1 to 16, each line with the host's own clock per phase (``host_phases``): out of sample too."""
GRID_BY_OP = ("h200-grid", "by_op")
"""Three more H200 lines, each op's GPU time beside its calls (``cpu_ops``: OpenLLaMA 7B LoRA at micro 8, OpenLLaMA
3B full at 8, TinyLlama full at 16; a later call that session, another H200 machine): what :data:`STRIDED_EFFICIENCY`,
:data:`CONV_EFFICIENCY` and :data:`CONV_BACKWARD_EFFICIENCY` were read from, and with :data:`MEMORY_EFFICIENCY` and
:data:`SM_BYTES_PER_CYCLE` fitted on."""
GRID_FP32 = ("h200-grid-again", "grid 32-true")
"""TinyLlama full at 32-true (fp32 weights, TF32 matmuls) at micro 8 and 32 on a third H200 machine: the
micro-8 line holds :data:`TF32_MATMUL_SHARE`, :data:`FP32_ATTENTION_EFFICIENCY` and
:data:`FOREACH_FP32_EFFICIENCY`, the micro-32 line checks the first two."""
GRID_QLORA = ("h200-grid-qlora", "grid QLoRA")
"""QLoRA beside LoRA on one H200 machine (TinyLlama at micro 1, 4, 16, OpenLLaMA 7B at 4; OpenLLaMA 7B QLoRA at 8
too): litgpt's bnb.nf4 as its script builds it (``profile_steps.py --methods lora,qlora``), PagedAdamW and the
StableEmbedding swap included. OpenLLaMA 7B's QLoRA line at micro 4 holds
:data:`tunelab.plan.model.bnb_kernels.DEQUANT_EFFICIENCY`, TinyLlama's at micro 4 the host's work per 4-bit matmul and per
PagedAdamW tensor; every other cell is out of sample."""
GRID_KEYS = ("model", "method", "dtype", "micro", "seq", "step_s", "phases", "kernels", "launches")
"""What each measured line of :data:`GRID` holds (``scripts/gpu/profile_steps.py --json``)."""


def read_grid(path) -> list[dict]:
    """:data:`GRID`'s measured lines (a line with an ``error``, e.g. out of memory, left out)."""

    out = []
    for n, line in enumerate(files.read_text(path, 1 << 20, "profile grid").splitlines(), 1):
        if line.strip():
            try:
                row = json.loads(line)
            except ValueError:
                raise files.FileRefused(f"{path}: line {n} is not JSON; fix: regenerate it with the runbook") from None
            missing = [] if not isinstance(row, dict) else [k for k in GRID_KEYS if k not in row]
            if not isinstance(row, dict) or ("error" not in row and missing):
                raise files.FileRefused(
                    f"{path}: line {n} lacks {', '.join(missing) or 'a JSON object'}; fix: regenerate it with the runbook"
                )
            if "error" not in row:
                out.append(row)
    return out


def grid_rows(root, grid: tuple = GRID, gpu: str = "H100-SXM") -> list[dict]:
    """The model against a grid's lines (:func:`tunelab.report.evidence.grids`) on ``gpu``, out of sample: per line the step and phases (CUDA
    events), the kernel categories (profiler self time) and the ops against the kernels launched; where the line
    has the host's own clock per phase, the model's host time (every op at :data:`HOST_S_PER_OP`) against that
    clock summed over the step. The optimizer is compared with its phase, not with the profiler's kernel time: in
    every line that is twice the phase's wall time (on one stream the kernels cannot outlast the interval that holds
    them, so the profiler counts them twice). ``fill``: the share of the forward, loss and backward phases' wall time
    the profiler's kernels fill; ``gap_per_op``: the rest over the ops the model counts in them."""
    from litgpt import Config

    rows = []
    for m in read_grid(root / evidence.path(*grid)):
        optimizer = bnb_kernels.litgpt_optimizer(m["method"])
        args = (m["method"], m["dtype"], m["micro"], m["seq"], optimizer, lora_profiled(m["method"]))
        st = kernels.step_time(kernels.Step(Config.from_name(m["model"]), *args), gpu, tables=TRACED)
        k, ph, cat = m["kernels"], m["phases"], st.gpu_by_category
        pairs = {
            "step": (st.step_s, m["step_s"]),
            "forward + loss": (st.phase_s("forward"), ph["forward"] + ph["loss"]),
            "backward": (st.phase_s("backward"), ph["backward"]),
            "optimizer (phase)": (st.phase_s("optimizer"), ph["optimizer"]),
            "matmul": (cat.get("matmul", 0.0), k.get("matmul", 0.0)),
            "attention": (cat.get("attention", 0.0), k.get("attention", 0.0)),
            "elementwise, loss, copies": (
                cat.get("elementwise", 0.0) + cat.get("loss", 0.0),
                sum(k.get(c, 0.0) for c in PROFILE_ELEMENTWISE),
            ),
        }
        if "dequantization" in k:
            pairs["dequantization"] = (cat.get("dequantization", 0.0), k["dequantization"])
        if isinstance(m.get("host_phases"), dict):
            pairs["host (own clock)"] = (st.host_s, sum(m["host_phases"].values()))
        if isinstance(m.get("decode"), dict) and m["decode"].get("s"):  # litgpt's generate, per token
            pairs["decode, per token"] = (st.phase_s("decode"), m["decode"]["s"])
        wall = ph["forward"] + ph["loss"] + ph["backward"]
        busy = sum(v for c, v in k.items() if c != "optimizer")
        rows.append(
            {
                "model": m["model"],
                "micro": m["micro"],
                "method": m["method"],
                "dtype": m["dtype"],
                "ops": st.ops,
                "launches": sum(m["launches"].values()),
                "fill": busy / wall,
                "gap_per_op": (wall - busy) / (st.ops_by_phase["forward"] + st.ops_by_phase["backward"]),
                "bound": "host" if st.host_s > st.gpu_s else "GPU",
                "pairs": {w: (p, v, p / v - 1 if v else None) for w, (p, v) in pairs.items()},
            }
        )
    return rows


GAP_FILL = 0.85
"""A grid line holds :data:`tunelab.plan.model.kernels.KERNEL_GAP_S` when its kernels fill this share of its forward,
loss and backward phases or more: the host kept the GPU's queue full, so what is left between kernels is the GPU's."""


def every_grid(root) -> list[tuple]:
    """(evidence entry, what, day, :func:`grid_rows`) of each grid of :func:`tunelab.report.evidence.grids` that
    ``root`` holds: every grid planned once, for the report's tables and the gap's fit."""
    return [
        (e, what, day, grid_rows(root, (e.id, what), e.device))
        for e, what, day in evidence.grids()
        if (root / evidence.path(e.id, what)).is_file()
    ]


def kernel_gaps(root, grids: list | None = None) -> list[tuple]:
    """(grid, line, seconds idle per op) of every grid line whose kernels fill :data:`GAP_FILL` of its forward, loss
    and backward phases (:func:`grid_rows`' ``gap_per_op``; ``grids``: :func:`every_grid` when already planned)."""
    return [
        (e.id, f"{r['model']} {r['method']} {r['dtype']} micro {r['micro']}", r["gap_per_op"])
        for e, _, _, rows in (every_grid(root) if grids is None else grids)
        for r in rows
        if r["fill"] >= GAP_FILL
    ]


def fit_foreach_fp32(root) -> float:
    """:data:`tunelab.plan.model.kernels.FOREACH_FP32_EFFICIENCY` recomputed: the efficiency that makes the model's
    optimizer phase equal the measured one on :data:`GRID_FP32`'s fitted line (micro 8), one step from the constant
    (the phase is its fp32 kernels' bytes over the rate; exact where the constant already holds)."""
    line = next(r for r in grid_rows(root, GRID_FP32, "H200") if r["micro"] == 8)
    planned, measured, _ = line["pairs"]["optimizer (phase)"]
    return kernels.FOREACH_FP32_EFFICIENCY * planned / measured


def fit_kernel_gap(root) -> float:
    """:data:`tunelab.plan.model.kernels.KERNEL_GAP_S` recomputed: the median of :func:`kernel_gaps`."""
    return statistics.median(g for *_, g in kernel_gaps(root))
