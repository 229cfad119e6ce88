"""``tunelab advise``: which GPUs, method, strategy and micro batch; how long and how much, before renting."""

from __future__ import annotations

from tunelab.cli.common import count, fail, folder, given_path, host_figure, listed, number


def add_parser(sub) -> None:
    """The subcommand's parser."""
    parser = sub.add_parser(
        "advise",
        help="rank every configuration of a model by predicted time and cost, before renting",
        description="Plan MODEL (a recipes/ folder such as open-llama-7b, or a recipe key) on each --gpus row "
        "with every method (full, LoRA, QLoRA), precision, micro batch, activation checkpointing and strategy "
        "(one device; DDP, FSDP, DeepSpeed ZeRO-2/3 on 2, 4, 8, 16 devices per node): keep what the planner says "
        "fits with --headroom to spare, rank by predicted wall time for the data (plan's time by cause: kernels, "
        "host launches, validation and samples at the recipe's eval settings, unhidden communication), with energy "
        "(board power, an upper bound) and cost (devices x hours x prices in configs/hardware/prices.yaml). Bytes per "
        "optimizer step by strategy (DDP all-reduces gradients, 2x their bytes; FSDP/ZeRO-3 gather parameters "
        "twice and reduce-scatter gradients, about 3x; ZeRO-2 about 2x; offload crosses PCIe) over the slowest "
        "link they cross (configs/hardware/links.yaml: NVLink, PCIe, InfiniBand, Ethernet, each with its source), "
        "less what the backward pass hides. The recipe's global batch is kept unless --global-batch free (which "
        "changes the training maths: no accumulation, global = micro x devices). Plans, not measurements: "
        "docs/planner.md says how accurate each term is; configurations within that error are marked ~ (a tie to "
        "measure). Any other --dotted.key VALUE is a litgpt-style override applied to every recipe: "
        "--checkpoint_dir checkpoints/Qwen/Qwen2.5-7B ranks any model litgpt knows with the folder's settings; "
        "--train.max_seq_length 1024, --lora_r 16, ... (not what advise tries itself: precision, devices, nodes, "
        "the micro batch).",
    )
    parser.add_argument("model", help="a folder of recipes/ (open-llama-7b) or a recipe key (open-llama-7b/lora)")
    parser.add_argument("--gpus", default="A10G,A100-80GB,H100-SXM", help="GPU table rows, comma-separated")
    parser.add_argument("--method", choices=["full", "lora", "qlora", "any"], default="any")
    parser.add_argument(
        "--precision",
        metavar="LIST",
        help="precisions to try (default: bf16-true,bf16-mixed where the GPU has bfloat16, else 16-mixed; QLoRA at "
        "the true one alone)",
    )
    parser.add_argument(
        "--strategies",
        metavar="LIST",
        help="strategy files to try, comma-separated (default: single "
        "on one device; ddp, fsdp, deepspeed-zero2, deepspeed-zero3 on several, fsdp-hybrid too on several nodes; "
        "offload files only when named: their CPU optimizer step is not in the time)",
    )
    parser.add_argument(
        "--max-devices",
        type=number(int, 1, 16, what="a device count"),
        default=8,
        help="devices per node at most (default 8; up to 16): the search tries 1, 2, 4, 8 and 16",
    )
    _workload(parser)
    parser.add_argument(
        "--global-batch",
        choices=["keep", "free"],
        default="keep",
        help="keep the recipe's global batch (default), or free: no accumulation, micro batches up to "
        "the planner's largest",
    )
    parser.add_argument(
        "--headroom",
        type=number(float, 0, 0.5, what="a fraction"),
        help="memory left free for the allocator (default 0.10: past 88-92%% of an H100 the measured "
        "steps retried allocations); 0 ranks tight configurations too",
    )
    _limits_and_output(parser)
    parser.set_defaults(func=handle, passthrough=True)


def _workload(parser) -> None:
    """The options that say what is trained: the tokens or the dataset, and the epochs."""
    work = parser.add_mutually_exclusive_group()
    work.add_argument(
        "--tokens",
        type=number(float, 0, 1e15, low_open=True, what="a token count"),
        help="padded tokens to train on (default 5e7), as samples of the lab's Alpaca length (437 at "
        "micro 8; padding per micro batch from a default length distribution)",
    )
    work.add_argument(
        "--data",
        metavar="FILE|MODULE",
        help="the dataset: a .json/.jsonl file or folder litgpt "
        "reads (lengths from the checkpoint's tokenizer, else from characters as tunelab plan counts them; "
        "padding per micro batch; its held-out split validated), or a litgpt data module (Alpaca, LIMA, ...)",
    )
    parser.add_argument("--epochs", type=number(int, 1, 10**4, what="an epoch count"), default=1)


def _limits_and_output(parser) -> None:
    """The options that bound the search (deadline, budget, prices, links, nodes) and shape what it prints."""
    parser.add_argument("--deadline", type=number(float, 0, 1e5, low_open=True, what="hours"), help="hours at most")
    parser.add_argument("--budget", type=number(float, 0, 1e9, low_open=True, what="dollars"), help="USD at most")
    parser.add_argument("--prices", type=given_path, help="a price file like configs/hardware/prices.yaml")
    parser.add_argument("--interconnect", metavar="LINK", help="the link between a node's GPUs (default: the GPU's)")
    parser.add_argument("--nodes", type=number(int, 1, 1024, what="a node count"), default=1, help="nodes (default 1)")
    parser.add_argument("--internode", metavar="LINK", help="the network between nodes (needed with --nodes above 1)")
    what = "microseconds per op litgpt's loop takes on your host's CPU, where you know it; auto: measured here, on "
    what += "the GPU machine the run will use; default: the median machine we measured"
    parser.add_argument("--host-us-per-op", "--host", type=host_figure, metavar="US|auto", help=what)
    parser.add_argument("--top", type=count, default=3, help="configurations shown per GPU (default 3)")
    parser.add_argument("--json", action="store_true", help="every fitting configuration, ranked, as JSON")
    parser.add_argument(
        "--write", type=folder, metavar="DIR", help="write the fastest (or --by cost: cheapest) as a recipe"
    )
    parser.add_argument("--by", choices=["time", "cost"], default="time", help="what --write picks by (default time)")


def handle(args, extra) -> int:
    """Run the subcommand; the exit code."""
    import json
    import sys

    from tunelab.plan import advise
    from tunelab.plan.model import memory
    from tunelab.plan.recipe import plan_recipe
    from tunelab.plan.trace.host_probe import measure_here

    lists = [listed(getattr(args, o), f"--{o}") for o in ("gpus", "precision", "strategies")]
    recipes, gpus, precision, strategies = advise.asked(args, *lists, overrides=extra)
    model = advise.model_line(recipes, extra) if extra else ""
    headroom = memory.ALLOCATOR_HEADROOM if args.headroom is None else args.headroom
    first = next(iter(recipes.values()))
    work = (
        advise.workload_from_data(args.data, first, args.epochs)
        if args.data
        else advise.workload_from_tokens(args.tokens or 5e7, args.epochs)
    )
    table = advise.prices(args.prices or advise.PRICE_TABLE)
    host = (args.host_us_per_op, "as given (--host-us-per-op)") if args.host_us_per_op else None
    if args.host_us_per_op == "auto":
        try:
            probe = measure_here(plan_recipe(first, [], gpu=None).input)
        except ValueError as e:
            return fail(str(e))
        host = (probe.us_per_op, probe.how())
    asked = {"max_devices": args.max_devices, "nodes": args.nodes, "interconnect": args.interconnect}
    asked |= {"internode": args.internode, "price_table": table, "precision": precision, "strategies": strategies}
    asked |= {"global_batch": args.global_batch, "headroom": headroom, "host_us_per_op": host[0] if host else None}
    asked["refused"] = refused = {}
    try:  # what the planner refuses of a recipe (a method it does not model, a count out of range): one line
        cands = advise.candidates(recipes, gpus, workload=work, **asked)
    except ValueError as e:
        return fail(str(e))
    limits = {"deadline_h": args.deadline, "budget": args.budget, "tight_ok": headroom == 0}
    ranked = advise.rank(cands, by=args.by, **limits)
    if args.json:
        print(json.dumps([{**c.__dict__, "world": c.world} for c in ranked], indent=1))
        print(*advise.refusals(refused), sep="\n", end="", file=sys.stderr)  # stdout stays one JSON
    else:
        answer = advise.render(cands, ranked, gpus, table, args.top, work, limits, host, refused)
        print(f"{model}\n{answer}" if model else answer)
    if args.write and ranked:
        chosen = ranked[0]
        by_key = {r.key: r for r in recipes.values()}
        for line in advise.write_choice(chosen, by_key[chosen.recipe], args.write, args.data, extra):
            print(f"launch: {line}", file=sys.stderr if args.json else sys.stdout)  # stdout stays one JSON
    return 0 if ranked else 1
