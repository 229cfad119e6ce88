"""``tunelab advise``: which GPUs, method, strategy and micro batch; how long and how much, before renting."""

from __future__ import annotations

from pathlib import Path

from tunelab.cli.common import count, fail, number


def add_parser(sub) -> None:
    """The subcommand's parser."""
    s = sub.add_parser(
        "advise",
        help="rank every configuration of a model by predicted time and cost, before renting",
        description="Plan MODEL (a recipes/ folder such as open-llama-7b, or a recipe key) on each --gpus row with "
        "every method (full, LoRA, QLoRA), micro batch, activation checkpointing and strategy (one device; DDP, "
        "FSDP, DeepSpeed ZeRO-2/3 on 2, 4, 8 devices): keep what the planner says fits, rank by predicted wall "
        "time for --tokens (compute, memory-bound work, overhead and the communication compute does not hide), "
        "with energy (board power, an upper bound) and cost (devices x hours x the price of "
        "configs/hardware/prices.yaml). The recipe's global batch is kept. Plans, not measurements: "
        "docs/planner.md says how accurate each term is.",
    )
    s.add_argument("model", help="a folder of recipes/ (open-llama-7b) or a recipe key (open-llama-7b/lora)")
    s.add_argument("--gpus", default="A10G,A100-80GB,H100-SXM", help="GPU table rows, comma-separated")
    s.add_argument("--method", choices=["full", "lora", "qlora", "any"], default="any")
    s.add_argument("--max-devices", type=number(int, 1, 64, what="a device count"), default=8)
    s.add_argument("--tokens", type=number(float, 0, 1e15, low_open=True, what="a token count"), default=5e7)
    s.add_argument("--deadline", type=number(float, 0, 1e5, low_open=True, what="hours"), help="hours at most")
    s.add_argument("--budget", type=number(float, 0, 1e9, low_open=True, what="dollars"), help="USD at most")
    s.add_argument("--prices", type=Path, help="a price file like configs/hardware/prices.yaml")
    s.add_argument("--interconnect", metavar="LINK", help="the link between a node's GPUs (default: the GPU's)")
    s.add_argument("--nodes", type=number(int, 1, 1024, what="a node count"), default=1, help="nodes (default 1)")
    s.add_argument("--internode", metavar="LINK", help="the network between nodes (needed with --nodes above 1)")
    s.add_argument("--top", type=count, default=3, help="configurations shown per GPU (default 3)")
    s.add_argument("--json", action="store_true", help="every fitting configuration, ranked, as JSON")
    s.add_argument("--write", type=Path, metavar="DIR", help="write the fastest (or --by cost: cheapest) as a recipe")
    s.add_argument("--by", choices=["time", "cost"], default="time", help="what --write picks by (default time)")
    s.set_defaults(func=handle)


def handle(args, extra) -> int:
    """Run the subcommand; the exit code."""
    import json

    from tunelab import hardware
    from tunelab.plan import advise
    from tunelab.recipes import RECIPES_DIR, resolve

    folder = RECIPES_DIR / args.model
    if folder.is_dir() and "/" not in args.model:
        methods = ["full", "lora", "qlora"] if args.method == "any" else [args.method]
        recipes = {m: resolve(f"{args.model}/{m}") for m in methods if (folder / f"{m}.yaml").is_file()}
    else:
        recipe = resolve(args.model)
        recipes = {recipe.path.stem: recipe}
    if not recipes:
        return fail(f"{args.model}: no {args.method} recipe there; fix: --method any")
    try:
        gpus = [hardware.lookup(g.strip()) for g in args.gpus.split(",") if g.strip()]
    except ValueError as e:
        return fail(f"--gpus: {e}")
    table = advise.prices(args.prices or advise.PRICE_TABLE)
    cands = advise.candidates(
        recipes, gpus, tokens=args.tokens, max_devices=args.max_devices, nodes=args.nodes,
        interconnect=args.interconnect, internode=args.internode, price_table=table,
    )  # fmt: skip
    ranked = advise.rank(cands, by=args.by, deadline_h=args.deadline, budget=args.budget)
    if args.json:
        print(json.dumps([{**c.__dict__, "world": c.world} for c in ranked], indent=1))
        return 0 if ranked else 1
    print(advise.render(cands, ranked, gpus, table, args.top, args.tokens))
    if args.write and ranked:
        chosen = ranked[0]
        by_key = {r.key: r for r in recipes.values()}
        for line in advise.write_choice(chosen, by_key[chosen.recipe], args.write):
            print(f"launch: {line}")
    return 0 if ranked else 1
