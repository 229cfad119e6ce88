"""``tunelab bench RECIPE``: litgpt's own command against tunelab's fast path, side by side, on one device."""

from __future__ import annotations

import argparse
import time

from tunelab.cli.common import count, fail, folder, memory_limit, model_choice, positive_seconds, run_options
from tunelab.files import unwritable_dir

PROBE_STEPS = 8
"""Optimizer steps of each --best-micro probe: the first is warm-up (excluded); the fast arm compiles every shape
before its first iteration, so no probe is timed on its compilation."""


def add_parser(sub) -> None:
    """The subcommand's parser."""
    parser = sub.add_parser(
        "bench",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        help="litgpt against tunelab's fast path on one device: tok/s, MFU, memory, loss, the speed-up with spread",
        description="Run RECIPE (with litgpt-style overrides) as `litgpt finetune_*` and under tunelab's loop with "
        "a strategy file (default: fast, every speed switch on), in alternating pairs on one device, at the same "
        "settings; then, with --best-micro, each at its own best micro batch (tune-batch). Every run is a record "
        "(reused when the command runs again); the report (bench.md, bench.csv, loss.png) gives real and padded "
        "tok/s, MFU on real tokens, peak memory, the first iteration (compilation) apart, and the speed-up as the "
        "median of the pairs' ratios with its range.",
        epilog="examples:\n  tunelab bench tiny-llama-1.1b/full --pairs 1 --train.max_steps 8   # CPU: the tiny "
        "model\n  tunelab bench tiny-llama-1.1b/full --weights random --pairs 3 --best-micro --gpu H100-SXM   # a GPU",
    )
    parser.add_argument("recipe", help="a key such as tiny-llama-1.1b/full, or a YAML path")
    parser.add_argument("--strategy", default="fast", help="the fast arm's strategy file or name (default: fast)")
    parser.add_argument("--pairs", type=count, default=3, help="alternating pairs per phase (default 3)")
    parser.add_argument("--best-micro", action="store_true", help="also run each arm at its own best micro batch")
    parser.add_argument("--gpu", help="GPU table row for tune-batch's starting guess (with --best-micro)")
    parser.add_argument("--max-micro", type=count, default=256, help="with --best-micro: never probe above this")
    parser.add_argument(
        "--deadline",
        type=positive_seconds,
        metavar="S",
        help="start no run after S seconds and kill one still running then (it runs again when the same command "
        "runs again): for machines that give a command a fixed time",
    )
    parser.add_argument("--out", type=folder, help="run directory (default: runs/bench/<recipe>)")
    parser.add_argument(
        "--report-dir", type=folder, help="report directory (default: reports/<date>-bench-<recipe>-<device>)"
    )
    run_options(parser)
    parser.set_defaults(func=handle, passthrough=True)


def _asked(args, extra) -> tuple:
    """(the recipe, the model source, the GPU row or None) asked for; ValueError (one line) for what the arms
    would refuse, before either trains."""
    from tunelab import hardware
    from tunelab.recipes import resolve
    from tunelab.settings import resolve as resolve_settings
    from tunelab.strategies import StrategyError, load_strategy

    recipe = resolve(args.recipe)
    model = model_choice(args)
    gpu = hardware.lookup(args.gpu) if args.gpu is not None else None
    strategy = load_strategy(args.strategy)
    try:
        strategy.check(resolve_settings(recipe, extra).args)  # what the fast arm's run would refuse
    except StrategyError as e:
        raise ValueError(f"--strategy {args.strategy}: {e}") from None
    return recipe, model, gpu


def handle(args, extra) -> int:
    """Run the subcommand; the exit code."""
    from tunelab.paths import output_root
    from tunelab.recipes import RecipeError
    from tunelab.report import bench as bench_report
    from tunelab.run.runner import RunOptions
    from tunelab.tune import bench

    try:
        recipe, model, gpu = _asked(args, extra)
    except (RecipeError, ValueError) as e:
        return fail(str(e))
    out = args.out or (output_root() / "runs" / "bench" / recipe.slug())
    from tunelab.files import Busy, exclusive_lock

    for option, where in (("--report-dir", args.report_dir), ("--out", out)):  # before either arm trains
        if where is not None and (why := unwritable_dir(where)):
            return fail(f"{option} {where}: {why}; fix: a new folder")
    try:
        out.mkdir(parents=True, exist_ok=True)
        lock = exclusive_lock(out / ".lock")  # held to the end: two benches on one --out would slow each other
    except Busy as e:
        return fail(f"--out {out}: another bench is running there ({e}); wait for it, or use another --out")
    except OSError as e:
        return fail(f"--out {out}: cannot be made ({e.strerror})")
    options = RunOptions(model=model, timeout_s=args.timeout, memory_limit_bytes=memory_limit(args))
    deadline = None if args.deadline is None else time.monotonic() + args.deadline
    arms = [bench.Arm("litgpt", None), bench.Arm("fast", args.strategy)]
    phases = [bench.run_phase(recipe, extra, out, "recipe", arms, args.pairs, options=options, deadline=deadline)]
    if args.best_micro and (deadline is None or time.monotonic() < deadline):
        best = bench.best_micro(recipe, extra, out, arms, options, gpu=gpu, max_micro=args.max_micro, steps=PROBE_STEPS)
        if len(best) == len(arms):
            fresh = [bench.Arm(a.name, a.strategy) for a in arms]
            phases.append(
                bench.run_phase(recipe, extra, out, "best", fresh, args.pairs, best, options=options, deadline=deadline)
            )
        else:
            print(f"best micro batch: not found for {sorted({a.name for a in arms} - set(best))}; phase skipped")
    if not any(arm.records for phase in phases for arm in phase.arms):
        lock.close()
        return fail(
            f"--deadline {args.deadline:g}: no run could start before it, nothing is recorded; fix: a longer "
            "--deadline (each run takes at least a minute here)"
        )
    report = bench_report.write_report(recipe, phases, out, args.report_dir)
    lock.close()
    print((report / "bench.md").read_text())
    print(f"records: {out}/\nreport:  {report}/bench.md")
    if left := sum(len(phase.not_started) for phase in phases):
        print(f"bench: incomplete, {left} run(s) not started before --deadline; the same command goes on from here")
        return 1
    return 0
