"""``tunelab data generate``: the project's Alpaca-format dataset, or the benchmark set."""

from __future__ import annotations

from pathlib import Path

from tunelab.cli.common import count, fail


def add_parser(sub) -> None:
    """The subcommand's parser."""
    s = sub.add_parser("data", help="regenerate the project's Alpaca-format dataset (data/alpaca_tunelab.json)")
    s.add_argument("action", choices=["generate"])
    s.add_argument("--n", type=count, default=400, help="number of records (default 400, the shipped file)")
    s.add_argument("--seed", type=int, default=42)
    s.add_argument("--out", help="output path (default: data/alpaca_tunelab.json)")
    s.add_argument(
        "--benchmark",
        action="store_true",
        help="instead: the 2,000-record benchmark set that random-weight runs read (the lab's ~437 padded "
        "tokens per sample at micro 8 under the benchmark tokenizer; default .tunelab/data/)",
    )
    s.set_defaults(func=handle)


def handle(args, extra) -> int:
    """Run the subcommand; the exit code."""
    from tunelab.data import alpaca as data
    from tunelab.data import benchmark as benchmark_data
    from tunelab.paths import DATASET

    try:
        if args.benchmark:  # the random-weight benchmark workload (tunelab/benchmark_data.py)
            out = Path(args.out) if args.out else benchmark_data.default_path()
            data.write(out, benchmark_data.generate())
        else:
            out = Path(args.out) if args.out else DATASET
            data.write(out, data.generate(args.n, args.seed))
    except OSError as e:
        return fail(f"--out {args.out or out}: cannot write ({e.strerror or e}); fix: give a writable path")
    print(out)
    return 0
