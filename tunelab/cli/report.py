"""``tunelab report DIR``: a sweep's or a tuning study's report from its records."""

from __future__ import annotations

from pathlib import Path

from tunelab.cli.common import fail, folder


def add_parser(sub) -> None:
    """The subcommand's parser."""
    parser = sub.add_parser(
        "report", help="write results.csv, results.md and plots from a sweep's or tuning study's records"
    )
    parser.add_argument("sweep_dir", help="the directory a sweep or tune-study wrote (runs/<name>)")
    parser.add_argument("--out", type=folder, help="report directory (default: reports/<date>-<sweep>[-<device>])")
    parser.add_argument("--not-run-reason", help="why the rows without a record were not run (shown in the report)")
    parser.add_argument(
        "--study",
        help="the tuning-study file the directory's probes came from (tune-study writes it "
        "into tune-study.json; give it for a directory without one)",
    )
    parser.set_defaults(func=handle)


def handle(args, extra) -> int:
    """Run the subcommand; the exit code."""
    from tunelab.report import study as study_report
    from tunelab.report.sweep import write_report
    from tunelab.tune import study as tune_study

    base = Path(args.sweep_dir)
    try:
        index = tune_study.read_index(base)
        if args.study or index:  # a tuning study's directory (tunelab tune-study): its own report
            sf = tune_study.load(args.study or tune_study.resolve_index_path(index))
            out = study_report.write_report(base, sf, args.out)
        else:
            out = write_report(base, args.out, not_run_reason=args.not_run_reason)
    except FileNotFoundError as e:
        return fail(str(e))
    print(f"{out}/results.md")
    return 0
