"""The ``tunelab`` command: one entry point, one subcommand per job.

Each subcommand's arguments are checked before any model is built; a bad input is one line on stderr and exit
code 2. litgpt-style overrides (``--train.micro_batch_size 8``) pass through to litgpt's own parser.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

EPILOG = """examples:
  tunelab ls                                     # the recipes, from the files
  tunelab show open-llama-7b/lora                # one recipe, with its download and launch commands
  tunelab validate recipes/*/*.yaml --gpu A100-80GB
  tunelab validate tiny-llama-1.1b/full --train.micro_batch_size 6   # litgpt-style overrides
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


def cmd_ls(args, extra) -> int:
    from tunelab.recipes import discover

    rows = [r.summary() for r in discover()]
    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        print(_table(rows, ["recipe", "model", "method", "precision", "quantize", "micro", "global", "accum",
                            "devices", "nodes"]))
    return 0


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
    print(f"# on the tiny model (CPU): {recipe.launch_command()} --checkpoint_dir $(tunelab build-model tiny) "
          "--precision 32-true --devices 1 --train.max_steps 2 --data.num_workers 0")
    return 0


def cmd_validate(args, extra) -> int:
    from tunelab.recipes import RecipeError, discover, resolve
    from tunelab.validate import check

    refs = args.recipes or [str(r.path) for r in discover()]
    failed = 0
    for ref in refs:
        try:
            recipe = resolve(ref)
        except RecipeError as e:
            print(f"{ref}: error: {e}")
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


def cmd_build_model(args, extra) -> int:
    import torch

    from tunelab import checkpoints

    try:
        checkpoints.model_config(args.name)
    except ValueError as e:
        return fail(str(e))
    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16, None: None}[args.dtype]
    out = checkpoints.build(args.name, args.out, dtype=dtype, device=args.device, force=args.force)
    print(out)
    return 0


def cmd_data(args, extra) -> int:
    from tunelab import data
    from tunelab.paths import DATASET

    out = Path(args.out) if args.out else DATASET
    data.write(out, data.generate(args.n, args.seed))
    print(out)
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="tunelab", formatter_class=argparse.RawDescriptionHelpFormatter, epilog=EPILOG,
        description="LitGPT fine-tuning recipes, with the tools that plan, run, measure and report them.")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")

    s = sub.add_parser("ls", help="list the recipes (model, method, precision, batch, devices) from the files")
    s.add_argument("--json", action="store_true", help="print the rows as JSON")
    s.set_defaults(func=cmd_ls)

    s = sub.add_parser("show", help="print one recipe with its download and launch commands")
    s.add_argument("recipe", help="a key such as open-llama-7b/lora, or a YAML path")
    s.set_defaults(func=cmd_show)

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

    s = sub.add_parser(
        "build-model", help="write a litgpt checkpoint directory offline: 'tiny' or a real architecture, random weights",
        description="Build a checkpoint directory that `litgpt finetune_*` accepts as it is (lit_model.pth, "
                    "model_config.yaml, a tokenizer trained here with `tokenizers`, tokenizer_config.json, "
                    "generation_config.json). Prints its path.")
    s.add_argument("name", help="'tiny' (2-layer TinyLlama layout, ~0.1M parameters) or a litgpt config name such as "
                                "open_llama_7b or tiny-llama-1.1b (random weights)")
    s.add_argument("--out", type=Path, help="directory to write (default: .tunelab/checkpoints/<name>)")
    s.add_argument("--dtype", choices=["float32", "bfloat16", "float16"],
                   help="weight dtype (default: float32 for tiny, bfloat16 for real architectures)")
    s.add_argument("--device", default="cpu", help="where to initialise the weights (cuda is much faster for 7B+)")
    s.add_argument("--force", action="store_true", help="rebuild even if the directory is complete")
    s.set_defaults(func=cmd_build_model)

    s = sub.add_parser("data", help="regenerate the project's Alpaca-format dataset (data/alpaca_tunelab.json)")
    s.add_argument("action", choices=["generate"])
    s.add_argument("--n", type=int, default=400, help="number of records (default 400, the shipped file)")
    s.add_argument("--seed", type=int, default=42)
    s.add_argument("--out", help="output path (default: data/alpaca_tunelab.json)")
    s.set_defaults(func=cmd_data)
    return p


def main(argv: list[str] | None = None) -> int:
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


if __name__ == "__main__":
    raise SystemExit(main())
