"""``tunelab ls``: the recipe table, read from the files."""

from __future__ import annotations

import json


def table(rows: list[dict], columns: list[str]) -> str:
    """Rows as aligned text columns with a header and a rule."""
    widths = {c: max(len(c), *(len(str(r.get(c, ""))) for r in rows)) for c in columns}
    lines = ["  ".join(c.ljust(widths[c]) for c in columns), "  ".join("-" * widths[c] for c in columns)]
    lines += ["  ".join(str(r.get(c, "")).ljust(widths[c]) for c in columns) for r in rows]
    return "\n".join(lines)


def add_parser(sub) -> None:
    """The subcommand's parser."""
    parser = sub.add_parser("ls", help="list the recipes (model, method, precision, batch, devices) from the files")
    parser.add_argument("--json", action="store_true", help="print the rows as JSON")
    parser.set_defaults(func=handle)


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
