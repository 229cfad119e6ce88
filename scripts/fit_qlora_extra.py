"""Refit the planner's one measured QLoRA term (tunelab.plan.memory.QLORA_EXTRA_BYTES, QLORA_EXTRA_PER_PARAM) from the
QLoRA run records of a sweep directory, and show LoRA's residuals beside them (the check that the extra belongs to
quantization, not to the activation model).

    mkdir -p runs/qlora-h100 && tar xzf reports/2026-11-23-qlora-memory-h100/records.tgz -C runs/qlora-h100
    python scripts/fit_qlora_extra.py runs/qlora-h100/qlora-memory

For each run: residual = measured peak allocated - the planner's peak without the QLoRA term; the fit is least
squares residual = a + b x quantized parameters over the QLoRA runs. Prints the residuals and the two constants.
"""

from __future__ import annotations

import sys
from pathlib import Path

from tunelab import record as record_mod
from tunelab.models import count_params
from tunelab.plan.recipe import plan_recipe
from tunelab.recipes import resolve


def main(sweep_dir: Path) -> int:
    rows = []
    for path in sorted(sweep_dir.glob("*/record.json")):
        rec = record_mod.load(path)
        if rec.status != "ok" or not rec.peak_allocated_bytes:
            continue
        planned = plan_recipe(resolve(rec.recipe), list(rec.overrides), gpu=None)
        x, plan = planned.input, planned.plan
        without = plan.peak_allocated_bytes - plan.breakdown_bytes.get("qlora_measured_extra", 0)
        total, emb = count_params(x.config)
        rows.append((rec.row_id, rec.method, total - emb, rec.peak_allocated_bytes, without))
    q = [(n, meas - plan) for _, m, n, meas, plan in rows if m == "qlora"]
    for row_id, method, _n, meas, plan in rows:
        print(
            f"{row_id:22s} {method:6s} measured {meas / 1e9:7.3f} GB  planned without the QLoRA term "
            f"{plan / 1e9:7.3f} GB  residual {(meas - plan) / 1e9:+.3f} GB"
        )
    if len(q) < 2:
        print("fewer than two QLoRA runs: nothing to fit")
        return 1
    mx = sum(n for n, _ in q) / len(q)
    my = sum(r for _, r in q) / len(q)
    b = sum((n - mx) * (r - my) for n, r in q) / sum((n - mx) ** 2 for n, _ in q)
    a = my - b * mx
    print(
        f"QLORA_EXTRA_BYTES = int({a / 1e9:.3f}e9)\nQLORA_EXTRA_PER_PARAM = {b:.4f}  "
        f"(over {len(q)} QLoRA runs; worst residual after the fit "
        f"{max(abs(r - a - b * n) for n, r in q) / 1e9:.3f} GB)"
    )
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 2 or not Path(sys.argv[1]).is_dir():
        print(
            "usage: python scripts/fit_qlora_extra.py SWEEP_DIR (a directory of <row>/record.json, e.g. "
            "runs/qlora-h100/qlora-memory)",
            file=sys.stderr,
        )
        raise SystemExit(2)
    raise SystemExit(main(Path(sys.argv[1])))
