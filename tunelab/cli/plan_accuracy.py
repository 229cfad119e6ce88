"""``tunelab plan-accuracy``: the planner against every lab measurement."""

from __future__ import annotations

from pathlib import Path


def add_parser(sub) -> None:
    """The subcommand's parser."""
    s = sub.add_parser("plan-accuracy", help="the planner against every lab measurement -> reports/planner-accuracy/")
    s.add_argument("--out", type=Path, help="output directory (default: reports/planner-accuracy)")
    s.set_defaults(func=handle)


def handle(args, extra) -> int:
    """Run the subcommand; the exit code."""
    from tunelab.plan.accuracy import write_accuracy

    out = write_accuracy(args.out)
    print((out / "accuracy.md").read_text())
    print("written: " + ", ".join(str(p) for p in sorted(out.iterdir()) if p.suffix in (".md", ".csv")))
    return 0
