"""``tunelab plan-families``: the planner's activation term against what autograd really keeps, per model family
(one real forward of litgpt's own model per family and method, each in its own process), written to
reports/planner-families/.
"""

from __future__ import annotations

import platform
import sys
from pathlib import Path

from tunelab.files import write_csv, write_text_atomic
from tunelab.paths import output_root
from tunelab.plan.model import bnb_kernels, memory
from tunelab.plan.trace.measure import FAMILIES, compare_methods_in_child
from tunelab.plan.trace.simulate import simulate
from tunelab.plan.trace.tables import TRACED
from tunelab.progress import ProgressLine
from tunelab.units import GB

CASE_COLUMNS = [
    "model",
    "method",
    "precision",
    "micro_batch_size",
    "seq_len",
    "n_layer",
]
"""What identifies a case in both files: the model, method, precision and shape."""
FAMILY_COLUMNS = [
    *CASE_COLUMNS,
    "measured_block",
    "planned_block",
    "error_block",
    "measured_first_block",
    "planned_first_block",
    "measured_head",
    "planned_head",
    "error_head",
    "measured_total",
    "planned_total",
    "error_total",
    "seconds",
    "notes",
]
"""families.csv: bytes autograd keeps (measured) and tunelab.plan.model.activations' derivation (planned), per block, for the
first block, for the head and loss, and for the whole model (first + (n_layer - 1) blocks + head)."""


FAMILY_PRECISIONS = ("bf16-true", "bf16-mixed")
"""The precisions plan-families measures each family at (the activation dtypes differ: see activations.py)."""


def _checked(names: list[str] | None, seq_len: int | None = None) -> list[str]:
    """The family names asked for (default :data:`FAMILIES`), each a litgpt config name whose model takes
    ``seq_len`` tokens (ValueError naming the option otherwise, before any model is built)."""
    from litgpt import Config

    names = names or list(FAMILIES)
    for name in names:
        try:
            config = Config.from_name(name)
        except ValueError:
            raise ValueError(
                f"--families {name}: not a litgpt config name; fix: e.g. {', '.join(FAMILIES[:3])}"
            ) from None
        if seq_len is not None and seq_len > config.block_size:
            raise ValueError(
                f"--seq-len {seq_len}: longer than {name}'s block size {config.block_size} (litgpt's model takes no "
                f"longer sequence); fix: --seq-len {config.block_size} or less"
            )
    return names


def write_families(out: Path | None = None, names: list[str] | None = None, seq_len: int = 128) -> Path:
    """reports/planner-families/: the planner's activation term against one real forward per family."""
    import torch

    names = _checked(names, seq_len)
    out = Path(out or output_root() / "reports" / "planner-families")
    rows = []
    progress = ProgressLine(len(names) * len(FAMILY_PRECISIONS))
    for i, name in enumerate(names):
        for j, precision in enumerate(FAMILY_PRECISIONS):  # full and LoRA in one child process per precision
            progress.started(i * len(FAMILY_PRECISIONS) + j, f"{name} full and lora, {precision}")
            rows += compare_methods_in_child(name, ["full", "lora"], [precision], 1, seq_len)
            progress.completed()
    sys.stderr.write("\n" if progress.tty else "")
    write_csv(out / "families.csv", rows, FAMILY_COLUMNS)
    worst = max(rows, key=lambda r: abs(r["error_total"]))
    worst_block = max(rows, key=lambda r: abs(r["error_block"]))
    lines = [
        "# The planner's activation term, per model family, against what autograd keeps",
        "",
        f"Regenerate with `tunelab plan-families` (this CPU: {platform.processor() or platform.machine()}, torch "
        f"{torch.__version__}). Measured: one real training forward of litgpt's own model classes (`litgpt.GPT`, "
        "`litgpt.lora.GPT`, litgpt's chunked loss) at full width with 2 blocks, every tensor saved for backward "
        "counted once per storage (`torch.autograd.graph.saved_tensors_hooks`), parameters excluded; attention "
        "through torch's CPU flash kernel, which keeps what CUDA's flash kernel keeps; dropout as CUDA's fused kernel "
        "(a 1-byte mask). bf16-mixed as Lightning Fabric runs it: fp32 weights, the model's forward under (CPU) "
        "autocast, its outputs converted to fp32 before the loss; autocast's 16-bit weight copies are not "
        "activations (the planner's `autocast_weight_cache`). Planned: `tunelab/plan/model/activations.py` from the "
        f"Config alone. Micro batch 1, {seq_len} tokens; LoRA r 8 on query, key, value, projection, MLP and head. "
        "Bytes; error = planned / measured - 1. The whole model = the first block + (n_layer - 1) blocks + head "
        "and loss.",
        "",
        f"- Worst whole-model error: {worst['error_total']:+.2%} ({worst['model']}, {worst['method']}, "
        f"{worst['precision']}); worst per-block error: {worst_block['error_block']:+.2%} ({worst_block['model']}, "
        f"{worst_block['method']}, {worst_block['precision']}); "
        f"{sum(abs(r['error_total']) <= 0.03 for r in rows)} of {len(rows)} cases within 3%.",
        "",
        "| model | method | precision | layers | block measured | block planned | error | head measured | "
        "head planned | error | whole model measured | planned | error |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['model']} | {r['method']} | {r['precision']} | {r['n_layer']} | {r['measured_block']:,} | "
            f"{r['planned_block']:,.0f} | "
            f"{r['error_block']:+.2%} | {r['measured_head']:,} | {r['planned_head']:,.0f} | {r['error_head']:+.2%} | "
            f"{r['measured_total']:,} | {r['planned_total']:,.0f} | {r['error_total']:+.2%} |"
        )
    notes = sorted({r["notes"] for r in rows if r["notes"]})
    if notes:
        lines += ["", "Notes: " + " / ".join(notes)]
    write_text_atomic(out / "families.md", "\n".join(lines) + "\n")
    return out


SIMULATED_COLUMNS = [
    *CASE_COLUMNS,
    "simulated_peak",
    "simulated_phase",
    "planned_peak",
    "error",
    *(f"simulated_{k.lower()}" for k in ("Parameter", "Gradient", "Activation", "Temp", "Optstate")),
    "where",
    "seconds",
]
"""simulated.csv: the simulated step's peak (bytes, its phase and what is alive there by kind) beside the analytic
plan's derived peak for the same configuration (QLoRA: without its measured term, shown apart: the simulation
derives what bitsandbytes' code allocates and cannot contain what was only measured)."""
SIMULATED_CASES = (
    ("full", "bf16-true"),
    ("full", "bf16-mixed"),
    ("lora", "bf16-true"),
    ("lora", "bf16-mixed"),
    ("qlora", "bf16-true"),
)
"""Method x precision simulated per family (QLoRA computes in the precision's dtype: bf16-true as litgpt runs it)."""


def simulated_rows(names, micro: int = 4, seq_len: int = 512, progress=None) -> list[dict]:
    """Every family x :data:`SIMULATED_CASES`: the analytic plan (:func:`tunelab.plan.model.memory.predict`) and the
    simulated step (:func:`tunelab.plan.trace.simulate.simulate`) of one device, AdamW (QLoRA: paged AdamW, as litgpt
    builds it), no accumulation."""
    from litgpt import Config

    rows = []
    for i, name in enumerate(names):
        config = Config.from_name(name)
        for j, (method, precision) in enumerate(SIMULATED_CASES):
            if progress:
                progress.started(i * len(SIMULATED_CASES) + j, f"{name} {method} {precision}")
            optimizer = bnb_kernels.litgpt_optimizer(method)
            case = memory.PlanInput(
                config=config,
                method=method,
                precision=precision,
                micro_batch_size=micro,
                seq_len=seq_len,
                quantize="bnb.nf4" if method == "qlora" else None,
                optimizer=optimizer,
                tables=TRACED,
            )
            planned = memory.predict(case).peak_allocated_bytes
            sim = simulate(case)
            snap = sim.phases[sim.peak_phase]
            rows.append(
                {
                    "model": name,
                    "method": method,
                    "precision": precision,
                    "micro_batch_size": micro,
                    "seq_len": seq_len,
                    "n_layer": config.n_layer,
                    "simulated_peak": round(sim.peak_bytes),
                    "simulated_phase": sim.peak_phase,
                    "planned_peak": round(planned),
                    "error": planned / sim.peak_bytes - 1,
                    **{
                        f"simulated_{k.lower()}": round(snap.get(k, 0))
                        for k in ("Parameter", "Gradient", "Activation", "Temp", "Optstate")
                    },
                    "where": sim.where.get(sim.peak_phase, ""),
                    "seconds": round(sim.seconds, 1),
                }
            )
            if progress:
                progress.completed()
    return rows


def write_simulated(out: Path | None = None, names: list[str] | None = None, micro: int = 4, seq_len: int = 512):
    """reports/planner-families/simulated.md and .csv: the analytic plan against the simulated step, per family."""
    import torch

    names = _checked(names, seq_len)
    out = Path(out or output_root() / "reports" / "planner-families")
    progress = ProgressLine(len(names) * len(SIMULATED_CASES))
    rows = simulated_rows(names, micro, seq_len, progress)
    sys.stderr.write("\n" if progress.tty else "")
    write_csv(out / "simulated.csv", rows, SIMULATED_COLUMNS)
    within = sum(abs(r["error"]) <= 0.03 for r in rows)
    worst = max(rows, key=lambda r: abs(r["error"]))
    lines = [
        "# The analytic plan against the simulated step, per model family",
        "",
        f"Regenerate with `tunelab plan-families --simulate` (torch {torch.__version__}). Simulated: litgpt's own "
        "model and loss at full width on fake tensors (`FakeTensorMode`), forward, backward and two optimizer steps "
        "under torch's `MemTracker`, 1 and 2 blocks extrapolated to the model's (`tunelab/plan/trace/simulate.py`). "
        f"Planned: `tunelab/plan/model/memory.py`. One device, micro batch {micro} x {seq_len} tokens, AdamW (QLoRA: "
        "paged AdamW: states of tensors from 1e5 elements outside the allocator, smaller ones' on the device), no "
        "accumulation, LoRA r 8 on every target. Peak allocated, "
        "GB = 1e9 bytes; error = planned / simulated - 1.",
        "",
        f"- {within} of {len(rows)} cases within 3%; worst {worst['error']:+.1%} ({worst['model']}, "
        f"{worst['method']}, {worst['precision']}).",
        "",
        *_dominant(rows),
        "",
        "| model | method | precision | simulated GB | phase | weights | grads | activations | temps | optimizer | "
        "planned GB | error |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['model']} | {r['method']} | {r['precision']} | {r['simulated_peak'] / GB:.2f} | "
            f"{r['simulated_phase']} | "
            + " | ".join(
                f"{r[f'simulated_{k}'] / GB:.2f}" for k in ("parameter", "gradient", "activation", "temp", "optstate")
            )
            + f" | {r['planned_peak'] / GB:.2f} | {r['error']:+.1%} |"
        )
    write_text_atomic(out / "simulated.md", "\n".join(lines) + "\n")
    return out


KIND_WORDS = {
    "parameter": "weights",
    "gradient": "gradients",
    "activation": "activations",
    "temp": "temporaries",
    "optstate": "optimizer states",
}


def _dominant(rows: list[dict]) -> list[str]:
    """Which phase sets the peak and which kind of memory is largest there, per method and precision."""
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault((r["method"], r["precision"]), []).append(r)
    out = ["Where the peak is and what dominates it (families per phase; the largest kind at the peak):", ""]
    for (method, precision), group in groups.items():
        phases: dict[str, int] = {}
        kinds: dict[str, int] = {}
        for r in group:
            phases[r["simulated_phase"]] = phases.get(r["simulated_phase"], 0) + 1
            top = max(KIND_WORDS, key=lambda k: r[f"simulated_{k}"])
            kinds[KIND_WORDS[top]] = kinds.get(KIND_WORDS[top], 0) + 1
        out.append(
            f"- {method} {precision}: peak in "
            + ", ".join(f"{p} ({n})" for p, n in sorted(phases.items(), key=lambda kv: -kv[1]))
            + "; largest there: "
            + ", ".join(f"{k} ({n})" for k, n in sorted(kinds.items(), key=lambda kv: -kv[1]))
        )
    return out
