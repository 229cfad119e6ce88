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
from tunelab.plan.measure import FAMILIES, compare_methods_in_child
from tunelab.progress import ProgressLine

FAMILY_COLUMNS = [
    "model",
    "method",
    "precision",
    "micro_batch_size",
    "seq_len",
    "n_layer",
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
"""families.csv: bytes autograd keeps (measured) and tunelab.plan.activations' derivation (planned), per block, for the
first block, for the head and loss, and for the whole model (first + (n_layer - 1) blocks + head)."""


def write_families(out: Path | None = None, names: list[str] | None = None, seq_len: int = 128) -> Path:
    """reports/planner-families/: the planner's activation term against one real forward per family."""
    import torch
    from litgpt import Config

    names = names or list(FAMILIES)
    for name in names:
        try:
            Config.from_name(name)
        except ValueError:
            raise ValueError(
                f"--families {name}: not a litgpt config name; fix: e.g. {', '.join(FAMILIES[:3])}"
            ) from None
    out = Path(out or output_root() / "reports" / "planner-families")
    progress = ProgressLine(len(names))
    rows = []
    for i, name in enumerate(names):  # full and LoRA of a family in one child process
        progress.started(i, f"{name} full and lora")
        rows += compare_methods_in_child(name, ["full", "lora"], "bf16-true", 1, seq_len)
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
        "through torch's CPU flash kernel, which keeps what CUDA's flash kernel keeps. Planned: "
        "`tunelab/plan/activations.py` from the Config alone, counted as on this CPU (LoRA dropout masks in the "
        "activation dtype; CUDA's fused dropout keeps 1 byte, which `tunelab plan` uses). bf16-true, micro batch 1, "
        f"{seq_len} tokens; LoRA r 8 on query, key, value, projection, MLP and head. Bytes; error = planned / "
        "measured - 1. The whole model = the first block + (n_layer - 1) blocks + head and loss.",
        "",
        f"- Worst whole-model error: {worst['error_total']:+.2%} ({worst['model']}, {worst['method']}); worst "
        f"per-block error: {worst_block['error_block']:+.2%} ({worst_block['model']}, {worst_block['method']}); "
        f"{sum(abs(r['error_total']) <= 0.03 for r in rows)} of {len(rows)} cases within 3%.",
        "",
        "| model | method | layers | block measured | block planned | error | head measured | head planned | error | "
        "whole model measured | planned | error |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['model']} | {r['method']} | {r['n_layer']} | {r['measured_block']:,} | {r['planned_block']:,.0f} | "
            f"{r['error_block']:+.2%} | {r['measured_head']:,} | {r['planned_head']:,.0f} | {r['error_head']:+.2%} | "
            f"{r['measured_total']:,} | {r['planned_total']:,.0f} | {r['error_total']:+.2%} |"
        )
    notes = sorted({r["notes"] for r in rows if r["notes"]})
    if notes:
        lines += ["", "Notes: " + " / ".join(notes)]
    write_text_atomic(out / "families.md", "\n".join(lines) + "\n")
    return out
