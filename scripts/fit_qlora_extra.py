"""Refit the planner's one measured QLoRA term (tunelab.plan.memory.QLORA_EXTRA_BYTES) from the
QLoRA run records of a sweep directory, and show LoRA's residuals beside them (the check that the extra belongs to
quantization, not to the activation model).

    mkdir -p runs/qlora-h100 && tar xzf reports/2026-11-23-qlora-memory-h100/records.tgz -C runs/qlora-h100
    python scripts/fit_qlora_extra.py runs/qlora-h100/qlora-memory

For each run: residual = measured peak allocated - the planner's peak without the QLoRA term. The constant is the
mean residual of the QLoRA runs of the smallest model only, so that the larger models' runs check it out of sample:
prints the residuals, the constant and each larger run's predicted peak against its measurement.
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
    for row_id, method, _n, meas, plan in rows:
        print(
            f"{row_id:22s} {method:6s} measured {meas / 1e9:7.3f} GB  planned without the QLoRA term "
            f"{plan / 1e9:7.3f} GB  residual {(meas - plan) / 1e9:+.3f} GB"
        )
    qlora = [r for r in rows if r[1] == "qlora"]
    if not qlora:
        print("no QLoRA run: nothing to fit")
        return 1
    smallest = min(n for _, _, n, _, _ in qlora)
    fit = [meas - plan for _, _, n, meas, plan in qlora if n == smallest]
    a = sum(fit) / len(fit)  # least squares for a constant
    print(
        f"QLORA_EXTRA_BYTES = int({a / 1e9:.3f}e9)  (the mean residual of the {len(fit)} QLoRA runs of the smallest "
        f"model, {smallest / 1e9:.2f}B quantized parameters; worst residual after the fit "
        f"{max(abs(r - a) for r in fit) / 1e9:.3f} GB)"
    )
    for row_id, _m, n, meas, plan in qlora:
        if n != smallest:
            print(
                f"out of sample: {row_id:22s} predicted {(plan + a) / 1e9:7.3f} GB  measured {meas / 1e9:7.3f} GB  "
                f"error {(plan + a) / meas - 1:+.1%}"
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
