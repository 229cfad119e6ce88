"""DeepSpeed ZeRO-2 and ZeRO-3 run for real on this CPU against the plan, per family: ``tunelab plan-strategies
--deepspeed``.

DeepSpeed's engine does not run on fake tensors, so each family's config is shrunk to a size DeepSpeed runs on a CPU
(:func:`tunelab.run.deepspeed_probe.scaled`: widths and vocabulary / 16, heads / 4, every block kept) and
DeepSpeed's own ZeRO-2 and ZeRO-3 train it on 2 and 4 gloo ranks with tunelab's config; each rank's measured peak is
set beside the plan of the same shrunk case (:mod:`tunelab.plan.model.strategies.zero`'s terms)."""

from __future__ import annotations

import csv
import io
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from tunelab import files
from tunelab.errors import InputError
from tunelab.plan.model import memory
from tunelab.plan.recipe import plan_recipe
from tunelab.plan.trace.tables import TRACED
from tunelab.recipes import resolve

SCALE = 16
"""Width, MLP width and vocabulary / this (heads / 4)."""
BUCKET = int(2e8 / SCALE**2)
"""DeepSpeed's default reduce bucket (2e8 elements) shrunk as the model's matrices are (/ SCALE^2)."""
ZERO3 = {
    "stage3_prefetch_bucket_size": int(5e7 / SCALE**2),
    "stage3_param_persistence_threshold": int(1e5 / SCALE**2),
    "stage3_max_live_parameters": int(1e9 / SCALE**2),
    "stage3_max_reuse_distance": int(1e9 / SCALE**2),
}
"""DeepSpeed's ZeRO-3 defaults (elements) shrunk as the model's matrices are (/ SCALE^2)."""
WORLDS = (2, 4)
STAGES = (2, 3)
MICRO, TOKENS = 2, 128
CSV_NAME = "deepspeed.csv"


@dataclass
class ZeroRow:
    """One family's ZeRO check on ``world`` ranks (bytes per rank, rank 0)."""

    family: str
    model: str
    """litgpt's config name, before shrinking."""
    world: int
    params: int
    """Parameters of the shrunk model."""
    planned_bytes: float
    measured_bytes: float
    seconds: float
    """The DeepSpeed run's wall time for every family on this world and stage (one torchrun)."""
    stage: int = 2
    """The ZeRO stage (2: measured under MemTracker; 3: under torch's profiler)."""

    @property
    def error(self) -> float:
        return self.planned_bytes / self.measured_bytes - 1


def plan_input(model: str, world: int, stage: int = 2):
    """The plan's input for the shrunk ``model`` on ``world`` ranks under ZeRO ``stage``, as the probe runs it."""
    from tunelab.run.deepspeed_probe import scaled

    zero3 = {f"zero3_{k[len('stage3_') :]}": v for k, v in ZERO3.items() if k != "stage3_prefetch_bucket_size"}
    return memory.PlanInput.of(
        config=scaled(model, SCALE),
        micro_batch_size=MICRO,
        seq_len=TOKENS,
        strategy="deepspeed",
        zero_stage=stage,
        devices=world,
        fabric=False,
        reduce_bucket_size=BUCKET,
        allgather_bucket_size=BUCKET,
        tables=TRACED,
        **(zero3 if stage == 3 else {}),
    )


def probe_case(model: str, stage: int) -> dict:
    """The probe's case for the shrunk ``model`` under ZeRO ``stage`` (:mod:`tunelab.run.deepspeed_probe`)."""
    case = {"stage": stage, "bucket": BUCKET, "family": model, "scale": SCALE}
    return {**case, "measure": "profiler", "zero": ZERO3} if stage == 3 else case


def _litgpt_name(family: tuple) -> str:
    """litgpt's config name of a :data:`tunelab.report.strategy_checks.FAMILIES` entry (its recipe's model, or the
    checkpoint directory it names)."""

    _, model, checkpoint = family
    overrides = ["--checkpoint_dir", checkpoint] if checkpoint else []
    return plan_recipe(resolve(f"{model}/full"), overrides, gpu=None).input.config.name


def _probe(cases: list[dict], world: int) -> list[dict]:
    """DeepSpeed on ``world`` gloo ranks of this CPU over ``cases`` (``tunelab.run.deepspeed_probe``, in its own
    processes under torchrun, which picks a free port itself: ``--standalone``)."""
    with tempfile.TemporaryDirectory() as d:
        out = Path(d) / "measured.json"
        env = {**os.environ, "TUNELAB_DS_CASES": json.dumps(cases), "OMP_NUM_THREADS": "1"}
        cmd = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc_per_node",
            str(world),
            "-m",
            "tunelab.run.deepspeed_probe",
            str(out),
        ]
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=3600, cwd=d)
        if done.returncode != 0 or not out.is_file():
            tail = (done.stderr or "").strip().splitlines()[-1:] or ["no output"]
            raise InputError(f"--deepspeed: DeepSpeed on {world} CPU ranks failed ({tail[0][:300]})")
        return json.loads(files.read_text(out, 1 << 20, "DeepSpeed probe output"))


def rows(families, worlds=WORLDS, stages=STAGES) -> list[ZeroRow]:
    """Every family on every world and stage, with progress on stderr (one DeepSpeed run per world and stage)."""

    names = [(f[0], _litgpt_name(f)) for f in families]
    out: list[ZeroRow] = []
    for stage in stages:
        for world in worlds:
            print(f"DeepSpeed ZeRO-{stage} on {world} CPU ranks: {', '.join(n for n, _ in names)} ...", file=sys.stderr)
            t0 = time.perf_counter()
            measured = _probe([probe_case(m, stage) for _, m in names], world)
            seconds = time.perf_counter() - t0
            for (label, model), got in zip(names, measured):
                planned = memory.predict(plan_input(model, world, stage)).peak_allocated_bytes
                out.append(ZeroRow(label, model, world, got["params"], planned, got["peak"], seconds, stage))
    return out


def read(path: Path) -> list[ZeroRow]:
    """The rows of an earlier ``deepspeed.csv``; InputError (file, what, fix) for one this code did not write, a link,
    a FIFO or anything not a regular file."""
    try:
        found = list(csv.DictReader(io.StringIO(files.read_text(path, 1 << 20, "DeepSpeed table", links=False))))
        return [
            ZeroRow(
                r["family"],
                r["model"],
                int(r["world"]),
                int(r["params"]),
                float(r["planned_bytes"]),
                float(r["measured_bytes"]),
                float(r["seconds"]),
                int(r["stage"]),
            )
            for r in found
        ]
    except (KeyError, ValueError, TypeError) as e:
        raise InputError(f"{path}: not a deepspeed.csv this version wrote ({e}); fix: rerun with --deepspeed") from e


def write(found: list[ZeroRow], out: Path) -> None:
    """``deepspeed.csv`` under ``out``, written atomically."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    header = [*ZeroRow.__dataclass_fields__, "error"]
    w.writerow(header)
    for r in found:
        w.writerow([getattr(r, k) for k in header])
    files.write_text_atomic(Path(out) / CSV_NAME, buf.getvalue())


def section(found: list[ZeroRow]) -> list[str]:
    """strategies.md's DeepSpeed section (none without rows)."""
    if not found:
        return []
    worst = {
        st: max((r for r in found if r.stage == st), key=lambda r: abs(r.error))
        for st in sorted({r.stage for r in found})
    }
    worst_text = "; ".join(f"ZeRO-{st} {r.error:+.1%} ({r.family} on {r.world})" for st, r in worst.items())
    lines = [
        "",
        "## DeepSpeed ZeRO-2 and ZeRO-3, run for real on this CPU (each family's shape / 16)",
        "",
        f"Regenerate with `tunelab plan-strategies --deepspeed`. DeepSpeed does not run on fake tensors, so each "
        f"family's litgpt config is shrunk (width, MLP width and vocabulary / {SCALE}, heads / 4, every block kept) "
        f"and DeepSpeed's own ZeRO-2 and ZeRO-3 run it on gloo ranks of this CPU (tunelab's DeepSpeed config and "
        f"loss, foreach AdamW, micro batch {MICRO} x {TOKENS} tokens, bf16; every element count of DeepSpeed's "
        f"defaults shrunk with the matrices: reduce bucket {BUCKET:,}, ZeRO-3's prefetch bucket "
        f"{ZERO3['stage3_prefetch_bucket_size']:,}, persistence threshold {ZERO3['stage3_param_persistence_threshold']:,}, "
        f"live parameters and reuse distance {ZERO3['stage3_max_live_parameters']:,}); rank 0's peak allocated beside "
        "the plan of the same model. ZeRO-2 is measured under torch's MemTracker, ZeRO-3 under torch's profiler (the "
        "tracker keeps ZeRO-3's released parameters alive): the blocks alive, followed by address through its memory "
        "events, not its running total, which keeps every block freed on a thread it does not cover (the walk ends "
        "such a block only when its address is allocated again, so it reads at or above the bytes alive). "
        f"Offload is not here (a CPU has no device to offload from). Worst: {worst_text}. MB = 1e6 bytes.",
        "",
        "| family | litgpt config | stage | ranks | parameters (shrunk) | planned MB | DeepSpeed MB | error |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in found:
        lines.append(
            f"| {r.family} | {r.model} | ZeRO-{r.stage} | {r.world} | {r.params:,} | {r.planned_bytes / 1e6:.2f} | "
            f"{r.measured_bytes / 1e6:.2f} | {r.error:+.1%} |"
        )
    return lines
