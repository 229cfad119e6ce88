"""``tunelab data generate``: the project's Alpaca-format dataset, or the benchmark set."""

from __future__ import annotations

from pathlib import Path

from tunelab.cli.common import fail, number
from tunelab.files import unwritable


def add_parser(sub) -> None:
    """The subcommand's parser."""
    parser = sub.add_parser("data", help="regenerate the project's Alpaca-format dataset (data/alpaca_tunelab.json)")
    parser.add_argument("action", choices=["generate"], help="generate: write the file (the one action)")
    parser.add_argument(
        "--n",
        type=number(int, 1, 1_000_000, what="a number of records"),
        default=400,
        help="number of records (default 400, the shipped file; at most 1,000,000)",
    )
    what = "the random seed (default 42, the shipped file's): the same seed and --n write the same file"
    parser.add_argument("--seed", type=number(int, 0, 10**9, what="a seed"), default=42, help=what)
    parser.add_argument("--out", help="output path (default: data/alpaca_tunelab.json)")
    parser.add_argument(
        "--benchmark",
        action="store_true",
        help="instead: the 2,000-record benchmark set that random-weight runs read (the lab's ~437 padded "
        "tokens per sample at micro 8 under the benchmark tokenizer; default .tunelab/data/; fixed: --n and --seed do "
        "not apply)",
    )
    parser.set_defaults(func=handle)


def handle(args, extra) -> int:
    """Run the subcommand; the exit code."""
    from tunelab.data import alpaca as data
    from tunelab.data import benchmark as benchmark_data
    from tunelab.paths import DATASET

    default = benchmark_data.default_path() if args.benchmark else DATASET
    out = default if args.out is None else Path(args.out)
    why = unwritable(args.out) if args.out is not None else None
    if why:
        return fail(f"--out {args.out!r}: {why}; fix: give a file path in a writable directory")
    try:
        if args.benchmark:  # the random-weight benchmark workload (tunelab/benchmark_data.py)
            data.write(out, benchmark_data.generate())
        else:
            data.write(out, data.generate(args.n, args.seed))
    except OSError as e:
        return fail(f"--out {args.out or out}: cannot write ({e.strerror or e}); fix: give a writable path")
    print(out)
    return 0
