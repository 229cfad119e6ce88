"""``tunelab plan-strategies``: the plan on several devices against rank 0's simulated step."""

from __future__ import annotations

import os
from pathlib import Path

from tunelab.cli.common import fail, folder, listed
from tunelab.errors import InputError
from tunelab.files import unwritable_dir
from tunelab.paths import output_root


def add_parser(sub) -> None:
    """The subcommand's parser."""
    parser = sub.add_parser(
        "plan-strategies",
        help="the plan on several devices against rank 0's simulated step -> reports/planner-strategies/",
        description="For each strategy simulated per rank (litgpt's own choice, fsdp2, fsdp, ddp; FSDP1's "
        "variants on request), 2, 4 and 8 devices, five families "
        "(TinyLlama, OpenLLaMA 3B and 7B, Gemma 2B, Phi-2), full and LoRA: the planned peak per device beside "
        "rank 0's simulated step (litgpt's model on fake tensors under a fake process group; FSDP2 and FSDP1 "
        "sharded as the run shards them), and the collectives it traced (bytes and calls) beside comm.py's "
        "(on 2 cores: the default four about 25 minutes, every strategy about an hour; 1-37 s a row).",
    )
    parser.add_argument("--out", type=folder, help="output directory (default: reports/planner-strategies)")
    parser.add_argument(
        "--strategies",
        help="comma-separated strategies (default litgpt,fsdp2,fsdp,ddp; litgpt: no strategy file, litgpt's own "
        "choice as its scripts wrap the model; FSDP1's variants fsdp-shard-grad-op, fsdp-hybrid, fsdp-no-shard, "
        "fsdp-no-wrap by name: about 7 minutes each over the 30 rows)",
    )
    parser.add_argument("--worlds", help="comma-separated device counts (default 2,4,8)")
    parser.add_argument("--families", help="comma-separated subset of the families' names, e.g. 'TinyLlama 1.1B,Phi-2'")
    parser.add_argument("--methods", help="comma-separated subset of full,lora (default both)")
    parser.add_argument(
        "--precisions",
        help="comma-separated precisions to check each row at, of 32-true,bf16-true,bf16-mixed (default: each "
        "recipe's own)",
    )
    parser.add_argument(
        "--keep", action="store_true", help="keep the rows of the report in --out that this call does not rerun"
    )
    parser.add_argument(
        "--deepspeed",
        action="store_true",
        help="instead of the simulations: run DeepSpeed's own ZeRO-2 and ZeRO-3 for real on this CPU (gloo ranks, 2 "
        "and 4) at each family's shape / 16 against the plan (--families, --worlds: default 2,4) -> deepspeed.csv "
        "and strategies.md's DeepSpeed section (about 23 minutes on 2 cores; needs deepspeed)",
    )
    parser.set_defaults(func=handle)


def handle(args, extra) -> int:
    """Run the subcommand; the exit code."""
    from tunelab.report import strategy_checks as sc

    strategies = listed(args.strategies, "--strategies")
    if strategies == [] or set(strategies or ()) - set(sc.STRATEGIES):
        return fail(f"--strategies {args.strategies}: simulated per rank are {', '.join(sc.STRATEGIES)}")
    worlds = listed(args.worlds, "--worlds")
    if worlds == [] or not all(w.isdigit() for w in worlds or ()):
        return fail(f"--worlds {args.worlds}: give device counts such as 2,4,8")
    strategies, worlds = tuple(strategies or sc.DEFAULT_STRATEGIES), tuple(int(w) for w in worlds or ()) or sc.WORLDS
    if any(not 2 <= w <= 1024 for w in worlds):
        return fail(f"--worlds {args.worlds}: each from 2 to 1024")
    names = listed(args.families, "--families")
    known = {f[0]: f for f in sc.FAMILIES}
    if names == [] or set(names or ()) - set(known):
        return fail(f"--families {args.families}: the families are {', '.join(known)}")
    families = tuple(known[n] for n in names) if names else sc.FAMILIES
    methods = listed(args.methods, "--methods")
    if methods == [] or set(methods or ()) - set(sc.METHODS):
        return fail(f"--methods {args.methods}: the methods are {', '.join(sc.METHODS)}")
    precisions = listed(args.precisions, "--precisions")
    if precisions == [] or set(precisions or ()) - set(sc.PRECISIONS):
        return fail(f"--precisions {args.precisions}: the precisions are {', '.join(sc.PRECISIONS)}")
    from tunelab.report import deepspeed_checks as dc

    out_dir = args.out or output_root() / "reports" / "planner-strategies"
    if why := unwritable_dir(out_dir, ("strategies.md", "strategies.csv", dc.CSV_NAME)):
        return fail(f"--out {out_dir}: {why}; fix: a new folder")  # before 20 minutes of simulation, not after
    if not args.deepspeed and os.path.lexists(out_dir / dc.CSV_NAME):  # its section is rewritten after every row
        try:
            dc.read(out_dir / dc.CSV_NAME)
        except InputError as e:
            return fail(str(e))
    if args.deepspeed:
        return _deepspeed(families, tuple(int(w) for w in listed(args.worlds, "--worlds") or ()), out_dir)
    kept = []
    if args.keep and (out_dir / "strategies.csv").is_file():
        try:
            kept = sc.read(out_dir / "strategies.csv")
        except InputError as e:
            return fail(str(e))
    out = sc.write(
        sc.rows(
            families=families,
            strategies=strategies,
            worlds=worlds,
            methods=tuple(methods or sc.METHODS),
            kept=kept,
            each=lambda found: sc.write(found, args.out),  # the report after every row: a stopped run keeps its rows
            precisions=tuple(precisions or (None,)),
        ),
        args.out,
    )
    print((out / "strategies.md").read_text())
    print(f"written: {out}/strategies.md, {out}/strategies.csv")
    return 0


def _deepspeed(families, worlds: tuple, out_dir: Path) -> int:
    """``--deepspeed``: DeepSpeed's rows (on ``worlds`` ranks, default 2 and 4), then strategies.md again with the
    simulated rows already there."""
    from tunelab.report import deepspeed_checks as dc
    from tunelab.report import strategy_checks as sc

    if any(w > 8 for w in worlds):
        return fail(f"--worlds {','.join(map(str, worlds))}: DeepSpeed runs a process per rank on this CPU: 2 to 8")
    try:
        import deepspeed  # noqa: F401
    except ImportError:
        return fail("--deepspeed: DeepSpeed is not installed; fix: pip install -r requirements.txt")
    try:
        zero = dc.rows(families, worlds or dc.WORLDS)
        out_dir.mkdir(parents=True, exist_ok=True)
        dc.write(zero, out_dir)
        found = sc.read(out_dir / "strategies.csv") if (out_dir / "strategies.csv").is_file() else []
    except InputError as e:
        return fail(str(e))
    print("\n".join(dc.section(zero)))
    if not found:  # no simulated rows in --out yet: strategies.md waits for them
        print(f"written: {out_dir}/{dc.CSV_NAME}")
        return 0
    out = sc.write(found, out_dir)
    print(f"written: {out}/{dc.CSV_NAME}, {out}/strategies.md")
    return 0
