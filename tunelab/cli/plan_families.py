"""``tunelab plan-families``: the planner's activation term against autograd, per model family."""

from __future__ import annotations

from tunelab.cli.common import count, fail, folder, listed


def add_parser(sub) -> None:
    """The subcommand's parser."""
    parser = sub.add_parser(
        "plan-families",
        help="the planner's activation term against autograd's saved tensors, per model family -> "
        "reports/planner-families/",
        description="For each model family (TinyLlama, OpenLLaMA, Llama 2, 3, 3.2, Mistral, Gemma 1 "
        "and 2, Phi-2, Phi-3, Falcon, StableLM, GPT-NeoX), full and LoRA, bf16-true and bf16-mixed: one real "
        "forward of litgpt's model (full width, 2 blocks) on this CPU, the bytes autograd keeps per "
        "block and for the head and loss, beside tunelab's derivation from the Config (about 11 minutes).",
    )
    parser.add_argument("--families", help="comma-separated litgpt config names (default: the 14 families)")
    parser.add_argument("--seq-len", type=count, help="tokens per sequence (default 128; with --simulate 512)")
    parser.add_argument("--out", type=folder, help="output directory (default: reports/planner-families)")
    parser.add_argument(
        "--simulate",
        action="store_true",
        help="instead: the analytic plan's peak against the simulated step (fake tensors under torch's MemTracker; "
        "full bf16-true/mixed, LoRA bf16-true/mixed, QLoRA), micro 4 x --seq-len 512 -> simulated.md/.csv",
    )
    parser.set_defaults(func=handle)


def handle(args, extra) -> int:
    """Run the subcommand; the exit code."""
    from tunelab.report.families import write_families

    names = listed(args.families, "--families")
    if names == []:
        return fail(f"--families {args.families!r}: no family named; fix: litgpt config names, comma-separated")
    if args.simulate:
        from tunelab.report.families import write_simulated

        try:
            out = write_simulated(args.out, names, seq_len=args.seq_len or 512)
        except (ValueError, RuntimeError) as e:
            return fail(str(e))
        print((out / "simulated.md").read_text())
        print(f"written: {out}/simulated.md, {out}/simulated.csv")
        return 0
    try:
        out = write_families(args.out, names, args.seq_len or 128)
    except (ValueError, RuntimeError) as e:
        return fail(str(e))
    print((out / "families.md").read_text())
    print(f"written: {out}/families.md, {out}/families.csv")
    return 0
