"""``tunelab plan-accuracy``: the planner against every lab measurement."""

from __future__ import annotations

from tunelab.cli.common import folder


def add_parser(sub) -> None:
    """The subcommand's parser."""
    parser = sub.add_parser(
        "plan-accuracy",
        help="the planner against every lab measurement -> reports/planner-accuracy/",
        description="The plan beside every measurement it can be held to, each row with its error: memory "
        "(accuracy.md: the lab's A100 rows, our H100 and H200 records, the lab's Part 2 on four GPUs, the fitted "
        "link efficiency left out row by row), time (runtime.md: the kernel model against our H100 rows, the Part 3 "
        "micro-batch curve, the fast path's benches and the lab's A100 Part 1 and Part 2 times) and the kernel "
        "constants (kernels.md); the CSVs beside them hold every row. CPU only, under a minute here; the tests "
        "check the committed reports against a fresh run.",
    )
    parser.add_argument("--out", type=folder, help="output directory (default: reports/planner-accuracy)")
    parser.set_defaults(func=handle)


def handle(args, extra) -> int:
    """Run the subcommand; the exit code."""
    from tunelab.report.runtime_accuracy import write_all

    out = write_all(args.out)
    print((out / "accuracy.md").read_text())
    print("written: " + ", ".join(str(p) for p in sorted(out.iterdir()) if p.suffix in (".md", ".csv")))
    return 0
