"""The ``tunelab`` command: one entry point, one subcommand per job.

Each subcommand's arguments are checked before any model is built; a bad input is one line on stderr and exit
code 2. litgpt-style overrides (``--train.micro_batch_size 8``) pass through to litgpt's own parser.
"""

from __future__ import annotations

import argparse
import errno
import json
import signal
import sys
from pathlib import Path

EPILOG = """examples:
  tunelab ls                                     # the recipes, from the files
  tunelab show open-llama-7b/lora                # one recipe, with its download and launch commands
  tunelab validate recipes/*/*.yaml --gpu A100-80GB
  tunelab validate tiny-llama-1.1b/full --train.micro_batch_size 8   # with litgpt-style overrides
  tunelab run tiny-llama-1.1b/lora --train.max_steps 4   # one run -> record.json (tiny model on CPU)
  tunelab sweep configs/sweeps/lab-part1.yaml    # the lab's Part 1, resumable, report at the end
  tunelab report runs/lab-part1                  # report again from the records
  tunelab plan open-llama-7b/full --gpu A100-80GB          # will it fit, how long will it take
  tunelab plan open-llama-13b/full --gpu A100-80GB --devices 4 --strategy fsdp-offload --json
  tunelab tune-batch tiny-llama-1.1b/full --gpu H100-SXM   # largest and fastest micro batch, real probes
  tunelab tune-study lab-part3 --only cpu-example          # the FSDP tuning tables (CPU example), then its report
  tunelab build-model tiny                       # the embedded tiny checkpoint (offline, seconds)
  tunelab build-model open_llama_7b --device cuda   # a real architecture with random weights (GPU benchmarks)
"""


def _table(rows: list[dict], columns: list[str]) -> str:
    widths = {c: max(len(c), *(len(str(r.get(c, ""))) for r in rows)) for c in columns}
    lines = ["  ".join(c.ljust(widths[c]) for c in columns), "  ".join("-" * widths[c] for c in columns)]
    lines += ["  ".join(str(r.get(c, "")).ljust(widths[c]) for c in columns) for r in rows]
    return "\n".join(lines)


def fail(message: str) -> int:
    print(f"tunelab: error: {message}", file=sys.stderr)
    return 2


def parser_ls(sub) -> None:
    s = sub.add_parser("ls", help="list the recipes (model, method, precision, batch, devices) from the files")
    s.add_argument("--json", action="store_true", help="print the rows as JSON")
    s.set_defaults(func=cmd_ls)


def cmd_ls(args, extra) -> int:
    from tunelab.recipes import discover

    rows = [r.summary() for r in discover()]
    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        print(_table(rows, ["recipe", "model", "method", "precision", "quantize", "micro", "global", "accum",
                            "devices", "nodes"]))
    return 0


def parser_show(sub) -> None:
    s = sub.add_parser("show", help="print one recipe with its download and launch commands")
    s.add_argument("recipe", help="a key such as open-llama-7b/lora, or a YAML path")
    s.set_defaults(func=cmd_show)


def cmd_show(args, extra) -> int:
    from tunelab.recipes import RecipeError, resolve

    try:
        recipe = resolve(args.recipe)
    except RecipeError as e:
        return fail(str(e))
    print(recipe.path.read_text(encoding="utf-8").rstrip())
    print()
    ckpt = recipe.get("checkpoint_dir")
    present = ckpt and (Path(ckpt) / "lit_model.pth").is_file()
    print(f"# download: {recipe.download_command()}" + ("" if present else "   (not downloaded here yet)"))
    print(f"# launch:   {recipe.launch_command()}")
    print(f"# on the tiny model (CPU): {recipe.tiny_command()}")
    return 0


def parser_validate(sub) -> None:
    s = sub.add_parser(
        "validate", formatter_class=argparse.RawDescriptionHelpFormatter,
        help="check recipes with litgpt's own parser plus the rules litgpt leaves unchecked",
        description="Check each recipe against the argument parser of the pinned litgpt command that runs it, then "
                    "against rules litgpt leaves unchecked or checks late (batch divisibility, warm-up, QLoRA on one "
                    "device with a -true precision, quantize only for LoRA, a known model, max_seq_length within the "
                    "block size, bf16 on the named GPU, CPU precision limits, LoRA eval hang on several devices, ...)."
                    " One line per problem: file: key: what; fix: how. Exit 1 if any recipe fails.",
        epilog="Any other --dotted.key VALUE is a litgpt-style override applied to every recipe checked.")
    s.add_argument("recipes", nargs="*", help="recipe keys or YAML paths (default: every recipe)")
    s.add_argument("--gpu", help="a row of configs/hardware/gpus.yaml (e.g. V100-32GB) to check hardware rules")
    s.add_argument("--device", choices=["cpu", "cuda"], help="the target device kind, for the CPU-only rules")
    s.set_defaults(func=cmd_validate, passthrough=True)


def cmd_validate(args, extra) -> int:
    from tunelab.recipes import RecipeError, discover, resolve
    from tunelab.validate import check

    refs = args.recipes or [str(r.path) for r in discover()]
    failed = 0
    for ref in refs:
        try:
            recipe = resolve(ref)
        except RecipeError as e:  # the message names the file already, or says there is none
            print(f"error: {e}")
            failed += 1
            continue
        result = check(recipe, extra, gpu=args.gpu, device=args.device)
        for p in result.problems:
            print(p)
        if result.ok:
            print(f"ok  {recipe.key}  ({recipe.command})")
        else:
            failed += 1
    if len(refs) > 1:
        print(f"{len(refs) - failed} of {len(refs)} recipes valid")
    return 1 if failed else 0


def _model_choice(args) -> str:
    if args.weights == "random":
        if args.model not in ("auto", "random"):
            raise ValueError("--weights random and --model tiny/checkpoint contradict each other")
        return "random"
    return args.model


def _number(kind, low=None, high=None, low_open=False, what="a number"):
    """An argparse type: ``kind`` (int or float) within [low, high] (low excluded when ``low_open``), checked where
    it is parsed, so that 0, negative or NaN values never reach a run."""
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {what}") from None
        if value != value or (low is not None and (value <= low if low_open else value < low)) \
                or (high is not None and value > high):
            bound = (f"> {low}" if low_open else f">= {low}") if high is None else \
                f"between {low} and {high}"
            raise argparse.ArgumentTypeError(f"{text!r}: give {what} {bound}")
        return value
    return parse


_positive_seconds = _number(float, 0, low_open=True, what="a number of seconds")
_positive_gb = _number(float, 0, low_open=True, what="a size in GB")
_count = _number(int, 1, what="an integer")


def _unwritable(path: Path) -> str | None:
    """Why a file cannot be written at ``path`` (its directory is created if missing), or None; leaves nothing."""
    import tempfile

    path = Path(path)
    if path.is_dir():
        return "is a directory"
    blocker = next((q for q in path.parents if q.exists()), None)
    if blocker is not None and not blocker.is_dir():
        return f"{blocker} is a file, not a folder"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path.parent, prefix=f".{path.name}.probe."):
            pass
    except OSError as e:
        return f"cannot be written ({e.strerror or e})"
    return None


def _memory_limit(args) -> int | None:
    return int(args.memory_limit_gb * 1e9) if args.memory_limit_gb else None


def _run_options(s):
    s.add_argument("--model", choices=["auto", "checkpoint", "tiny", "random"], default="auto",
                   help="auto (default): the recipe's checkpoint if downloaded, else the tiny model when no GPU "
                        "is present; tiny: the embedded tiny model; random: the recipe's real architecture with "
                        "random weights; checkpoint: the recipe's checkpoint or fail")
    s.add_argument("--weights", choices=["random"], help="same as --model random: a benchmark without downloads (the real architecture with "
                        "random weights, built in a child process; the benchmark tokenizer and dataset with the "
                        "lab's token counts; litgpt's final save and LoRA merge skipped)")
    s.add_argument("--timeout", type=_positive_seconds, metavar="S",
                   help="kill a run after S seconds (status killed)")
    s.add_argument("--memory-limit-gb", type=_positive_gb, metavar="GB",
                   help="address-space limit for each run (RLIMIT_AS, GB = 1e9 B): a CPU stand-in for GPU memory")


def _strategy_options(s):
    s.add_argument("--strategy", help="a configs/strategies file or name (ddp, fsdp, fsdp-shard-grad-op, fsdp2, "
                                      "deepspeed-zero3-offload, ...): run under torchrun with tunelab's "
                                      "multi-device loop instead of litgpt's built-in strategy; --devices N sets "
                                      "processes per node")
    s.add_argument("--nnodes", type=_count, default=1, help="nodes (with --strategy); run the same command on each")
    s.add_argument("--node-rank", type=_number(int, 0, what="an integer"), default=0, help="this node's rank (0 writes the record)")
    s.add_argument("--master-addr", default="127.0.0.1", help="address of node 0 (torchrun rendezvous)")
    s.add_argument("--master-port", type=_number(int, 1, 65535, what="a port"), help="port on node 0 (default: a free one; give one for >1 node)")


def parser_run(sub) -> None:
    s = sub.add_parser(
        "run", formatter_class=argparse.RawDescriptionHelpFormatter,
        help="run one recipe through litgpt as a child process and write its run record",
        description="Validate, then run `litgpt finetune_*` for RECIPE in a child process (litgpt's own CLI behind "
                    "tunelab.entry, which records each rank's allocator peaks at exit), collect memory, speed, FLOPs, "
                    "MFU, GPU power and loss into record.json under --out.",
        epilog="Any other --dotted.key VALUE is a litgpt-style override, e.g. --train.max_steps 10.")
    s.add_argument("recipe", help="a key such as tiny-llama-1.1b/lora, or a YAML path")
    s.add_argument("--out", type=Path, help="run directory (default: runs/single/<recipe>-<time>)")
    s.add_argument("--id", default="run", help="row id stored in the record")
    _run_options(s)
    _strategy_options(s)
    s.set_defaults(func=cmd_run, passthrough=True)


def cmd_run(args, extra) -> int:
    from tunelab.recipes import RecipeError, resolve
    from tunelab.runner import RunError, run
    from tunelab.progress import ProgressLine

    if args.node_rank >= args.nnodes:
        return fail(f"--node-rank {args.node_rank}: must be below --nnodes {args.nnodes} (ranks count from 0)")
    if args.nnodes > 1 and not args.strategy:
        return fail("--nnodes > 1 needs --strategy (litgpt's own command runs on one node here)")
    try:
        recipe = resolve(args.recipe)
        model = _model_choice(args)
    except (RecipeError, ValueError) as e:
        return fail(str(e))
    progress = ProgressLine(1)
    progress.started(0, f"{args.id} {recipe.key}", show=False)
    if args.out is None:
        from datetime import datetime

        from tunelab.paths import output_root

        args.out = output_root() / "runs" / "single" / f"{recipe.slug()}-{datetime.now():%Y%m%d-%H%M%S}"
    try:
        rec = run(recipe, extra, args.out, row_id=args.id, model=model, timeout_s=args.timeout,
                  memory_limit_bytes=_memory_limit(args), on_progress=progress.show, strategy=args.strategy,
                  nnodes=args.nnodes, node_rank=args.node_rank, master_addr=args.master_addr,
                  master_port=args.master_port)
    except RunError as e:
        return fail(str(e))
    if args.node_rank:
        print(f"node {args.node_rank} done (exit code {rec.exit_code}); node 0 writes the record")
        return 0 if rec.exit_code == 0 else 1
    progress.finished(rec)
    print(json.dumps({k: getattr(rec, k) for k in ("status", "error", "peak_allocated_bytes", "peak_rss_bytes",
                                                   "step_time_s", "tok_s_padded", "tok_s_real", "mfu",
                                                   "val_loss_final")}, indent=2))
    print(f"record: {Path(args.out) / 'record.json'}")
    return 0 if rec.status == "ok" else 1


def parser_sweep(sub) -> None:
    s = sub.add_parser(
        "sweep", formatter_class=argparse.RawDescriptionHelpFormatter,
        help="run every row of a sweep YAML (resumable), then write the report",
        description="Run each row of SWEEP (configs/sweeps/*.yaml) as its own child process, one record per row "
                    "(OOM, crashed, killed and timed-out runs included), with a progress line. Rows already "
                    "recorded in the sweep directory are skipped (resume) unless --rerun. Writes "
                    "reports/<date>-<sweep>[-<device>]/ at the end.")
    s.add_argument("sweep", help="a sweep YAML path, or a name under configs/sweeps/ (lab-part1)")
    s.add_argument("--out", type=Path, help="sweep directory for the records (default: runs/<sweep name>)")
    s.add_argument("--rerun", action="store_true", help="run rows again even if they have a record")
    s.add_argument("--only", help="comma-separated row ids to run (others untouched)")
    s.add_argument("--no-report", action="store_true", help="do not write the report at the end")
    s.add_argument("--report-dir", type=Path, help="report directory (default: reports/<date>-<sweep>[-<device>])")
    s.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="a litgpt override for every row (dotted key, YAML value), e.g. --set train.max_steps=5; "
                        "repeatable; recorded in each row's overrides")
    s.add_argument("--deadline", type=_positive_seconds, metavar="S",
                   help="start no row after S seconds, and kill a row still running then (it runs again on resume): "
                        "for machines that give a command a fixed time")
    s.add_argument("--report-each-row", action="store_true",
                   help="rewrite the report after every row, not only at the end")
    s.add_argument("--archive", type=Path, metavar="FILE.tgz",
                   help="after every row, write the records and logs (no weights) to this .tar.gz")
    s.add_argument("--prune-checkpoints", action="store_true",
                   help="with --weights random: delete a random-weight checkpoint once no later row needs it (disk)")
    _run_options(s)
    s.set_defaults(func=cmd_sweep)


def cmd_sweep(args, extra) -> int:
    from tunelab.report import write_report
    from tunelab.sweep import SweepError, load, run_sweep

    from tunelab.sweep import archive, with_settings

    def after_row(sweep_dir: Path) -> None:  # what a command killed later must still leave behind
        if args.report_each_row and not args.no_report:
            write_report(sweep_dir, args.report_dir)
        if args.archive:
            archive(sweep_dir, args.archive)

    if args.out is not None and args.out.exists() and not args.out.is_dir():
        return fail(f"--out {args.out}: is a file; fix: give a directory for the sweep's records")
    if args.archive is not None:  # found now, not after the first row has run
        why = _unwritable(args.archive)
        if why:
            return fail(f"--archive {args.archive}: {why}; fix: give a .tgz path in a writable directory")
    try:
        model = _model_choice(args)
        sweep = load(args.sweep)
        if args.set:
            sweep = with_settings(sweep, args.set)
        sweep_dir = run_sweep(sweep, args.out, rerun=args.rerun, model=model,
                              only=args.only.split(",") if args.only else None, timeout_s=args.timeout,
                              memory_limit_bytes=_memory_limit(args), deadline_s=args.deadline,
                              after_row=after_row, prune_checkpoints=args.prune_checkpoints)
    except (SweepError, ValueError, OSError) as e:
        return fail(str(e).replace("\n", "\n  "))
    print(f"records: {sweep_dir}")
    if not args.no_report:
        out = write_report(sweep_dir, args.report_dir)
        print(f"report:  {out}/results.md")
    if args.archive:
        print(f"archive: {archive(sweep_dir, args.archive)}")
    return 0


def parser_report(sub) -> None:
    s = sub.add_parser("report", help="write results.csv, results.md and plots from a sweep's or tuning study's records")
    s.add_argument("sweep_dir", help="the directory a sweep or tune-study wrote (runs/<name>)")
    s.add_argument("--out", type=Path, help="report directory (default: reports/<date>-<sweep>[-<device>])")
    s.add_argument("--not-run-reason", help="why the rows without a record were not run (shown in the report)")
    s.add_argument("--study", help="the tuning-study file the directory's probes came from (tune-study writes it "
                                   "into tune-study.json; give it for a directory without one)")
    s.set_defaults(func=cmd_report)


def cmd_report(args, extra) -> int:
    from tunelab import tune_report, tune_study
    from tunelab.report import write_report

    base = Path(args.sweep_dir)
    try:
        index = tune_study.read_index(base)
        if args.study or index:  # a tuning study's directory (tunelab tune-study): its own report
            sf = tune_study.load(args.study or tune_study.resolve_index_path(index))
            out = tune_report.write_report(base, sf, args.out)
        else:
            out = write_report(base, args.out, not_run_reason=args.not_run_reason)
    except FileNotFoundError as e:
        return fail(str(e))
    print(f"{out}/results.md")
    return 0


def parser_tune_study(sub) -> None:
    s = sub.add_parser(
        "tune-study", formatter_class=argparse.RawDescriptionHelpFormatter,
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
               "3 GB cap each\n  tunelab tune-study lab-part3 --only tiny-llama-1.1b-full --weights random   # one GPU")
    s.add_argument("study_file", help="a study YAML, or a name under configs/sweeps/ (lab-part3)")
    s.add_argument("--only", help="comma-separated study ids (default: every study in the file)")
    s.add_argument("--out", type=Path, help="probe directory (default: runs/<name>)")
    s.add_argument("--report-dir", type=Path, help="report directory (default: reports/<date>-<name>-<device>)")
    s.add_argument("--no-report", action="store_true", help="only probe; write no report")
    s.add_argument("--max-micro", type=_count, help="cap every setting's micro batch (a quick rehearsal)")
    s.add_argument("--deadline", type=_positive_seconds, metavar="S",
                   help="start no setting after S seconds (a running probe finishes or hits --timeout)")
    _run_options(s)
    s.set_defaults(func=cmd_tune_study)


def cmd_tune_study(args, extra) -> int:
    import time

    from tunelab import tune_report, tune_study
    from tunelab.paths import output_root

    try:
        sf = tune_study.load(args.study_file)
        chosen = tune_study.check(sf, [x for x in (args.only or "").split(",") if x] or None)
        model = _model_choice(args)
    except (tune_study.StudyError, ValueError) as e:
        return fail(str(e))
    out = args.out or (output_root() / "runs" / sf.name)
    out.mkdir(parents=True, exist_ok=True)
    tune_study.write_index(sf, out)
    deadline = None if args.deadline is None else time.monotonic() + args.deadline
    from tunelab.tune_batch import render

    for study in chosen:
        try:
            results = tune_study.run_study(sf, study, out, model=model, max_micro=args.max_micro,
                                           deadline=deadline, timeout_s=args.timeout)
        except RuntimeError as e:
            return fail(str(e))
        print("\n\n".join(render(r) for r in results))
    print(f"probe records: {out}/")
    if not args.no_report:
        report = tune_report.write_report(out, sf, args.report_dir)
        print(f"{report}/results.md")
    return 0


def parser_plan(sub) -> None:
    from tunelab.planner import DEFAULT_MFU_RANGE

    s = sub.add_parser(
        "plan", formatter_class=argparse.RawDescriptionHelpFormatter,
        help="predict peak memory, fit, largest micro batch, runtime and energy before launch",
        description="Predict the peak GPU memory of RECIPE (with litgpt-style overrides) per device, broken down "
                    "into weights, gradients, optimizer states, activations, logits, strategy buffers; the verdict "
                    "for --gpu with its margin and the largest micro batch that fits; FLOPs per token and a runtime "
                    "and energy range for the recipe's training run. The model comes from the recipe's "
                    "checkpoint_dir (its model_config.yaml, else litgpt's config of the directory name), so any "
                    "model litgpt knows can be planned: --checkpoint_dir checkpoints/meta-llama/Llama-2-7b-hf.",
        epilog="--json prints the same as one object: peak_memory_gb (predicted peak allocated per device, GB = "
               "1e9 bytes, as litgpt prints 'Memory Used'), fits, margin_gb, max_micro_batch_size, breakdown_gb "
               "(sums to peak_memory_gb), predicted_reserved_bytes, cuda_context_bytes, host_ram_gb, seq_len, "
               "seq_len_source, notes, and projection {flops_per_token, flops_formula, tokens, seconds_low/high, "
               "mfu_low/high, mfu_source, power_w, power_source, energy_j_low/high, "
               "energy_j_per_million_tokens_low/high}.")
    s.add_argument("recipe", help="a key such as open-llama-7b/lora, or a YAML path")
    s.add_argument("--gpu", help="a row of configs/hardware/gpus.yaml: A100-80GB, H100-SXM, V100-32GB, L4, ...")
    s.add_argument("--devices", type=_count, help="GPUs per node (default: the recipe's devices)")
    s.add_argument("--strategy", default="litgpt", metavar="NAME",
                   help="how model states are divided across devices: a configs/strategies file or name (ddp, fsdp, "
                        "fsdp-no-wrap, fsdp-shard-grad-op, fsdp-offload, fsdp2, deepspeed-zero2, deepspeed-zero3, "
                        "deepspeed-zero3-offload, ...), the same files `run --strategy` runs; default litgpt: the "
                        "recipe's own choice (one device; FSDP per block on several)")
    s.add_argument("--activation-checkpointing", action="store_true", help="keep only block inputs, recompute")
    s.add_argument("--dataset", type=Path, help="an Alpaca JSON: use its longest sample as the sequence length "
                                                "(needs the checkpoint's tokenizer)")
    s.add_argument("--tokens", type=_number(float, 0, low_open=True, what="a token count"), help="token budget to project (default: the recipe's training run)")
    s.add_argument("--tokens-per-sample", type=_number(float, 0, low_open=True, what="a token count"),
                   help="padded tokens per sample (default: from the data and tokenizer when both are here, else "
                        "the lab's 437)")
    s.add_argument("--mfu-range", type=_number(float, 0, 1, low_open=True, what="an MFU fraction"), nargs=2, default=list(DEFAULT_MFU_RANGE), metavar=("LOW", "HIGH"),
                   help="MFU range for the runtime projection when not calibrated (default 0.25 0.55)")
    s.add_argument("--calibrate", type=Path, help="a directory of run records: use the measured MFU (and power) of "
                                                  "the nearest measured configuration")
    s.add_argument("--measure", action="store_true",
                   help="also count what autograd keeps in one real forward of litgpt's model for this case (full "
                        "width, 2 blocks, one sequence of the planned length, on this CPU; seconds to a minute) and "
                        "print it beside the planner's activation term")
    s.add_argument("--json", action="store_true", help="print one JSON object (fields listed below)")
    s.set_defaults(func=cmd_plan, passthrough=True)


def cmd_plan(args, extra) -> int:
    from tunelab import hardware, planner
    from tunelab.plan_cli import epoch_tokens, plan_recipe, render, runtime_terms, tokens_per_sample_from_data
    from tunelab.recipes import RecipeError, resolve

    lo, hi = args.mfu_range
    if lo > hi:
        return fail(f"--mfu-range {lo} {hi}: LOW must not exceed HIGH")
    if args.calibrate and not any(Path(args.calibrate).glob("**/record.json")):
        return fail(f"--calibrate {args.calibrate}: no run records (record.json) under it; fix: give a sweep "
                    "directory such as runs/lab-part1")
    try:
        recipe = resolve(args.recipe)
        if args.gpu:
            hardware.lookup(args.gpu)
        x, plan, seq_source, resolved = plan_recipe(
            recipe, extra, gpu=args.gpu, devices=args.devices, strategy=args.strategy,
            activation_checkpointing=args.activation_checkpointing, dataset=args.dataset)
    except (RecipeError, ValueError, KeyError) as e:
        return fail(str(e.args[0]) if isinstance(e, KeyError) and e.args else str(e))
    projection, tokens_note = None, ""
    if args.gpu:
        per_sample = args.tokens_per_sample or tokens_per_sample_from_data(resolved, x)
        tokens, tokens_note = (args.tokens, f"--tokens {args.tokens:,.0f}") if args.tokens else \
            epoch_tokens(resolved, x, per_sample)
        lo, hi = args.mfu_range
        projection = planner.project(x, hardware.lookup(args.gpu), tokens, args.calibrate, (lo, hi),
                                     work=runtime_terms(resolved, x, per_sample))
    measured = None
    if args.measure:
        if str(x.precision) not in ("bf16-true", "16-true", "32-true"):
            return fail(f"--measure: precision {x.precision} is not measured (CPU autocast keeps other ops in fp32 "
                        "than CUDA's); fix: measure with --precision bf16-true or 32-true")
        from tunelab.measure_activations import compare

        print(f"measuring {x.config.name} ({x.method}, {x.precision}, one sequence of {x.seq_len} tokens, 2 blocks "
              "at full width) on this CPU ...", file=sys.stderr, flush=True)
        measured = compare(x.config, x.method, str(x.precision), 1, x.seq_len, x.lora_r or 8,
                           x.lora_targets or None)
    if args.json:
        out = plan.to_json()
        out["seq_len_source"] = seq_source
        if projection:
            out["projection"] = {**projection.__dict__, "tokens_source": tokens_note}
        if measured:
            out["measured_activations"] = measured
        print(json.dumps(out, indent=2))
    else:
        print(render(x, plan, seq_source, projection, tokens_note))
        if measured:
            m, micro = measured, x.micro_batch_size
            print(f"\nactivations, measured (autograd's saved tensors, one real forward on this CPU) vs planned, "
                  f"for micro batch {micro} (the measurement x {micro}; GB = 1e9 bytes):")
            for what, key in (("a block", "block"), ("the first block", "first_block"), ("head and loss", "head"),
                              (f"all {m['n_layer']} blocks + head", "total")):
                mb, pb = m[f"measured_{key}"] * micro, m[f"planned_{key}"] * micro
                print(f"  {what:<22} measured {mb / 1e9:8.3f}  planned {pb / 1e9:8.3f}  "
                      f"({(pb - mb) / mb:+.1%})" if mb else f"  {what}: nothing measured")
            print("  (planned as counted on CPU: dropout masks in the activation dtype; on CUDA they are 1 byte)")
    return 0


def parser_plan_families(sub) -> None:
    s = sub.add_parser("plan-families",
                       help="the planner's activation term against autograd's saved tensors, per model family -> "
                            "reports/planner-families/",
                       description="For each model family (TinyLlama, OpenLLaMA, Llama 2, 3, 3.2, Mistral, Gemma 1 "
                                   "and 2, Phi-2, Phi-3, Falcon, StableLM), full and LoRA: one real forward of "
                                   "litgpt's model (full width, 2 blocks) on this CPU, the bytes autograd keeps per "
                                   "block and for the head and loss, beside tunelab's derivation from the Config.")
    s.add_argument("--families", help="comma-separated litgpt config names (default: the 13 families)")
    s.add_argument("--seq-len", type=_count, default=128, help="tokens per sequence (default 128)")
    s.add_argument("--out", type=Path, help="output directory (default: reports/planner-families)")
    s.set_defaults(func=cmd_plan_families)


def cmd_plan_families(args, extra) -> int:
    from tunelab.plan_cli import write_families

    names = [x for x in (args.families or "").split(",") if x] or None
    try:
        out = write_families(args.out, names, args.seq_len)
    except (ValueError, RuntimeError) as e:
        return fail(str(e))
    print((out / "families.md").read_text())
    print(f"written: {out}/families.md, {out}/families.csv")
    return 0


def parser_plan_accuracy(sub) -> None:
    s = sub.add_parser("plan-accuracy", help="the planner against every lab measurement -> reports/planner-accuracy/")
    s.add_argument("--out", type=Path, help="output directory (default: reports/planner-accuracy)")
    s.set_defaults(func=cmd_plan_accuracy)


def cmd_plan_accuracy(args, extra) -> int:
    from tunelab.plan_cli import write_accuracy

    out = write_accuracy(args.out)
    print((out / "accuracy.md").read_text())
    print(f"written: {out}/accuracy.md, {out}/accuracy.csv")
    return 0


def parser_tune_batch(sub) -> None:
    s = sub.add_parser(
        "tune-batch", formatter_class=argparse.RawDescriptionHelpFormatter,
        help="find the largest and the fastest micro batch with short real probes",
        description="Start from the planner's guess, run short real probes (a few steps each), doubling then "
                    "bisecting the micro batch; report the largest that fits and the best (highest tok/s among "
                    "probes with no allocator retries). Each probe is a run record under --out. On CPU, give "
                    "--memory-limit-gb so that 'fits' means something.",
        epilog="Any other --dotted.key VALUE is a litgpt-style override.")
    s.add_argument("recipe", help="a key such as tiny-llama-1.1b/full, or a YAML path")
    s.add_argument("--gpu", help="GPU table row for the planner's starting guess")
    s.add_argument("--start", type=_count, help="starting micro batch (default: the planner's guess, or 1)")
    s.add_argument("--max-micro", type=_count, default=1024, help="never probe above this micro batch")
    s.add_argument("--steps", type=_number(int, 2, what="a number of optimizer steps"), default=3,
                   help="optimizer steps per probe, 2 or more (default 3; the first is warm-up)")
    s.add_argument("--strategy", metavar="NAME", help="probe under a configs/strategies file (ddp, fsdp, fsdp2, "
                                                       "deepspeed-zero3, ...) with tunelab's multi-device loop")
    s.add_argument("--devices", type=_count, help="devices per node for the probes (default: the recipe's)")
    s.add_argument("--activation-checkpointing", choices=["on", "off", "both"],
                   help="with --strategy: search with activation checkpointing on, off, or each (two tables)")
    s.add_argument("--backward-prefetch", choices=["none", "pre", "post"],
                   help="with an FSDP --strategy: prefetch the next unit's parameters during backward before (pre) "
                        "or after (post) the current unit's gradients, or not at all (none); default: the file's")
    s.add_argument("--also", type=_micro_list, default=[], metavar="N,N,...",
                   help="also probe these micro batches (rows for the table: how tok/s grows with the batch)")
    s.add_argument("--out", type=Path, help="probe directory (default: runs/tune-batch/<recipe>)")
    s.add_argument("--json", action="store_true", help="print the summary as JSON")
    _run_options(s)
    s.set_defaults(func=cmd_tune_batch, passthrough=True)


def _micro_list(text: str) -> list[int]:
    return [_count(x) for x in text.split(",") if x.strip()]


def cmd_tune_batch(args, extra) -> int:
    from tunelab import hardware, settings
    from tunelab.paths import output_root
    from tunelab.recipes import RecipeError, resolve
    from tunelab.tune_batch import (planned_start, probe_problems, render, strategy_variant, summary_json, tune,
                                    variant_name)

    if args.activation_checkpointing and not args.strategy:
        return fail("--activation-checkpointing needs --strategy (litgpt's own command decides it for itself: on "
                    "for LoRA on several devices)")
    if args.backward_prefetch and not args.strategy:
        return fail("--backward-prefetch needs an FSDP --strategy (fsdp, fsdp-no-wrap, ...)")
    if args.devices:
        extra = [*extra, "--devices", str(args.devices)]
    try:
        recipe = resolve(args.recipe)
        model = _model_choice(args)
        if args.gpu:
            hardware.lookup(args.gpu)
        if args.strategy:
            from tunelab.distributed.strategy import load_strategy

            strat = load_strategy(args.strategy)
            if args.backward_prefetch and strat.name != "fsdp":
                raise ValueError(f"--backward-prefetch: strategy {args.strategy} is {strat.name}, not FSDP; "
                                 "fix: give an FSDP strategy or leave the option out")
    except (RecipeError, ValueError) as e:
        return fail(str(e))
    world = settings.resolve(recipe, extra).world_size
    problems = probe_problems(recipe, extra, world, args.steps, bool(args.strategy))
    if problems:
        return fail("; ".join(problems))
    out = args.out or (output_root() / "runs" / "tune-batch" / recipe.slug())
    ac = {"on": [True], "off": [False], "both": [False, True], None: [None]}[args.activation_checkpointing]
    results = []
    for setting in ac:
        strategy, sub_out, label = args.strategy, out, args.strategy or ""
        if setting is not None or args.backward_prefetch:
            sub_out = out / variant_name(setting, args.backward_prefetch)
            strategy = str(strategy_variant(args.strategy, setting, sub_out, args.backward_prefetch))
            label = ", ".join([args.strategy] + ([] if setting is None else [
                f"activation checkpointing {'on' if setting else 'off'}"]) + ([] if not args.backward_prefetch else [
                    f"backward prefetch {args.backward_prefetch}"]))
        predicted, start, why = planned_start(recipe, extra, args.gpu, strategy, bool(setting), model)
        if args.start:
            start, why = args.start, "--start"
        try:
            res = tune(recipe, extra, sub_out, start=start, start_reason=why, max_micro=args.max_micro,
                       steps=args.steps, model=model, memory_limit_bytes=_memory_limit(args), timeout_s=args.timeout,
                       world=world, strategy=strategy, setting=label, also=args.also, predicted_largest=predicted)
        except RuntimeError as e:
            return fail(str(e))
        results.append(res)
    if args.json:
        print("[" + ",\n".join(summary_json(r) for r in results) + "]" if len(results) > 1 else summary_json(results[0]))
    else:
        print("\n\n".join(render(r) for r in results))
    print(f"probe records and summary: {out}/")
    return 0


def parser_build_model(sub) -> None:
    s = sub.add_parser(
        "build-model", help="write a litgpt checkpoint directory offline: 'tiny' or a real architecture, random weights",
        description="Build a checkpoint directory that `litgpt finetune_*` accepts as it is (lit_model.pth, "
                    "model_config.yaml, a tokenizer trained here with `tokenizers`, tokenizer_config.json, "
                    "generation_config.json). Prints its path.")
    s.add_argument("name", help="'tiny' (2-layer TinyLlama layout, ~0.1M parameters), 'tiny-deep' (24 narrow blocks, "
                                "4.5M parameters: activations dominate, for activation-checkpointing demonstrations) "
                                "or a litgpt config name such as "
                                "open_llama_7b or tiny-llama-1.1b (random weights)")
    s.add_argument("--out", type=Path, help="directory to write (default: .tunelab/checkpoints/<name>)")
    s.add_argument("--dtype", choices=["float32", "bfloat16", "float16"],
                   help="weight dtype (default: float32 for tiny, bfloat16 for real architectures)")
    s.add_argument("--device", default="cpu", help="where to initialise the weights (cuda is much faster for 7B+)")
    s.add_argument("--force", action="store_true", help="rebuild even if the directory is complete")
    s.set_defaults(func=cmd_build_model)


def cmd_build_model(args, extra) -> int:
    import torch

    from tunelab import checkpoints

    try:
        checkpoints.model_config(args.name)
    except ValueError as e:
        return fail(str(e))
    try:
        device = torch.device(args.device)
    except RuntimeError:
        return fail(f"--device {args.device!r} is not a torch device; fix: cpu, cuda or cuda:N")
    if device.type not in ("cpu", "cuda"):
        return fail(f"--device {args.device}: build on cpu or cuda")
    if device.type == "cuda" and not torch.cuda.is_available():
        return fail(f"--device {args.device}: this machine has no CUDA device; fix: --device cpu")
    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16, None: None}[args.dtype]
    out = checkpoints.build(args.name, args.out, dtype=dtype, device=args.device, force=args.force)
    print(out)
    return 0


def parser_data(sub) -> None:
    s = sub.add_parser("data", help="regenerate the project's Alpaca-format dataset (data/alpaca_tunelab.json)")
    s.add_argument("action", choices=["generate"])
    s.add_argument("--n", type=_count, default=400, help="number of records (default 400, the shipped file)")
    s.add_argument("--seed", type=int, default=42)
    s.add_argument("--out", help="output path (default: data/alpaca_tunelab.json)")
    s.add_argument("--benchmark", action="store_true",
                   help="instead: the 2,000-record benchmark set that random-weight runs read (the lab's ~437 padded "
                        "tokens per sample at micro 8 under the benchmark tokenizer; default .tunelab/data/)")
    s.set_defaults(func=cmd_data)


def cmd_data(args, extra) -> int:
    from tunelab import data
    from tunelab.paths import DATASET

    try:
        if args.benchmark:  # the random-weight benchmark workload (tunelab/benchmark_data.py)
            from tunelab import benchmark_data

            out = Path(args.out) if args.out else benchmark_data.default_path()
            data.write(out, benchmark_data.generate())
        else:
            out = Path(args.out) if args.out else DATASET
            data.write(out, data.generate(args.n, args.seed))
    except OSError as e:
        return fail(f"--out {args.out or out}: cannot write ({e.strerror or e}); fix: give a writable path")
    print(out)
    return 0


class _Parser(argparse.ArgumentParser):
    """argparse with whole option names only (``--data`` is never taken as ``--dataset``) and one-line errors."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message} (see: {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    """The whole command line: each subcommand's parser is built by parser_<command>, next to its handler."""
    p = _Parser(
        prog="tunelab", formatter_class=argparse.RawDescriptionHelpFormatter, epilog=EPILOG,
        description="LitGPT fine-tuning recipes, with the tools that plan, run, measure and report them.")
    p.add_argument("--debug", action="store_true",
                   help="show the Python traceback of an error instead of one line (accepted anywhere on the line)")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    parser_ls(sub)
    parser_show(sub)
    parser_validate(sub)
    parser_run(sub)
    parser_sweep(sub)
    parser_report(sub)
    parser_plan(sub)
    parser_plan_accuracy(sub)
    parser_plan_families(sub)
    parser_tune_batch(sub)
    parser_tune_study(sub)
    parser_build_model(sub)
    parser_data(sub)
    return p


def _raise_interrupt(signum, frame):
    raise KeyboardInterrupt


def _os_error_line(e: OSError) -> str:
    where = f"{e.filename}: " if e.filename else ""
    fix = "free space and run the same command again" if e.errno == errno.ENOSPC else \
        "check the path and its permissions"
    return f"{where}{e.strerror or e}; fix: {fix}"


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv  # anywhere on the line: show tracebacks instead of one-line errors
    argv = [a for a in argv if a != "--debug"]
    from tunelab.errors import InputError, Interrupted

    previous = signal.signal(signal.SIGTERM, _raise_interrupt)  # a killed sweep records its row, like Ctrl-C
    try:
        parser = build_parser()
        args, extra = parser.parse_known_args(argv)
        if not getattr(args, "command", None):
            parser.print_help()
            return 2
        if extra and not getattr(args, "passthrough", False):
            return fail(f"unrecognized arguments: {' '.join(extra)} (see: tunelab {args.command} --help)")
        bad = [x for x in extra if x.startswith("-") and not x.startswith("--")]
        if bad:
            return fail(f"litgpt-style overrides are --dotted.key VALUE, got {bad[0]!r}")
        return args.func(args, extra)
    except Interrupted as e:
        print(f"tunelab: interrupted: {e}", file=sys.stderr)
        return Interrupted.exit_code
    except KeyboardInterrupt:  # before any run started: nothing to record
        print("tunelab: interrupted (nothing was running yet; nothing recorded)", file=sys.stderr)
        return Interrupted.exit_code
    except InputError as e:
        return fail(str(e).replace("\n", "\n  "))
    except BrokenPipeError:  # `tunelab ls | head`
        return 0
    except OSError as e:
        if debug:
            raise
        return fail(_os_error_line(e))
    except Exception as e:  # noqa: BLE001 - a bug or a fault of the machine: one line, the traceback on --debug
        if debug:
            raise
        return fail(f"{type(e).__name__}: {e} (unexpected; rerun with --debug for the traceback, and report it)")
    finally:
        signal.signal(signal.SIGTERM, previous)


if __name__ == "__main__":
    raise SystemExit(main())
