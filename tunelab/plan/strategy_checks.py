"""The plan on several devices against rank 0's simulated step (:mod:`tunelab.plan.ranks`), for every strategy
simulated per rank, world sizes 2, 4 and 8, five model families, full and LoRA; and the collectives the simulation
traced against :mod:`tunelab.plan.comm`'s formulas. Written to ``reports/planner-strategies/`` by ``tunelab
plan-strategies``; the tests run a fast subset.

Each row plans a recipe as ``tunelab plan RECIPE --devices N --strategy S`` does (the family's model through
``--checkpoint_dir``), at micro batch 2 x 512 tokens and the recipe's global batch (so the accumulation falls as the
world grows), and simulates the same configuration.
"""

from __future__ import annotations

import csv
import datetime
import io
import sys
from dataclasses import dataclass
from pathlib import Path

from tunelab import files
from tunelab.paths import output_root

FAMILIES = (
    ("TinyLlama 1.1B", "tiny-llama-1.1b", None),
    ("OpenLLaMA 3B", "open-llama-3b", None),
    ("OpenLLaMA 7B", "open-llama-7b", None),
    ("Gemma 2B", "open-llama-3b", "checkpoints/google/gemma-2b"),
    ("Phi-2", "open-llama-3b", "checkpoints/microsoft/phi-2"),
)
"""(label, recipe model, checkpoint_dir override): the families checked, each on a recipe of ours (Gemma and Phi-2
on OpenLLaMA 3B's settings, their model from litgpt's config of the directory name)."""
STRATEGIES = ("fsdp2", "fsdp", "ddp", "fsdp-shard-grad-op", "fsdp-hybrid", "fsdp-no-shard", "fsdp-no-wrap")
"""Strategy files (``configs/strategies/``) checked: every one simulated per rank. Not here: ``fsdp-offload`` (FSDP1
offloads only from a CUDA device, so the simulation cannot show its device side), DeepSpeed's (not simulated) and
``fast`` (one device)."""
DEFAULT_STRATEGIES = ("fsdp2", "fsdp", "ddp")
"""What a call without ``--strategies`` reruns; FSDP1's variants (each as quick as ``fsdp``) are asked for by name."""
WORLDS = (2, 4, 8)
METHODS = ("full", "lora")
MICRO, SEQ = 2, 512


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


def check(family: tuple, method: str, strategy: str, world: int) -> Row:
    """Plan and simulate one configuration."""
    from tunelab.plan import comm, ranks
    from tunelab.plan.recipe import plan_recipe
    from tunelab.recipes import resolve
    from tunelab.strategies import load_strategy

    label, model, checkpoint = family
    overrides = ["--train.micro_batch_size", str(MICRO), "--train.max_seq_length", str(SEQ)]
    if checkpoint:
        overrides += ["--checkpoint_dir", checkpoint]
    planned = plan_recipe(resolve(f"{model}/{method}"), overrides, gpu=None, devices=world, strategy=strategy)
    x = planned.input
    sim = ranks.for_plan(x, load_strategy(strategy))
    formula = comm.per_step(x, comm.lookup("nvlink4", "gpu"))
    return Row(
        label, method, str(x.precision), strategy, world, x.accumulation, planned.plan.peak_allocated_bytes,
        sim.peak_bytes, sim.peak_phase, sim.bytes_moved(), formula.bytes_gpu, sim.seconds,
        sum(c.calls for c in sim.collectives), sum(n for _, n, _, _ in formula.calls),
    )  # fmt: skip


def rows(
    families=FAMILIES, strategies=DEFAULT_STRATEGIES, worlds=WORLDS, methods=METHODS, kept=(), each=None
) -> list[Row]:
    """Every combination, with progress on stderr, beside the ``kept`` rows of other combinations (an earlier
    report's: :func:`read`), in the table's order; ``each(rows so far)`` after every row (the command writes the
    report there, so a run stopped after an hour keeps the hour's rows)."""
    todo = [(f, m, s, w) for f in families for m in methods for s in strategies for w in worlds]
    out: list[Row] = []
    for i, (f, m, s, w) in enumerate(todo, 1):
        print(f"[{i}/{len(todo)}] {f[0]} {m} {s} on {w} ...", file=sys.stderr, flush=True)
        out.append(check(f, m, s, w))
        if each is not None:
            each(_merged(out, kept))
    return _merged(out, kept)


def _merged(out: list[Row], kept) -> list[Row]:
    """``out`` and the ``kept`` rows it did not rerun, in the table's order."""
    done = {(r.family, r.method, r.strategy, r.world) for r in out}
    found = out + [r for r in kept if (r.family, r.method, r.strategy, r.world) not in done]
    order = {f[0]: i for i, f in enumerate(FAMILIES)}
    return sorted(found, key=lambda r: (order.get(r.family, 99), r.method, STRATEGIES.index(r.strategy)
                                        if r.strategy in STRATEGIES else 99, r.world))  # fmt: skip


def read(path: Path) -> list[Row]:
    """The rows of an earlier strategies.csv (read bounded; a file that is not one: InputError naming it)."""
    from tunelab.errors import InputError

    text = files.read_text(path, 1 << 20, "strategies table")
    out = []

    def num(r: dict, key: str) -> int | None:
        return int(r[key]) if r.get(key) not in (None, "", "None") else None

    try:
        for r in csv.DictReader(io.StringIO(text)):
            out.append(Row(r["family"], r["method"], r["precision"], r["strategy"], int(r["world"]),
                           int(r["accumulation"]), float(r["planned_bytes"]), float(r["simulated_bytes"]),
                           r["simulated_phase"], float(r["traced_bytes_per_step"]), float(r["formula_bytes_per_step"]),
                           float(r["seconds"]), num(r, "traced_calls"), num(r, "formula_calls")))  # fmt: skip
    except (KeyError, ValueError, TypeError) as e:
        raise InputError(f"{path}: not a strategies table ({e}); fix: run without --keep") from None
    return out


VARIANTS = STRATEGIES[3:]
"""FSDP1's variants among :data:`STRATEGIES`."""


def _families_of(found: list[Row], strategies) -> list[str]:
    """The families with a row under any of ``strategies``, in the table's order."""
    have = {r.family for r in found if r.strategy in strategies}
    return [f[0] for f in FAMILIES if f[0] in have]


def _seconds(found: list[Row], strategies) -> str:
    """The range of the simulation's seconds over the rows of ``strategies`` (the table's last column)."""
    secs = [r.seconds for r in found if r.strategy in strategies]
    return f"{min(secs):.0f}-{max(secs):.0f} s of simulation a row on this CPU" if secs else "no row yet"


def markdown(found: list[Row]) -> str:
    """strategies.md: the summary (rows within 3%, the worst), what is not simulated, one table row per check."""
    worst = max(found, key=lambda r: abs(r.memory_error))
    within = sum(abs(r.memory_error) <= 0.03 for r in found)
    comm_rows = [r for r in found if r.comm_error is not None]
    comm_worst = max((abs(r.comm_error) for r in comm_rows), default=0.0)
    lines = [
        "# The plan on several devices against rank 0's simulated step",
        "",
        f"Regenerate with `tunelab plan-strategies` ({datetime.date.today().isoformat()}). Each row plans a recipe "
        f"as `tunelab plan RECIPE --devices N --strategy S` does, at micro batch {MICRO} x {SEQ} tokens and the "
        "recipe's global batch (accumulation = global / (micro x N)), and simulates the same step as rank 0 of N "
        "on this CPU: litgpt's model at full width on fake tensors, torch's fake process group; FSDP2 sharded by "
        "the run's own `tunelab.parallel.wrap` (every block, under torch's FSDPMemTracker), DDP as the one-device "
        "simulated step plus DDP's own bucket assignment. Memory: peak allocated per device, GB = 1e9 bytes. "
        "Communication: bytes rank 0 sends per optimizer step in a ring, traced from the collectives the "
        "simulation dispatched against `tunelab/plan/comm.py`'s formula.",
        "",
        f"**{within} of {len(found)} rows within 3%**; worst {worst.memory_error:+.1%} ({worst.family} "
        f"{worst.method} {worst.strategy} on {worst.world}). Traced communication against the formula: worst "
        f"{comm_worst:.1%} over {len(comm_rows)} rows.",
        "",
        "FSDP1 (`fsdp`: a `name: fsdp` file, FULL_SHARD per block, as litgpt's CLI wraps full fine-tuning) is "
        "simulated on fake tensors as the run wraps it, flat parameters included. Calls: the collectives rank 0 "
        "issued per step beside those comm.py charges NCCL's latency for (blank: a row kept from a report made "
        "before they were counted). FSDP1's variants (the files `fsdp-shard-grad-op`, `fsdp-hybrid` on one node, "
        "`fsdp-no-shard`, `fsdp-no-wrap`) are simulated the same way; their rows cover "
        f"{', '.join(_families_of(found, VARIANTS)) or 'no family yet'} ({_seconds(found, VARIANTS)}). "
        "Not simulated per rank (planned by arithmetic, see docs/planner.md): DeepSpeed ZeRO-2/3 and offload "
        "(checked against DeepSpeed's own code on CPU by the tests instead), FSDP1's `fsdp-offload` (FSDP1 "
        "offloads only from a CUDA device: the simulation cannot show its device side), QLoRA on several devices.",
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
            f"{r.planned_bytes / 1e9:.2f} | {r.simulated_bytes / 1e9:.2f} | {r.memory_error:+.1%} | "
            f"{r.simulated_phase} | {r.traced_bytes_per_step / 1e9:.2f} | {r.formula_bytes_per_step / 1e9:.2f} | "
            f"{ce} | {calls} | {r.seconds:.1f} |"
        )
    return "\n".join(lines) + "\n"


def write(found: list[Row], out: Path | None = None) -> Path:
    """strategies.md and strategies.csv under ``out`` (default reports/planner-strategies/), written atomically."""
    out = Path(out or output_root() / "reports" / "planner-strategies")
    out.mkdir(parents=True, exist_ok=True)
    files.write_text_atomic(out / "strategies.md", markdown(found))
    header = [*Row.__dataclass_fields__, "memory_error", "comm_error"]
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(header)
    for r in found:
        w.writerow([getattr(r, k) for k in header])
    files.write_text_atomic(out / "strategies.csv", buf.getvalue())
    return out
