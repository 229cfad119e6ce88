"""The plan on several devices against rank 0's simulated step (:mod:`tunelab.plan.trace.ranks`), for every strategy
simulated per rank, world sizes 2, 4 and 8, five model families, full and LoRA; and the collectives the simulation
traced against :mod:`tunelab.plan.model.comm`'s formulas. Written to ``reports/planner-strategies/`` by ``tunelab
plan-strategies``; the tests run a fast subset.

Each row plans a recipe as ``tunelab plan RECIPE --devices N --strategy S`` does (the family's model through
``--checkpoint_dir``), at micro batch 2 x 512 tokens and the recipe's global batch (so the accumulation falls as the
world grows), and simulates the same configuration.
"""

from __future__ import annotations

import csv
import datetime
import functools
import io
import os
import sys
from dataclasses import dataclass
from pathlib import Path

from tunelab import files, hardware
from tunelab.errors import InputError
from tunelab.paths import output_root
from tunelab.plan.model import comm, memory
from tunelab.plan.recipe import plan_recipe
from tunelab.plan.trace import ranks
from tunelab.plan.trace.tables import TRACED
from tunelab.recipes import resolve
from tunelab.report import accuracy, deepspeed_checks
from tunelab.strategies import load_strategy
from tunelab.units import GB

FAMILIES = (
    ("TinyLlama 1.1B", "tiny-llama-1.1b", None),
    ("OpenLLaMA 3B", "open-llama-3b", None),
    ("OpenLLaMA 7B", "open-llama-7b", None),
    ("Gemma 2B", "open-llama-3b", "checkpoints/google/gemma-2b"),
    ("Phi-2", "open-llama-3b", "checkpoints/microsoft/phi-2"),
)
"""(label, recipe model, checkpoint_dir override): the families checked, each on a recipe of ours (Gemma and Phi-2
on OpenLLaMA 3B's settings, their model from litgpt's config of the directory name)."""
STRATEGIES = (
    "litgpt",
    "fsdp2",
    "fsdp",
    "ddp",
    "fsdp-shard-grad-op",
    "fsdp-hybrid",
    "fsdp-no-shard",
    "fsdp-no-wrap",
    "fsdp-offload",
)
"""``litgpt`` (no strategy file: litgpt's own choice, as its scripts wrap the model) and the strategy files
(``configs/strategies/``) checked: every one simulated per rank (``fsdp-offload`` on a stand-in accelerator, its
device side compared: :mod:`tunelab.plan.trace.fake_device`). Not here: DeepSpeed's (not simulated) and ``fast`` (one
device)."""
DEFAULT_STRATEGIES = ("litgpt", "fsdp2", "fsdp", "ddp")
"""What a call without ``--strategies`` reruns; FSDP1's variants (each as quick as ``fsdp``) are asked for by name."""
WORLDS = (2, 4, 8)
PRECISIONS = ("32-true", "bf16-true", "bf16-mixed")
"""Precisions a row may be checked at (``--precisions``; by default each recipe's own), in the table's order."""
METHODS = ("full", "lora")
MICRO, SEQ = 2, 512


SEED_V100_MB = {
    False: {1: 9028, 2: 10510, 4: 12488, 7: 14736, 8: 14992, 9: None},
    True: {8: 8458, 16: 8604, 32: 10188, 64: 11490},
}
"""The FSDP study's 1.4B table (minGPT's GPT-2 XL under Lightning Lite's FSDPStrategy, each Block a unit, AMP,
sequence 128, 4 V100 16 GB): {activation checkpointing: {batch per GPU: "Memory (MB)" as published, an average
over the GPUs and 100 iterations as a GPU monitor reads it (MiB: the caching allocator's reserve and the CUDA
context); None: out of memory}}."""


def gpt2_xl_config():
    """GPT-2 XL as minGPT builds it, in litgpt's terms: 48 blocks, 25 heads, width 1600, GELU MLP of 6400, LayerNorm,
    biases, its 50,257-token vocabulary unpadded. Not modelled: its learned position embedding (1.6M parameters) and
    its dropout (masks after attention and each residual branch), which litgpt's blocks do not have."""
    from litgpt import Config

    return Config(
        name="gpt2-xl (minGPT)",
        block_size=128,
        vocab_size=50257,
        padded_vocab_size=50257,
        n_layer=48,
        n_head=25,
        n_embd=1600,
        n_query_groups=25,
        rotary_percentage=0.0,
        parallel_residual=False,
        bias=True,
        norm_class_name="LayerNorm",
        mlp_class_name="GptNeoxMLP",
        intermediate_size=6400,
        gelu_approximate="none",
    )


def v100_rows() -> list[dict]:
    """Each :data:`SEED_V100_MB` row planned as Lightning's FSDPStrategy runs it (FSDP1 FULL_SHARD per block, its
    16-bit MixedPrecision over fp32 shards, AdamW, the logits held by the loop, V100 without flash attention): the
    peak allocated and what a GPU monitor would read (reserved and the CUDA context), MiB, and the verdict on a
    V100 16 GB."""

    gpu, out = hardware.lookup("V100-16GB"), []
    for ac, table in SEED_V100_MB.items():
        for batch, mb in table.items():
            case = memory.PlanInput.of(
                config=gpt2_xl_config(),
                method="full",
                precision="16-mixed",
                micro_batch_size=batch,
                seq_len=128,
                devices=4,
                strategy="fsdp",
                sharding="FULL_SHARD",
                fsdp_root_kept=True,
                activation_checkpointing=ac,
                attention_math=True,
                tables=TRACED,
            )
            plan = memory.verdict(memory.predict(case), gpu)
            seen = (plan.predicted_reserved_bytes + plan.cuda_context_bytes) / 2**20
            out.append(
                {
                    "checkpointing": ac,
                    "batch": batch,
                    "peak_mib": plan.peak_allocated_bytes / 2**20,
                    "seen_mib": seen,
                    "measured_mib": mb,
                    "error": seen / mb - 1 if mb else None,
                    "fits": plan.fits,
                    "lab_fits": mb is not None,
                }
            )
    return out


@functools.lru_cache(maxsize=1)
def _part2_section() -> tuple[str, ...]:
    """strategies.md's section on the lab's Part 2 rows on several GPUs, as ``tunelab plan-accuracy`` checks them
    (planned once per process: the report is written after every row)."""

    rows = [r for r in accuracy.accuracy_rows() if r["part"] == "Part 2" and r["devices"] > 1]
    return (
        "",
        "## The lab's Part 2 on four GPUs (measured, not simulated)",
        "",
        "The same rows as `reports/planner-accuracy/accuracy.md`: the plan per device against what the lab printed, "
        "which is the memory allocated at one moment of a step as its own Lightning scripts printed it (in GiB; "
        "shown in GB, min-max over the GPUs), not the step's peak: the error is to the nearest end of the "
        "range, and where the plan's peak is FSDP's backward end without auto-wrap (m3, v4: the whole model's "
        "gradient twice over, as the simulation above shows for `fsdp-no-wrap`) the reading sits far under it.",
        "",
        *accuracy.memory_table(rows),
    )


def _v100_section() -> list[str]:
    """strategies.md's section on the FSDP study's V100 table (:func:`v100_rows`)."""
    rows = v100_rows()
    lines = [
        "",
        "## The FSDP study's 1.4B model on 4 V100s (published, not simulated)",
        "",
        "minGPT's GPT-2 XL (built as a litgpt Config: `strategy_checks.gpt2_xl_config`) under Lightning's "
        "FSDPStrategy, each Block a unit, AMP (fp16), sequence 128, 4 V100 16 GB, planned as `tunelab plan` plans "
        "FSDP1 under Lightning; against the study's 'Memory (MB)', which a GPU monitor reads (the allocator's reserve "
        "and the CUDA context, MiB): the plan's reserved (peak allocated x 1.05) and context beside it. minGPT is "
        "not litgpt: its dropout masks, its attention written out by hand and, likely, CUDA autocast's fp32 "
        "LayerNorm outputs keep more per sample than the litgpt blocks the plan models (about 850 MiB a sample "
        "published against 390 planned without checkpointing); the published figure is also an average over GPUs. "
        "Shown, not tuned for.",
        "",
        "| activation checkpointing | batch per GPU | planned peak MiB | planned reserved + context MiB | "
        "published MiB | error | planned | published |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        err = "" if r["error"] is None else f"{r['error']:+.1%}"
        lines.append(
            f"| {'yes' if r['checkpointing'] else 'no'} | {r['batch']} | {r['peak_mib']:.0f} | {r['seen_mib']:.0f} | "
            f"{r['measured_mib'] or ''} | {err} | {'fits' if r['fits'] else 'OOM'} | "
            f"{'fits' if r['lab_fits'] else 'OOM'} |"
        )
    return lines


@dataclass
class Row:
    """One checked configuration."""

    family: str
    method: str
    precision: str
    strategy: str
    world: int
    accumulation: int
    planned_bytes: float
    simulated_bytes: float
    simulated_phase: str
    traced_bytes_per_step: float
    """Bytes rank 0 sends per optimizer step by the traced collectives (ring)."""
    formula_bytes_per_step: float
    """The same by comm.py's formula for the strategy."""
    seconds: float
    traced_calls: int | None = None
    """Collective calls rank 0 issued per optimizer step (None: a row kept from an earlier report without them)."""
    formula_calls: int | None = None
    """The calls comm.py charges NCCL's latency for."""

    @property
    def memory_error(self) -> float:
        """Planned / simulated peak - 1."""
        return self.planned_bytes / self.simulated_bytes - 1

    @property
    def comm_error(self) -> float | None:
        """comm.py's bytes / the traced bytes - 1 (None where nothing is exchanged)."""
        return self.formula_bytes_per_step / self.traced_bytes_per_step - 1 if self.traced_bytes_per_step else None


def check(family: tuple, method: str, strategy: str, world: int, precision: str | None = None) -> Row:
    """Plan and simulate one configuration (``precision``: None, the recipe's)."""

    label, model, checkpoint = family
    overrides = ["--train.micro_batch_size", str(MICRO), "--train.max_seq_length", str(SEQ)]
    if checkpoint:
        overrides += ["--checkpoint_dir", checkpoint]
    if precision:
        overrides += ["--precision", precision]
    planned = plan_recipe(resolve(f"{model}/{method}"), overrides, gpu=None, devices=world, strategy=strategy)
    case = planned.input
    sim = ranks.for_plan(case, None if strategy == "litgpt" else load_strategy(strategy))
    formula = comm.per_step(case, comm.lookup("nvlink4", "gpu"))
    return Row(
        label,
        method,
        str(case.precision),
        strategy,
        world,
        case.accumulation,
        planned.plan.peak_allocated_bytes,
        sim.peak_bytes,
        sim.peak_phase,
        sim.bytes_moved(),
        formula.bytes_gpu,
        sim.seconds,
        sum(c.calls for c in sim.collectives),
        sum(n for _, n, _, _ in formula.calls),
    )


def rows(
    families=FAMILIES,
    strategies=DEFAULT_STRATEGIES,
    worlds=WORLDS,
    methods=METHODS,
    kept=(),
    each=None,
    precisions=(None,),
) -> list[Row]:
    """Every combination (``precisions``: None, each recipe's own), with progress on stderr, beside the ``kept`` rows
    of other combinations (an earlier report's: :func:`read`), in the table's order; ``each(rows so far)`` after
    every row (the command writes the report there, so a run stopped after an hour keeps the hour's rows)."""
    todo = [(f, m, s, w, p) for f in families for m in methods for p in precisions for s in strategies for w in worlds]
    out: list[Row] = []
    for i, (f, m, s, w, p) in enumerate(todo, 1):
        print(f"[{i}/{len(todo)}] {f[0]} {m} {p or ''} {s} on {w} ...".replace("  ", " "), file=sys.stderr, flush=True)
        out.append(check(f, m, s, w, p))
        if each is not None:
            each(_merged(out, kept))
    return _merged(out, kept)


def _merged(out: list[Row], kept) -> list[Row]:
    """``out`` and the ``kept`` rows it did not rerun, in the table's order."""
    done = {(r.family, r.method, r.precision, r.strategy, r.world) for r in out}
    found = out + [r for r in kept if (r.family, r.method, r.precision, r.strategy, r.world) not in done]
    order = {f[0]: i for i, f in enumerate(FAMILIES)}
    return sorted(
        found,
        key=lambda r: (
            order.get(r.family, 99),
            r.method,
            PRECISIONS.index(r.precision) if r.precision in PRECISIONS else 99,
            STRATEGIES.index(r.strategy) if r.strategy in STRATEGIES else 99,
            r.world,
        ),
    )


def read(path: Path) -> list[Row]:
    """The rows of an earlier strategies.csv (read bounded; a file that is not one: InputError naming it)."""

    text = files.read_text(path, 1 << 20, "strategies table")
    out = []

    def num(r: dict, key: str) -> int | None:
        return int(r[key]) if r.get(key) not in (None, "", "None") else None

    try:
        for r in csv.DictReader(io.StringIO(text)):
            out.append(
                Row(
                    r["family"],
                    r["method"],
                    r["precision"],
                    r["strategy"],
                    int(r["world"]),
                    int(r["accumulation"]),
                    float(r["planned_bytes"]),
                    float(r["simulated_bytes"]),
                    r["simulated_phase"],
                    float(r["traced_bytes_per_step"]),
                    float(r["formula_bytes_per_step"]),
                    float(r["seconds"]),
                    num(r, "traced_calls"),
                    num(r, "formula_calls"),
                )
            )
    except (KeyError, ValueError, TypeError) as e:
        raise InputError(f"{path}: not a strategies table ({e}); fix: run without --keep") from None
    return out


VARIANTS = STRATEGIES[4:]
"""FSDP1's variants among :data:`STRATEGIES`."""


def _families_of(found: list[Row], strategies) -> list[str]:
    """The families with a row under any of ``strategies``, in the table's order."""
    have = {r.family for r in found if r.strategy in strategies}
    return [f[0] for f in FAMILIES if f[0] in have]


def _seconds(found: list[Row], strategies) -> str:
    """The range of the simulation's seconds over the rows of ``strategies`` (the table's last column)."""
    secs = [r.seconds for r in found if r.strategy in strategies]
    return f"{min(secs):.0f}-{max(secs):.0f} s of simulation a row on this CPU" if secs else "no row yet"


def _how(found: list[Row]) -> str:
    """strategies.md's paragraph on how each strategy is simulated and what is not."""
    return (
        "`litgpt` (no strategy file: `tunelab plan RECIPE --devices N`, litgpt's own choice) is simulated as "
        "litgpt's scripts wrap the model: full fine-tuning by Lightning's own `FSDPStrategy.setup_module` with the "
        "keywords litgpt's `finetune/full.py` passes (read from its source: FSDP1, each Block a unit and "
        "checkpointed, `limit_all_gathers`, Lightning's `FSDPPrecision`), LoRA by litgpt's own `parallelize_fn` "
        "(FSDP2 over checkpointed blocks, the root kept from forward to backward by torch's default), both in "
        "litgpt's loop (the logits held until the next forward rebinds them). "
        "FSDP1 (`fsdp`: a `name: fsdp` file, FULL_SHARD per block) is "
        "simulated on fake tensors as the run wraps it, flat parameters included. Calls: the collectives rank 0 "
        "issued per step beside those comm.py charges NCCL's latency for (blank: a row kept from a report made "
        "before they were counted). FSDP1's variants (the files `fsdp-shard-grad-op`, `fsdp-hybrid` on one node, "
        "`fsdp-no-shard`, `fsdp-no-wrap`, `fsdp-offload`) are simulated the same way; their rows cover "
        f"{', '.join(_families_of(found, VARIANTS)) or 'no family yet'} ({_seconds(found, VARIANTS)}). "
        "`fsdp-offload` (FSDP1's `cpu_offload`, which offloads only from an accelerator) runs on a stand-in "
        "accelerator (fake tensors on torch's `meta` device, the host's apart: `tunelab/plan/trace/fake_device.py`); its "
        "rows compare the device side (peak allocated on the device; the host's peak is in `tunelab plan "
        "--simulate`). Not simulated per rank (planned by arithmetic, see docs/planner.md): DeepSpeed ZeRO-2/3 and "
        "offload (DeepSpeed's own ZeRO-2 runs for real on this CPU at each family's shape / 16 instead: the "
        "section below), QLoRA on several devices."
    )


def markdown(found: list[Row], zero_rows=()) -> str:
    """strategies.md: the summary (rows within 3%, the worst), what is not simulated, one table row per check; then
    the lab's Part 2, DeepSpeed run for real (``zero_rows``: :mod:`tunelab.report.deepspeed_checks`) and the FSDP
    study's V100 table."""
    worst = max(found, key=lambda r: abs(r.memory_error))
    within = sum(abs(r.memory_error) <= 0.03 for r in found)
    comm_rows = [r for r in found if r.comm_error is not None]
    comm_worst = max((abs(r.comm_error) for r in comm_rows), default=0.0)
    lines = [
        "# The plan on several devices against rank 0's simulated step",
        "",
        f"Regenerate with `tunelab plan-strategies` ({datetime.date.today().isoformat()}). Each row plans a recipe "
        f"as `tunelab plan RECIPE --devices N --strategy S` does, at micro batch {MICRO} x {SEQ} tokens, the "
        "recipe's global batch (accumulation = global / (micro x N)) and the recipe's precision (or the one "
        "`--precisions` names: the table's column), and simulates the same step as rank 0 of N "
        "on this CPU: litgpt's model at full width on fake tensors, torch's fake process group; FSDP2 sharded by "
        "the run's own `tunelab.parallel.wrap` (every block, under torch's FSDPMemTracker), DDP as the one-device "
        "simulated step plus DDP's own bucket assignment. Memory: peak allocated per device, GB = 1e9 bytes. "
        "Communication: bytes rank 0 sends per optimizer step in a ring, traced from the collectives the "
        "simulation dispatched against `tunelab/plan/model/comm.py`'s formula.",
        "",
        f"**{within} of {len(found)} rows within 3%**; worst {worst.memory_error:+.1%} ({worst.family} "
        f"{worst.method} {worst.strategy} on {worst.world}). Traced communication against the formula: worst "
        f"{comm_worst:.1%} over {len(comm_rows)} rows.",
        "",
        _how(found),
        "",
        "| family | method | precision | strategy | devices | accumulation | planned GB | simulated GB | error | "
        "simulated peak | traced GB/step | comm.py GB/step | comm error | calls traced / comm.py | simulation s |",
        "|" + "---|" * 15,
    ]
    for r in found:
        ce = "" if r.comm_error is None else f"{r.comm_error:+.1%}"
        calls = "" if r.traced_calls is None else f"{r.traced_calls} / {r.formula_calls}"
        lines.append(
            f"| {r.family} | {r.method} | {r.precision} | {r.strategy} | {r.world} | {r.accumulation} | "
            f"{r.planned_bytes / GB:.2f} | {r.simulated_bytes / GB:.2f} | {r.memory_error:+.1%} | "
            f"{r.simulated_phase} | {r.traced_bytes_per_step / GB:.2f} | {r.formula_bytes_per_step / GB:.2f} | "
            f"{ce} | {calls} | {r.seconds:.1f} |"
        )

    return (
        "\n".join(lines + list(_part2_section()) + deepspeed_checks.section(list(zero_rows)) + _v100_section()) + "\n"
    )


def write(found: list[Row], out: Path | None = None) -> Path:
    """strategies.md and strategies.csv under ``out`` (default reports/planner-strategies/), written atomically;
    the DeepSpeed section from the ``deepspeed.csv`` there, if any."""

    out = Path(out or output_root() / "reports" / "planner-strategies")
    out.mkdir(parents=True, exist_ok=True)
    zero = out / deepspeed_checks.CSV_NAME
    zero_rows = deepspeed_checks.read(zero) if os.path.lexists(zero) else ()  # a link or FIFO refused, not skipped
    files.write_text_atomic(out / "strategies.md", markdown(found, zero_rows))
    header = [*Row.__dataclass_fields__, "memory_error", "comm_error"]
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(header)
    for r in found:
        w.writerow([getattr(r, k) for k in header])
    files.write_text_atomic(out / "strategies.csv", buf.getvalue())
    return out
