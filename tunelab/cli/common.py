"""What the subcommands share: the one-line error, number types checked where they are parsed, the options of
the commands that run training, and the argparse subclass that never abbreviates an option."""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

from tunelab.errors import InputError
from tunelab.units import GB

MESSAGE_MAX = 2_000
"""Longest error message printed whole; a longer one keeps its start and its end (the fix), the middle elided."""


def fail(message: str) -> int:
    """Print ``tunelab: error: <message>`` (:data:`MESSAGE_MAX`) on stderr; the exit code of bad input (2)."""
    if len(message) > MESSAGE_MAX:
        half = MESSAGE_MAX // 2
        message = f"{message[:half]} [... {len(message) - 2 * half:,} characters ...] {message[-half:]}"
    print(f"tunelab: error: {message}", file=sys.stderr)
    return 2


def model_choice(args) -> str:
    """--model / --weights as one model source (auto, checkpoint, tiny, random); ValueError if they contradict."""
    if args.weights == "random":
        if args.model not in ("auto", "random"):
            raise ValueError("--weights random and --model tiny/checkpoint contradict each other")
        return "random"
    return args.model


def number(kind, low=None, high=None, low_open=False, what="a number"):
    """An argparse type: ``kind`` within [low, high] (low excluded if ``low_open``), so no bad value reaches a run."""

    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {what}; fix: give {what}") from None
        if (
            not math.isfinite(value)
            or (low is not None and (value <= low if low_open else value < low))
            or (high is not None and value > high)
        ):
            bound = f"above {low:g}" if low_open else f"of at least {low:g}" if high is None else f"between {low:g}"
            bound += "" if high is None else f" and at most {high:g}" if low_open else f" and {high:g}"
            raise argparse.ArgumentTypeError(f"{text!r} is out of range; fix: give {what} {bound}")
        return value

    return parse


def _path(kind: str):
    def parse(text: str):
        """An argparse type: a path, never blank (an unset shell variable would make it the current folder); a
        folder to write into is not an existing file (a device, a FIFO, a regular file) nor a link to nothing."""
        if not text.strip():
            raise argparse.ArgumentTypeError(f"an empty path (it would mean the current folder); fix: give a {kind}")
        path = Path(text)
        if kind == "folder" and (path.exists() or path.is_symlink()) and not path.is_dir():
            what = "exists and is not a folder" if path.exists() else "is a link to nothing"
            raise argparse.ArgumentTypeError(f"{text!r} {what}; fix: give a new or existing folder")
        return path

    return parse


given_path = _path("path")
"""An argparse type: a file or folder to read or write, never empty."""
folder = _path("folder")
"""An argparse type: a folder to write into, never empty."""


positive_seconds = number(float, 0, 3e7, low_open=True, what="a number of seconds")
"""Seconds: more than 0, at most 3e7 (a year: larger values overflow the timers they set)."""
positive_gb = number(float, 0.001, 1e6, what="a size in GB")
"""GB (1e9 bytes): 0.001 (1 MB: smaller rounds to nothing) to 1e6."""
count = number(int, 1, 10**9, what="an integer")
"""A count (micro batch, steps, pairs, records): 1 to 1e9."""


def host_figure(text: str):
    """An argparse type: ``--host-us-per-op``'s ``auto`` (measured here) or microseconds an op, 1 to 10,000."""
    if text == "auto":
        return text
    try:
        return number(float, 1, 10_000, what="microseconds")(text)
    except argparse.ArgumentTypeError as e:
        raise argparse.ArgumentTypeError(f"{e}, or auto (measured here)") from None


def listed(text: str | None, option: str) -> list[str] | None:
    """A comma-separated ``option`` as a list (None when not given); InputError (one line) when it is given but
    names nothing (``--gpus ''``: an unset shell variable), which no command takes as "all" or "none"."""
    if text is None:
        return None
    items = [t.strip() for t in text.split(",") if t.strip()]
    if not items:
        raise InputError(f"{option} {text!r}: names nothing (an unset shell variable?); fix: a comma-separated list")
    return items


def memory_limit(args) -> int | None:
    """--memory-limit-gb in bytes (GB = 1e9), or None."""
    return int(args.memory_limit_gb * GB) if args.memory_limit_gb else None


def run_options(parser):
    """--model, --weights, --timeout, --memory-limit-gb: the options of every command that runs training."""
    parser.add_argument(
        "--model",
        choices=["auto", "checkpoint", "tiny", "random"],
        default="auto",
        help="auto (default): the recipe's checkpoint if downloaded, else the tiny model when no GPU "
        "is present; tiny: the embedded tiny model; random: the recipe's real architecture with "
        "random weights; checkpoint: the recipe's checkpoint or fail",
    )
    what = "same as --model random: a benchmark without downloads (the real architecture with random weights, built in "
    what += "a child process; the benchmark tokenizer and dataset with the lab's token counts; litgpt's final save and "
    parser.add_argument("--weights", choices=["random"], help=what + "LoRA merge skipped)")
    what = "kill a run after S seconds (status killed)"
    parser.add_argument("--timeout", type=positive_seconds, metavar="S", help=what)
    what = "address-space limit for each run (RLIMIT_AS, GB = 1e9 B): a CPU stand-in for GPU memory"
    parser.add_argument("--memory-limit-gb", type=positive_gb, metavar="GB", help=what)


def strategy_options(parser):
    """--strategy and the multi-node rendezvous options of `run`."""
    parser.add_argument(
        "--strategy",
        help="a configs/strategies file or name (ddp, fsdp, fsdp-shard-grad-op, fsdp2, deepspeed-zero3-offload, ...): "
        "run under torchrun with tunelab's multi-device loop instead of litgpt's built-in strategy; --devices N sets "
        "processes per node",
    )
    parser.add_argument("--nnodes", type=count, default=1, help="nodes (with --strategy); run the same command on each")
    rank = number(int, 0, what="an integer")
    parser.add_argument("--node-rank", type=rank, default=0, help="this node's rank (0 writes the record)")
    parser.add_argument("--master-addr", default="127.0.0.1", help="address of node 0 (torchrun rendezvous)")
    port = number(int, 1, 65535, what="a port")
    parser.add_argument("--master-port", type=port, help="port on node 0 (default: a free one; give one for >1 node)")


class Parser(argparse.ArgumentParser):
    """argparse with whole option names only (``--data`` is never taken as ``--dataset``) and one-line errors."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message} (see: {self.prog} --help)\n")


def micro_list(text: str) -> list[int]:
    """An argparse type: a comma-separated list of micro batches, each >= 1."""
    return [count(x) for x in text.split(",") if x.strip()]
