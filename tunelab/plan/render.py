"""``tunelab plan`` as text: the breakdown, the verdict, the time and energy, and ``--measure``'s table."""

from __future__ import annotations

import json

from tunelab import hardware
from tunelab.plan import advise
from tunelab.plan.model import kernels, memory, runtime, strategies
from tunelab.plan.model.fast_step import FAST_START_EXTRA_S
from tunelab.plan.model.strategies import zero
from tunelab.plan.projection import Projection
from tunelab.plan.recipe import PlannedRecipe
from tunelab.plan.trace import measure, ranks
from tunelab.units import BILLION, GB, duration, energy, gb, tokens


def render(
    planned: PlannedRecipe, gpu: hardware.GPU | None = None, projection: Projection | None = None, tokens_note: str = ""
) -> str:
    """The plan as text: the breakdown summing to the peak, the verdict for ``gpu``, the notes, time and energy."""
    plan = planned.plan
    lines = _memory_lines(plan, planned.seq_source, _strategy(planned)) + _verdict_lines(planned, gpu)
    lines += [f"note: {note}" for note in plan.notes]
    lines += [f"warning: litgpt's loop would hang: {w}" for w in planned.warnings]
    if projection:
        lines += _time_lines(projection, tokens_note)
    return "\n".join(lines)


def output(planned, gpu, projection, tokens_note: str, extras: dict, as_json: bool, verbose: bool) -> str:
    """What ``tunelab plan`` prints: one JSON object, the whole plan (``verbose``) or its answer, then what
    ``--measure`` and ``--simulate`` added (``extras``: measured, simulated, by_kernel; None where not asked)."""
    measured, simulated, by_kernel = extras["measured"], extras["simulated"], extras["by_kernel"]
    if as_json:
        out = planned.plan.to_json()
        out["seq_len_source"] = planned.seq_source
        out["strategy_described"] = planned.strategy
        out["warnings"] = planned.warnings
        if projection:
            out["projection"] = {**projection.__dict__, "tokens_source": tokens_note}
        if measured:
            out["measured_activations"] = measured
        if simulated:
            out["simulated"] = simulated.to_json()
        if by_kernel is not None:
            out["step_by_kernel"] = kernels.to_json(by_kernel)
        return json.dumps(out, indent=2)
    parts = [render(planned, gpu, projection, tokens_note) if verbose else render_answer(planned, projection)]
    if measured:
        parts.append(render_measured(measured, planned.input.micro_batch_size))
    if simulated:
        parts.append(render_simulation(simulated, planned.plan))
    if by_kernel is not None:
        parts.append(kernels.render(by_kernel))
    return "\n".join(parts)


def largest_micro_batch(planned: PlannedRecipe) -> str:
    """The verdict's last words: the largest micro batch that fits, or, where not even one sample does, what
    shrinks the peak."""
    if planned.plan.max_micro_batch_size:
        return f"largest micro batch that fits: {planned.plan.max_micro_batch_size}"
    case, plan = planned.input, planned.plan
    need = plan.predicted_reserved_bytes + plan.cuda_context_bytes
    kept = plan.breakdown_bytes.get("activations", 0)  # what checkpointing shrinks to the block inputs
    fixes = ["--activation-checkpointing (block inputs only)"] * (
        not case.activation_checkpointing and need - kept < plan.gpu_memory_bytes
    )
    fixes += ["--precision bf16-true (half the bytes of weights and states)"] * str(case.precision).startswith("32")
    fixes += ["more devices under a sharding --strategy"] * (not case.quantize)  # QLoRA trains on one device
    return f"not even micro batch 1 fits: {', '.join([*fixes, 'a GPU with more memory'])}"


def render_answer(planned: PlannedRecipe, projection: Projection | None = None) -> str:
    """The plan's answer in about ten lines: the verdict with its margin and the largest micro batch, the peak per
    device by its largest terms, the time with its band and its causes, energy, the price where the price table
    knows the GPU, and how many notes ``--verbose`` shows (with the breakdown and where each figure comes from)."""
    plan = planned.plan
    where = f"{plan.devices} device(s), {_strategy(planned)}, {plan.precision}, micro batch {plan.micro_batch_size}"
    head = f"{plan.model} {plan.method} ({where}, sequence {plan.seq_len})"
    lines = [head]
    if plan.gpu:
        need = plan.predicted_reserved_bytes + plan.cuda_context_bytes
        word = "AT THE EDGE" if plan.edge else ("FITS" if plan.fits else "DOES NOT FIT")
        lines.append(
            f"{word} on {plan.gpu}: needs {need / GB:.2f} of {plan.gpu_memory_bytes / GB:.2f} GB, margin "
            f"{plan.margin_bytes / GB:+.2f} GB; {largest_micro_batch(planned)}"
        )
    terms = sorted(((v, k) for k, v in plan.breakdown_bytes.items() if v), reverse=True)
    shown = ", ".join(f"{k.replace('_', ' ')} {v / GB:.2f}" for v, k in terms[:3])
    lines.append(
        f"peak allocated per device {gb(plan.peak_allocated_bytes, '.2f')} GB (1e9 B): {shown}"
        + (f", {len(terms) - 3} more" if len(terms) > 3 else "")
    )
    if projection is not None:
        price = advise.prices().get(plan.gpu) if plan.gpu else None
        lines += _answer_time(projection, price, planned.input.world, plan.edge)
    elif plan.gpu is None:
        lines.append("time, energy and a verdict: name a GPU (--gpu H100-SXM, ...)")
    lines += [f"warning: litgpt's loop would hang: {w}" for w in planned.warnings]
    more = len(plan.notes)
    lines.append(f"--verbose: the breakdown, where each figure comes from{f' and {more} note(s)' if more else ''}")
    return "\n".join(lines)


def _answer_time(p: Projection, price, world: int, edge: bool = False) -> list[str]:
    """The time, its causes, energy and price lines of :func:`render_answer` (``edge``: the plan is at the edge of
    memory, its band's high end stretched for the allocator's retries)."""
    if p.seconds_low is None:  # a precision the GPU has no peak for: the one line that says so
        return [f"time and energy: {p.seconds_source}"]
    if p.seconds:
        band = f"{duration(p.seconds_band[0])} to {duration(p.seconds_band[1])}"
        time_line = f"time: {duration(p.seconds)} (band {band}) for {tokens(p.tokens, 'padded tokens')}"
        if edge:
            time_line += f" (at the edge: retries may stretch each step up to {runtime.EDGE_STRETCH}x)"
        if p.lower_bound:
            time_line += f" (a lower bound: {p.lower_bound})"
    else:
        time_line = (
            f"time: {duration(p.seconds_low)} to {duration(p.seconds_high)} (MFU {p.mfu_low:.0%}-{p.mfu_high:.0%})"
        )
    if p.mfu_predicted_padded is not None:
        time_line += f"; predicted MFU {p.mfu_predicted_padded:.1%} on padded tokens"
    lines = [time_line]
    if p.seconds_by_cause:
        total = sum(p.seconds_by_cause.values())
        top = sorted(((v, k) for k, v in p.seconds_by_cause.items() if v >= total / 20), reverse=True)
        lines.append("  by cause: " + ", ".join(f"{k} {v / total:.0%}" for v, k in top))
    elif p.seconds_by_cause_source:
        lines.append(f"  by cause: {p.seconds_by_cause_source[:100]}")
    if p.fast_saved_per_step_s is not None:
        lines.append("  " + _fast_pays(p))
    where = [w for w in (p.host_source and f"host: {p.host_source}", p.link_source and f"link: {p.link_source}") if w]
    if where:
        lines.append("  " + "; ".join(where))
    if p.checked:
        lines.append(f"  checked: {p.checked}")
    if p.calibration is not None:
        lines.append(f"  --calibrate: {p.calibration}")
    power = "the power measured in a record" if p.power_measured else "board power, an upper bound"
    line = f"energy: {energy(p.energy_j_low)} to {energy(p.energy_j_high)} ({power})"
    if price is not None and p.seconds:
        hours = p.seconds / 3600 * world
        line += f"; price: {price.usd_per_hour * hours:,.2f} USD at {price.usd_per_hour:g} USD/h per GPU"
    lines.append(line)
    return lines


def _fast_pays(p: Projection) -> str:
    """The fast path against stock litgpt end to end: its later start, the time a step saves, where it pays."""
    warm, cold = FAST_START_EXTRA_S
    start = f"fast path: starts {warm:.0f}-{cold:.0f} s after litgpt (warm-cold compile cache)"
    if p.fast_break_even_steps is None:
        return f"{start} and saves no time a step here: stock litgpt is the faster end to end"
    n_warm, n_cold = p.fast_break_even_steps
    return (
        f"{start}, saves {p.fast_saved_per_step_s:.2f} s a step: ahead from {n_warm:.0f}-{n_cold:.0f} optimizer steps"
    )


def _strategy(planned: PlannedRecipe) -> str:
    """The strategy planned, in a few words: the file's (FSDP1's sharding, FSDP2, the ZeRO stage), else litgpt's own
    on several devices (FSDP1 for full fine-tuning, FSDP2 for LoRA, each block checkpointed)."""
    if planned.strategy_config is not None:
        return planned.strategy_config.label()
    case = planned.input
    if case.world == 1:
        return planned.plan.strategy
    return f"litgpt's {strategies.of(case).label}" + (", blocks checkpointed" if case.activation_checkpointing else "")


def _memory_lines(plan: memory.Plan, seq_source: str, strategy: str) -> list[str]:
    """What is planned, and the peak per device by term (GB = 1e9 bytes), reserved, the CUDA context, host RAM."""
    lines = [
        f"plan: {plan.model} {plan.method} on {plan.gpu or '(no GPU named: --gpu for a verdict)'} "
        f"({plan.devices} device(s), {strategy}), {plan.precision}, micro batch {plan.micro_batch_size}, "
        f"sequence {plan.seq_len} ({seq_source})",
        f"model: {plan.params / BILLION:.2f} B parameters, {plan.trainable_params / 1e6:,.1f} M trainable",
        "predicted peak allocated per device, GB (1e9 bytes):",
    ]
    lines += [f"  {k:<28}{gb(v, '9.2f')}" for k, v in plan.breakdown_bytes.items() if v]
    lines.append(f"  {'= peak allocated':<28}{gb(plan.peak_allocated_bytes, '9.2f')}   (litgpt's 'Memory Used')")
    slack = f"reserved (x{memory.ALLOCATOR_SLACK:.2f} slack)"
    lines.append(f"  {slack:<28}{gb(plan.predicted_reserved_bytes, '9.2f')}")
    lines.append(f"  {'+ CUDA context':<28}{gb(plan.cuda_context_bytes, '9.2f')}")
    if plan.host_ram_bytes:
        lines.append(f"  host RAM (offload)          {gb(plan.host_ram_bytes, '9.2f')}")
    return lines


def _verdict_lines(planned: PlannedRecipe, gpu: hardware.GPU | None) -> list[str]:
    """The fit verdict on the named GPU (none without one)."""
    plan = planned.plan
    if not plan.gpu:
        return []
    need = plan.predicted_reserved_bytes + plan.cuda_context_bytes
    word = (
        (
            "AT THE EDGE (" + ("fits" if plan.fits else "short") + " by less than "
            f"{memory.EDGE_FRACTION:.0%} of memory: allocator fragmentation decides; expect retries)"
        )
        if plan.edge
        else ("FITS" if plan.fits else "DOES NOT FIT")
    )
    lines = [
        f"verdict: {word} on {plan.gpu}: needs {need / GB:.2f} GB of "
        f"{plan.gpu_memory_bytes / GB:.2f} GB, margin {plan.margin_bytes / GB:+.2f} GB; "
        f"{largest_micro_batch(planned)}"
    ]
    if gpu is not None:
        lines.append(f"  GPU memory: {gpu.cuda_total_gib:.2f} GiB usable by CUDA ({gpu.cuda_total_source})")
    return lines


def _time_lines(p: Projection, tokens_note: str) -> list[str]:
    """The tokens, FLOPs, the MFU range's times, the point estimate, energy, the time by cause, checkpoints and
    communication."""
    if p.seconds_low is None:
        return [f"time: {p.tokens / 1e6:.2f} M padded tokens ({tokens_note}); time and energy {p.seconds_source}"]
    lines = [
        f"time: {p.tokens / 1e6:.2f} M padded tokens ({tokens_note}); {p.flops_per_token / BILLION:.2f} GFLOPs/token "
        f"[{p.flops_formula}]",
        f"  at MFU {p.mfu_low:.0%}-{p.mfu_high:.0%} ({p.mfu_source}): "
        f"{p.seconds_low:,.0f} s to {p.seconds_high:,.0f} s",
        (
            f"  point estimate of the training time: {p.seconds:,.0f} s ({p.seconds_band[0]:,.0f}-"
            f"{p.seconds_band[1]:,.0f} s; {p.seconds_source})"
            + (f"; a lower bound: {p.lower_bound}" if p.lower_bound else "")
            if p.seconds
            else f"  {p.seconds_source}"
        ),
        f"  energy: {energy(p.energy_j_low)} to {energy(p.energy_j_high)}, "
        f"{p.energy_j_per_million_tokens_low / 1e3:,.1f}-{p.energy_j_per_million_tokens_high / 1e3:,.1f} kJ "
        f"per million tokens; power: {p.power_source}",
    ]
    if p.checked:
        lines.append(f"  checked: {p.checked}")
    if p.seconds_by_cause:
        lines += _by_cause_lines(p)
    elif p.seconds_by_cause_source:
        lines.append(f"  time by cause: {p.seconds_by_cause_source}")
    if p.comm_bytes_per_step is not None:
        moved = ", ".join(f"{v / GB:.2f} GB over the {k} link" for k, v in p.comm_bytes_per_step.items() if v)
        lines.append(
            f"  communication per optimizer step and device: {moved or 'none'}: {p.comm_seconds_per_step:.3f} s "
            f"before overlap (included above) [{p.comm_source}]"
        )
    if p.comm_bytes_per_forward:
        lines.append(
            f"  gathered per validation batch and generated token: {p.comm_bytes_per_forward / GB:.2f} GB, "
            f"{p.comm_seconds_per_forward:.3f} s (what their compute does not hide: in communication above)"
        )
    return lines


def _by_cause_lines(p: Projection) -> list[str]:
    """The time by cause (causes under 1% of the total left out of the line, not the sum), the predicted MFU, and
    the checkpoint saves in and after the loop."""
    total = sum(p.seconds_by_cause.values())
    causes = (
        ", ".join(
            f"{k} {v:,.0f}" if v >= 10 else f"{k} {v:.2g}" for k, v in p.seconds_by_cause.items() if v >= total / 100
        )
        + " s"
    )
    if p.mfu_predicted_padded is not None:
        real = f", {p.mfu_predicted_real:.1%} on real" if p.mfu_predicted_real is not None else ""
        causes += f"; predicted MFU {p.mfu_predicted_padded:.1%} on padded tokens{real}"
    saves = p.seconds_by_cause.get("checkpoint saves", 0.0)
    return [
        f"  time by cause: {total:,.0f} s = {causes} [{p.seconds_by_cause_source}]",
        f"  checkpoints: {saves:,.0f} s of in-loop saves (included above); after the loop (not in litgpt's "
        f"Training Time) {p.bytes_after_loop / GB:,.2f} GB written, {p.seconds_after_loop:,.0f} s "
        f"[at {p.save_bytes_per_s / GB:g} GB/s, "
        + (
            "--save-gbs]"
            if p.save_bytes_per_s != runtime.CHECKPOINT_WRITE_BYTES_PER_S
            else "torch.save's rate on a fast local disk; --save-gbs for yours]"
        ),
    ]


def render_measured(m: dict, micro: int) -> str:
    """``plan --measure``: what autograd kept in one real forward (x the micro batch) beside the planner's term."""
    lines = [
        f"\nactivations, measured (autograd's saved tensors, one real forward on this CPU) vs planned, for micro "
        f"batch {micro} (the measurement x {micro}; GB = 1e9 bytes):"
    ]
    for what, key in (
        ("a block", "block"),
        ("the first block", "first_block"),
        ("head and loss", "head"),
        (f"all {m['n_layer']} blocks + head", "total"),
    ):
        mb, pb = m[f"measured_{key}"] * micro, m[f"planned_{key}"] * micro
        lines.append(
            f"  {what:<22} measured {mb / GB:8.3f}  planned {pb / GB:8.3f}  ({(pb - mb) / mb:+.1%})"
            if mb
            else f"  {what}: nothing measured"
        )
    lines.append(
        "  (planned for the kernels the measurement runs: CUDA's 1-byte dropout masks, torch's CPU flash attention; "
        "at 32-true CUDA runs the memory-efficient kernel, whose output the projection reads as a view: the plan "
        "above counts that)"
    )
    return "\n".join(lines)


def render_simulated(sim, plan) -> str:
    """``plan --simulate``: each phase's peak of the simulated step, what is alive there, beside the plan."""
    kinds = (
        ("Parameter", "weights"),
        ("Gradient", "grads"),
        ("Activation", "activations"),
        ("Temp", "temps"),
        ("Optstate", "optimizer"),
    )
    lines = [
        f"\nsimulated step (litgpt's model on fake tensors under torch's MemTracker; {sim.layers_built[0]} and "
        f"{sim.layers_built[1]} blocks extrapolated to {sim.n_layer}; {sim.seconds:.1f} s): peak allocated per phase, "
        "GB = 1e9 bytes",
        f"  {'phase':<15}{'total':>8}" + "".join(f"{label:>13}" for _, label in kinds) + "  running there",
    ]
    for phase, snap in sim.phases.items():
        lines.append(
            f"  {phase:<15}{snap['Total'] / GB:8.2f}"
            + "".join(f"{snap.get(k, 0) / GB:13.2f}" for k, _ in kinds)
            + f"  {sim.where.get(phase, '')}"
        )
    planned = plan.peak_allocated_bytes
    lines.append(
        f"  peak: {sim.peak_phase}, {sim.peak_bytes / GB:.2f} GB simulated; planned {planned / GB:.2f} GB "
        f"({(planned - sim.peak_bytes) / sim.peak_bytes:+.1%})"
    )
    lines += [f"  ({note})" for note in sim.notes]
    return "\n".join(lines)


def render_simulation(sim, plan) -> str:
    """Any simulation beside the plan: rank 0's (:func:`tunelab.plan.trace.ranks.render`), DeepSpeed's sizes, or the one-device step's."""
    if isinstance(sim, zero.ZeroSizes):
        return zero.render_zero_sizes(sim, plan)
    return ranks.render(sim, plan) if isinstance(sim, ranks.RankSimulation) else render_simulated(sim, plan)


def added(case, gpu, strategy_name: str, measured: bool, simulated: bool) -> dict:
    """What ``plan --measure`` and ``--simulate`` add beside the plan of PlanInput ``case`` (None where not asked):
    the measured step on this machine, the simulated step (rank 0's under ``strategy_name`` on several devices) and,
    with a GPU on one device, the step by kernel."""
    return {
        "measured": measure.for_plan(case) if measured else None,
        "simulated": ranks.simulation(case, strategy_name) if simulated else None,
        "by_kernel": kernels.for_plan(case, gpu) if simulated and gpu is not None and case.world == 1 else None,
    }
