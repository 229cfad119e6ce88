"""``tunelab plan RECIPE``: predicted memory, fit, largest micro batch, runtime and energy before launch."""

from __future__ import annotations

import argparse
from pathlib import Path

from tunelab.cli.common import count, fail, given_path, host_figure, number
from tunelab.plan.projection import DEFAULT_MFU_RANGE


def add_parser(sub) -> None:
    """The subcommand's parser."""
    parser = sub.add_parser(
        "plan",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        help="predict peak memory, fit, largest micro batch, runtime and energy before launch",
        description="Predict the peak GPU memory of RECIPE (with litgpt-style overrides) per device, broken down into "
        "weights, gradients, optimizer states, activations, logits, strategy buffers; the verdict for --gpu with its "
        "margin and the largest micro batch that fits; the run's time and energy. Any model litgpt knows plans (the "
        "recipe's checkpoint_dir: its model_config.yaml, else litgpt's config of the directory name).",
        epilog="--json prints the same as one object: peak_memory_gb (predicted peak allocated per device, GB = "
        "1e9 bytes, as litgpt prints 'Memory Used'), fits, margin_gb, max_micro_batch_size, breakdown_gb (sums to "
        "peak_memory_gb), predicted_reserved_bytes, cuda_context_bytes, host_ram_gb, seq_len, seq_len_source, notes, "
        "warnings (where litgpt's own loop would hang), strategy (its kind), strategy_described (the file's words), "
        "and with --gpu a projection: seconds (the point estimate), seconds_by_cause (matmul, attention, "
        "elementwise, dequantization, optimizer, kernel gaps, host launches, validation, generation, checkpoint saves, "
        "communication; they sum to seconds), mfu_predicted_padded/real, seconds_after_loop, bytes_after_loop, "
        "save_bytes_per_s, the MFU range's seconds_low/high, energy_j_low/high (power x devices x the band), "
        "comm_bytes_per_step and comm_seconds_per_step on several devices (per forward without gradients: "
        "comm_bytes/seconds_per_forward); host_source, link_source and checked (where the host's time per op "
        "and the links come from; the GPU's timed runs or their absence); calibration, power_measured, lower_bound "
        "(why the time is one: offload); under tunelab's fast path fast_saved_per_step_s and fast_break_even_steps "
        "(against stock litgpt; warm and cold compile cache). How each is computed: docs/planner.md.",
    )
    _case_arguments(parser.add_argument_group("the run planned"))
    _time_arguments(parser.add_argument_group("its time, energy and links"))
    checks = parser.add_argument_group("checks beside the plan (seconds each, on this CPU)")
    what = "count what autograd keeps in one real forward of litgpt's model (full width, 2 blocks) beside the plan"
    checks.add_argument("--measure", action="store_true", help=what)
    what = "run litgpt's step on fake tensors under MemTracker: each phase's peak beside the plan; on several "
    what += "devices rank 0 under a fake process group, wrapped as the run wraps it (docs/planner.md)"
    checks.add_argument("--simulate", action="store_true", help=what)
    parser.add_argument("--json", action="store_true", help="print one JSON object (fields listed below)")
    what = "the whole plan: the breakdown term by term, every note, where each figure comes from (default: the "
    parser.add_argument("--verbose", action="store_true", help=what + "answer in about ten lines)")
    parser.set_defaults(func=handle, passthrough=True)


def _case_arguments(group) -> None:
    """The recipe, the GPU, the devices and the strategy: what is planned."""
    group.add_argument("recipe", help="a key such as open-llama-7b/lora, or a YAML path")
    group.add_argument("--gpu", help="a configs/hardware/gpus.yaml row (A100-80GB, h100-sxm) or nvidia-smi's name")
    group.add_argument("--devices", type=count, help="GPUs per node (default: the recipe's devices)")
    group.add_argument(
        "--strategy",
        default="litgpt",
        metavar="NAME",
        help="how model states are divided across devices: a configs/strategies file or name (ddp, fsdp, "
        "fsdp-no-wrap, fsdp-shard-grad-op, fsdp-offload, fsdp2, deepspeed-zero2, deepspeed-zero3, "
        "deepspeed-zero3-offload, ...), the same files `run --strategy` runs; default litgpt: the "
        "recipe's own choice (one device; FSDP per block on several)",
    )
    group.add_argument("--activation-checkpointing", action="store_true", help="keep only block inputs, recompute")
    what = "an Alpaca JSON: use its longest sample as the sequence length (needs the checkpoint's tokenizer)"
    group.add_argument("--dataset", type=given_path, help=what)


def _time_arguments(group) -> None:
    """The run's size, the MFU range, the disk, the links and the host: what its time and energy depend on."""
    group.add_argument(
        "--tokens",
        type=number(float, 0, 1e18, low_open=True, what="a token count"),
        help="padded tokens to train, in place of the recipe's epochs and max_steps (its validation and save "
        "intervals kept; default: the recipe's training run)",
    )
    group.add_argument(
        "--tokens-per-sample",
        type=number(float, 2, 1e7, what="a token count per sample (a sample of one token predicts nothing)"),
        help="padded tokens per sample (default: from the data and tokenizer when both are here; litgpt's Alpaca from "
        "its records, measured per tokenizer family (configs/measured/alpaca-lengths.yaml); else the lab's length "
        "distribution padded at the micro batch, 437 at micro 8, scaled to the model's tokenizer family)",
    )
    group.add_argument(
        "--mfu-range",
        type=number(float, 0, 1, low_open=True, what="an MFU fraction"),
        nargs=2,
        default=list(DEFAULT_MFU_RANGE),
        metavar=("LOW", "HIGH"),
        help="MFU range for the runtime projection when not calibrated (default 0.25 0.55)",
    )
    group.add_argument(
        "--calibrate",
        type=given_path,
        help="a directory of run records: the measured MFU and power of the run of this model, method, precision "
        "and GPU nearest to this configuration (the same strategy, then the nearest micro batch; others passed over)",
    )
    group.add_argument(
        "--save-gbs",
        type=number(float, 0, 1e4, low_open=True, what="GB/s"),
        metavar="GBS",
        help="GB/s (1e9 bytes) your disk takes checkpoint saves at (default 0.7: torch.save on a fast "
        "local NVMe; a network volume is slower)",
    )
    group.add_argument("--interconnect", metavar="LINK", help="the link between a node's GPUs (default: the GPU's own)")
    group.add_argument("--internode", metavar="LINK", help="the network between nodes (with --num_nodes above 1)")
    group.add_argument(
        "--host-us-per-op",
        "--host",
        type=host_figure,
        metavar="US|auto",
        help="microseconds per op litgpt's loop takes on your host's CPU, where you know it (a record's implied "
        "figure); auto: measured here, on the GPU machine the run will use (seconds: litgpt's step of this model at "
        "a toy width); default: the median machine we measured, the band spanning them all",
    )


def handle(args, extra) -> int:
    """Run the subcommand; the exit code."""
    from tunelab import hardware
    from tunelab.plan.model import comm
    from tunelab.plan.projection import project_recipe
    from tunelab.plan.recipe import plan_recipe
    from tunelab.plan.render import added, output
    from tunelab.plan.trace.host_probe import measure_here
    from tunelab.recipes import RecipeError, resolve
    from tunelab.validate import plan_refusal

    lo, hi = args.mfu_range
    if lo > hi:
        return fail(f"--mfu-range {lo} {hi}: LOW must not exceed HIGH")
    if args.calibrate and not any(Path(args.calibrate).glob("**/record.json")):
        return fail(f"--calibrate {args.calibrate}: no run records (record.json) under it; fix: a sweep directory")
    if args.gpu is None and args.host_us_per_op:
        return fail("--host-us-per-op: it times the run, which needs --gpu; fix: add --gpu GPU or leave it out")
    try:
        for link, scope in ((args.interconnect, "gpu"), (args.internode, "node")):
            if link is not None:  # named: checked even where no time is projected (one line naming the option)
                comm.lookup(link, scope, given=True)
        gpu = hardware.lookup(args.gpu) if args.gpu is not None else hardware.local_gpu()  # none: this machine's
        asked = {k: getattr(args, k) for k in ("devices", "strategy", "activation_checkpointing", "dataset")}
        planned = plan_recipe(recipe := resolve(args.recipe), extra, gpu=gpu, **asked)
        if refused := plan_refusal(recipe, extra, planned.settings.data_class):  # litgpt's parser's own refusal
            return fail(refused)
    except (RecipeError, ValueError, KeyError) as e:
        return fail(str(e.args[0]) if isinstance(e, KeyError) and e.args else str(e))
    projection, tokens_note = None, ""
    if args.gpu is not None:
        try:
            asked = {k: getattr(args, k) for k in ("tokens", "tokens_per_sample", "interconnect", "internode")}
            asked |= {"save_gbs": args.save_gbs, "host_us_per_op": args.host_us_per_op, "mfu_range": (lo, hi)}
            if args.host_us_per_op == "auto":
                probe = measure_here(planned.input)
                asked |= {"host_us_per_op": probe.us_per_op, "host_from": probe.source()}
            projection, tokens_note = project_recipe(planned, gpu, calibrate_dir=args.calibrate, **asked)
        except ValueError as e:
            return fail(str(e))
    extras = added(planned.input, gpu, args.strategy, measured=args.measure, simulated=args.simulate)
    print(output(planned, gpu, projection, tokens_note, extras, as_json=args.json, verbose=args.verbose))
    return 0
