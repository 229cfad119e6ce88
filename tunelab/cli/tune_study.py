"""``tunelab tune-study FILE``: a tuning study (tune-batch per strategy setting), then its report."""

from __future__ import annotations

import argparse
import time

from tunelab.cli.common import count, fail, folder, listed, model_choice, positive_seconds, run_options
from tunelab.errors import InputError


def add_parser(sub) -> None:
    """The subcommand's parser."""
    parser = sub.add_parser(
        "tune-study",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        help="run a tuning study (configs/sweeps/lab-part3.yaml): tune-batch per strategy setting, then its report",
        description="For each study of FILE (a recipe, a strategy, a device count) and each of its settings "
        "(activation checkpointing on/off, backward prefetch), search the micro batch with real short "
        "probes as tune-batch does: the --also rows first, doubling from the planner's guess, bisecting "
        "to the largest that fits, then to the largest without allocator retries; a setting with "
        "at_best_of probes only the best micro batch of an earlier one. Every probe is a run record "
        "under OUT/<study>/<setting>/mbs<N>/; the same command again reuses them. The report (tables "
        "in the study's columns beside its reference figures, predicted vs probed, plot, CSV) is "
        "written at the end, or with `tunelab report OUT`.",
        epilog="examples:\n  tunelab tune-study lab-part3 --only cpu-example     # CPU: tiny-deep, 2 processes, "
        "3 GB cap each\n  tunelab tune-study lab-part3 --only tiny-llama-1.1b-full --weights random   # one GPU",
    )
    parser.add_argument("study_file", help="a study YAML, or a name under configs/sweeps/ (lab-part3)")
    parser.add_argument("--only", help="comma-separated study ids (default: every study in the file)")
    parser.add_argument("--out", type=folder, help="probe directory (default: runs/<name>)")
    parser.add_argument("--report-dir", type=folder, help="report directory (default: reports/<date>-<name>-<device>)")
    parser.add_argument("--no-report", action="store_true", help="only probe; write no report")
    parser.add_argument("--max-micro", type=count, help="cap every setting's micro batch (a quick rehearsal)")
    parser.add_argument(
        "--deadline",
        type=positive_seconds,
        metavar="S",
        help="start no setting after S seconds (a running probe finishes or hits --timeout)",
    )
    run_options(parser)
    parser.set_defaults(func=handle)


def handle(args, extra) -> int:
    """Run the subcommand; the exit code."""
    from tunelab.paths import output_root
    from tunelab.report import study as study_report
    from tunelab.tune import study as tune_study
    from tunelab.tune.batch import render

    try:
        sf = tune_study.load(args.study_file)
        chosen = tune_study.check(sf, listed(args.only, "--only"))
        model = model_choice(args)
    except (tune_study.StudyError, ValueError) as e:
        return fail(str(e))
    out = args.out or (output_root() / "runs" / sf.name)
    out.mkdir(parents=True, exist_ok=True)
    tune_study.write_index(sf, out)
    deadline = None if args.deadline is None else time.monotonic() + args.deadline
    for study in chosen:
        try:
            results = tune_study.run_study(
                sf, study, out, model=model, max_micro=args.max_micro, deadline=deadline, timeout_s=args.timeout
            )
        except (RuntimeError, InputError) as e:  # a probe failed or was refused: the line names it
            return fail(str(e))
        print("\n\n".join(render(r) for r in results))
    print(f"probe records: {out}/")
    if not args.no_report:
        report = study_report.write_report(out, sf, args.report_dir)
        print(f"{report}/results.md")
    return 0
