"""``tunelab sweep SWEEP``: every row of a sweep file as its own run, resumable; then the report."""

from __future__ import annotations

import argparse
from pathlib import Path

from tunelab.cli.common import (
    fail,
    folder,
    given_path,
    listed,
    memory_limit,
    model_choice,
    positive_seconds,
    run_options,
)
from tunelab.files import unwritable


def add_parser(sub) -> None:
    """The subcommand's parser."""
    parser = sub.add_parser(
        "sweep",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        help="run every row of a sweep YAML (resumable), then write the report",
        description="Run each row of SWEEP (configs/sweeps/*.yaml) as its own child process, one record per row "
        "(OOM, crashed, killed and timed-out runs included), with a progress line. Rows already "
        "recorded in the sweep directory are skipped (resume) unless --rerun. Writes "
        "reports/<date>-<sweep>[-<device>]/ at the end.",
    )
    parser.add_argument("sweep", help="a sweep YAML path, or a name under configs/sweeps/ (lab-part1)")
    parser.add_argument("--out", type=folder, help="sweep directory for the records (default: runs/<sweep name>)")
    parser.add_argument("--rerun", action="store_true", help="run rows again even if they have a record")
    parser.add_argument("--only", help="comma-separated row ids to run (others untouched)")
    parser.add_argument("--no-report", action="store_true", help="do not write the report at the end")
    parser.add_argument(
        "--report-dir", type=folder, help="report directory (default: reports/<date>-<sweep>[-<device>])"
    )
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a litgpt override for every row (dotted key, YAML value), e.g. --set train.max_steps=5; "
        "repeatable; recorded in each row's overrides",
    )
    parser.add_argument(
        "--deadline",
        type=positive_seconds,
        metavar="S",
        help="start no row after S seconds, and kill a row still running then (it runs again on resume): "
        "for machines that give a command a fixed time",
    )
    parser.add_argument(
        "--report-each-row", action="store_true", help="rewrite the report after every row, not only at the end"
    )
    parser.add_argument(
        "--archive",
        type=given_path,
        metavar="FILE.tgz",
        help="after every row, write the records and logs (no weights) to this .tar.gz, paths under the working "
        "directory made relative (a lent machine's archive names no path of it)",
    )
    parser.add_argument(
        "--prune-checkpoints",
        action="store_true",
        help="with --weights random: delete a random-weight checkpoint once no later row needs it (disk)",
    )
    run_options(parser)
    parser.set_defaults(func=handle)


def handle(args, extra) -> int:
    """Run the subcommand; the exit code."""
    from tunelab.report.sweep import write_report
    from tunelab.run.sweep import SweepOptions, archive, run_sweep
    from tunelab.sweep_file import SweepError, load

    def after_row(sweep_dir: Path) -> None:  # what a command killed later must still leave behind
        if args.report_each_row and not args.no_report:
            write_report(sweep_dir, args.report_dir)
        if args.archive:
            archive(sweep_dir, args.archive)

    if args.out is not None and args.out.exists() and not args.out.is_dir():
        return fail(f"--out {args.out}: is a file; fix: give a directory for the sweep's records")
    if args.archive is not None:  # found now, not after the first row has run
        why = unwritable(args.archive)
        if not why and not str(args.archive).endswith((".tgz", ".tar.gz")):
            why = "its name does not end in .tgz or .tar.gz, and what is written is a gzipped tar"
        if why:
            return fail(f"--archive {args.archive}: {why}; fix: give a .tgz path in a writable directory")
    try:
        model = model_choice(args)
        sweep = load(args.sweep, args.set)
        options = SweepOptions(
            rerun=args.rerun,
            model=model,
            only=listed(args.only, "--only"),
            timeout_s=args.timeout,
            memory_limit_bytes=memory_limit(args),
            deadline_s=args.deadline,
            after_row=after_row,
            prune_checkpoints=args.prune_checkpoints,
        )
        sweep_dir = run_sweep(sweep, args.out, options)
    except (SweepError, ValueError, OSError) as e:
        return fail(str(e).replace("\n", "\n  "))
    print(f"records: {sweep_dir}")
    if not args.no_report:
        out = write_report(sweep_dir, args.report_dir)
        print(f"report:  {out}/results.md")
    if args.archive:
        print(f"archive: {archive(sweep_dir, args.archive)}")
    return 0
