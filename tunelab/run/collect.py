"""Collecting one run's record (step 4 of :mod:`tunelab.run.runner`): what each rank measured about itself
(``stats/rank<N>.json``), litgpt's printout and ``metrics.csv``, and the NVML samples, into the
:class:`~tunelab.record.RunRecord`. Nothing is parsed from names: the settings come from the run's resolved
arguments.
"""

from __future__ import annotations

import csv
import io
import math
import re
import signal
import statistics
from dataclasses import dataclass
from pathlib import Path

from tunelab import hardware
from tunelab.files import RECORD_MAX_BYTES, FileRefused, read_json, read_text
from tunelab.models import load_config, lora_param_count
from tunelab.plan.model.flops import flops_per_token, mfu
from tunelab.record import RankStats, RunRecord, driver_calls_in, read_rank_file, steady_state, unnoted_pauses
from tunelab.run.gpu_monitor import GPUMonitor
from tunelab.settings import Settings, training_precision

OOM_MARKERS = (
    "OutOfMemoryError",
    "CUDA out of memory",
    "MemoryError",
    "can't allocate memory",
    "DefaultCPUAllocator: not enough memory",
    "std::bad_alloc",
    "Cannot allocate memory",
)
"""Text in a rank's exception or the child's stderr that means it ran out of memory (CUDA or host)."""


def read_metrics(out_dir: Path) -> list[dict]:
    """The rows of the newest metrics.csv litgpt wrote under ``out_dir`` (bounded read; [] when there is none or
    it is not a readable file)."""
    files = sorted(out_dir.glob("logs/csv/version_*/metrics.csv"))
    if not files:
        return []
    try:
        text = read_text(files[-1], RECORD_MAX_BYTES * 4, "metrics file")
    except FileRefused:
        return []  # not a file litgpt wrote: the figures it would give stay empty, the record says why elsewhere
    return list(csv.DictReader(io.StringIO(text)))


def latest_tokens(out_dir: Path) -> int | None:
    """The cumulative real-token count of the last row litgpt flushed to metrics.csv (cheap: reads the tail)."""
    files = sorted(out_dir.glob("logs/csv/version_*/metrics.csv"))
    if not files:
        return None
    try:
        with open(files[-1], "rb") as f:
            header = f.readline().decode().strip().split(",")
            f.seek(0, 2)
            f.seek(max(0, f.tell() - 4096))
            last = f.read().decode(errors="replace").strip().splitlines()[-1].split(",")
        value = dict(zip(header, last)).get("tokens")
        return int(float(value)) if value else None
    except (OSError, ValueError, IndexError):
        return None


def parse_litgpt_report(stdout: str) -> dict:
    """The figures litgpt prints at the end of a fine-tune (its Training Time, Tok/sec: padded tokens over that time,
    Memory Used, parameter counts, final val loss, last iteration); None for each it did not print."""

    def grab(pattern, cast=float):
        m = re.findall(pattern, stdout)
        return cast(m[-1].replace(",", "")) if m else None

    return {
        "training_time_s": grab(r"Training Time\s*:\s*([\d.]+) s"),
        "tok_s": grab(r"Tok/sec\s*:\s*([\d.]+) tok/s"),
        "memory_gb": grab(r"Memory Used\s*:\s*([\d.]+) GB"),
        "trainable": grab(r"Number of trainable parameters: ([\d,]+)", int),
        "non_trainable": grab(r"Number of non-trainable parameters: ([\d,]+)", int),
        "val_loss": grab(r"Final evaluation \| val loss: ([\d.]+)"),
        "last_iter": grab(r"iter (\d+) step \d+ \|", int),
    }


def rank_report(ranks: list[RankStats]) -> dict | None:
    """The figures of :func:`parse_litgpt_report` from rank 0's file, where tunelab's loop wrote them (None: litgpt's
    own script, whose printed report is the only place they are)."""
    first = next((r for r in ranks if r.rank == 0), None)
    if first is None or first.report_training_time_s is None:
        return None
    return {
        "training_time_s": first.report_training_time_s,
        "tok_s": first.report_tok_s,
        "memory_gb": first.report_memory_gb,
        "trainable": first.trainable_params,
        "non_trainable": first.frozen_params,
        "val_loss": first.report_val_loss,
        "last_iter": None,
    }


def _classify(
    exit_code: int | None, killed_reason: str | None, ranks: list[RankStats], stderr_tail: str, stdout_tail: str
) -> tuple[str, str | None]:
    if killed_reason:
        return "killed", killed_reason
    if exit_code == 0:
        return "ok", None
    text = "\n".join([*(r.exception or "" for r in ranks), stderr_tail])
    if any(m in text for m in OOM_MARKERS):
        line = next(
            (r.exception for r in ranks if r.exception and any(m in r.exception for m in OOM_MARKERS)), None
        ) or last_error_line(stderr_tail)
        return "oom", line
    if exit_code is not None and exit_code < 0:
        return "killed", f"killed by signal {signal.Signals(-exit_code).name}"
    line = (
        next((r.exception for r in ranks if r.exception), None)
        or last_error_line(stderr_tail)
        or last_error_line(stdout_tail)
    )
    return "error", line or f"exit code {exit_code}"


def last_error_line(text: str) -> str | None:
    """The last line of ``text`` that names an error (an exception or an ``error:`` line), else its last line."""
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    for ln in reversed(lines):
        if re.match(r"^[\w.]*(Error|Exception|Interrupt)\b", ln) or ": error:" in ln:
            return ln[:500]
    return lines[-1][:500] if lines else None


def _read_ranks(rec: RunRecord, stats_dir: Path) -> list[list]:
    """Step 1: every rank's file (its RankStats into the record); returns each rank's iteration log."""
    ranks_read = []
    for f in sorted(stats_dir.glob("rank*.json")):
        try:
            ranks_read.append(read_rank_file(read_json(f, what="rank file")))
        except (ValueError, TypeError) as e:  # a rank killed mid-write, or a foreign file: said, not hidden
            rec.notes.append(f"{f.name} not read: {e}")
    ranks_read.sort(key=lambda r: r[0].rank)
    rec.ranks = [stats for stats, _ in ranks_read]
    return [iters for _, iters in ranks_read]


def _rank_figures(rec: RunRecord) -> None:
    """Step 2: the run's figures from its ranks: max of the peaks and of the first iteration, sum of the retries."""

    def agg(attr, fn):
        vals = [getattr(r, attr) for r in rec.ranks if getattr(r, attr) is not None]
        return fn(vals) if vals else None

    rec.peak_allocated_bytes = agg("peak_allocated_bytes", max)
    rec.peak_reserved_bytes = agg("peak_reserved_bytes", max)
    rec.num_alloc_retries = agg("num_alloc_retries", sum)
    rec.peak_rss_bytes = agg("peak_rss_bytes", max)
    rec.first_iteration_s = agg("first_iteration_s", max)
    rec.compile_s = agg("compile_s", max)
    rec.compile_cache_hits = agg("compile_cache_hits", max)
    rec.compile_cache_misses = agg("compile_cache_misses", max)
    rec.graphs_compiled_in_loop = agg("graphs_compiled_in_loop", max)
    rec.recompile_limit_hits = agg("recompile_limit_hits", max)
    rec.paused_s = agg("paused_s", max)
    rec.fused_kernels = next((r.fused_kernels for r in rec.ranks if r.fused_kernels), None)
    rec.fused_loss_reads = agg("fused_loss_reads", max)


def _litgpt_figures(rec: RunRecord, stdout: str, out_dir: Path) -> int:
    """Step 3: litgpt's printed figures and metrics.csv (losses, iterations, steps); returns the iterations run."""
    lit = rank_report(rec.ranks) or parse_litgpt_report(stdout)
    rec.litgpt_training_time_s, rec.litgpt_tok_s, rec.litgpt_memory_gb = (
        lit["training_time_s"],
        lit["tok_s"],
        lit["memory_gb"],
    )
    if lit["trainable"] is not None:
        rec.n_trainable = lit["trainable"]
        rec.n_params = lit["trainable"] + (lit["non_trainable"] or 0)
    metrics = read_metrics(out_dir)
    losses = [float(m["loss"]) for m in metrics if m.get("loss")]
    if losses:
        rec.loss_first, rec.loss_last = losses[0], losses[-1]
    vals = [float(m["val_loss"]) for m in metrics if m.get("val_loss")]
    rec.val_loss_final = vals[-1] if vals else lit["val_loss"]
    n_iters = max([int(m["iter"]) for m in metrics if m.get("iter")] or [lit["last_iter"] or 0])
    rec.iters = n_iters or None
    rec.optimizer_steps = n_iters // rec.accumulation if n_iters and rec.accumulation else None
    return n_iters


def _speed(rec: RunRecord, ranks_iters: list[list], n_iters: int) -> dict:
    """Step 4: token counts and the steady-state figures (warm-up excluded); returns the steady-state summary."""
    rec.tokens_padded = sum(it[1] for its in ranks_iters for it in its[:n_iters] if it[1] >= 0) or None
    rec.tokens_real = sum(it[2] for its in ranks_iters for it in its[:n_iters] if it[2] >= 0) or None
    drop = unnoted_pauses(rec, ranks_iters[0] if ranks_iters else [])
    steady = steady_state(ranks_iters, rec.accumulation or 1, n_iters, [r.trained_until for r in rec.ranks], drop)
    for key in (
        "warmup_steps_excluded",
        "step_time_s",
        "iter_time_s",
        "step_time_mean_s",
        "tok_s_padded",
        "tok_s_real",
    ):
        setattr(rec, key, steady.get(key))
    if steady.get("window"):
        rec.steady_window_s = steady["window"][1] - steady["window"][0]
    if steady.get("window_iterations") and rec.ranks and rec.ranks[0].driver_allocs:  # rank 0's, the same window
        calls = driver_calls_in(rec.ranks[0].driver_allocs, *steady["window_iterations"])
        rec.driver_mallocs_steady, rec.driver_frees_steady = calls or (None, None)
    if rec.tok_s_padded is not None:
        rec.tok_s_padded_per_device = rec.tok_s_padded / rec.device_count
    if steady.get("iterations_s") and rec.micro_batch_size:  # each rank's micro batch holds `micro` samples
        rec.samples_s = steady["iterations_s"] * rec.micro_batch_size
        rec.padded_per_sample = steady["padded_per_iteration"] / rec.micro_batch_size
    return steady


def _compute(rec: RunRecord, settings: Settings, ckpt: Path, n_iters: int) -> None:
    """Step 5: FLOPs per token at the run's mean padded length, achieved TFLOP/s and MFU against the GPU table."""
    try:
        config = load_config(ckpt)
        rec.model_name = config.name
        seq = (
            rec.tokens_padded / (n_iters * rec.micro_batch_size * rec.device_count)
            if rec.tokens_padded and n_iters
            else (rec.max_seq_length or config.block_size)
        )
        n_lora = lora_param_count(config, int(settings.lora_r or 0), settings.lora_targets) if settings.lora else 0
        fpt = flops_per_token(config, seq, "lora" if settings.lora else "full", n_lora)
        rec.flops_per_token, rec.flops_formula = fpt.total, fpt.formula
        gpu = hardware.identify(rec.device_name) if rec.device_type == "cuda" else None
        if rec.precision is None and (gpu is not None or rec.device_type != "cuda"):  # litgpt's pick on this device
            rec.precision = training_precision(None, gpu.bf16 if gpu else True)
        if rec.tok_s_real:
            real_per_dev = rec.tok_s_real / rec.device_count
            rec.achieved_tflops_per_device = fpt.total * real_per_dev / 1e12
            matmul = next((r.float32_matmul_precision for r in rec.ranks if r.float32_matmul_precision), None)
            peak = gpu.peak_flops(rec.precision or "32-true", matmul) if gpu else None
            if peak:
                rec.peak_basis = hardware.peak_basis(rec.precision or "32-true", matmul, gpu)
                rec.peak_tflops_per_device = peak / 1e12
                rec.mfu = mfu(fpt.total, real_per_dev, peak)
                rec.mfu_padded = mfu(fpt.total, rec.tok_s_padded / rec.device_count, peak)
    except Exception as e:  # noqa: BLE001 - a compute figure must not lose the record
        rec.flops_formula = f"not computed: {e!r}"


def _gpu_summary(figs: list) -> tuple:
    """(mean utilisation, mean of the utilisation std, summed power, summed energy) over GPUs, None where absent."""

    def mean_of(attr):
        vals = [getattr(f, attr) for f in figs if getattr(f, attr) is not None]
        return statistics.fmean(vals) if vals else None

    def sum_of(attr):
        vals = [getattr(f, attr) for f in figs if getattr(f, attr) is not None]
        return sum(vals) if vals else None

    return mean_of("util_mean"), mean_of("util_std"), sum_of("power_mean_w"), sum_of("energy_j")


def _gpu_figures(rec: RunRecord, gpus: list, steady: dict, monitor: GPUMonitor | None) -> None:
    """Step 6: NVML utilisation, power and energy over the whole run and over the steady-state window less its pauses
    (and there the SM clock and how often power or heat held it down)."""
    if not gpus:
        return
    rec.gpu_util_mean, rec.gpu_util_std, rec.power_mean_w, rec.energy_j = _gpu_summary(gpus)
    if rec.energy_j and rec.tokens_real:
        rec.energy_j_per_1k_tokens = rec.energy_j / rec.tokens_real * 1000
    window = steady.get("window")
    if window and monitor is not None:  # the steady-state window: the steps tok/s is measured over
        figs = monitor.window(*window, skip=steady.get("pauses", ()))
        rec.gpu_util_steady_mean, rec.gpu_util_steady_std, rec.power_steady_w, rec.energy_steady_j = _gpu_summary(figs)
        clocks = [f.sm_clock_mhz for f in figs if f.sm_clock_mhz is not None]
        capped = [f.clock_capped_share for f in figs if f.clock_capped_share is not None]
        rec.sm_clock_steady_mhz = statistics.fmean(clocks) if clocks else None
        rec.clock_capped_steady_share = statistics.fmean(capped) if capped else None
        if rec.energy_steady_j and steady.get("window_tokens_real"):
            rec.energy_steady_j_per_1k_tokens = rec.energy_steady_j / steady["window_tokens_real"] * 1000


@dataclass
class Finished:
    """What a finished (or stopped) run left for its record: one object from the runner to :func:`collect`."""

    settings: Settings
    """The settings the run was launched with (resolved once by the parent)."""
    run_dir: Path
    """The run's folder: ``stats/`` (the ranks' files) and ``litgpt/`` (litgpt's out_dir) under it."""
    stdout: str
    """The tail of the child's stdout (litgpt's printout)."""
    stderr: str
    """The tail of the child's stderr."""
    killed_reason: str | None
    """Why the runner stopped the child (a timeout, Ctrl-C), or None where it exited by itself."""
    gpus: list
    """The NVML samples, per GPU."""
    sample_hz: float | None
    """Their rate (None without samples)."""
    checkpoint_dir: Path
    """The model the run trained (its config gives the FLOPs)."""
    monitor: GPUMonitor | None = None
    """The sampler (its SM clock and power caps), where one ran."""


def collect(rec: RunRecord, run: Finished) -> RunRecord:
    """Fill ``rec`` from the rank files, litgpt's printout and metrics.csv, and the NVML samples."""
    ranks_iters = _read_ranks(rec, run.run_dir / "stats")
    tails = run.stderr[-20000:], run.stdout[-5000:]
    rec.status, rec.error = _classify(rec.exit_code, run.killed_reason, rec.ranks, *tails)
    _rank_figures(rec)
    n_iters = _litgpt_figures(rec, run.stdout, run.run_dir / "litgpt")
    steady = _speed(rec, ranks_iters, n_iters)
    _compute(rec, run.settings, run.checkpoint_dir, n_iters)
    rec.gpus, rec.sample_hz = run.gpus, run.sample_hz
    _gpu_figures(rec, run.gpus, steady, run.monitor)
    for name in ("step_time_s", "iter_time_s", "tok_s_padded", "tok_s_real"):
        v = getattr(rec, name)
        if v is not None and (math.isnan(v) or math.isinf(v)):
            setattr(rec, name, None)
    return rec
