"""``tunelab plan`` and ``tunelab plan-accuracy``: the planner from a recipe, as text or JSON, and its error
against every lab measurement (regenerated into reports/planner-accuracy/)."""

from __future__ import annotations

import json
import sys
import random
from pathlib import Path


from tunelab import hardware, planner, settings
from tunelab.paths import CONFIGS_DIR, output_root, project_path
from tunelab.recipes import Recipe

LAB_PADDED_TOKENS_PER_SAMPLE = 437
"""The lab's padded tokens per training sample (spec: 7,646 tok/s x 57.19 s over 1,000 samples, micro 8)."""


def plan_recipe(recipe: Recipe, overrides: list[str], *, gpu: str | None, devices: int | None = None,
                strategy: str | None = None, activation_checkpointing: bool = False, dataset: Path | None = None):
    """(PlanInput, Plan, seq_source, resolved args) for a recipe with overrides.

    ``strategy``: a configs/strategies file or name (``fsdp``, ``fsdp-no-wrap``, ``deepspeed-zero3-offload``, ...);
    None or 'litgpt' for litgpt's own choice (one device; FSDP on several). ``activation_checkpointing`` turns it
    on whatever the strategy says."""
    from tunelab.distributed.strategy import load_strategy

    args = settings.resolve_args(recipe, overrides)
    if devices:
        args["devices"] = devices
    planner.check_ranges(args)
    s = settings.from_args(recipe, args)
    strat = None if strategy in (None, "litgpt") else load_strategy(strategy)
    fields = planner.strategy_fields(strat, s.world_size)
    if activation_checkpointing:
        fields["activation_checkpointing"] = True
    seq_source = "the recipe's train.max_seq_length"
    seq = None
    if dataset is not None:
        ckpt = Path(args["checkpoint_dir"])
        if not (ckpt / "tokenizer.json").is_file() and not (ckpt / "tokenizer.model").is_file():
            raise ValueError(f"--dataset needs the model's tokenizer, and {ckpt} has none (download the checkpoint)")
        longest = planner.longest_sample_tokens(dataset, ckpt)
        cap = args["train"].get("max_seq_length")
        seq = min(longest, cap) if cap else longest
        seq_source = f"the dataset's longest sample ({longest} tokens){' capped at max_seq_length' if cap and longest > cap else ''}"
    x = planner.plan_input_from_args(args, recipe.method, seq_len=seq, devices=devices, **fields)
    g = hardware.lookup(gpu) if gpu else hardware.local_gpu()  # no --gpu: this machine's GPU, if any
    if g is not None and str(x.precision).startswith("bf16") and not g.bf16:
        x.attention_math = True
    plan = planner.predict(x)
    if g is not None:
        planner.verdict(plan, g)
        plan.max_micro_batch_size = planner.max_micro_batch(x, g)
    return x, plan, seq_source, args


def epoch_tokens(args: dict, x: planner.PlanInput, tokens_per_sample: float | None) -> tuple[float, str]:
    """Padded tokens of the recipe's training run (epochs over its data, or max_steps)."""
    data = (args.get("data") or {}).get("init_args", {})
    n, src = settings.data_size(args)
    train = args["train"]
    per_sample = tokens_per_sample or LAB_PADDED_TOKENS_PER_SAMPLE
    how = (f"{per_sample:.0f} padded tokens/sample" +
           ("" if tokens_per_sample else " (the lab's Alpaca figure; --tokens-per-sample to change)"))
    if train.get("max_steps"):
        samples = train["max_steps"] * train["global_batch_size"]
        return samples * per_sample, f"max_steps {train['max_steps']} x global batch {train['global_batch_size']} x {how}"
    if n is None:
        n = 2000
        src = f"the lab's 2,000-sample Alpaca subset assumed: {src}"
    train_samples = int(n * (1 - (data.get("val_split_fraction") or 0)))
    epochs = train.get("epochs") or 1
    return train_samples * epochs * per_sample, f"{epochs} epoch(s) of {train_samples} training samples ({src}) x {how}"


def render(x, plan, seq_source: str, projection=None, tokens_note: str = "") -> str:
    gb = lambda b: f"{b / 1e9:9.2f}"  # noqa: E731
    lines = [f"plan: {plan.model} {plan.method} on {plan.gpu or '(no GPU named: --gpu for a verdict)'} "
             f"({plan.devices} device(s), {plan.strategy}), {plan.precision}, micro batch {plan.micro_batch_size}, "
             f"sequence {plan.seq_len} ({seq_source})",
             f"model: {plan.params / 1e9:.2f} B parameters, {plan.trainable_params / 1e6:,.1f} M trainable",
             "predicted peak allocated per device, GB (1e9 bytes):"]
    for k, v in plan.breakdown_bytes.items():
        if v:
            lines.append(f"  {k:<28}{gb(v)}")
    lines.append(f"  {'= peak allocated':<28}{gb(plan.peak_allocated_bytes)}   (litgpt's 'Memory Used')")
    lines.append(f"  {'reserved (x%.2f slack)' % planner.ALLOCATOR_SLACK:<28}{gb(plan.predicted_reserved_bytes)}")
    lines.append(f"  {'+ CUDA context':<28}{gb(plan.cuda_context_bytes)}")
    if plan.host_ram_bytes:
        lines.append(f"  host RAM (offload)          {gb(plan.host_ram_bytes)}")
    if plan.gpu:
        need = plan.predicted_reserved_bytes + plan.cuda_context_bytes
        word = ("AT THE EDGE (" + ("fits" if plan.fits else "short") + " by less than "
                f"{planner.EDGE_FRACTION:.0%} of memory: allocator fragmentation decides; expect retries)") \
            if plan.edge else ("FITS" if plan.fits else "DOES NOT FIT")
        lines.append(f"verdict: {word} on {plan.gpu}: needs {need / 1e9:.2f} GB of "
                     f"{plan.gpu_memory_bytes / 1e9:.2f} GB, margin {plan.margin_bytes / 1e9:+.2f} GB; "
                     f"largest micro batch that fits: {plan.max_micro_batch_size}")
        g = hardware.lookup(plan.gpu) if plan.gpu in hardware.table() else None
        if g is not None:
            lines.append(f"  GPU memory: {g.cuda_total_gib:.2f} GiB usable by CUDA ({g.cuda_total_source})")
    for note in plan.notes:
        lines.append(f"note: {note}")
    if projection:
        p = projection
        lines += [f"time: {p.tokens / 1e6:.2f} M tokens ({tokens_note}); {p.flops_per_token / 1e9:.2f} GFLOPs/token "
                  f"[{p.flops_formula}]",
                  f"  at MFU {p.mfu_low:.0%}-{p.mfu_high:.0%} ({p.mfu_source}): "
                  f"{p.seconds_low:,.0f} s to {p.seconds_high:,.0f} s",
                  (f"  point estimate of litgpt's Training Time: {p.seconds:,.0f} s ({p.seconds_band[0]:,.0f}-"
                   f"{p.seconds_band[1]:,.0f} s; {p.seconds_source})" if p.seconds else f"  {p.seconds_source}"),
                  f"  energy: {p.energy_j_low / 3.6e6:.3f}-{p.energy_j_high / 3.6e6:.3f} kWh, "
                  f"{p.energy_j_per_million_tokens_low / 1e3:,.1f}-{p.energy_j_per_million_tokens_high / 1e3:,.1f} kJ "
                  f"per million tokens; power: {p.power_source}"]
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------------------------
# Accuracy against the lab

def accuracy_rows() -> list[dict]:
    """Predicted vs measured for every lab row with a figure or a verdict: Part 1 (configs/sweeps/lab-part1.yaml)
    and Part 2 (configs/sweeps/lab-part2.yaml), each row planned for its GPU with its strategy file."""
    from tunelab.sweep import load

    rows = []
    for r in load(CONFIGS_DIR / "sweeps" / "lab-part1.yaml").rows:
        x, plan, _, _ = plan_recipe(r.recipe, r.overrides(), gpu=r.gpu)
        rows.append(_row("Part 1", r.id, r.recipe.key, r.note, r.gpu, plan, r.lab.get("memory_gb"),
                         r.lab.get("status"), "peak allocated, GB (litgpt Memory Used)"))
    for r in load(CONFIGS_DIR / "sweeps" / "lab-part2.yaml").rows:
        measured = r.lab.get("allocated_gib")
        if measured is None and r.lab.get("status") != "oom":
            continue  # the lab printed no figure and no failure: nothing to compare
        x, plan, _, _ = plan_recipe(r.recipe, r.overrides(), gpu=r.gpu, strategy=r.strategy)
        measured = [m * 2**30 / 1e9 for m in measured] if isinstance(measured, list) else (
            measured * 2**30 / 1e9 if measured is not None else None)
        rows.append(_row("Part 2", r.id, r.recipe.key, r.note, r.gpu, plan, measured, r.lab.get("status"),
                         "current allocated per GPU as the lab printed it (GiB, converted to GB)"))
    return rows


def _row(part, rid, recipe, note, gpu, plan, measured, lab_status, what) -> dict:
    lo = hi = None
    if isinstance(measured, list):
        lo, hi = measured
        err = 0.0 if lo <= plan.peak_memory_gb <= hi else min(abs(plan.peak_memory_gb - lo) / lo,
                                                                abs(plan.peak_memory_gb - hi) / hi)
        err *= 1 if plan.peak_memory_gb > hi else -1 if plan.peak_memory_gb < lo else 0
    elif measured is not None:
        err = (plan.peak_memory_gb - measured) / measured
    else:
        err = None
    lab_fits = None if lab_status is None else lab_status != "oom"
    return {"part": part, "id": rid, "recipe": recipe, "note": note, "gpu": gpu, "strategy": plan.strategy,
            "devices": plan.devices, "micro": plan.micro_batch_size, "predicted_gb": plan.peak_memory_gb,
            "measured_gb": measured, "rel_error": err, "predicted_fits": plan.fits, "lab_fits": lab_fits,
            "edge": plan.edge,
            "verdict_ok": None if lab_fits is None or plan.edge else plan.fits == lab_fits, "measured_is": what}


def _write_csv(path: Path, rows: list[dict]) -> None:
    """Rows (dicts with the same keys, in order) as a CSV file."""
    import csv
    import io

    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=list(rows[0]))
    w.writeheader()
    w.writerows(rows)
    path.write_text(buf.getvalue())


def write_accuracy(out: Path | None = None) -> Path:
    out = Path(out or output_root() / "reports" / "planner-accuracy")
    out.mkdir(parents=True, exist_ok=True)
    rows = accuracy_rows()
    _write_csv(out / "accuracy.csv", rows)
    runtime_lines = _runtime_section(out)

    def fmt_meas(m):
        if m is None:
            return ""
        return f"{m[0]:.2f}-{m[1]:.2f}" if isinstance(m, list) else f"{m:.2f}"

    p1 = [r for r in rows if r["part"] == "Part 1" and r["rel_error"] is not None]
    worst1 = max(p1, key=lambda r: abs(r["rel_error"]))
    verdicts = [r for r in rows if r["verdict_ok"] is not None]
    lines = ["# Planner accuracy against the lab", "",
             "Regenerate with `tunelab plan-accuracy`. Predicted = `tunelab plan` peak allocated per device (GB = 1e9 "
             "bytes) from the recipe and the lab's settings; no constant is fitted to a lab row (the formulas are in "
             "`tunelab/planner.py`; one QLoRA term is fitted to H100 measurements of our own, QLORA_EXTRA_BYTES). Verdict: fits when predicted reserved (x1.05 allocator slack) + 0.5 GiB CUDA "
             "context <= the GPU's memory.", "",
             f"- Part 1 (litgpt's peak 'Memory Used' on 1x A100 80GB): worst relative error "
             f"{worst1['rel_error']:+.1%} ({worst1['id']}); mean absolute "
             f"{sum(abs(r['rel_error']) for r in p1) / len(p1):.1%} over {len(p1)} measured rows.",
             f"- Verdicts (fits / OOM) matching the lab: {sum(r['verdict_ok'] for r in verdicts)} of {len(verdicts)} "
             f"decided; at the edge (margin within {planner.EDGE_FRACTION:.0%} of the GPU's memory, where "
             "fragmentation decides and the planner says so instead of guessing): "
             + (", ".join(f"{r['id']} (lab: {'fits' if r['lab_fits'] else 'OOM'})" for r in rows
                          if r["edge"] and r["lab_fits"] is not None) or "none") + ". GPU memory is what CUDA "
             "exposes (79.15 GiB on an A100 80GB), not the marketed 80 GiB.",
             "- Part 2: the lab printed *current* allocated memory per GPU during training from its own Lightning "
             "scripts (not litgpt's peak), in GiB; ranges are min-max over GPUs. Error is to the nearest end of the "
             "range (0 inside it). These rows are shown, not tuned for.", "",
             "| part | row | recipe | settings | GPU | strategy | devices | micro | predicted GB | lab GB | error | "
             "predicted | lab | verdict |", "|" + "---|" * 14]
    for r in rows:
        err = "" if r["rel_error"] is None else f"{r['rel_error']:+.1%}"
        lab = "" if r["lab_fits"] is None else ("fits" if r["lab_fits"] else "OOM")
        ok = "edge" if r["edge"] and r["lab_fits"] is not None else "" if r["verdict_ok"] is None else \
            ("right" if r["verdict_ok"] else "WRONG")
        lines.append(f"| {r['part']} | {r['id']} | {r['recipe']} | {r['note']} | {r['gpu']} | {r['strategy']} | "
                     f"{r['devices']} | {r['micro']} | {r['predicted_gb']:.2f} | {fmt_meas(r['measured_gb'])} | {err} | "
                     f"{'fits' if r['predicted_fits'] else 'OOM'} | {lab} | {ok} |")
    (out / "accuracy.md").write_text("\n".join(lines + runtime_lines) + "\n")
    return out


def tokens_per_sample_from_data(args: dict, x: planner.PlanInput) -> float | None:
    """Mean padded tokens per sample of the recipe's data under its batching (needs the checkpoint's tokenizer)."""
    data = (args.get("data") or {}).get("init_args", {})
    path, ckpt = data.get("json_path"), Path(args["checkpoint_dir"])
    if not path or not project_path(path).is_file() or not (ckpt / "tokenizer.json").is_file():
        return None
    from litgpt.prompts import PromptStyle
    from litgpt.tokenizer import Tokenizer

    tok, style = Tokenizer(ckpt), PromptStyle.from_name(data.get("prompt_style", "alpaca"))
    cap = args["train"].get("max_seq_length") or 10**9
    lengths = [min(cap, len(tok.encode(style.apply(r["instruction"], input=r.get("input", "")) + r["output"],
                                       eos=True))) for r in json.loads(project_path(path).read_text(encoding="utf-8"))]
    random.Random(data.get("seed", 42)).shuffle(lengths)
    m = x.micro_batch_size
    batches = [lengths[i:i + m] for i in range(0, len(lengths), m)]
    return sum(max(b) * len(b) for b in batches) / len(lengths)



FAMILY_COLUMNS = ["model", "method", "precision", "micro_batch_size", "seq_len", "n_layer", "measured_block",
                  "planned_block", "error_block", "measured_first_block", "planned_first_block", "measured_head",
                  "planned_head", "error_head", "measured_total", "planned_total", "error_total", "seconds", "notes"]
"""families.csv: bytes autograd keeps (measured) and tunelab.activations' derivation (planned), per block, for the
first block, for the head and loss, and for the whole model (first + (n_layer - 1) blocks + head)."""


def write_families(out: Path | None = None, names: list[str] | None = None, seq_len: int = 128) -> Path:
    """reports/planner-families/: the planner's activation term against one real forward per family."""
    import platform

    import torch
    from litgpt import Config

    from tunelab.measure_activations import FAMILIES, compare_in_child
    from tunelab.progress import ProgressLine

    names = names or list(FAMILIES)
    for name in names:
        try:
            Config.from_name(name)
        except ValueError:
            raise ValueError(f"--families {name}: not a litgpt config name; fix: e.g. {', '.join(FAMILIES[:3])}") \
                from None
    out = Path(out or output_root() / "reports" / "planner-families")
    out.mkdir(parents=True, exist_ok=True)
    progress = ProgressLine(2 * len(names))
    rows = []
    for name in names:
        for method in ("full", "lora"):
            progress.started(len(rows), f"{name} {method}")
            rows.append(compare_in_child(name, method, "bf16-true", 1, seq_len))
    sys.stderr.write("\n" if progress.tty else "")
    _write_csv(out / "families.csv", [{k: r.get(k) for k in FAMILY_COLUMNS} for r in rows])
    worst = max(rows, key=lambda r: abs(r["error_total"]))
    worst_block = max(rows, key=lambda r: abs(r["error_block"]))
    lines = [
        "# The planner's activation term, per model family, against what autograd keeps", "",
        f"Regenerate with `tunelab plan-families` (this CPU: {platform.processor() or platform.machine()}, torch "
        f"{torch.__version__}). Measured: one real training forward of litgpt's own model classes (`litgpt.GPT`, "
        "`litgpt.lora.GPT`, litgpt's chunked loss) at full width with 2 blocks, every tensor saved for backward "
        "counted once per storage (`torch.autograd.graph.saved_tensors_hooks`), parameters excluded; attention "
        "through torch's CPU flash kernel, which keeps what CUDA's flash kernel keeps. Planned: "
        "`tunelab/activations.py` from the Config alone, counted as on this CPU (LoRA dropout masks in the "
        "activation dtype; CUDA's fused dropout keeps 1 byte, which `tunelab plan` uses). bf16-true, micro batch 1, "
        f"{seq_len} tokens; LoRA r 8 on query, key, value, projection, MLP and head. Bytes; error = planned / "
        "measured - 1. The whole model = the first block + (n_layer - 1) blocks + head and loss.", "",
        f"- Worst whole-model error: {worst['error_total']:+.2%} ({worst['model']}, {worst['method']}); worst "
        f"per-block error: {worst_block['error_block']:+.2%} ({worst_block['model']}, {worst_block['method']}); "
        f"{sum(abs(r['error_total']) <= 0.03 for r in rows)} of {len(rows)} cases within 3%.", "",
        "| model | method | layers | block measured | block planned | error | head measured | head planned | error | "
        "whole model measured | planned | error |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(
            f"| {r['model']} | {r['method']} | {r['n_layer']} | {r['measured_block']:,} | {r['planned_block']:,.0f} | "
            f"{r['error_block']:+.2%} | {r['measured_head']:,} | {r['planned_head']:,.0f} | {r['error_head']:+.2%} | "
            f"{r['measured_total']:,} | {r['planned_total']:,.0f} | {r['error_total']:+.2%} |")
    notes = sorted({r["notes"] for r in rows if r["notes"]})
    if notes:
        lines += ["", "Notes: " + " / ".join(notes)]
    (out / "families.md").write_text("\n".join(lines) + "\n")
    return out


# ---------------------------------------------------------------------------------------------------------------
# Runtime against the lab's times

def _runtime_section(out: Path) -> list[str]:
    """runtime.csv and the runtime section of accuracy.md: the lab's times beside the estimate, leave-one-out."""
    from tunelab import runtime

    items = _lab_runtime_items()  # the 11 rows planned once, for the table and the refit
    rows = runtime_rows(items)
    _write_csv(out / "runtime.csv", rows)
    loo = [abs(r["loo_error"]) for r in rows]
    worst = max(rows, key=lambda r: abs(r["loo_error"]))
    fitted = fit_runtime_constants(items)
    lines = ["", "## Runtime: the point estimate against the lab's A100 times", "",
             "litgpt's \"Training Time\" (one epoch of 1,000 training samples, the fit loop with its in-loop "
             "validations and generated samples under the lab's eval settings: interval 25, 100 batches, 100 new "
             "tokens) against `tunelab.runtime`: compute FLOPs / (peak x ETA) + memory-bound bytes / (bandwidth x "
             f"MU) + iterations x OVERHEAD_S, with ETA {runtime.ETA}, MU {runtime.MU}, OVERHEAD_S "
             f"{runtime.OVERHEAD_S} s fitted on these rows (a refit now gives {fitted[0]:.4f}, {fitted[1]:.4f}, "
             f"{fitted[2]:.4f}). Leave-one-out: each row estimated with the constants refitted without it. "
             f"Padded tokens per sample: the lab's {LAB_PADDED_TOKENS_PER_SAMPLE}.", "",
             f"- Leave-one-out error: mean absolute {sum(loo) / len(loo):.1%}, worst {worst['loo_error']:+.1%} "
             f"({worst['id']}: the only QLoRA row, the one that holds the memory-bound constant); in-sample worst "
             f"{max(rows, key=lambda r: abs(r['error']))['error']:+.1%} "
             f"({max(rows, key=lambda r: abs(r['error']))['id']}).", "",
             "| row | recipe | lab s | estimate s | error | leave-one-out s | error | optimizer steps | validations | "
             "compute s | memory-bound s | overhead s |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['id']} | {r['recipe']} | {r['lab_s']:.1f} | {r['estimate_s']:.1f} | {r['error']:+.1%} | "
                     f"{r['loo_estimate_s']:.1f} | {r['loo_error']:+.1%} | {r['optimizer_steps']} | "
                     f"{r['evaluations']} | {r['compute_s']:.1f} | {r['memory_s']:.1f} | {r['overhead_s']:.1f} |")
    return lines


def runtime_terms(args: dict, x: planner.PlanInput, tokens_per_sample: float | None):
    """The recipe's run as tunelab.runtime.Terms: its data's size and split (or the lab's 2,000 samples), epochs or
    max_steps, eval settings, padded tokens per sample."""
    from tunelab import runtime

    n, _ = settings.data_size(args)
    n = n or 2000
    val = (args.get("data") or {}).get("init_args", {}).get("val_split_fraction") or 0
    train_samples = int(n * (1 - val))
    return runtime.terms(x, args, train_samples, n - train_samples, tokens_per_sample or LAB_PADDED_TOKENS_PER_SAMPLE)


def _lab_runtime_items() -> list:
    """(row, terms, peak FLOP/s, bandwidth B/s, lab seconds) for every Part 1 row with a time: the row's settings
    under the lab's eval settings, one epoch of the lab's 1,000 training samples (1,000 more validate)."""
    from tunelab import runtime
    from tunelab.sweep import load

    items = []
    for r in load(CONFIGS_DIR / "sweeps" / "lab-part1.yaml").rows:
        if not r.lab.get("time_s"):
            continue
        extra = [*r.overrides(), *settings.to_overrides(runtime.LAB_EVAL)]
        x, _, _, resolved = plan_recipe(r.recipe, extra, gpu=r.gpu)
        t = runtime.terms(x, resolved, 1000, 1000, LAB_PADDED_TOKENS_PER_SAMPLE)
        g = hardware.lookup(r.gpu)
        items.append((r, t, g.peak_flops(x.precision, "high"), g.bandwidth_gbs * 1e9, float(r.lab["time_s"])))
    return items


def fit_runtime_constants(items: list | None = None) -> tuple[float, float, float]:
    """(ETA, MU, OVERHEAD_S) fitted on every lab row with a time: what tunelab.runtime holds."""
    from tunelab import runtime

    return runtime.fit([item[1:] for item in (items or _lab_runtime_items())])


def runtime_rows(items: list | None = None) -> list[dict]:
    """Each lab row's time beside the estimate with tunelab.runtime's constants and the estimate with the constants
    refitted without that row (leave-one-out), and the split of the estimate into its terms."""
    from tunelab import runtime

    items = items or _lab_runtime_items()
    fitted = (runtime.ETA, runtime.MU, runtime.OVERHEAD_S)
    rows = []
    for i, (r, t, peak, bw, secs) in enumerate(items):
        loo = runtime.fit([item[1:] for j, item in enumerate(items) if j != i])
        est, est_loo = t.seconds(peak, bw, *fitted), t.seconds(peak, bw, *loo)
        rows.append({"id": r.id, "recipe": r.recipe.key, "note": r.note, "gpu": r.gpu, "lab_s": secs,
                     "estimate_s": est, "error": est / secs - 1, "loo_estimate_s": est_loo,
                     "loo_error": est_loo / secs - 1, **t.detail,
                     "compute_s": t.compute_flops / (peak * fitted[0]), "memory_s": t.memory_bytes / (bw * fitted[1]),
                     "overhead_s": t.iterations * fitted[2]})
    return rows
