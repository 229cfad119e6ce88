"""``tunelab validate``: litgpt's own parser plus the rules litgpt leaves unchecked, one line per problem."""

from __future__ import annotations

import argparse


def add_parser(sub) -> None:
    """The subcommand's parser."""
    parser = sub.add_parser(
        "validate",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        help="check recipes with litgpt's own parser plus the rules litgpt leaves unchecked",
        description="Check each recipe against the argument parser of the pinned litgpt command that runs it, then "
        "against rules litgpt leaves unchecked or checks late (batch divisibility, warm-up, QLoRA on one "
        "device with a -true precision, quantize only for LoRA, a known model, max_seq_length within the "
        "block size, bf16 on the named GPU, CPU precision limits, LoRA eval hang on several devices, ...)."
        " One line per problem: file: key: what; fix: how. Exit 1 if any recipe fails.",
        epilog="Any other --dotted.key VALUE is a litgpt-style override applied to every recipe checked.",
    )
    parser.add_argument("recipes", nargs="*", help="recipe keys or YAML paths (default: every recipe)")
    parser.add_argument("--gpu", help="a row of configs/hardware/gpus.yaml (e.g. V100-32GB) to check hardware rules")
    parser.add_argument("--device", choices=["cpu", "cuda"], help="the target device kind, for the CPU-only rules")
    parser.add_argument(
        "--strategy",
        metavar="NAME",
        help="also check each recipe under a configs/strategies file, as `tunelab run --strategy` would (its device "
        "count, QLoRA, 16-mixed, Liger's limits)",
    )
    parser.set_defaults(func=handle, passthrough=True)


def handle(args, extra) -> int:
    """Run the subcommand; the exit code."""
    from tunelab.cli.common import fail
    from tunelab.paths import display_path
    from tunelab.recipes import RecipeError, discover, resolve
    from tunelab.strategies import StrategyError, load_strategy
    from tunelab.validate import LITGPT_LOOP_ONLY, check

    try:
        strategy = load_strategy(args.strategy) if args.strategy is not None else None
    except StrategyError as e:
        return fail(f"--strategy {args.strategy}: {e}")
    refs = args.recipes or [str(r.path) for r in discover()]
    failed = 0
    for ref in refs:
        try:
            recipe = resolve(ref)
        except RecipeError as e:  # the message names the file already, or says there is none
            print(f"error: {e}")
            failed += 1
            continue
        result = check(recipe, extra, gpu=args.gpu, device=args.device)
        for p in result.problems:  # under --strategy tunelab's loop runs it: litgpt's loop's own problems are not
            print(f"{p} (litgpt's own loop; not under --strategy)" if strategy and p.key in LITGPT_LOOP_ONLY else p)
        ok = not result.blocking(under_strategy=strategy is not None)
        if ok and strategy is not None:
            try:
                strategy.check(result.resolved, args.device)
            except StrategyError as e:  # what run refuses under the file, before anything is built
                print(f"{display_path(recipe.path)}: --strategy {args.strategy}: {e}")
                failed += 1
                continue
        if ok:
            print(f"ok  {recipe.key}  ({recipe.command})")
        else:
            failed += 1
    if len(refs) > 1:
        print(f"{len(refs) - failed} of {len(refs)} recipes valid")
    return 1 if failed else 0
