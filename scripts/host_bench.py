"""What the CPU host benches share (bench_wrapper_host.py, bench_eval_host.py): their rep arguments, the checks
that refuse bad input in one line before anything runs, and the machine and software a result was measured on."""

from __future__ import annotations

import argparse
import platform
import statistics
from pathlib import Path

from tunelab.errors import InputError
from tunelab.files import check_target


def add_rep_args(ap: argparse.ArgumentParser, reps: int, iters: int, warmup: int) -> None:
    """--reps, --iters, --warmup and --json-out, at these defaults."""
    ap.add_argument("--reps", type=int, default=reps, help="reps (default %(default)s)")
    ap.add_argument("--iters", type=int, default=iters, help="timed turns per model (default %(default)s)")
    ap.add_argument("--warmup", type=int, default=warmup, help="untimed turns first (default %(default)s)")
    ap.add_argument("--json-out", type=Path, help="write every rep and the summary here (.json; .md beside it)")


def check_rep_args(ap: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """One line (argparse's exit 2) for counts out of range or an output that is not a .json file one may write
    (never through a link, FIFO or device: :func:`tunelab.files.check_target`), the table's place included."""
    if min(args.reps, args.iters) < 1 or args.warmup < 0:
        ap.error("--reps and --iters take 1 or more, --warmup 0 or more")
    if args.json_out:
        if args.json_out.suffix != ".json":
            ap.error(f"--json-out {args.json_out}: a .json file (its table is written beside it as .md)")
        try:
            check_target(args.json_out, "--json-out")
            check_target(args.json_out.with_suffix(".md"), "--json-out's table")
        except InputError as e:
            ap.error(str(e))


def spreads(each: list[dict]) -> dict:
    """{key: {"median", "min", "max"}} over the reps' dicts ``each`` (one flat dict of numbers a rep)."""
    return {
        key: {
            "median": statistics.median(e[key] for e in each),
            "min": min(e[key] for e in each),
            "max": max(e[key] for e in each),
        }
        for key in each[0]
    }


def cell(stat: dict, digits: int) -> str:
    """A table cell of one :func:`spreads` entry: median (range)."""
    return f"{stat['median']:.{digits}f} ({stat['min']:.{digits}f} to {stat['max']:.{digits}f})"


def measured_on(args: argparse.Namespace, blocks: tuple) -> dict:
    """The CPU, Python, torch and litgpt a result was measured with, and its settings."""
    from importlib.metadata import version

    return {
        "cpu": platform.processor() or platform.machine(),
        "python": platform.python_version(),
        "torch": version("torch"),
        "litgpt": version("litgpt"),
        "settings": {"reps": args.reps, "iters": args.iters, "warmup": args.warmup, "blocks": blocks},
    }


def write(args: argparse.Namespace, result: dict, markdown) -> None:
    """``result`` into --json-out and its table (``markdown(result)``) beside it as .md, each atomically (what was
    written before stays whole if the run is cut); nothing without --json-out."""
    from tunelab.files import write_json_atomic, write_text_atomic

    if args.json_out:
        write_json_atomic(args.json_out, result)
        write_text_atomic(args.json_out.with_suffix(".md"), markdown(result))


def run_reps(args: argparse.Namespace, result: dict, one_rep, summarise, key: str, progress, markdown) -> int:
    """--reps reps of ``one_rep(iters, warmup)`` into ``result["reps"]``; after each, ``result[key]`` is
    ``summarise(reps)``, a progress line (``progress(result[key])``) goes to standard error and the files are
    written again (a run cut short keeps its finished reps); then :func:`finish`."""
    import sys

    for i in range(args.reps):
        print(f"[{i + 1}/{args.reps}] rep ...", file=sys.stderr, flush=True)
        result["reps"].append(one_rep(args.iters, args.warmup))
        result[key] = summarise(result["reps"])
        print(progress(result[key]), file=sys.stderr, flush=True)
        write(args, result, markdown)
    return finish(args, result)


def finish(args: argparse.Namespace, result: dict) -> int:
    """The end of a bench's main: ``result`` on standard output where no --json-out took it; exit status 0."""
    import json

    if not args.json_out:
        print(json.dumps(result, indent=1))
    return 0


def cpu_model(case, seq_len: int):
    """litgpt's model of the planned ``case`` on this CPU: random weights (normal, std 0.02), ``seq_len`` positions,
    and its RoPE cache computed (``to_empty`` leaves it unset, and a model would compute on garbage)."""
    import torch

    from tunelab.plan.trace.simulate import case_model

    with torch.device("meta"):
        model = case_model(case)
    model = model.to_empty(device="cpu")
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.02)
    model.max_seq_length = seq_len
    model.reset_parameters()
    return model
