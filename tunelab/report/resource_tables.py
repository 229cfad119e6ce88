"""litgpt's published resource tables (``configs/published/litgpt-resource-tables.yaml``): LoRA and QLoRA on one
A100 and LoRA under FSDP on several, each row planned from the YAML beside the table and set to the row's model,
quantization, micro batch, GPUs and longest sample: the plan's time per 1,000 iterations and its band against the
table's, its peak per device and its verdict against the table's. A check set: nothing is fitted on it."""

from __future__ import annotations

import math
from pathlib import Path

from tunelab import hardware, recipes
from tunelab.errors import InputError
from tunelab.paths import ROOT
from tunelab.plan.projection import project_recipe
from tunelab.plan.recipe import plan_recipe, replanned
from tunelab.report import evidence
from tunelab.units import GB

TABLE = "litgpt-resource-tables"
"""The table's name under ``configs/published/`` (and the folder of its YAML)."""
GPU = "A100-40GB"
"""The table's GPU: NVIDIA A100-SXM4-40GB."""
ITERATIONS = 1000
"""The table's unit of time: "Time 1k iterations"."""
SAMPLES_PER_STEP = 128
"""The table's minibatch: samples per optimizer step over all GPUs."""
KEYS = ("model", "quantize", "micro_batch_size", "gpus", "longest", "trainable", "minutes", "peak_gb")
"""The keys of each row."""
AS_RAN = {
    "fsdp_root_kept": True,
    "fsdp2_root_kept": False,
    "bnb_keeps_matmul_inputs": True,
    "qlora_stable_embedding": False,
    "longest_first": True,
}
"""The table's runs as lit-gpt's script and bitsandbytes of the time ran them: on several GPUs FSDP1 (Lightning's
``FSDPStrategy``, ``use_orig_params``), a unit a block and its root kept, where litgpt 0.5.13 shards LoRA with FSDP2
(its frozen weights then take gradients: :func:`tunelab.plan.model.strategies.fsdp1.frozen_units`); QLoRA with
bitsandbytes 0.41.1's 4-bit matmul keeping its inputs and the embedding frozen; the longest sample the first micro
batch (:class:`tunelab.plan.model.case.LoopFeatures`)."""


def _overrides(row: dict) -> tuple[list[str], int]:
    """(litgpt overrides that set the YAML to ``row``, the iterations each GPU then runs): the optimizer steps that
    first reach :data:`ITERATIONS` micro batches a GPU."""
    from litgpt import Config

    accumulation = SAMPLES_PER_STEP // (row["micro_batch_size"] * row["gpus"])
    steps = math.ceil(ITERATIONS / accumulation)
    org = Config.from_name(row["model"]).hf_config["org"]
    out = ["--checkpoint_dir", f"checkpoints/{org}/{row['model']}", "--devices", str(row["gpus"])]
    out += ["--train.micro_batch_size", str(row["micro_batch_size"]), "--train.max_steps", str(steps)]
    out += ["--train.max_seq_length", str(row["longest"])]
    return out + (["--quantize", row["quantize"]] if row["quantize"] else []), steps * accumulation


def _checked(n: int, row: dict) -> None:
    """One line naming the row and its fix where a value is not what the table's keys say."""
    counts = all(evidence.positive(row[k], whole=True) for k in ("micro_batch_size", "gpus", "longest", "trainable"))
    numbers = all(row[k] is None or evidence.positive(row[k]) for k in ("minutes", "peak_gb"))
    model = isinstance(row["model"], str) and row["quantize"] in (None, "bnb.nf4")
    if not (counts and numbers and model and SAMPLES_PER_STEP % (row["micro_batch_size"] * row["gpus"]) == 0):
        raise InputError(
            f"{evidence.PUBLISHED}/{TABLE}.yaml: rows[{n}]: a model name, quantize null or bnb.nf4, whole counts "
            f"whose micro batch x GPUs divides {SAMPLES_PER_STEP}, minutes and peak_gb numbers or null; fix: correct it"
        )


def rows(root: Path = ROOT) -> list[dict]:
    """Each row of the table planned: ``planned_min`` and ``band`` (minutes per :data:`ITERATIONS` iterations a GPU),
    ``error`` and ``inside`` against the table's minutes; ``planned_gb`` (peak allocated per device, GB) and
    ``memory_error`` against its peak; ``fits`` (the plan's verdict) against its OOM; ``planned_trainable``."""
    _, table = evidence.published(TABLE, ("source", "note"), KEYS, root)
    folder = (root / evidence.PUBLISHED / TABLE).resolve()
    if not (folder / "lora.yaml").resolve().is_relative_to(folder):  # never read through a link leading outside
        raise InputError(
            f"{evidence.PUBLISHED}/{TABLE}/lora.yaml: leads outside {evidence.PUBLISHED}/{TABLE}/; fix: restore it "
            f"(git checkout -- {evidence.PUBLISHED}/{TABLE}/lora.yaml)"
        )
    base = recipes.load(folder / "lora.yaml")
    gpu = hardware.lookup(GPU)
    out = []
    for n, row in enumerate(table):
        _checked(n, row)
        try:
            extra, iterations = _overrides(row)
            planned = plan_recipe(base, extra, gpu=gpu)
        except ValueError as e:  # a model litgpt does not know, a value the planner's checks refuse
            raise InputError(f"{evidence.PUBLISHED}/{TABLE}.yaml: rows[{n}] (set on {TABLE}/lora.yaml): {e}") from None
        planned = replanned(planned, gpu, **AS_RAN)
        projection = project_recipe(planned, gpu)[0]
        per = ITERATIONS / iterations / 60  # seconds of the planned run to minutes per 1,000 iterations
        lo, hi = projection.seconds_band
        peak = planned.plan.peak_allocated_bytes / GB
        minutes = row["minutes"]
        out.append(
            {
                **row,
                "strategy": planned.input.strategy,
                "planned_min": projection.seconds * per,
                "band": (lo * per, hi * per),
                "error": projection.seconds * per / minutes - 1 if minutes else None,
                "inside": lo * per <= minutes <= hi * per if minutes else None,
                "planned_gb": peak,
                "memory_error": peak / row["peak_gb"] - 1 if row["peak_gb"] else None,
                "fits": planned.plan.fits,
                "planned_trainable": planned.plan.trainable_params,
            }
        )
    return out


def _span(timed: list[dict]) -> str:
    """The memory errors of ``timed`` rows as a range, in words."""
    if not timed:
        return "none timed"
    errors = [r["memory_error"] for r in timed]
    return f"{min(errors):+.0%} to {max(errors):+.0%} against the table's ({len(timed)} rows)"


def as_run(row: dict) -> dict:
    """A timed row of :func:`rows` as the band figure takes a run: seconds per 1,000 iterations."""
    lo, hi = row["band"]
    return {
        "measured_s": row["minutes"] * 60,
        "predicted_s": row["planned_min"] * 60,
        "band_low_s": lo * 60,
        "band_high_s": hi * 60,
        "in_band": row["inside"],
    }


def markdown(table_rows: list[dict], root: Path = ROOT) -> list[str]:
    """runtime.md's section on the table: each row's time and band, peak and verdict beside the published ones."""
    head, _ = evidence.published(TABLE, ("source", "note"), KEYS, root)
    timed = [r for r in table_rows if r["minutes"]]
    inside = sum(r["inside"] for r in timed)
    several = [r for r in timed if r["gpus"] > 1]
    lines = [
        "",
        "## litgpt's published resource tables (a check set, not fitted)",
        "",
        f"{head['source']}: LoRA (r 8 on the query and value) and QLoRA on one A100-SXM4-40GB, LoRA under FSDP on "
        f"several; each row planned from `{evidence.PUBLISHED}/{TABLE}/lora.yaml` set to the row "
        f"(`tunelab.report.resource_tables`), its samples Alpaca's records as measured in the model's tokenizer "
        f"family (`configs/measured/alpaca-lengths.yaml`). {head['note']} {inside} of {len(timed)} timed rows lie "
        "inside the "
        f"plan's band; on several GPUs {sum(r['inside'] for r in several)} of {len(several)}, errors "
        + (f"{min(r['error'] for r in several):+.0%} to {max(r['error'] for r in several):+.0%}." if several else "-.")
        + " Peaks: GB (1e9 bytes) allocated per device, as lit-gpt printed them; on one GPU the plan's "
        + _span([r for r in timed if r["gpus"] == 1 and r["peak_gb"]])
        + ", on several "
        + _span([r for r in several if r["peak_gb"]])
        + ".",
        "",
        "| model | quantize | GPUs | strategy | micro | published min / 1k iterations | planned (band) | error | inside "
        "| published GB | planned GB | memory error | fits (published) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in table_rows:
        lo, hi = r["band"]
        time = "OOM" if r["minutes"] is None else f"{r['minutes']:.2f}"
        err = "" if r["error"] is None else f"{r['error']:+.0%}"
        mem = "" if r["memory_error"] is None else f"{r['memory_error']:+.0%}"
        lines.append(
            f"| {r['model']} | {r['quantize'] or ''} | {r['gpus']} | {r['strategy']} | {r['micro_batch_size']} | "
            f"{time} | {r['planned_min']:.2f} ({lo:.2f}-{hi:.2f}) | {err} | "
            f"{'' if r['inside'] is None else ('yes' if r['inside'] else 'no')} | "
            f"{'OOM' if r['peak_gb'] is None else r['peak_gb']} | {r['planned_gb']:.2f} | {mem} | "
            f"{'yes' if r['fits'] else 'no'} ({'no' if r['peak_gb'] is None else 'yes'}) |"
        )
    return lines
