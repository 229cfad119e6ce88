"""``tunelab build-model NAME``: a litgpt checkpoint directory built offline (tiny, or random weights)."""

from __future__ import annotations

from tunelab.cli.common import fail, folder


def add_parser(sub) -> None:
    """The subcommand's parser."""
    parser = sub.add_parser(
        "build-model",
        help="write a litgpt checkpoint directory offline: 'tiny' or a real architecture, random weights",
        description="Build a checkpoint directory that `litgpt finetune_*` accepts as it is (lit_model.pth, "
        "model_config.yaml, a tokenizer trained here with `tokenizers`, tokenizer_config.json, "
        "generation_config.json). Prints its path.",
    )
    parser.add_argument(
        "name",
        help="'tiny' (2-layer TinyLlama layout, ~0.1M parameters), 'tiny-deep' (24 narrow blocks, "
        "4.5M parameters: activations dominate, for activation-checkpointing demonstrations) "
        "or a litgpt config name such as "
        "open_llama_7b or tiny-llama-1.1b (random weights)",
    )
    parser.add_argument("--out", type=folder, help="directory to write (default: .tunelab/checkpoints/<name>)")
    parser.add_argument(
        "--dtype",
        choices=["float32", "bfloat16", "float16"],
        help="weight dtype (default: float32 for tiny, bfloat16 for real architectures)",
    )
    parser.add_argument("--device", default="cpu", help="where to initialise the weights (cuda is much faster for 7B+)")
    parser.add_argument("--force", action="store_true", help="rebuild even if the directory is complete")
    parser.set_defaults(func=handle)


def handle(args, extra) -> int:
    """Run the subcommand; the exit code."""
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
