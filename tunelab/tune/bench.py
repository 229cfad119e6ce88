"""``tunelab bench RECIPE``: litgpt's own command against tunelab's fast path, side by side on one device.

Both arms run the same recipe and settings as real runs with their records: ``litgpt`` is ``litgpt finetune_*``
behind tunelab's observer, ``fast`` tunelab's loop under a strategy file (default ``configs/strategies/fast.yaml``).
They alternate in pairs, litgpt first, so a drift of the machine touches both; the speed-up is the median over the
pairs of each pair's ratio of steady-state real tokens/s (warm-up excluded), with its range, and ``bench.md`` also
gives each arm's whole run: start-up, the time an optimizer step saves and the step from which the fast arm is
ahead end to end. Losses are compared per pair."""

from __future__ import annotations

import dataclasses
import functools
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from tunelab import record as record_mod
from tunelab.files import set_aside
from tunelab.progress import ProgressLine
from tunelab.recipes import Recipe
from tunelab.run.resume import DEADLINE_PREFIX, resume_state, strategy_label, strategy_settings
from tunelab.run.runner import RunOptions, run
from tunelab.tune.batch import Probes, search
from tunelab.validate import parse


@dataclass
class Arm:
    """One side of the comparison."""

    name: str
    """``litgpt`` or ``fast``."""
    strategy: str | None
    """None: litgpt's own command; else a configs/strategies file run by tunelab's loop."""
    records: list = field(default_factory=list)
    """(pair, record, path) of each run."""

    @functools.cached_property
    def identity(self) -> tuple[str, dict | None]:
        """(label, every key) of its strategy as a record keeps them, read once: what a reused record must match."""
        return strategy_label(self.strategy), strategy_settings(self.strategy)


@dataclass
class Phase:
    """The pairs run at one setting: the recipe's micro batch, or each arm's best."""

    name: str
    arms: list
    micro: dict = field(default_factory=dict)
    """The micro batch of each arm (by name)."""
    not_started: list = field(default_factory=list)
    """The runs the command's ``--deadline`` left no time to start ("pair 1 fast", ...)."""

    def ratios(self) -> list[float]:
        """fast / litgpt real tokens/s, pair by pair (pairs where both finished and neither is refused)."""
        by = {a.name: {p: r for p, r, _ in a.records if not refused(r)} for a in self.arms}
        return [
            by["fast"][p].tok_s_real / by["litgpt"][p].tok_s_real
            for p in sorted(by["litgpt"])
            if p in by["fast"] and by["fast"][p].tok_s_real and by["litgpt"][p].tok_s_real
        ]


def refused(rec: record_mod.RunRecord) -> str | None:
    """Why a finished run's speed cannot be compared (None: it can): torch.compile recompiled inside the training
    loop, so compilation fell inside the measured window; or it hit its recompile limit, so some blocks ran eagerly
    (a run slower than the strategy it claims)."""
    if rec.graphs_compiled_in_loop:
        return f"{rec.graphs_compiled_in_loop} graph(s) compiled inside the training loop (recompilation in the window)"
    if rec.recompile_limit_hits:
        return f"torch.compile hit its recompile limit {rec.recompile_limit_hits} time(s): blocks ran eagerly for some shapes"
    return None


def _one(
    recipe: Recipe,
    overrides: list[str],
    run_dir: Path,
    arm: Arm,
    options: RunOptions,
    *,
    stream,
    progress: ProgressLine,
) -> record_mod.RunRecord:
    path = run_dir / "record.json"
    done, why = resume_state(path, recipe.key, overrides, *arm.identity)
    if done:
        stream.write(f"{run_dir.name}: recorded earlier, not run again\n")
        return record_mod.load(path)
    if why:
        set_aside(path, why)
    progress.started(progress.done, f"{run_dir.name} {recipe.key}")
    options = dataclasses.replace(
        options, sweep="bench", row_id=run_dir.name, strategy=arm.strategy, on_progress=progress.show
    )
    rec = run(recipe, overrides, run_dir, options)
    progress.finished(rec)
    return rec


def run_phase(
    recipe: Recipe,
    overrides: list[str],
    out: Path,
    name: str,
    arms: list[Arm],
    pairs: int,
    micro: dict | None = None,
    *,
    options: RunOptions,
    stream=sys.stderr,
    deadline: float | None = None,
) -> Phase:
    """``pairs`` alternating pairs (litgpt, then fast) of the recipe with ``overrides`` on one device; ``micro``:
    an arm's own micro batch (its global batch: :func:`global_batch_for`); ``options``: how each run runs (its
    weights and limits; each arm sets its strategy).
    ``deadline`` (time.monotonic()): no run starts after it, and one still running then is killed and recorded as
    cut by the deadline (it runs again when the same command runs again)."""
    phase = Phase(name=name, arms=arms, micro=micro or {})
    progress = ProgressLine(pairs * len(arms), stream)
    prefix = "" if name == "recipe" else f"{name}-"
    not_started = phase.not_started
    for pair in range(pairs):
        for arm in arms:
            extra = [*overrides, "--devices", "1"]
            if arm.name in phase.micro:
                m = phase.micro[arm.name]
                g = global_batch_for(recipe, overrides, m)
                extra += ["--train.micro_batch_size", str(m), "--train.global_batch_size", str(g)]
            run_dir = out / f"{prefix}{arm.name}-{pair}"
            this = options
            if deadline is not None:  # past it, a run recorded earlier still counts; none starts
                left = deadline - time.monotonic()
                done, _ = resume_state(run_dir / "record.json", recipe.key, extra, *arm.identity)
                if left < 1 and not done:
                    not_started.append(f"pair {pair} {arm.name}")
                    continue
                this = dataclasses.replace(options, timeout_s=min(options.timeout_s or left, max(left, 1)))
            rec = _one(recipe, extra, run_dir, arm, this, stream=stream, progress=progress)
            if deadline is not None and rec.status == "killed" and time.monotonic() >= deadline - 1:
                rec.error = f"{DEADLINE_PREFIX} the command's time ran out during this run; it runs again"
                record_mod.save(rec, run_dir / "record.json")
            arm.records.append((pair, rec, run_dir / "record.json"))
    if not_started:
        stream.write(f"deadline reached: {name} {', '.join(not_started)} not started; the same command goes on\n")
    return phase


def global_batch_for(recipe: Recipe, overrides: list[str], micro: int) -> int:
    """The global batch of a run at its own best ``micro``: the recipe's (with the overrides) when ``micro`` divides
    it, so the optimizer's maths is the baseline's, else the next multiple of ``micro`` above it (said in bench.md)."""

    g = int(parse(recipe, overrides)["train"]["global_batch_size"])
    return -(-g // micro) * micro


def best_micro(
    recipe: Recipe,
    overrides: list[str],
    out: Path,
    arms: list[Arm],
    options: RunOptions,
    *,
    gpu,
    max_micro: int,
    steps: int,
) -> dict:
    """Each arm's best micro batch on one device: tune-batch's search (the fastest without allocator retries), its
    probes under ``<out>/tune-<arm>/`` (``options``: their weights and limits). An arm with no clean probe is left
    out."""

    best = {}
    for arm in arms:
        results = search(
            recipe,
            [*overrides, "--devices", "1"],
            out / f"tune-{arm.name}",
            dataclasses.replace(options, strategy=arm.strategy),
            Probes(max_micro=max_micro, steps=steps, world=1),
            gpu=gpu,
        )
        if results and results[0].best:
            best[arm.name] = results[0].best
    return best
