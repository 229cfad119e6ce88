"""``tunelab run RECIPE``: one run through litgpt (or tunelab's loop under --strategy) -> its run record."""

from __future__ import annotations

import argparse
import json
from datetime import datetime
from pathlib import Path

from tunelab.cli.common import fail, folder, memory_limit, model_choice, run_options, strategy_options


def add_parser(sub) -> None:
    """The subcommand's parser."""
    parser = sub.add_parser(
        "run",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        help="run one recipe through litgpt as a child process and write its run record",
        description="Validate, then run `litgpt finetune_*` for RECIPE in a child process (litgpt's own CLI behind "
        "tunelab.run.entry, which records each rank's allocator peaks at exit), collect memory, speed, FLOPs, "
        "MFU, GPU power and loss into record.json under --out.",
        epilog="Any other --dotted.key VALUE is a litgpt-style override, e.g. --train.max_steps 10.",
    )
    parser.add_argument("recipe", help="a key such as tiny-llama-1.1b/lora, or a YAML path")
    parser.add_argument("--out", type=folder, help="run directory (default: runs/single/<recipe>-<time>)")
    parser.add_argument("--id", default="run", help="row id stored in the record")
    run_options(parser)
    strategy_options(parser)
    parser.set_defaults(func=handle, passthrough=True)


SUMMARY = (
    "status",
    "error",
    "peak_allocated_bytes",
    "peak_rss_bytes",
    "step_time_s",
    "tok_s_padded",
    "tok_s_real",
    "mfu",
    "val_loss_final",
)
"""The record's fields a finished run prints (the whole record is in record.json)."""


def handle(args, extra) -> int:
    """Run the subcommand; the exit code."""
    from tunelab.paths import output_root
    from tunelab.progress import ProgressLine
    from tunelab.recipes import RecipeError, resolve
    from tunelab.run.runner import RunError, RunOptions, run

    if args.node_rank >= args.nnodes:
        return fail(f"--node-rank {args.node_rank}: must be below --nnodes {args.nnodes} (ranks count from 0)")
    if args.nnodes > 1 and not args.strategy:
        return fail("--nnodes > 1 needs --strategy (litgpt's own command runs on one node here)")
    try:
        recipe = resolve(args.recipe)
        model = model_choice(args)
    except (RecipeError, ValueError) as e:
        return fail(str(e))
    progress = ProgressLine(1)
    progress.started(0, f"{args.id} {recipe.key}", show=False)
    if args.out is None:
        args.out = output_root() / "runs" / "single" / f"{recipe.slug()}-{datetime.now():%Y%m%d-%H%M%S}"
    try:
        options = RunOptions(
            row_id=args.id,
            model=model,
            timeout_s=args.timeout,
            memory_limit_bytes=memory_limit(args),
            on_progress=progress.show,
            strategy=args.strategy,
            nnodes=args.nnodes,
            node_rank=args.node_rank,
            master_addr=args.master_addr,
            master_port=args.master_port,
        )
        rec = run(recipe, extra, args.out, options)
    except RunError as e:
        return fail(str(e))
    if args.node_rank:
        print(f"node {args.node_rank} done (exit code {rec.exit_code}); node 0 writes the record")
        return 0 if rec.exit_code == 0 else 1
    progress.finished(rec)
    print(json.dumps({k: getattr(rec, k) for k in SUMMARY}, indent=2))
    print(f"record: {Path(args.out) / 'record.json'}")
    return 0 if rec.status == "ok" else 1
