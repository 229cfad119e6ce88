"""The ``tunelab`` command: one entry point, one module per subcommand (its parser and a thin handler).

Each subcommand's arguments are checked before any model is built; a bad input is one line on stderr and exit
code 2. litgpt-style overrides (``--train.micro_batch_size 8``) pass through to litgpt's own parser. The registry is
:data:`COMMANDS`, in the order ``tunelab --help`` lists them; a handler imports its stage's modules when it runs, so
that ``tunelab --help`` and ``tunelab plan`` import neither torch nor litgpt's training code.
"""

from __future__ import annotations

import argparse
import errno
import logging
import signal
import sys

from tunelab import paths
from tunelab.cli import (
    advise,
    bench,
    build_model,
    data,
    ls,
    plan,
    plan_accuracy,
    plan_families,
    plan_strategies,
    report,
    run,
    show,
    sweep,
    tune_batch,
    tune_study,
    validate,
)
from tunelab.cli.common import Parser, fail
from tunelab.errors import InputError, Interrupted

COMMANDS = (
    ls,
    show,
    validate,
    run,
    sweep,
    report,
    plan,
    advise,
    plan_accuracy,
    plan_families,
    plan_strategies,
    tune_batch,
    tune_study,
    bench,
    build_model,
    data,
)
"""The subcommands, each a module with ``add_parser(sub)`` and ``handle(args, extra)``."""

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


def build_parser() -> argparse.ArgumentParser:
    """The whole command line: each subcommand's parser is built by its module's add_parser, next to its handler."""
    p = Parser(
        prog="tunelab",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=EPILOG,
        description="LitGPT fine-tuning recipes, with the tools that plan, run, measure and report them.",
    )
    p.add_argument(
        "--debug",
        action="store_true",
        help="show the Python traceback of an error instead of one line (accepted anywhere on the line)",
    )
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    for module in COMMANDS:
        module.add_parser(sub)
    return p


def _raise_interrupt(signum, frame):
    raise KeyboardInterrupt


def _os_error_line(e: OSError) -> str:
    where = f"{e.filename}: " if e.filename else ""
    fix = (
        "free space and run the same command again" if e.errno == errno.ENOSPC else "check the path and its permissions"
    )
    return f"{where}{e.strerror or e}; fix: {fix}"


def main(argv: list[str] | None = None) -> int:
    """Run ``tunelab`` with ``argv`` (default: the process's arguments); the exit code. Bad input is one line
    (exit 2), Ctrl-C or SIGTERM records what ran (exit 130), anything unexpected is one line too (``--debug``: the
    traceback)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    logging.getLogger("bitsandbytes").setLevel(logging.ERROR)  # its import warning on a CPU: noise in an answer
    paths.keep_compile_cache()
    debug = "--debug" in argv  # anywhere on the line: show tracebacks instead of one-line errors
    argv = [a for a in argv if a != "--debug"]
    previous = signal.signal(signal.SIGTERM, _raise_interrupt)  # a killed sweep records its row, like Ctrl-C
    try:
        parser = build_parser()
        args, extra = parser.parse_known_args(argv)
        if not getattr(args, "command", None):
            parser.print_help()
            return 2
        if extra and not getattr(args, "passthrough", False):
            return fail(f"unrecognized arguments: {' '.join(extra)} (see: tunelab {args.command} --help)")
        bad = [i for i, x in enumerate(extra) if x.startswith("-") and not x.startswith("--")]
        if bad:
            i = bad[0]
            key = extra[i - 1] if i and extra[i - 1].startswith("--") else None
            if key:  # a value such as -1 after its key: argparse took it for an option
                return fail(
                    f"{key} {extra[i]}: not a value {key} takes (give a positive one; see: tunelab {args.command} --help)"
                )
            return fail(f"litgpt-style overrides are --dotted.key VALUE, got {extra[i]!r}")
        return args.func(args, extra)
    except Interrupted as e:
        print(f"tunelab: interrupted: {e}", file=sys.stderr)
        return Interrupted.exit_code
    except KeyboardInterrupt:  # before any run started: nothing to record
        print("tunelab: interrupted (no run was in progress; what finished before is kept)", file=sys.stderr)
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
