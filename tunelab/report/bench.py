"""The report of ``tunelab bench`` (its runs: :mod:`tunelab.tune.bench`): ``bench.md`` (the environment, per phase
each arm's medians with their range and the pair-by-pair speed-up with its interval, the loss curves compared),
``bench.csv`` (one row per run, fixed columns), ``bench.json`` and ``loss.png``, all from the runs' records."""

from __future__ import annotations

import csv
import statistics
from pathlib import Path

from tunelab.files import save_figure, write_csv, write_json_atomic, write_text_atomic
from tunelab.paths import report_dir
from tunelab.recipes import Recipe
from tunelab.report.stats import median_interval
from tunelab.report.sweep import environment
from tunelab.run.collect import read_metrics
from tunelab.tune.bench import Phase, refused
from tunelab.units import fmt, gb, to_gb

COLUMNS = [
    "phase",
    "arm",
    "pair",
    "strategy",
    "micro_batch_size",
    "status",
    "error",
    "tok_s_real",
    "tok_s_padded",
    "padding_pct",
    "mfu",
    "mfu_padded",
    "peak_allocated_gb",
    "peak_rss_gb",
    "first_iteration_s",
    "compile_s",
    "compile_cache_hits",
    "compile_cache_misses",
    "wall_s",
    "graphs_compiled_in_loop",
    "recompile_limit_hits",
    "paused_s",
    "step_time_s",
    "optimizer_steps",
    "warmup_steps_excluded",
    "loss_first",
    "loss_last",
    "val_loss_final",
    "device_name",
    "record",
]
"""bench.csv: one row per run (GB = 1e9 bytes; tok/s in the steady state, warm-up excluded, summed over ranks; MFU on
real tokens, and on padded tokens; first_iteration_s: the first iteration's wall time; compile_s: the fast arm's
compilation of every training shape before it, compile_cache_hits / compile_cache_misses: its graphs inductor's
cache gave back / compiled anew (a warm or a cold start); wall_s: the run end to end, start to final checkpoint
(model load, compilation, training, validations, saves); graphs_compiled_in_loop: recompilations inside the loop;
recompile_limit_hits: graph variants torch.compile gave up on (those blocks ran eagerly); a run with either is
refused: left out of the ratios; paused_s: validation and checkpoints inside the loop, left out of the steady
state)."""


def _median(values: list) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def _spread(values: list) -> str:
    values = [v for v in values if v is not None]
    if not values:
        return ""
    return (
        f"{statistics.median(values):,.0f} ({min(values):,.0f}-{max(values):,.0f})"
        if len(values) > 1
        else f"{values[0]:,.0f}"
    )


def rows(phases: list[Phase], base: Path) -> list[dict]:
    """bench.csv's rows: every run of every phase, finished or not."""
    out = []
    for phase in phases:
        for arm in phase.arms:
            for pair, r, path in arm.records:
                pad = None if not (r.tokens_padded and r.tokens_real) else 100 * (1 - r.tokens_real / r.tokens_padded)
                out.append(
                    {
                        "phase": phase.name,
                        "arm": arm.name,
                        "pair": pair,
                        "strategy": r.strategy,
                        "micro_batch_size": r.micro_batch_size,
                        "status": r.status,
                        "error": r.error,
                        "tok_s_real": r.tok_s_real,
                        "tok_s_padded": r.tok_s_padded,
                        "padding_pct": pad,
                        "mfu": r.mfu,
                        "mfu_padded": r.mfu_padded,
                        "peak_allocated_gb": to_gb(r.peak_allocated_bytes),
                        "peak_rss_gb": to_gb(r.peak_rss_bytes),
                        "first_iteration_s": r.first_iteration_s,
                        "compile_s": r.compile_s,
                        "compile_cache_hits": r.compile_cache_hits,
                        "compile_cache_misses": r.compile_cache_misses,
                        "wall_s": r.wall_s,
                        "graphs_compiled_in_loop": r.graphs_compiled_in_loop,
                        "recompile_limit_hits": r.recompile_limit_hits,
                        "paused_s": r.paused_s,
                        "step_time_s": r.step_time_s,
                        "optimizer_steps": r.optimizer_steps,
                        "warmup_steps_excluded": r.warmup_steps_excluded,
                        "loss_first": r.loss_first,
                        "loss_last": r.loss_last,
                        "val_loss_final": r.val_loss_final,
                        "device_name": r.device_name,
                        "record": str(path.relative_to(base)),
                    }
                )
    return out


def markdown(recipe: Recipe, phases: list[Phase], base: Path) -> str:
    """bench.md: environment, definitions, per phase the arms' medians and the pair-by-pair ratio."""
    records = [r for p in phases for a in p.arms for _, r, _ in a.records]
    lines = _head(recipe, records)
    for phase in phases:
        lines += _phase_section(phase)
    lines += [
        "What the fast path changes and keeps: the model, the loss and the optimizer's update are litgpt's; "
        "with length grouping the micro batches are formed from samples of similar length (every sample "
        "once per epoch), so the sample order, the padding and the loss curve's path differ (`loss.png`).",
        "",
    ]
    return "\n".join(lines)


def _head(recipe: Recipe, records: list) -> list[str]:
    """bench.md's title, the environment its runs saw and what each column means."""
    cpu = all(r.device_type == "cpu" for r in records)
    return [
        f"# {recipe.key}: litgpt against tunelab's fast path" + (" (CPU, the embedded tiny model)" if cpu else ""),
        "",
        "Regenerate with `tunelab bench` (records are reused). "
        + (
            "**A CPU rehearsal**: the tiny model on this CPU says nothing about GPU speed; it shows that both "
            "arms run the same recipe and what the report holds."
            if cpu
            else ""
        ),
        "",
        "## Environment",
        "",
        *environment(records),
        "",
        "Definitions: tok/s in the steady state (warm-up steps excluded), real = without padding, padded = as "
        "computed; MFU on real tokens (padded tokens in brackets) against the GPU table's dense peak; peak "
        "allocated is torch's allocator peak (GB = 1e9 bytes), peak RSS the process's resident memory; the fast "
        "arm's compilation of every training shape (before its first iteration) and the first iteration's wall "
        "time are costs of their own, not in the steady state; end to end: the run from its start to its final "
        "checkpoint, compilation included (what a short run pays); recompiles in loop: graphs compiled after the first "
        "iteration (a run with any is refused). "
        "Medians over the pairs, range in brackets. Ratio: fast / litgpt real tokens/s, pair by pair.",
        "",
    ]


def whole_cost(fast: list, litgpt: list) -> dict | None:
    """When the fast arm pays for itself, from finished runs of the two arms (records): each run's start-up (wall time
    less litgpt's printed Training Time: loading, compiling ahead, the final save), the fast arm's from its warmest
    to its coldest compile cache; the time each optimizer step saves (the Training Times over the steps); the steps
    from which the fast arm is ahead end to end, warm and cold. None without a finished run of each arm, or where
    the fast arm saves nothing per step."""

    def parts(recs: list) -> list[tuple[float, float]]:
        return [
            (r.wall_s - r.litgpt_training_time_s, r.litgpt_training_time_s * (r.accumulation or 1) / r.iters)
            for r in recs
            if r.status == "ok" and r.wall_s and r.litgpt_training_time_s and r.iters
        ]

    f, lit = parts(fast), parts(litgpt)
    if not f or not lit:
        return None
    lit_start, lit_step = statistics.median(s for s, _ in lit), statistics.median(t for _, t in lit)
    saved = lit_step - statistics.median(t for _, t in f)
    if saved <= 0:
        return None
    warm, cold = min(s for s, _ in f), max(s for s, _ in f)
    return {
        "fast_start_s": (warm, cold),
        "litgpt_start_s": lit_start,
        "saved_per_step_s": saved,
        "break_even_steps": tuple(max(0.0, (s - lit_start) / saved) for s in (warm, cold)),
    }


def whole_cost_line(cost: dict | None) -> list[str]:
    """:func:`whole_cost` in a sentence (nothing without it)."""
    if cost is None:
        return []
    (warm, cold), (n_warm, n_cold) = cost["fast_start_s"], cost["break_even_steps"]
    start = (
        f"{warm:.0f} s" if round(warm) == round(cold) else f"{warm:.0f} s (its warmest compile cache) to {cold:.0f} s"
    )
    ahead = f"{n_warm:.0f}" if round(n_warm) == round(n_cold) else f"{n_warm:.0f} to {n_cold:.0f}"
    return [
        "",
        f"End to end: the fast arm starts in {start} (litgpt: {cost['litgpt_start_s']:.0f} s; loading, compiling "
        f"ahead, the final save), then saves {cost['saved_per_step_s']:.2f} s an optimizer step: it is ahead from "
        f"about {ahead} optimizer steps.",
    ]


def _phase_section(phase: Phase) -> list[str]:
    """One phase of the bench (the recipe's settings, or each arm at its best micro batch): the arms' table, the
    speed-up over the pairs, the runs that failed or were refused, the loss lines."""
    lines = [
        f"## {'At the recipe settings' if phase.name == 'recipe' else 'Each at its best micro batch'}",
        "",
        *(
            []
            if phase.name == "recipe"
            else [
                "Each arm's global batch is the recipe's when its micro batch divides it (the same optimizer "
                "maths), else the next multiple of its micro batch above it.",
                "",
            ]
        ),
        "| arm | strategy | micro | runs ok | tok/s real | tok/s padded | MFU (padded) | peak alloc. GB | "
        "peak RSS GB | compile s | first iteration s | end to end s | recompiles in loop | last loss |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    lines += [_arm_row(arm) for arm in phase.arms]
    ratios = phase.ratios()
    if ratios:
        ci = median_interval(ratios)
        lines += [
            "",
            f"Speed-up, fast / litgpt real tokens/s: **{statistics.median(ratios):.2f}x** (range "
            f"{min(ratios):.2f}-{max(ratios):.2f} over {len(ratios)} pair(s)"
            + (f"; 95% interval of the median {ci.low:.2f}-{ci.high:.2f}" if ci else "")
            + ").",
        ]
    arms = {arm.name: [r for _, r, _ in arm.records] for arm in phase.arms}
    lines += whole_cost_line(whole_cost(arms.get("fast", []), arms.get("litgpt", [])))
    failed = [(arm.name, r) for arm in phase.arms for _, r, _ in arm.records if r.status != "ok"]
    lines += [f"- {name} {r.row_id}: {r.status}: {r.error}" for name, r in failed]
    lines += [
        f"- {arm.name} {r.row_id}: refused: {refused(r)}"
        for arm in phase.arms
        for _, r, _ in arm.records
        if r.status == "ok" and refused(r)
    ]
    lines += loss_lines(phase)
    lines.append("")
    return lines


def _arm_row(arm) -> str:
    """One arm's table row: its runs' medians (tokens/s with their range, MFU, memory, compile and first
    iteration, recompiles, the last loss)."""
    recs = [r for _, r, _ in arm.records]
    ok = [r for r in recs if r.status == "ok" and not refused(r)]
    mfu, mfu_p = _median([r.mfu for r in ok]), _median([r.mfu_padded for r in ok])
    alloc = max((r.peak_allocated_bytes for r in ok if r.peak_allocated_bytes), default=None)
    rss = max((r.peak_rss_bytes for r in ok if r.peak_rss_bytes), default=None)
    first = _median([r.first_iteration_s for r in ok])
    comp = _median([r.compile_s for r in ok])
    wall = _median([r.wall_s for r in ok])
    recompiles = [r.graphs_compiled_in_loop for r in recs if r.graphs_compiled_in_loop is not None]
    last = _median([r.loss_last for r in ok])
    return (
        f"| {arm.name} | {recs[0].strategy if recs else ''} | {recs[0].micro_batch_size if recs else ''} | "
        f"{len(ok)} of {len(recs)} | {_spread([r.tok_s_real for r in ok])} | "
        f"{_spread([r.tok_s_padded for r in ok])} | "
        f"{'' if mfu is None else f'{mfu:.1%} ({mfu_p:.1%})'} | "
        f"{gb(alloc)} | {gb(rss)} | {fmt(comp, '.1f')} | {fmt(first, '.1f')} | {fmt(wall, '.1f')} | "
        f"{'' if not recompiles else max(recompiles)} | {fmt(last, '.3f')} |"
    )


def _curve(run_dir: Path) -> list[tuple[int, float]]:
    """(iteration, logged training loss): the fast loop's every iteration (``iterations.csv``, kept on the device
    and read at the end), else litgpt's metrics.csv."""
    fast = sorted((run_dir / "litgpt").glob("logs/csv/version_*/iterations.csv"))
    if fast:
        with open(fast[-1], newline="") as f:
            return [(int(r["iter"]), float(r["logged_loss"])) for r in csv.DictReader(f)]
    return [(int(r["iter"]), float(r["loss"])) for r in read_metrics(run_dir / "litgpt") if r.get("loss")]


def loss_lines(phase: Phase) -> list[str]:
    """The loss of the two arms' first runs compared iteration by iteration (the loss litgpt logs: the mean over
    the accumulation window)."""
    curves = {a.name: _curve(a.records[0][2].parent) for a in phase.arms if a.records}
    if len(curves) < 2 or not all(curves.values()):
        return []
    ref, fast = dict(curves["litgpt"]), dict(curves["fast"])
    common = sorted(set(ref) & set(fast))
    if not common:
        return []
    diffs = [abs(fast[i] - ref[i]) / max(abs(ref[i]), 1e-12) for i in common]
    return [
        "",
        f"Loss, point by point (first pair, {len(common)} iterations in both): largest relative difference "
        f"{max(diffs):.2%}, median {statistics.median(diffs):.2%} (with length grouping the arms train different "
        "micro batches at each iteration, so points differ by design; without it they agree to rounding).",
    ]


def plot(phases: list[Phase], base: Path, out_dir: Path) -> Path | None:
    """loss.png: the training loss of each arm's first run, against the iteration."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    phase = phases[0]
    fig, ax = plt.subplots(figsize=(7, 4))
    drawn = False
    for arm in phase.arms:
        if not arm.records:
            continue
        points = _curve(arm.records[0][2].parent)
        if points:
            label = (
                "litgpt finetune_* (loss logged every iteration)"
                if arm.strategy is None
                else f"tunelab --strategy {arm.strategy} (every iteration's loss, kept on the device)"
            )
            ax.plot(*zip(*points), marker="o" if len(points) < 60 else None, markersize=3, label=label)
            drawn = True
    if not drawn:
        plt.close(fig)
        return None
    ax.set_xlabel("iteration (micro batch)")
    ax.set_ylabel("training loss (as logged)")
    ax.set_title("Loss: litgpt vs tunelab's fast path (first pair)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    return save_figure(fig, out_dir / "loss.png")


def default_report_dir(recipe: Recipe, phases: list[Phase]) -> Path:
    """reports/<date>-bench-<recipe>-<device> (:func:`tunelab.paths.report_dir`)."""
    rec = next((r for p in phases for a in p.arms for _, r, _ in a.records if r.device_name), None)
    return report_dir(f"bench-{recipe.slug()}", rec)


def write_report(recipe: Recipe, phases: list[Phase], base: Path, out_dir: Path | None = None) -> Path:
    """bench.md, bench.csv, bench.json and loss.png from the phases' records."""
    out_dir = Path(out_dir) if out_dir else default_report_dir(recipe, phases)
    table = rows(phases, base)
    write_csv(out_dir / "bench.csv", table, COLUMNS)
    write_json_atomic(
        out_dir / "bench.json",
        {
            "recipe": recipe.key,
            "phases": [{"phase": p.name, "micro": p.micro, "ratios_real_tok_s": p.ratios()} for p in phases],
            "runs": table,
        },
    )
    write_text_atomic(out_dir / "bench.md", markdown(recipe, phases, base))
    plot(phases, base, out_dir)
    return out_dir
