"""``tunelab ls``: the recipe table, read from the files."""

from __future__ import annotations

import json

from tunelab.cli.common import table


def add_parser(sub) -> None:
    """The subcommand's parser."""
    s = sub.add_parser("ls", help="list the recipes (model, method, precision, batch, devices) from the files")
    s.add_argument("--json", action="store_true", help="print the rows as JSON")
    s.set_defaults(func=handle)


def handle(args, extra) -> int:
    """Run the subcommand; the exit code."""
    from tunelab.recipes import discover

    rows = [r.summary() for r in discover()]
    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        print(
            table(
                rows,
                ["recipe", "model", "method", "precision", "quantize", "micro", "global", "accum", "devices", "nodes"],
            )
        )
    return 0
