"""``tunelab validate``: litgpt's own parser plus the rules litgpt leaves unchecked, one line per problem."""

from __future__ import annotations

import argparse


def add_parser(sub) -> None:
    """The subcommand's parser."""
    s = sub.add_parser(
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
    s.add_argument("recipes", nargs="*", help="recipe keys or YAML paths (default: every recipe)")
    s.add_argument("--gpu", help="a row of configs/hardware/gpus.yaml (e.g. V100-32GB) to check hardware rules")
    s.add_argument("--device", choices=["cpu", "cuda"], help="the target device kind, for the CPU-only rules")
    s.set_defaults(func=handle, passthrough=True)


def handle(args, extra) -> int:
    """Run the subcommand; the exit code."""
    from tunelab.recipes import RecipeError, discover, resolve
    from tunelab.validate import check

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
        for p in result.problems:
            print(p)
        if result.ok:
            print(f"ok  {recipe.key}  ({recipe.command})")
        else:
            failed += 1
    if len(refs) > 1:
        print(f"{len(refs) - failed} of {len(refs)} recipes valid")
    return 1 if failed else 0
