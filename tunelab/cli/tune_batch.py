"""``tunelab tune-batch RECIPE``: the largest and the fastest micro batch, by real short probes."""

from __future__ import annotations

import argparse

from tunelab.cli.common import count, fail, folder, memory_limit, micro_list, model_choice, number, run_options


def add_parser(sub) -> None:
    """The subcommand's parser."""
    parser = sub.add_parser(
        "tune-batch",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        help="find the largest and the fastest micro batch with short real probes",
        description="Start from the planner's guess, run short real probes (a few steps each), doubling then "
        "bisecting the micro batch; report the largest that fits and the best (highest tok/s among "
        "probes with no allocator retries). Each probe is a run record under --out. On CPU, give "
        "--memory-limit-gb so that 'fits' means something.",
        epilog="Any other --dotted.key VALUE is a litgpt-style override.",
    )
    parser.add_argument("recipe", help="a key such as tiny-llama-1.1b/full, or a YAML path")
    parser.add_argument("--gpu", help="GPU table row for the planner's starting guess")
    parser.add_argument("--start", type=count, help="starting micro batch (default: the planner's guess, or 1)")
    parser.add_argument(
        "--max-micro",
        type=count,
        default=1024,
        help="never probe above this micro batch (nor above the training samples per device, where the data is here)",
    )
    parser.add_argument(
        "--steps",
        type=number(int, 2, 10**6, what="a number of optimizer steps"),
        default=3,
        help="optimizer steps per probe, 2 to 1e6 (default 3; the first is warm-up)",
    )
    parser.add_argument(
        "--strategy",
        metavar="NAME",
        help="probe under a configs/strategies file (ddp, fsdp, fsdp2, "
        "deepspeed-zero3, ...) with tunelab's multi-device loop",
    )
    parser.add_argument("--devices", type=count, help="devices per node for the probes (default: the recipe's)")
    parser.add_argument(
        "--activation-checkpointing",
        choices=["on", "off", "both"],
        help="with --strategy: search with activation checkpointing on, off, or each (two tables)",
    )
    parser.add_argument(
        "--backward-prefetch",
        choices=["none", "pre", "post"],
        help="with an FSDP --strategy: prefetch the next unit's parameters during backward before (pre) "
        "or after (post) the current unit's gradients, or not at all (none); default: the file's",
    )
    parser.add_argument(
        "--also",
        type=micro_list,
        default=[],
        metavar="N,N,...",
        help="also probe these micro batches (rows for the table: how tok/s grows with the batch)",
    )
    parser.add_argument("--out", type=folder, help="probe directory (default: runs/tune-batch/<recipe>)")
    parser.add_argument("--json", action="store_true", help="print the summary as JSON")
    run_options(parser)
    parser.set_defaults(func=handle, passthrough=True)


def _needs_strategy(args) -> str | None:
    """The line for a switch that only a strategy file can carry, given without one; None when all is well."""
    if args.activation_checkpointing and not args.strategy:
        return (
            "--activation-checkpointing needs --strategy (litgpt's own command decides it for itself: on "
            "for LoRA on several devices)"
        )
    if args.backward_prefetch and not args.strategy:
        return "--backward-prefetch needs an FSDP --strategy (fsdp, fsdp-no-wrap, ...)"
    return None


def handle(args, extra) -> int:
    """Run the subcommand; the exit code."""
    from tunelab import hardware, settings
    from tunelab.paths import output_root
    from tunelab.recipes import RecipeError, resolve
    from tunelab.run.runner import RunOptions
    from tunelab.strategies import load_strategy
    from tunelab.tune.batch import Probes, probe_problems, render, search, summary_json

    needs = _needs_strategy(args)
    if needs:
        return fail(needs)
    if args.devices:
        extra = [*extra, "--devices", str(args.devices)]
    try:
        recipe = resolve(args.recipe)
        model = model_choice(args)
        gpu = hardware.lookup(args.gpu) if args.gpu is not None else None
        if args.strategy:
            strategy = load_strategy(args.strategy)
            if args.backward_prefetch and not strategy.kind.prefetches:
                raise ValueError(
                    f"--backward-prefetch: strategy {args.strategy} is {strategy.name}, not FSDP; "
                    "fix: give an FSDP strategy or leave the option out"
                )
    except (RecipeError, ValueError) as e:
        return fail(str(e))
    world = settings.resolve(recipe, extra).world_size
    problems = probe_problems(recipe, extra, world, args.steps, bool(args.strategy))
    if problems:
        return fail("; ".join(problems))
    out = args.out or (output_root() / "runs" / "tune-batch" / recipe.slug())
    try:
        options = RunOptions(
            model=model, strategy=args.strategy, memory_limit_bytes=memory_limit(args), timeout_s=args.timeout
        )
        probes = Probes(max_micro=args.max_micro, steps=args.steps, world=world, also=args.also)
        results = search(
            recipe,
            extra,
            out,
            options,
            probes,
            gpu=gpu,
            activation_checkpointing=args.activation_checkpointing,
            backward_prefetch=args.backward_prefetch,
            start=args.start,
        )
    except RuntimeError as e:
        return fail(str(e))
    if args.json:
        print(
            "[" + ",\n".join(summary_json(r) for r in results) + "]" if len(results) > 1 else summary_json(results[0])
        )
    else:
        print("\n\n".join(render(r) for r in results))
    print(f"probe records and summary: {out}/")
    return 0
