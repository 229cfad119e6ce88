"""Time and energy of a planned run: a range from an MFU range (or the measured MFU and power of the nearest run
record, ``--calibrate``), and the point estimate of litgpt's "Training Time" (:mod:`tunelab.plan.model.runtime`).
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from tunelab import hardware
from tunelab import record as record_mod
from tunelab.data.lengths import default_lengths, padded_tokens_per_sample
from tunelab.models import lora_param_count, sliding_window_layers
from tunelab.plan.model import comm as comm_mod
from tunelab.plan.model import runtime, strategies
from tunelab.plan.model.fast_step import COMPILED_HOST_S_PER_KERNEL, FAST_MODEL_ERROR, FAST_START_EXTRA_S, fast_step
from tunelab.plan.model.flops import flops_per_token
from tunelab.plan.model.memory import PlanInput
from tunelab.plan.recipe import PlannedRecipe, data_lengths, epoch_tokens, runtime_terms
from tunelab.units import GB

OFFLOADED = "the optimizer step on the CPU (offload) is not timed"
"""Why an offloaded run's time is a lower bound."""
DEFAULT_MFU_RANGE = (0.25, 0.55)
"""The MFU range a projection assumes without a measurement."""


@dataclass
class Projection:
    """The runtime and energy of a run: a range from an MFU range, and a point estimate (tunelab.plan.model.runtime)."""

    tokens: float
    """Tokens to process (padded), all devices."""
    flops_per_token: float
    flops_formula: str
    mfu_low: float
    mfu_high: float
    mfu_source: str
    """Where the MFU range comes from (a default range, or the calibration record)."""
    peak_flops_per_device: float
    seconds_low: float | None
    """The MFU range's times (fast end first); None, with the energies, where the GPU has no peak for the
    precision's compute type (``seconds_source`` says why)."""
    seconds_high: float | None
    power_w: float
    power_source: str
    power_measured: bool
    """Whether ``power_w`` was measured (a calibration record's mean power), not the board's power (an upper
    bound)."""
    calibration: str | None
    """What ``--calibrate``'s records gave, in one line: the run whose MFU and power were taken, or why none was
    (None: not asked)."""
    energy_j_low: float | None
    """The power (board power, an upper bound, or a calibration record's measured power) x devices x the time: the
    point estimate's band where there is one (as the price and ``advise`` take it), else the MFU range's times."""
    energy_j_high: float | None
    energy_j_per_million_tokens_low: float | None
    energy_j_per_million_tokens_high: float | None
    seconds: float | None = None
    """Point estimate of litgpt's "Training Time" for the run: the kernel-level model's causes summed
    (``seconds_by_cause``) where it applies, else tunelab.plan.model.runtime's fitted curve (compute + memory-bound work +
    per-iteration overhead, constants fitted on the lab's A100 times); None without the GPU's bandwidth."""
    seconds_band: tuple | None = None
    """seconds x (1 -/+ the estimate's error: the kernel model's widest miss where the GPU bounds a run we hold (ours,
    the lab's A100 rows), widened to the hosts we measured, the kernels at that miss there too; the fitted curve's
    leave-one-out mean absolute error on the lab's rows)."""
    seconds_source: str = ""
    comm_bytes_per_step: dict | None = None
    """Bytes one device moves per optimizer step over each link ({'gpu': ..., 'node': ..., 'host': ...}), None on
    one device (tunelab.plan.model.comm)."""
    comm_seconds_per_step: float | None = None
    """Seconds that traffic takes per optimizer step, before overlap (its calls' latency included)."""
    comm_bytes_per_forward: float | None = None
    """Bytes one device gathers per forward without gradients (a validation batch, a generated token) under a
    sharded strategy, None on one device; the run's seconds count what its compute does not hide."""
    comm_seconds_per_forward: float | None = None
    """Seconds those gathers take, their calls' latency included."""
    comm_latency_per_step: float | None = None
    """Of those, the seconds of NCCL's ring latency over the step's collective calls (tunelab.plan.model.comm)."""
    comm_source: str = ""
    """The links, their achieved bandwidth and the volume formula; the seconds above include the exposed part."""
    seconds_by_cause: dict | None = None
    """The run's seconds by cause from the kernel-level model (tunelab.plan.model.runtime.Terms.by_cause: matmul,
    attention, elementwise, optimizer, kernel gaps, host launches, validation, generation, communication; they sum to
    ``seconds``), None where it does not apply (``seconds_by_cause_source`` says why; ``seconds`` is then the
    fitted curve's)."""
    seconds_by_cause_source: str = ""
    host_source: str = ""
    """Where the time the host takes per op comes from (the hosts we measured, ``--host-us-per-op``, the fast
    path's fitted constant); empty for the fitted curve."""
    link_source: str = ""
    """The links several devices' traffic crosses and where they come from (``--interconnect``, ``--internode``, or
    the GPU's own); empty on one device."""
    checked: str = ""
    """What the time is checked against on this GPU: its row's timed runs, or that none are
    (:func:`tunelab.hardware.time_checked`); empty where there is no time."""
    fast_saved_per_step_s: float | None = None
    """tunelab's fast path: seconds each optimizer step takes less than stock litgpt's at the recipe's settings
    (litgpt's padding against the fast path's), the kernel model's both; None for litgpt's own loop."""
    fast_break_even_steps: tuple | None = None
    """The optimizer steps from which the fast path's whole run is the shorter, its start-up
    (:data:`tunelab.plan.model.fast_step.FAST_START_EXTRA_S`) warm and cold; None where it saves nothing a step."""
    seconds_after_loop: float | None = None
    """Seconds after litgpt's loop (outside its Training Time, inside the wall time paid for): the final checkpoint
    and, for LoRA and QLoRA, the merged model litgpt writes (:func:`tunelab.plan.model.runtime.checkpoint_bytes`)."""
    bytes_after_loop: float | None = None
    """The bytes written after the loop (GB = 1e9 bytes when printed)."""
    save_bytes_per_s: float | None = None
    """The write rate the checkpoint saves are timed at (bytes per second: ``--save-gbs``, else
    :data:`tunelab.plan.model.runtime.CHECKPOINT_WRITE_BYTES_PER_S`)."""
    lower_bound: str = ""
    """Why the time is a lower bound where it is one (an optimizer step on the CPU, which nothing times yet); empty
    otherwise."""
    mfu_predicted_padded: float | None = None
    """The run's training FLOPs on padded tokens over its predicted seconds (validation and generation included)
    x devices x the peak: the MFU the kernel model predicts."""
    mfu_predicted_real: float | None = None
    """The same on real (unpadded) tokens, where their count is known (the data's lengths or the default
    distribution's; not with --tokens-per-sample)."""


def calibration(
    records_dir: Path, model: str, method: str, precision: str, micro: int, strategy: str | None = None, gpu=None
):
    """The measured run of this model, method and precision on this GPU (``gpu``: its table row; None: any) nearest
    to this configuration: the same strategy first when given, then the nearest micro batch. Another model's or
    GPU's MFU and power say nothing of this run's: such records, those that cannot be read, and those whose MFU is
    not in (0, 1] are passed over and counted (types and ranges are checked by :func:`tunelab.record.load`):
    ((record, path) or None, {why passed over: count})."""
    best, best_key = None, None
    passed: Counter = Counter()
    for path in sorted(Path(records_dir).rglob("record.json")):
        try:
            rec = record_mod.load(path)
        except (ValueError, OSError):
            passed["unreadable or mistyped"] += 1
            continue
        if rec.status != "ok" or rec.mfu is None or not 0 < rec.mfu <= 1:
            passed["not ok" if rec.status != "ok" else "no MFU in (0, 1]"] += 1
            continue
        if (rec.model_name, rec.method, rec.precision) != (model, method, precision):
            passed[f"another model, method or precision than {model} {method} {precision}"] += 1
            continue
        measured_on = hardware.identify(rec.device_name or "")
        if gpu is not None and (measured_on is None or measured_on.name != gpu.name):
            passed[f"measured on another GPU than {gpu.name}"] += 1
            continue
        key = (
            strategy is not None and (rec.strategy or "litgpt") != strategy,
            abs(math.log2(max(rec.micro_batch_size or 1, 1)) - math.log2(max(micro, 1))),
        )
        if best_key is None or key < best_key:
            best, best_key = (rec, path), key
    return best, passed


def project(
    case: PlanInput,
    gpu: hardware.GPU,
    tokens: float,
    calibrate_dir: Path | None = None,
    mfu_range: tuple[float, float] = DEFAULT_MFU_RANGE,
    work=None,
    strategy: str | None = None,
) -> Projection:
    """The runtime and energy range from an MFU range (or a measured run's MFU), and with ``work`` (the run's
    tunelab.plan.model.runtime.Terms) the point estimate."""
    n_lora = lora_param_count(case.config, case.lora_r, case.lora_targets) if case.lora else 0
    fpt = flops_per_token(case.config, case.seq_len, "full" if case.method == "full" else "lora", n_lora)
    peak = gpu.training_peak(case.precision) or 0.0
    measured = _mfu_and_power(case, gpu, calibrate_dir, mfu_range, strategy)
    lo, hi, power = measured["mfu_low"], measured["mfu_high"], measured["power_w"]
    world = case.world
    total_flops = fpt.total * tokens
    if peak:
        t_low, t_high = total_flops / (hi * peak * world), total_flops / (lo * peak * world)
        if work is not None and work.comm is not None:
            t_low, t_high = t_low + work.comm_beside(t_low), t_high + work.comm_beside(t_high)
        estimate = {**_point_estimate(work, gpu, peak), **_by_cause(work, gpu, peak)}
        if estimate.get("seconds") is not None and strategies.of(case).off_device(case):
            estimate["lower_bound"] = OFFLOADED
        low, high = estimate.get("seconds_band") or (t_low, t_high)  # the point estimate's band where there is one
        e_low, e_high = power * world * low, power * world * high
    else:  # a precision the GPU has no peak for: no time, no energy, one line why
        t_low = t_high = e_low = e_high = None
        why = _not_timed(case, gpu)
        estimate = {"seconds_source": why, "seconds_by_cause_source": why}
    return Projection(
        tokens=tokens,
        flops_per_token=fpt.total,
        flops_formula=fpt.formula,
        peak_flops_per_device=peak,
        seconds_low=t_low,
        seconds_high=t_high,
        **measured,
        energy_j_low=e_low,
        energy_j_high=e_high,
        energy_j_per_million_tokens_low=None if e_low is None else e_low / tokens * 1e6 if tokens else 0.0,
        energy_j_per_million_tokens_high=None if e_high is None else e_high / tokens * 1e6 if tokens else 0.0,
        **estimate,
        **_comm_fields(work),
    )


def _not_timed(case: PlanInput, gpu: hardware.GPU) -> str:
    """Why a precision ``gpu`` has no peak for (bfloat16 on a T4 or a V100) is not timed, and what to plan instead
    (the memory plan and the communication's volume stand)."""
    kind = hardware.precision_compute_dtype(case.precision, "high", gpu)
    why = f"not estimated: configs/hardware/gpus.yaml gives the {gpu.name} no {kind} peak"
    if kind == "bf16":  # litgpt trains a quantized model at no mixed precision
        fix = "16-true" if case.quantize else "16-mixed or 16-true"
        why += f" (it computes no bfloat16: torch emulates it, far slower); fix: --precision {fix}"
    return why


def _mfu_and_power(case: PlanInput, gpu: hardware.GPU, calibrate_dir, mfu_range, strategy) -> dict:
    """The projection's MFU range, power and calibration fields: the range asked and the board's power, or a
    calibration record's measured MFU and power where one matches (:func:`calibration`)."""
    lo, hi, source = mfu_range[0], mfu_range[1], f"default range {mfu_range[0]:.0%}-{mfu_range[1]:.0%}"
    power, power_source = float(gpu.tdp_w), f"{gpu.name} board power {gpu.tdp_w} W (upper bound, not measured)"
    measured, calibrated = False, None
    if calibrate_dir:
        found, passed = calibration(
            calibrate_dir, case.config.name, case.method, case.precision, case.micro_batch_size, strategy, gpu
        )
        skipped = "; ".join(f"{n} record(s) passed over: {why}" for why, n in passed.items())
        if not found:
            calibrated = f"no usable record under {calibrate_dir}{': ' + skipped if skipped else ''}"
            source += f" ({calibrated})"
        else:
            rec, path = found
            lo = hi = rec.mfu
            calibrated = f"run {rec.sweep or ''}/{rec.row_id} ({path})"
            source = (
                f"measured MFU {rec.mfu:.1%} of run {rec.sweep or ''}/{rec.row_id} ({rec.model_name} "
                f"{rec.method} {rec.precision} micro {rec.micro_batch_size} on {rec.device_name}; {path})"
                + (f" ({skipped})" if skipped else "")
            )
            if rec.power_mean_w and rec.power_mean_w > 0:
                power, measured = rec.power_mean_w / max(rec.device_count, 1), True
                power_source = f"measured mean {power:.0f} W per GPU in that run"
            calibrated += f": measured MFU {rec.mfu:.1%} (the MFU range --verbose shows), " + (
                f"{power:.0f} W per GPU (the energy)" if measured else "no power measured (the energy is the board's)"
            )
    return {
        "mfu_low": lo,
        "mfu_high": hi,
        "mfu_source": source,
        "power_w": power,
        "power_source": power_source,
        "power_measured": measured,
        "calibration": calibrated,
    }


def _by_cause(work, gpu: hardware.GPU, peak: float) -> dict:
    if work is None:
        return {}
    if not isinstance(work.kernels, runtime.KernelWork):
        return {"seconds_by_cause_source": f"not modelled: {work.kernels}"}
    causes = work.by_cause(gpu)
    d, seconds = work.detail, sum(causes.values())
    after = {
        "seconds_after_loop": work.save_seconds(after_loop=True),
        "bytes_after_loop": d["final_save_bytes"],
        "save_bytes_per_s": work.save_bytes_per_s,
    }
    mfu = d["train_flops"] / (seconds * d["world"] * peak) if seconds and peak else None
    real = d.get("real_tokens_per_sample")
    return {
        **after,
        "mfu_predicted_padded": mfu,
        "mfu_predicted_real": mfu * real / work.kernels.step.tokens if mfu is not None and real else None,
        "seconds_by_cause": causes,
        "seconds_by_cause_source": (
            f"kernel-level model (tunelab/plan/model/kernels.py, runtime.Terms.by_cause) on {gpu.name}: constants "
            "fitted on our H100 and H200 profiles and H100 Part 1 rows; checked in reports/planner-accuracy/runtime.md"
            + _host_bound_note(causes.get("host launches", 0.0), seconds, work.kernels)
            if work.kernels.fast is None
            else f"tunelab's loop with its speed switches, kernel by kernel (tunelab/plan/model/fast_step.py) on {gpu.name}:"
            " compiled blocks from torch.compile's own graphs, Liger's chunks, the fused optimizer, launches queued "
            "ahead of the GPU; checked against our H100 bench in reports/planner-accuracy/runtime.md"
        ),
    }


HOST_BOUND_SHARE = 0.25
"""The share of a plan's time spent waiting on the host's launches above which ``plan`` says the run is host-bound."""


def _host_bound_note(host_s: float, seconds: float, work: runtime.KernelWork) -> str:
    """A sentence for a plan whose time is mostly the host launching kernels (:data:`HOST_BOUND_SHARE`): that share
    follows the machine's CPU, not its GPU, and what shortens it (QLoRA: bitsandbytes' own Python is much of it, and
    the fast path's model does not take QLoRA; sliding-window layers: litgpt's mask, built row by row; a sharding
    wrapper's own work); "" otherwise."""
    if not seconds or host_s < HOST_BOUND_SHARE * seconds:
        return ""
    shorten = (
        "a larger micro batch shortens it (much of it is bitsandbytes' Python: per 4-bit matmul and PagedAdamW's "
        "step tensor by tensor, tunelab/plan/model/bnb_kernels.py)"
        if work.step.method == "qlora"
        else "a larger micro batch or the fast path's compiled blocks (configs/strategies/fast.yaml) shorten it"
    )
    if work.step.mask_by_row and (windowed := sliding_window_layers(work.step.config)):
        shorten += (
            f"; litgpt builds each sliding-window layer's mask row by row in Python in training and validation: "
            f"about {work.step.tokens:.0f} more ops in each of its {windowed} such layers per forward, counted here"
        )
    if wrapper := sum(work.wrapper_ops):
        shorten += (
            f"; the sharding wrapper's own work (hooks, views, unshards) is about {wrapper:,.0f} ops a micro batch, "
            "measured on a CPU against the plain loop (scripts/bench_wrapper_host.py), counted here"
        )
    low, high = (h * 1e6 for h in runtime.LITGPT_HOST_S_PER_OP_RANGE)
    return (
        f". Host-bound: {host_s / seconds:.0%} of it is the host launching kernels (litgpt's loop at "
        f"{runtime.LITGPT_HOST_S_PER_OP * 1e6:.0f} us an op, the median machine we measured): it follows the CPU, "
        "not the GPU (on the machines we measured, the lab's included, litgpt's loop took "
        f"{low:.0f}-{high:.0f} us an op: reports/planner-accuracy/runtime.md); " + shorten
    )


def _comm_fields(work) -> dict:
    c = getattr(work, "comm", None)
    if c is None:
        return {}
    links = comm_mod.table()
    used = "; ".join(
        f"{scope} link {name}: {links[name].gbs:g} GB/s x {links[name].efficiency:g} ({links[name].source})"
        for scope, name in c.links.items()
    )
    calls = (
        ", ".join(f"{n} {kind}" for kind, n, _, _ in c.calls)
        + f" calls per step: {c.latency_s * 1e3:.3g} ms of NCCL's ring latency (included)"
        if c.calls
        else "no collective calls"
    )
    return {
        "comm_bytes_per_step": {"gpu": c.bytes_gpu, "node": c.bytes_node, "host": c.bytes_host},
        "comm_seconds_per_step": c.seconds,
        "comm_bytes_per_forward": c.forward_bytes,
        "comm_seconds_per_forward": c.forward_s,
        "comm_latency_per_step": c.latency_s,
        "comm_source": f"{c.formula}; {calls}; {used}; {comm_mod.SCHEDULES[c.hideable_under]}"
        + (f", {c.unhidden:.0%} of it after or outside that" if c.unhidden else ""),
    }


def _fast_source(k: runtime.KernelWork, gpu: hardware.GPU) -> tuple[str, str, float]:
    """(where a fast-path time comes from, where its host figure does, its band's fraction either side): what
    bounds it and the band :func:`tunelab.plan.model.runtime.fast_band` gives that bound."""
    bound = fast_step(k.fast, gpu, k.step.tokens).bound()
    e, own = runtime.fast_band(bound), FAST_MODEL_ERROR[bound]
    widest = (
        f"the fast path's widest miss {own:.0%} over our benches' {bound}-bound runs"
        if e == own
        else f"the kernel model's widest miss {e:.0%}, wider than the fast path's over our benches' {bound}-bound "
        f"runs ({own:.0%})"
    )
    source = (
        f"the time by cause below, {bound}-bound (band: {widest}"
        f"{'; a host-bound step follows the host CPU' if bound == 'host' else ''})"
    )
    host = f"tunelab's loop, {COMPILED_HOST_S_PER_KERNEL * 1e6:.0f} us per compiled kernel (fitted on our H100 bench)"
    return source, host, e


def _point_estimate(work, gpu: hardware.GPU, peak: float) -> dict:
    if work is None or not gpu.bandwidth_gbs or not peak:
        return {
            "seconds_source": "no point estimate: the GPU table has no bandwidth or peak for this precision"
            if work is not None
            else ""
        }
    counts = f"{work.detail['optimizer_steps']} optimizer steps, {work.detail['evaluations']} in-loop validations"
    secs = work.seconds_on(gpu, peak)
    if isinstance(work.kernels, runtime.KernelWork) and work.kernels.fast is not None:
        source, host, e = _fast_source(work.kernels, gpu)
        band = (secs * (1 - e), secs * (1 + e))
    elif isinstance(work.kernels, runtime.KernelWork) and work.host_s_per_op:
        e = runtime.KERNEL_MODEL_ERROR
        source = (
            f"the time by cause below, litgpt's loop at {work.host_s_per_op * 1e6:.3g} us an op on the host "
            f"({'--host auto' if work.host_from else '--host-us-per-op'}; band: the kernel model's widest miss {e:.0%} "
            "where the GPU bounds a run we hold)"
        )
        host = work.host_from or f"{work.host_s_per_op * 1e6:g} us an op, as given (--host-us-per-op)"
        band = (secs * (1 - e), secs * (1 + e))
    elif isinstance(work.kernels, runtime.KernelWork):
        e = runtime.KERNEL_MODEL_ERROR
        band = runtime.litgpt_band(
            secs, lambda h, s: sum(work.by_cause(gpu, h / runtime.LITGPT_HOST_S_PER_OP, s).values())
        )
        a, b = (h * 1e6 for h in runtime.LITGPT_HOST_S_PER_OP_RANGE)
        wider = band[0] < secs * (1 - e) * (1 - 1e-6) or band[1] > secs * (1 + e) * (1 + 1e-6)  # not rounding alone
        source = (
            f"the time by cause below (band: its widest miss {e:.0%} where the GPU bounds a run we hold, ours and the "
            "lab's"
            + (
                f"; widened to the host's {a:.0f}-{b:.0f} us an op that litgpt's loop took on the machines we measured, "
                "the kernels at that miss there too"
                if wider
                else ""
            )
            + ")"
        )
        side = "a faster CPU nears the band's low end" if wider else "the GPU bounds this run"
        host = f"{a:.0f}-{b:.0f} us an op, as on the machines we measured; {side} (yours: --host-us-per-op)"
    else:
        low, high = runtime.LOO_BAND
        source = (
            f"tunelab.plan.model.runtime fitted on the lab's A100 times (leave-one-out error mean "
            f"{runtime.LOO_MEAN_ABS_ERROR:.0%}, worst {runtime.LOO_WORST_ERROR:+.0%}; band: their time {low:+.0%} to "
            f"{high:+.0%} of the estimate, left out one by one); {gpu.name}: {peak / 1e12:.0f} TFLOP/s, "
            f"{gpu.bandwidth_gbs:.0f} GB/s"
        )
        band, host = (secs * (1 + low), secs * (1 + high)), ""
    return {
        "seconds": secs,
        "seconds_band": band,
        "seconds_source": f"{source}; {counts}",
        "host_source": host,
        "checked": hardware.time_checked(gpu),
    }


def _host_and_links(work, case, gpu: hardware.GPU, host_us_per_op, interconnect, internode) -> None:
    """Into ``work``: the host's time per op where it is known, and on several devices the communication over the
    links named (else the GPU's own)."""
    if host_us_per_op:
        if case.loop.fast:
            raise ValueError(
                "--host-us-per-op: the host figure of litgpt's loop; the fast path (a strategy file's speed switches) "
                "has its own launch model; fix: leave --host-us-per-op out"
            )
        work.host_s_per_op = host_us_per_op * 1e-6
    if case.world > 1:
        work.comm = comm_mod.per_step(
            case,
            comm_mod.lookup(interconnect or gpu.link or "pcie4", "gpu", given=bool(interconnect)),
            comm_mod.lookup(internode, "node", given=True) if internode else None,
            comm_mod.lookup("host-pcie4", "host"),
        )


def _pays_from(fast, stock, gpu: hardware.GPU) -> dict:
    """The fast path against stock litgpt on the same run (:class:`tunelab.plan.model.runtime.Terms` of each): the
    time an optimizer step saves (training only: validation, samples and saves are alike) and the step from which
    the fast path's start-up (:data:`FAST_START_EXTRA_S`, warm and cold) is paid back."""
    apart = ("validation", "generation", "checkpoint saves")
    steps = fast.detail["optimizer_steps"] or 1

    def per_step(terms) -> float:
        return sum(v for k, v in terms.by_cause(gpu).items() if k not in apart) / steps

    saved = per_step(stock) - per_step(fast)
    pays = tuple(extra / saved for extra in FAST_START_EXTRA_S) if saved > 0 else None
    return {"fast_saved_per_step_s": saved, "fast_break_even_steps": pays}


def _link_source(c, gpu: hardware.GPU, interconnect: str | None) -> str:
    """Where the links a multi-device run's traffic crosses came from (:attr:`Projection.link_source`)."""
    own = "as given (--interconnect)" if interconnect else f"the {gpu.name}'s own (other: --interconnect)"
    links = [f"{c.links['gpu']} between the GPUs, {own}"]
    if "node" in c.links:
        links.append(f"{c.links['node']} between nodes (--internode)")
    return "; ".join(links)


def project_recipe(
    planned: PlannedRecipe,
    gpu: hardware.GPU,
    *,
    tokens: float | None = None,
    tokens_per_sample: float | None = None,
    calibrate_dir: Path | None = None,
    mfu_range: tuple[float, float] = DEFAULT_MFU_RANGE,
    interconnect: str | None = None,
    internode: str | None = None,
    save_gbs: float | None = None,
    host_us_per_op: float | None = None,
    host_from: str | None = None,
) -> tuple[Projection, str]:
    """The projection of a planned recipe's training run on ``gpu`` and how its token count was had: ``tokens``
    if given, else the run's epochs (or max_steps) at ``tokens_per_sample`` padded tokens per sample (default:
    measured on the recipe's data with its tokenizer when both are here, else the default length distribution of
    :func:`tunelab.data.lengths.default_lengths` padded at the run's micro batch). On several devices
    the communication term (tunelab.plan.model.comm) is added, over ``interconnect`` (default: the GPU's own link) and
    between nodes over ``internode`` (needed for several nodes). Checkpoint saves are written at ``save_gbs`` GB/s
    (1e9 bytes) where given, else at :data:`tunelab.plan.model.runtime.CHECKPOINT_WRITE_BYTES_PER_S`; litgpt's loop
    launches at ``host_us_per_op`` microseconds an op where the host is known (``host_from``: where a figure measured
    here came from; ValueError for the fast path, whose host constants are its own), else at the fitted constant with
    the measured hosts' spread as its band."""
    settings, case, strategy = planned.settings, planned.input, planned.strategy_config
    cap, vocab = settings.max_seq_length or 512, case.config.vocab_size
    lengths, source = (None if tokens_per_sample else data_lengths(settings, vocab)) or (None, "")
    known = list(lengths or default_lengths(cap, vocab))  # the data's, else the default distribution's
    regrouped = not tokens_per_sample and strategy is not None and strategy.regroups  # the fast path's own batches
    per_sample = tokens_per_sample or (
        padded_tokens_per_sample(known, case.micro_batch_size, strategy, cap)
        if lengths or regrouped
        else None  # litgpt's padding of the default lengths, said so by epoch_tokens
    )
    real = None if tokens_per_sample else statistics.fmean(known)
    if tokens:
        run_tokens, note = tokens, f"--tokens {tokens:,.0f}"
    else:
        run_tokens, note = epoch_tokens(settings, per_sample, vocab, "" if source == "the data's lengths" else source)
        if regrouped:
            note += (
                f" (the fast path's micro batches: length-grouped in windows of {strategy.length_grouping} micro "
                f"batches, padded to multiples of {strategy.pad_to_multiple}, over "
                + (f"{source})" if lengths else "the default Alpaca-like length distribution)")
            )
    work = runtime_terms(settings, case, per_sample, real, tokens=tokens)
    if save_gbs:
        work.save_bytes_per_s = save_gbs * GB
    work.host_from = host_from
    _host_and_links(work, case, gpu, host_us_per_op, interconnect, internode)
    out = project(case, gpu, run_tokens, calibrate_dir, mfu_range, work=work, strategy=planned.strategy)
    if out.seconds_low is not None and isinstance(work.kernels, runtime.KernelWork) and work.kernels.fast is not None:
        switches = {"compiled": False, "fused_loss": False, "fused_optimizer": False, "loss_read_interval": 1}
        stock = case.changed(fabric=True, **switches)
        stock_per_sample = padded_tokens_per_sample(known, case.micro_batch_size, None, cap)
        stock_work = runtime_terms(settings, stock, stock_per_sample, real, tokens=tokens)
        out = dataclasses.replace(out, **_pays_from(work, stock_work, gpu))
    if work.comm is not None:
        out = dataclasses.replace(out, link_source=_link_source(work.comm, gpu, interconnect))
    return _at_the_edge(out) if planned.plan.edge and out.seconds_band else out, note


def _at_the_edge(out: Projection) -> Projection:
    """A projection whose plan is at the edge of memory: its band's high end stretched for the allocator's retries
    (:func:`tunelab.plan.model.runtime.edge_band`), and its source saying so."""
    edge = f"; at the edge of memory the allocator's retries may stretch each step up to {runtime.EDGE_STRETCH}x"
    band = runtime.edge_band(out.seconds_band)
    longer = band[1] / out.seconds_band[1]
    energies = {
        k: getattr(out, k) * longer
        for k in ("energy_j_high", "energy_j_per_million_tokens_high")
        if getattr(out, k) is not None
    }
    return dataclasses.replace(out, seconds_band=band, seconds_source=out.seconds_source + edge, **energies)
