"""``reports/planner-accuracy/runtime.md``: the kernel-level time model
(:meth:`tunelab.plan.model.runtime.Terms.by_cause`) against every time we hold, each row with its error and whether
it falls inside the plan's band.

The rows come from the archived measurements ``reports/evidence.yaml`` lists (our Part 1 rows, the fast-path
benches, the Part 3 micro-batch curve, litgpt runs on H200 machines), the lab's published rows (the A100 Part 1 and
Part 2 tables) and the host probes the records carry. The one constant fitted on runs, litgpt's host time per op, is
also shown refitted without each row (leave-one-out). :func:`write_all` writes the page and its CSV."""

from __future__ import annotations

import csv
import dataclasses
import functools
import io
import json
import re
import statistics
from pathlib import Path

from tunelab import files, hardware, recipes, settings
from tunelab.data.lengths import default_padded_per_sample
from tunelab.errors import InputError
from tunelab.files import RECORD_MAX_BYTES, save_figure, write_csv, write_text_atomic
from tunelab.models import sliding_window_layers, without_sliding_window
from tunelab.paths import ROOT
from tunelab.plan import stored
from tunelab.plan.model import bnb_kernels, comm, fast_step, kernels, memory, runtime, strategies
from tunelab.plan.model.case import PlanInput
from tunelab.plan.projection import project_recipe
from tunelab.plan.recipe import plan_recipe, replanned, runtime_terms
from tunelab.plan.trace.tables import TRACED
from tunelab.record import read_rank_file, steady_state, steady_steps, unnoted_pauses
from tunelab.report import bench, evidence, profiles, resource_tables
from tunelab.report.accuracy import (
    LAB_PART2_LINK,
    archived_records,
    beside,
    lab_runtime_items,
    ran_eagerly,
    write_accuracy,
)
from tunelab.run.collect import parse_litgpt_report
from tunelab.sweep_file import lab_rows
from tunelab.tune import study
from tunelab.units import GB, fmt

H100_ROWS = "h100-part1"
"""Our H100 Part 1 report (its table and records; an entry of :mod:`tunelab.report.evidence`)."""
PART3_ROWS = "h100-part3"
"""Our H100 Part 3 study (its table): TinyLlama full fine-tuning, bf16-mixed, FSDP on one device, micro batch 8 to
244, without and with activation checkpointing; one micro batch per optimizer step."""
PART3_STUDY = "configs/sweeps/lab-part3.yaml"
"""The FSDP study's file: its published tables (``lab``) beside our Part 3 probes."""


def h100_items(root: Path) -> list[dict]:
    """Each timed H100 row: its shape, the measured seconds per optimizer step, the kernel model's step (with the
    LoRA its record in the report's records.tgz trained; a row without a record is not timed, since today's recipe
    may differ from the run's) and the host time per op it implies (:func:`implied_host`)."""
    from litgpt import Config

    text = files.read_text(root / evidence.path(H100_ROWS, "rows"), 1 << 20, "results table")
    archive = root / evidence.path(H100_ROWS, "records")
    ran, steady = {}, {}
    for name, rec, _ in archived_records(archive):
        ran[rec.row_id], steady[rec.row_id] = lora_ran(rec), _steady(archive, name, rec)
    items = []
    for r in csv.DictReader(io.StringIO(text)):
        if (
            not r.get("step_time_s")
            or r.get("method") == "qlora"
            or r.get("status") != "ok"
            or not steady.get(r["row_id"])
        ):
            continue
        step = float(r["step_time_s"])
        tokens = steady[r["row_id"]][1]  # padded tokens per sample over the steady window, from its iteration log
        micro, acc = int(r["micro_batch_size"]), int(r["accumulation"])
        args = (Config.from_name(r["model_name"]), r["method"], r["precision"], micro, tokens)
        st = kernels.step_time(kernels.Step(*args, lora=ran[r["row_id"]], accumulation=acc), "H100-SXM", tables=TRACED)
        util = float(r["gpu_util_steady_mean"]) if r.get("gpu_util_steady_mean") else None
        items.append(
            {
                "id": r["row_id"],
                "recipe": r["recipe"],
                "precision": r["precision"],
                "micro": micro,
                "gpu_util": util,
                "accumulation": acc,
                "tokens": tokens,
                "measured_s": step,
                "st": st,
                "implied_host": implied_host(st, acc, step),
            }
        )
    return items


def lora_ran(rec) -> tuple:
    """The LoRA (rank, targets) a run record trained with, from its own resolved arguments; () for full
    fine-tuning."""
    return settings.lora_of(settings.settings_of(rec.resolved_args, method=rec.method, command=rec.command))


HOST_BOUND_UTIL = 60.0
"""GPU utilisation (NVML, % of the steady window) under which a row counts as host-bound by measurement (the GPU
waited on the host at least 40% of the window): only such a row's step says what its host costs per op (a busy
GPU's gap is the kernel model's, not the host's)."""


def waits_on_host(causes: dict) -> bool:
    """Whether a modelled run (its seconds by cause, :data:`tunelab.plan.model.runtime.CAUSES`) waits on its host:
    its kernels busy under :data:`HOST_BOUND_UTIL` % of the loop, the gaps between them idle, as NVML counts."""
    busy = sum(causes.get(cause, 0.0) for cause in runtime.CAUSES[: runtime.CAUSES.index("kernel gaps")])
    idle = causes.get("kernel gaps", 0.0) + causes.get("host launches", 0.0)
    return busy > 0 and busy / (busy + idle) < HOST_BOUND_UTIL / 100


def solve(seconds_at, measured_s: float, lo: float, hi: float, halvings: int = 50) -> float | None:
    """The ``x`` in [lo, hi] at which the increasing ``seconds_at(x)`` equals ``measured_s``, by bisection (the
    interval halved ``halvings`` times); None where ``measured_s`` lies outside [seconds_at(lo), seconds_at(hi)]."""
    if seconds_at(lo) >= measured_s or seconds_at(hi) <= measured_s:
        return None
    for _ in range(halvings):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if seconds_at(mid) < measured_s else (lo, mid)
    return (lo + hi) / 2


def implied_host(st, acc: int, measured_s: float) -> float | None:
    """The host seconds per op that makes :func:`step_seconds` equal ``measured_s``; None when the kernels alone,
    with no host time, already take longer (a GPU-bound row says nothing of its host)."""
    return solve(lambda h: step_seconds(st, acc, h), measured_s, 0.0, 1e-3)


def _record_step(rec, gpu):
    """The kernel model's step of a litgpt run's record on ``gpu`` (a QLoRA run with litgpt's PagedAdamW)."""
    from litgpt import Config

    optimizer = bnb_kernels.litgpt_optimizer(rec.method)
    config = Config.from_name(rec.model_name)
    args = (rec.method, rec.precision, rec.micro_batch_size, rec.padded_per_sample, optimizer, lora_ran(rec))
    return kernels.step_time(kernels.Step(config, *args, rec.accumulation or 1), gpu.name, tables=TRACED)


def _bench_step(it: dict):
    """The kernel model's step of a bench item's litgpt run (:func:`bench_items`)."""
    case = it["case"]
    args = (case.config, it["method"], case.precision, it["micro"], it["tokens"])
    step = kernels.Step(*args, lora=settings.lora_of(case), accumulation=it["accumulation"])
    return kernels.step_time(step, it["gpu"].name, tables=TRACED)


def busy_steps(root: Path, bench: list[dict] | None = None, steps: dict | None = None) -> list[tuple]:
    """(step, accumulation, measured s, run) of every litgpt run we timed whose GPU was busy :data:`HOST_BOUND_UTIL` %
    of its steady window or more (its time is its kernels', its host's leaves no mark): the H100 Part 1 rows, each
    ``steps`` entry's rows and the benches' litgpt arms (``bench``: :func:`bench_items`, ``steps``: {key:
    :func:`steps_rows`}, when already read); ``run`` names it as runtime.md does."""
    out = [
        (i["st"], i["accumulation"], i["measured_s"], f"our H100 {i['id']}")
        for i in h100_items(root)
        if i["gpu_util"] >= HOST_BOUND_UTIL
    ]
    if steps is None:
        steps = {e.id: steps_rows(root, e.id) for e in evidence.with_role("steps", root)}
    for key, rows in steps.items():
        out += [
            (r["st"], r["accumulation"], r["measured_s"], f"{evidence.entry(key, root).folder} {r['id']}")
            for r in rows
            if (r["gpu_util"] or 0) >= HOST_BOUND_UTIL
        ]
    for it in bench if bench is not None else bench_items(root):
        if it["arm"] == "litgpt" and (it["gpu_util"] or 0) >= HOST_BOUND_UTIL:
            out.append((_bench_step(it), it["accumulation"], it["measured_s"], f"{it['report']} {it['run']}"))
    return out


def gpu_bound_errors(rows: list[dict], busy: list[tuple]) -> list[tuple[str, float]]:
    """(run, measured over estimated - 1) of every run :func:`kernel_model_error` takes its miss over: the lab's A100
    rows the kernels bound (``rows``: :func:`a100_rows`) and our busy runs (``busy``: :func:`busy_steps`) at the
    planner's host constant."""
    h = runtime.LITGPT_HOST_S_PER_OP
    lab = [r for r in rows if r["kernel_s"] is not None and not r["host_bound"]]
    return [(f"the lab's {r['id']}", r["lab_s"] / r["kernel_s"] - 1) for r in lab] + [
        (run, m / step_seconds(st, acc, h) - 1) for st, acc, m, run in busy
    ]


def steps_rows(root: Path, key: str) -> list[dict]:
    """Each litgpt run of the evidence entry ``key`` (a ``steps`` entry of :mod:`tunelab.report.evidence`): its mean
    optimizer step (steady window) and that step by third of the window (:func:`window_thirds`)
    against the kernel model on its GPU's table row at :data:`tunelab.plan.model.runtime.LITGPT_HOST_S_PER_OP` (the
    median machine's), the host time per op the row implies, the probes, the SM clock and the
    GPU's busy share (``st``: the model's step). A QLoRA row is timed with litgpt's PagedAdamW."""
    rows = []
    for name, rec, _ in archived_records(path := root / evidence.path(key, "records", root)):
        gpu = hardware.identify(rec.device_name or "")
        steady = _steady(path, name, rec) if rec.status == "ok" and rec.step_time_mean_s else None
        if steady is None or gpu is None:
            continue
        acc, measured = rec.accumulation or 1, steady[0]
        st = _record_step(rec, gpu)
        pred = step_seconds(st, acc, runtime.LITGPT_HOST_S_PER_OP)
        g = st.gpu_by_phase
        rows.append(
            {
                "id": rec.row_id or name.split("/")[-2],
                "st": st,
                "gpu": gpu.name,
                "recipe": rec.recipe,
                "precision": rec.precision,
                "micro": rec.micro_batch_size,
                "accumulation": acc,
                "tokens": rec.padded_per_sample,
                "measured_s": measured,
                "predicted_s": pred,
                "error": pred / measured - 1,
                "kernels_s": acc * (g["forward"] + g["backward"]) + g["optimizer"],
                "host_bound": (rec.gpu_util_steady_mean or 100.0) < HOST_BOUND_UTIL,
                "implied_host_us": (h * 1e6 if (h := implied_host(st, acc, measured)) else None),
                "host_op_us": rec.host_op_us,
                "device_op_us": rec.device_op_us,
                "sm_clock_mhz": rec.sm_clock_steady_mhz,
                "gpu_util": rec.gpu_util_steady_mean,
                "thirds": window_thirds(path, name, rec, st),
                **_band(pred, lambda h, s, st=st, acc=acc: step_seconds(st, acc, h, s), measured),
            }
        )
    return sorted(rows, key=lambda r: _natural(r["id"]))


def window_thirds(archive: Path, member: str, rec, st) -> list[tuple]:
    """(mean optimizer step s, host us per op it implies or None) over each third of a run's steady window, from
    its rank-0 iteration log in the archive (none without one): whether the step held still through the window."""
    _, log = _rank0(archive, member)
    if not log:
        return []
    acc = rec.accumulation or 1
    drop = unnoted_pauses(rec, log)
    steps = [sum(d for d, _, _ in step) for step in steady_steps(log, acc, rec.iters or len(log), None, drop)[2]]
    if len(steps) < 3:
        return []
    out = []
    for k in range(3):
        part = steps[k * len(steps) // 3 : (k + 1) * len(steps) // 3]
        mean = sum(part) / len(part)
        host = implied_host(st, acc, mean)
        out.append((mean, host * 1e6 if host else None))
    return out


def _natural(name: str) -> tuple:
    """A row id's sort key with its numbers compared as numbers (s2 before s10)."""
    return tuple(int(t) if t.isdigit() else t for t in re.split(r"(\d+)", name))


def _band(point: float, seconds_at, measured: float, edge: bool = False) -> dict:
    """The plan's band around a litgpt time (:func:`tunelab.plan.model.runtime.litgpt_band`; stretched where the plan
    is at the edge of memory: :func:`tunelab.plan.model.runtime.edge_band`) and whether ``measured`` lies in it."""
    low, high = runtime.litgpt_band(point, seconds_at)
    low, high = runtime.edge_band((low, high)) if edge else (low, high)
    return {"band_low_s": low, "band_high_s": high, "in_band": low <= measured <= high}


def _fast_band(point: float, bound: str, measured: float) -> dict:
    """The plan's band around a fast-path time: its stated error for the bound either side
    (:func:`tunelab.plan.model.runtime.fast_band`)."""
    e = runtime.fast_band(bound)
    low, high = point * (1 - e), point * (1 + e)
    return {"band_low_s": low, "band_high_s": high, "in_band": low <= measured <= high}


def step_seconds(st, acc: int, host_s_per_op: float, gpu_scale: float = 1.0) -> float:
    """An optimizer step of ``acc`` micro batches in litgpt's loop: each phase its kernels (``gpu_scale`` times
    as long) or its launches."""
    g, ops = st.gpu_by_phase, st.host_ops_by_phase
    it = max(gpu_scale * (g["forward"] + g["backward"]), host_s_per_op * (ops["forward"] + ops["backward"]))
    return acc * it + max(gpu_scale * g["optimizer"], host_s_per_op * ops["optimizer"])


def fit_host(items: list[dict]) -> float:
    """The host seconds per op that minimises the squared relative error over ``items`` (a grid of 0.1 us)."""
    grid = [n * 1e-7 for n in range(100, 2000)]
    return min(
        grid, key=lambda h: sum((step_seconds(i["st"], i["accumulation"], h) / i["measured_s"] - 1) ** 2 for i in items)
    )


def h100_rows(root: Path, items: list | None = None) -> list[dict]:
    """Each H100 row's measured step beside the prediction, and the prediction with the host constant refitted
    without that row (leave-one-out); ``items``: :func:`h100_items` when already read."""
    items = items or h100_items(root)
    rows = []
    for i, it in enumerate(items):
        loo = fit_host([o for j, o in enumerate(items) if j != i])
        pred = step_seconds(it["st"], it["accumulation"], runtime.LITGPT_HOST_S_PER_OP)
        pred_loo = step_seconds(it["st"], it["accumulation"], loo)
        st = it["st"]
        rows.append(
            {
                **{k: v for k, v in it.items() if k != "st"},
                "predicted_s": pred,
                "error": pred / it["measured_s"] - 1,
                "loo_host_us": loo * 1e6,
                "loo_predicted_s": pred_loo,
                "loo_error": pred_loo / it["measured_s"] - 1,
                "gpu_s_per_micro": st.gpu_by_phase["forward"] + st.gpu_by_phase["backward"],
                "ops_per_micro": st.ops_by_phase["forward"] + st.ops_by_phase["backward"],
                **_band(
                    pred, lambda h, s, st=st, acc=it["accumulation"]: step_seconds(st, acc, h, s), it["measured_s"]
                ),
            }
        )
    return rows


@functools.cache
def _rank0(archive: Path, member: str) -> tuple:
    """(RankStats, iteration log) of an archived run's rank-0 file (:func:`tunelab.record.read_rank_file`), read once
    per report; (None, []) without one."""
    raw = beside(archive, member, "stats/rank0.json", RECORD_MAX_BYTES)
    return read_rank_file(json.loads(raw)) if raw is not None else (None, [])


def _steady(archive: Path, member: str, rec) -> tuple[float, float] | None:
    """(mean optimizer step s, padded tokens per sample) over a run's steady window: the record's, else recomputed
    from its rank-0 iteration log in the archive (records made before the collector kept the mean). A run of
    tunelab's loop that recorded no synchronised end (:attr:`tunelab.record.RankStats.trained_until`; older records)
    ended its window on a host timestamp with work still queued: its window is recomputed to the end
    the loop's printed training time gives (taken after the loop's last synchronising loss read), which counts that
    work (:func:`synchronised_end`)."""
    stats, iters = _rank0(archive, member)
    end, drop = synchronised_end(archive, member, rec, stats, iters), unnoted_pauses(rec, iters)
    if rec.step_time_mean_s and rec.padded_per_sample and end is None and not drop:
        return rec.step_time_mean_s, rec.padded_per_sample
    if stats is None:
        return None
    ends = [stats.trained_until if stats.trained_until is not None else end]
    out = steady_state([iters], rec.accumulation or 1, rec.iters or len(iters), ends, drop)
    if not out.get("step_time_mean_s"):
        return None
    return out["step_time_mean_s"], out["padded_per_iteration"] / rec.micro_batch_size


def synchronised_end(archive: Path, member: str, rec, stats, iters: list) -> float | None:
    """Where an archived run of tunelab's loop finished its training work on the device, for a run whose rank file
    kept no ``trained_until``: its first iteration's start plus the training time the loop printed (measured after
    the loop's last loss read, which synchronises). None for litgpt's own loop (its loss read every step
    synchronises each step, and its printed time includes validation) or where the figures are missing.
    ``stats``, ``iters``: its rank-0 file as :func:`tunelab.record.read_rank_file` reads it (None, [] without one)."""

    if rec.strategy == "litgpt" or stats is None:
        return None
    if stats.trained_until is not None or not iters:
        return None
    out = beside(archive, member, "stdout.log", RECORD_MAX_BYTES)
    seconds = parse_litgpt_report(out.decode("utf-8", "replace")).get("training_time_s") if out else None
    return iters[0][0] + seconds if seconds else None


def bench_items(root: Path) -> list[dict]:
    """Each finished run of the benches (the evidence manifest's ``bench`` entries): its mean optimizer step and padded tokens per sample over the steady
    window, GPU utilisation, the GPU it ran on, and its PlanInput as planned from its own recipe, overrides and
    strategy keys. Records are read in memory from the archive: regular ``*/record.json`` members of at most
    RECORD_MAX_BYTES (and their rank-0 iteration logs where the record lacks the mean)."""

    items = []
    for archive in (e.path("records") for e in evidence.with_role("bench")):
        for name, rec, strategy in archived_records(root / archive):
            steady = _steady(root / archive, name, rec) if rec.status == "ok" else None
            gpu = hardware.identify(rec.device_name or "")
            if not steady or gpu is None:
                continue
            case = stored.todays_plan(rec, None, strategy).input
            parts = name.split("/")
            items.append(
                {
                    "bench": parts[1],
                    "report": Path(archive).parent.name,
                    "run": "/".join(parts[-3:-1]) if "tune" in name else parts[-2],
                    "arm": "litgpt" if case.loop.fabric else "fast",
                    "case": case,
                    "gpu": gpu,
                    "method": case.method,
                    "micro": case.micro_batch_size,
                    "accumulation": case.accumulation,
                    "tokens": steady[1],
                    "measured_s": steady[0],
                    "gpu_util": rec.gpu_util_steady_mean,
                    "eager": not case.loop.fabric and ran_eagerly(root / archive, name, rec),
                }
            )
    return items


def bench_step(
    item: dict,
    compiled_host_s: float | None = None,
    host_scale: float = 1.0,
    memory_efficiency: float | None = None,
    gpu_scale: float = 1.0,
) -> tuple[float, str]:
    """(predicted seconds per optimizer step, what bounds it) of a bench run on its own GPU: the fast path by
    :func:`tunelab.plan.model.fast_step.fast_step` (its micro batches and its optimizer step; its two fitted
    constants replaceable, for their refits), litgpt's by the planner's own
    :meth:`tunelab.plan.model.runtime.Terms.by_cause` over one step (validation left out; its host's time per op
    ``host_scale`` times the constant's, its kernels ``gpu_scale`` times the model's)."""

    gpu, case, acc = item["gpu"], item["case"], item["accumulation"]
    if case.loop.fabric:
        work = runtime.kernel_work(case, item["tokens"])
        one = {"train_iterations": acc, "optimizer_steps": 1, "eval_iterations": 0, "samples_generated": 0}
        one |= {"evaluations": 0, "new_tokens": 0}
        by = runtime.Terms(0.0, 0.0, acc, one, None, work).by_cause(gpu, host_scale, gpu_scale)
        return sum(by.values()), "host" if by["host launches"] > 0 else "GPU"
    h = fast_step.COMPILED_HOST_S_PER_KERNEL if compiled_host_s is None else compiled_host_s
    m = fast_step.COMPILED_MEMORY_EFFICIENCY if memory_efficiency is None else memory_efficiency
    fs = fast_step.fast_step(case, gpu, item["tokens"], h, m)
    return acc * fs.iteration_s() + fs.optimizer_s(), fs.bound()


def _fitted(item: dict) -> bool:
    """The runs that hold the fast path's host constant: TinyLlama full's micro-8 pairs on the H100."""
    return item["arm"] == "fast" and item["accumulation"] > 1 and item["method"] == "full" and not item["eager"]


def fit_compiled_host(items: list[dict]) -> float:
    """The host seconds per compiled kernel minimising the squared relative error over the fast path's H100 bench
    runs at the bench's own micro batch (a grid of 1 us; the probes at large micro batches are GPU-bound and hold no
    information on it; the LoRA runs stay out of sample)."""
    return _least_squares([i for i in items if _fitted(i)], [n * 1e-6 for n in range(5, 200)], "compiled_host_s")


def _least_squares(fitted: list[dict], grid: list[float], constant: str) -> float:
    """The value of the fast path's ``constant`` (a keyword of :func:`bench_step`) on ``grid`` minimising the
    squared relative error of the predicted step over the ``fitted`` bench runs."""
    return min(grid, key=lambda v: sum((bench_step(i, **{constant: v})[0] / i["measured_s"] - 1) ** 2 for i in fitted))


def _probe(item: dict) -> bool:
    """The runs that hold the fast path's compiled memory efficiency: its one-micro-batch probes (tune-batch's, at
    the largest micro batches), compiled throughout."""
    return item["arm"] == "fast" and item["accumulation"] == 1 and not item["eager"]


def fit_compiled_memory(items: list[dict]) -> float:
    """The share of the memory rate the fast path's compiled and Liger kernels reach over the bytes the traced
    graphs read and write once, minimising the squared relative error over its one-micro-batch probes (GPU-bound;
    a grid of 0.01). The micro-8 runs are host-bound (no information on it); every other run stays out of sample."""
    return _least_squares([i for i in items if _probe(i)], [n / 100 for n in range(20, 101)], "memory_efficiency")


def fast_errors(rows: list[dict]) -> dict:
    """{bound: (widest miss, runs)} of the fast path's bench rows that ran compiled throughout, by the bound the model
    gives each: the largest ``|measured / planned - 1|``, so a band of that width either side of the plan holds every
    such run; what :data:`tunelab.plan.model.fast_step.FAST_MODEL_ERROR` states."""
    out = {}
    for bound in ("GPU", "host"):
        misses = [
            abs(r["measured_s"] / r["predicted_s"] - 1)
            for r in rows
            if r["arm"] == "fast" and not r["eager"] and r["bound"] == bound
        ]
        if misses:
            out[bound] = (max(misses), len(misses))
    return out


def bench_rows(items: list[dict]) -> list[dict]:
    """Each bench run (:func:`bench_items`)'s mean optimizer step beside the prediction (which runs hold the fitted
    constant: said)."""
    rows = []
    for item in items:
        pred, bound = bench_step(item)
        m = item["measured_s"]
        rows.append(
            {
                "bench": item["bench"],
                "report": item["report"],
                "gpu": item["gpu"].name,
                "run": item["run"],
                "arm": item["arm"],
                "micro": item["micro"],
                "accumulation": item["accumulation"],
                "tokens": item["tokens"],
                "measured_s": item["measured_s"],
                "predicted_s": pred,
                "error": pred / item["measured_s"] - 1,
                "bound": bound,
                "gpu_util": item["gpu_util"],
                "eager": item["eager"],
                "sample": "in (host constant)"
                if _fitted(item)
                else "in (memory efficiency)"
                if _probe(item)
                else "out",
                **(
                    _band(
                        pred,
                        lambda h, s, i=item: bench_step(i, host_scale=h / runtime.LITGPT_HOST_S_PER_OP, gpu_scale=s)[0],
                        m,
                    )
                    if item["arm"] == "litgpt"
                    else _fast_band(pred, bound, m)
                ),
            }
        )
    return rows


def part3_rows(root: Path) -> list[dict]:
    """Each finished probe of the Part 3 study: its measured iteration (steady window) against the kernel model's
    micro batch and optimizer step, at the probe's padded tokens per sample."""
    from litgpt import Config

    c = Config.from_name("tiny-llama-1.1b")
    fsdp1 = PlanInput.of(config=c, method="full", precision="bf16-mixed", strategy="fsdp", fsdp_root_kept=True)
    wrapper = sum(strategies.of(fsdp1).wrapper_host_ops(fsdp1))  # litgpt's FSDP (FSDP1) on one device
    rows = []
    for r in csv.DictReader(
        io.StringIO(files.read_text(root / evidence.path(PART3_ROWS, "rows"), 1 << 20, "results table"))
    ):
        if r.get("status") != "ok" or not r.get("iter_time_ms"):
            continue
        micro, it = int(r["micro_batch_size"]), float(r["iter_time_ms"]) / 1e3
        tokens = float(r["tok_s_padded"]) * it / micro
        st = kernels.step_time(kernels.Step(c, "full", "bf16-mixed", micro, tokens), "H100-SXM", tables=TRACED)
        g, ops, f = st.gpu_by_phase, st.host_ops_by_phase, 2 if r["activation_checkpointing"] == "True" else 1
        gpu, host_ops = f * g["forward"] + g["backward"], f * ops["forward"] + ops["backward"] + wrapper

        def at(h, s=1.0, gpu=gpu, host_ops=host_ops, g=g, ops=ops):
            return max(s * gpu, h * host_ops) + max(s * g["optimizer"], h * ops["optimizer"])

        pred = at(runtime.LITGPT_HOST_S_PER_OP)
        edge = _part3_plan(micro, f == 2).edge
        rows.append(
            {
                "setting": r["setting"],
                "micro": micro,
                "tokens": tokens,
                "measured_s": it,
                "predicted_s": pred,
                "error": pred / it - 1,
                "bound": "GPU" if gpu >= runtime.LITGPT_HOST_S_PER_OP * host_ops else "host",
                "gpu_util": float(r["gpu_util_mean"]),
                "retries": int(r["num_alloc_retries"] or 0),
                "edge": edge,
                **_band(pred, at, it, edge),
            }
        )
    return rows


def _part3_plan(micro: int, checkpointing: bool):
    """The memory plan of a Part 3 probe on the study's GPU row (``configs/sweeps/lab-part3.yaml``: TinyLlama full
    under FSDP on one H100, bf16-mixed, one micro batch a step)."""
    case = _part3_case(checkpointing).changed(micro_batch_size=micro, accumulation=1)
    return memory.verdict(memory.predict(case), hardware.lookup("H100-SXM"))


@functools.cache
def _part3_case(checkpointing: bool) -> PlanInput:
    """The Part 3 study's case, planned once per setting (its probes change the micro batch alone)."""
    overrides = ["--precision", "bf16-mixed", "--devices", "1"]
    recipe, gpu = recipes.resolve("tiny-llama-1.1b/full"), hardware.lookup("H100-SXM")
    return plan_recipe(recipe, overrides, gpu=gpu, strategy="fsdp", activation_checkpointing=checkpointing).input


def retry_stretch(root: Path) -> float:
    """:data:`tunelab.plan.model.runtime.EDGE_STRETCH` recomputed: the largest time per sample of a micro batch the
    caching allocator retried in over that of the same setting's largest micro batch below it without retries, in
    the FSDP study's published tables (``configs/sweeps/lab-part3.yaml``, rows noted 'cudaMalloc retries') and our
    Part 3 rows (``num_alloc_retries``)."""
    settings_rows = [
        [(int(r["micro"]), float(r["iter_ms"]), "retries" in str(r.get("note", ""))) for r in rows if r.get("iter_ms")]
        for rows in study.load(root / PART3_STUDY).lab.values()
    ]
    ours: dict[str, list] = {}
    table = root / evidence.path(PART3_ROWS, "rows")
    for r in csv.DictReader(io.StringIO(files.read_text(table, 1 << 20, "results table") if table.is_file() else "")):
        if r.get("status") == "ok" and r.get("iter_time_ms"):
            row = (int(r["micro_batch_size"]), float(r["iter_time_ms"]), int(r["num_alloc_retries"] or 0) > 0)
            ours.setdefault(r["setting"], []).append(row)
    stretches = []
    for rows in [*settings_rows, *ours.values()]:
        for micro, ms, retried in rows:
            clean = [(m, t) for m, t, r in rows if m < micro and not r]
            if retried and clean:
                m, t = max(clean)
                stretches.append((ms / micro) / (t / m))
    return max(stretches)


def part2_rows() -> list[dict]:
    """The lab's Part 2 A100 rows (OpenLLaMA 7B full, one device and four over PCIe): the kernel model's optimizer
    step (its micro batches, optimizer step and the communication compute does not hide; no validation) against
    the lab's time over its steps (which also holds start-up and any validation: an upper bound of the step)."""

    link = comm.lookup(LAB_PART2_LINK, "gpu")
    rows = []
    for r in lab_rows("lab-part2"):
        if not r.lab.get("time_s") or r.gpu != "A100-80GB":
            continue
        gpu = hardware.lookup(r.gpu)
        planned = plan_recipe(r.recipe, r.overrides(), gpu=gpu, strategy=r.strategy)
        case, train = planned.input, planned.settings.args["train"]
        t = runtime_terms(planned.settings, case, None)
        if not isinstance(t.kernels, runtime.KernelWork):
            continue
        t.comm = comm.per_step(case, link) if case.world > 1 else None
        t.detail.update(eval_iterations=0, evaluations=0, samples_generated=0)
        causes = t.by_cause(gpu)
        steps = t.detail["optimizer_steps"]
        lab = float(r.lab["time_s"]) / train["max_steps"]
        pred = sum(causes.values()) / steps
        rows.append(
            {
                "id": r.id,
                "strategy": r.strategy,
                "devices": case.world,
                "micro": case.micro_batch_size,
                "lab_step_s": lab,
                "predicted_s": pred,
                "error": pred / lab - 1,
                "compute_s": (sum(causes.values()) - causes["communication"]) / steps,
                "communication_s": causes["communication"] / steps,
            }
        )
    return rows


def a100_items() -> list[tuple]:
    """The lab's timed A100 rows planned (``tunelab.report.accuracy.lab_runtime_items``), the kernel model's step padded
    at each row's micro batch (not the lab's 437 tokens at 8): (row, terms, peak FLOP/s, bandwidth, lab seconds)."""

    items = lab_runtime_items()
    for _, t, *_ in items:
        if isinstance(t.kernels, runtime.KernelWork):
            step = dataclasses.replace(t.kernels.step, tokens=default_padded_per_sample(t.kernels.step.micro))
            t.kernels = dataclasses.replace(t.kernels, step=step)
    return items


def a100_rows(items: list | None = None, hosts: dict | None = None) -> list[dict]:
    """The lab's A100 rows: the kernel model's run by cause against litgpt's Training Time, and the fitted curve;
    ``host_bound``: the model says the row waited on its host (:func:`lab_hosts`); ``items``: :func:`a100_items` and
    ``hosts``: :func:`lab_hosts` when already computed."""
    items = items or a100_items()
    hosts = lab_hosts(items) if hosts is None else hosts
    rows = []
    for r, t, peak, bw, secs in items:
        row = {"id": r.id, "recipe": r.recipe.key, "note": r.note, "lab_s": secs, "curve_s": t.seconds(peak, bw)}
        row["host_bound"] = r.id in hosts
        if isinstance(t.kernels, runtime.KernelWork):
            gpu = hardware.lookup(r.gpu)
            causes = t.by_cause(gpu)
            pred = sum(causes.values())
            row.update(kernel_s=pred, error=pred / secs - 1, **causes)
            h0 = runtime.LITGPT_HOST_S_PER_OP
            row.update(_band(pred, lambda h, s, t=t, gpu=gpu, h0=h0: sum(t.by_cause(gpu, h / h0, s).values()), secs))
        else:
            row.update(kernel_s=None, error=None, not_modelled=t.kernels)
        rows.append(row)
    return rows


def kernel_model_error(rows: list[dict], busy: list[tuple]) -> float:
    """:data:`tunelab.plan.model.runtime.KERNEL_MODEL_ERROR` before rounding: the widest miss of the kernel model,
    as the band applies it (``|measured / predicted - 1|``: a band of the estimate x (1 -/+ it) holds the run), where
    the GPU bounds a run we calibrate on: the lab's A100 rows (:func:`a100_rows`) it times and does not call
    host-bound, and our runs whose GPU was busy :data:`HOST_BOUND_UTIL` % or more (``busy``: :func:`busy_steps`),
    these at the planner's host constant."""
    return max(abs(error) for _, error in gpu_bound_errors(rows, busy))


def lab_hosts(items: list | None = None) -> dict:
    """{row: host us per op} of the lab's A100 rows the kernel model says waited on their host (the training loop's
    kernels, without the gaps between them, under :data:`HOST_BOUND_UTIL` of its time at the planner's host: the share
    NVML gives our runs over their training window): the host time per op that makes the modelled run (validation
    and samples included) equal the lab's Training Time, by bisection on the host's scale; ``items``:
    :func:`a100_items` when already planned. The lab's machine is one of the hosts the plan's band spans."""
    out = {}
    for r, t, *_, secs in items or a100_items():
        if not isinstance(t.kernels, runtime.KernelWork):
            continue
        gpu = hardware.lookup(r.gpu)
        step = t.step_time(gpu)

        def run_s(scale: float, t=t, gpu=gpu, step=step) -> float:
            return sum(t.by_cause(gpu, scale, step=step).values())

        if not waits_on_host(t.by_cause(gpu, step=step)):
            continue  # busy with its kernels by the model (gaps idle, as NVML counts): its time says nothing of its host
        if (scale := solve(run_s, secs, 1e-4, 4.0)) is not None:
            out[r.id] = scale * runtime.LITGPT_HOST_S_PER_OP * 1e6
    return out


def shared_training_pairs(items: list, rows: list[dict]) -> list[tuple]:
    """Pairs of the lab's A100 rows that train alike (recipe, precision, micro batch and padded tokens: the same
    training kernels by the model) and differ in their validations and samples, each solved for the lab's machine:
    (first id, second id, its training time over the model's, its validations' and samples' over the model's).
    ``items``: :func:`a100_items`; ``rows``: :func:`a100_rows` of them. A diagnostic: two rows, two factors."""
    by_id = {r["id"]: r for r in rows if r["kernel_s"] is not None}
    groups: dict = {}
    for r, t, *_ in items:
        if r.id in by_id:
            k = t.kernels.step
            groups.setdefault((r.recipe.key, k.precision, k.micro, round(k.tokens, 3)), []).append(r.id)
    out = []
    for ids in groups.values():
        for a, b in zip(ids, ids[1:]):
            (ta, ea, sa), (tb, eb, sb) = (
                (by_id[i]["kernel_s"] - _evaluation_s(by_id[i]), _evaluation_s(by_id[i]), by_id[i]["lab_s"])
                for i in (a, b)
            )
            det = ta * eb - tb * ea
            if abs(det) > 1e-9 * abs(ta * eb):
                out.append((a, b, (sa * eb - sb * ea) / det, (ta * sb - tb * sa) / det))
    return out


def _evaluation_s(row: dict) -> float:
    """A lab row's modelled seconds of validation and generated samples."""
    return row["validation"] + row["generation"]


HOST_SCALES = tuple(round(0.3 + 0.05 * i, 2) for i in range(19))
"""The lab machine's host time per op relative to ours that :func:`lab_machine` tries (0.30 to 1.20)."""
GPU_SCALES = tuple(round(0.9 + 0.025 * i, 3) for i in range(17))
"""The lab board's time per kernel relative to the model's that :func:`lab_machine` tries (0.90 to 1.30)."""


def lab_machine(items: list | None = None) -> dict:
    """A diagnostic, not used by the planner: the lab's A100 machine as two factors against the kernel model, its host's
    time per op and its board's time per kernel relative to the constants' (``Terms.by_cause``'s ``host_scale`` and
    ``gpu_scale``), fitted by least squares on relative error over the lab's Part 1 rows, then each row predicted with
    them refitted without it (leave-one-out). {"host", "gpu": the fit on every row; "loo": {row: error}; "mae": the
    leave-one-out mean absolute error}; ``items``: :func:`a100_items` when already planned."""
    rows = [
        (r.id, t, hardware.lookup(r.gpu), secs)
        for r, t, *_, secs in items or a100_items()
        if isinstance(t.kernels, runtime.KernelWork)
    ]
    grid = [(h, g) for h in HOST_SCALES for g in GPU_SCALES]
    steps = {i: t.step_time(gpu) for i, t, gpu, _ in rows}  # each row's step once, scaled at every grid point
    err = {
        (i, hg): sum(t.by_cause(gpu, *hg, step=steps[i]).values()) / secs - 1 for i, t, gpu, secs in rows for hg in grid
    }

    def fit(without=None) -> tuple:
        return min(grid, key=lambda hg: sum(err[i, hg] ** 2 for i, *_ in rows if i != without))

    host, gpu_scale = fit()
    loo = {i: err[i, fit(i)] for i, *_ in rows}
    return {"host": host, "gpu": gpu_scale, "loo": loo, "mae": sum(map(abs, loo.values())) / len(loo)}


def write_report(path: Path, root: Path) -> None:
    """runtime.md (and runtime-kernel.csv beside it): one function per section."""

    items, bench = h100_items(root), bench_items(root)
    steps = {e.id: steps_rows(root, e.id) for e in evidence.with_role("steps", root)}
    lab = a100_items()  # the lab's rows planned once, for their table and the diagnostic
    hosts = lab_hosts(lab)
    h100, a100 = h100_rows(root, items), a100_rows(lab, hosts)
    rows = [{"set": "h100", **r} for r in h100] + [{"set": "a100-lab", **r} for r in a100]
    write_csv(path.with_name("runtime-kernel.csv"), rows, list(dict.fromkeys(k for r in rows for k in r)))
    part3 = part3_rows(root) if (root / evidence.path(PART3_ROWS, "rows")).is_file() else []
    benches = bench_rows(bench)
    timed = {
        "our H100 Part 1 rows": [(r["id"], r) for r in h100],
        **{evidence.entry(key, root).folder: [(r["id"], r) for r in rows] for key, rows in steps.items()},
        "our H100 Part 3 curve": [(f"{r['setting']} micro {r['micro']}", r) for r in part3],
        "our benches": [(f"{r['report']} {r['run']}", r) for r in benches],
        "the lab's A100 Part 1 times": [
            (r["id"], {**r, "measured_s": r["lab_s"], "predicted_s": r["kernel_s"]}) for r in a100 if r["kernel_s"]
        ],
    }
    hub, resources = config_hub_rows(root), resource_tables.rows(root)
    checks = {
        "litgpt's config_hub (check set)": _hub_runs(hub),
        "litgpt's resource tables (check set)": [
            (
                f"{r['model']} {r['quantize'] or ''} x{r['gpus']} micro {r['micro_batch_size']}",
                resource_tables.as_run(r),
            )
            for r in resources
            if r["minutes"]
        ],
    }
    save_figure(band_figure({**timed, **checks}), path.with_name("band.png"))
    lines = [
        *_md_h100(h100, fit_host(items)),
        *_md_band(timed, gpu_bound_errors(a100, busy_steps(root, bench, steps)), retry_stretch(root)),
        *_md_hosts(host_by_machine(items, bench, steps, hosts), steps),
        *(line for key, rows in steps.items() for line in _md_steps(evidence.entry(key, root), rows, items)),
        *(_md_part3(part3) if part3 else []),
        *_md_bench(bench, benches),
        *_md_whole_cost(bench_costs(root)),
        *_md_generate(generate_rows(root)),
        *_md_config_hub(hub),
        *resource_tables.markdown(resources, root),
        *_md_part2(),
        *_md_a100(a100),
        *_md_weak(lab, a100),
    ]
    write_text_atomic(path, "\n".join(lines))


def _hub_runs(rows: list[dict]) -> list[tuple[str, dict]]:
    """The config_hub check set's counted runs (:func:`_counted`, as runtime.md counts them) in :func:`_band`'s
    shape."""
    return [
        (
            f"{r['config']} {r['machine']}",
            {
                "measured_s": r["minutes"] * 60,
                "predicted_s": r["planned_s"],
                "band_low_s": r["band"][0],
                "band_high_s": r["band"][1],
                "in_band": r["inside"],
            },
        )
        for r in rows
        if _counted(r)
    ]


def band_figure(timed: dict):
    """band.png: every timed run's band over its measured time (a bar; blue inside, red outside) and the point
    estimate over it (a dot), set by set (``timed``: {set: [(run, row), ...]}, rows as :func:`_band` makes them): a
    run lies inside where its bar crosses the line at 1."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(11, 4.2))
    x, ticks = 0, []
    for name, rows in timed.items():
        start = x
        for _, r in rows:
            m = r["measured_s"]
            ax.vlines(x, r["band_low_s"] / m, r["band_high_s"] / m, colors="tab:blue" if r["in_band"] else "tab:red")
            if r.get("predicted_s"):
                ax.plot(x, r["predicted_s"] / m, "k.", markersize=3)
            x += 1
        ticks.append(((start + x - 1) / 2, f"{name} ({len(rows)})"))
        x += 3
    ax.axhline(1.0, color="gray", linewidth=0.8)
    ax.set_yscale("log")
    ax.set_yticks(
        [0.4, 0.5, 0.67, 0.8, 1.0, 1.25, 1.5, 2.0, 2.5], ["0.4", "0.5", "0.67", "0.8", "1", "1.25", "1.5", "2", "2.5"]
    )
    ax.minorticks_off()
    ax.set_xticks([t for t, _ in ticks], [n for _, n in ticks], fontsize=7, rotation=20, ha="right")
    ax.set_ylabel("planned / measured time (log)")
    ax.set_title("The plan's band around each timed run (bar: band, dot: point estimate; inside where a bar crosses 1)")
    fig.tight_layout()
    return fig


def _md_band(timed: dict, bound: list[tuple[str, float]], stretch: float) -> list[str]:
    """Whether each timed run lies in the band the plan prints around it (``timed``: {set: [(run, row), ...]}, each
    row with its measured seconds and :func:`_band`'s figures; ``bound``: :func:`gpu_bound_errors`, the runs the
    band's miss is taken over; ``stretch``: :func:`retry_stretch` recomputed)."""
    e, (a, b) = runtime.KERNEL_MODEL_ERROR, (h * 1e6 for h in runtime.LITGPT_HOST_S_PER_OP_RANGE)
    runs = [run for rows in timed.values() for run in rows]
    inside = sum(r["in_band"] for _, r in runs)
    widest = max(abs(error) for _, error in bound)
    beyond = [f"{run} {error:+.1%}" for run, error in bound if abs(error) > 0.10]
    lines = [
        "",
        "## The plan's band against every timed run",
        "",
        f"The band `tunelab plan` prints around litgpt's loop: the kernel model's widest miss where the GPU bounds a run "
        f"we calibrate on (ours busy {HOST_BOUND_UTIL:.0f}% or more, the lab's A100 rows its kernels bound; {e:.1%}, "
        f"recomputed {widest:.2%}) "
        f"either side of its estimate, widened to the hosts we measured ({a:.0f}-{b:.0f} us an op) with the kernels at that "
        "miss there too (a run the fastest host leaves bound by its GPU keeps the GPU's miss); around the fast path: "
        f"its stated error for its bound; where the plan is at the edge of memory, its high end stretched "
        f"{runtime.EDGE_STRETCH}x for the allocator's retries (recomputed {stretch:.3f}x: the FSDP study's tables and "
        f"our Part 3 rows). {inside} of {len(runs)} timed runs lie inside it. Of the {len(bound)} runs the GPU "
        f"bounds (those the miss is taken over), {len(bound) - len(beyond)} are within 10% of the estimate"
        + (f"; beyond it, measured over estimated: {'; '.join(beyond)}" if beyond else "")
        + ". (The lab's Part 2 "
        "times hold start-up and validation: an upper bound of the step, not held to the band.) Each run's band over "
        "its measured time, litgpt's config_hub check set beside them: `band.png`.",
        "",
        "| timed runs | inside | outside: measured s (band s) |",
        "|---|---|---|",
    ]
    for name, rows in timed.items():
        out = [
            f"{run}: {r['measured_s']:.3f} ({r['band_low_s']:.3f}-{r['band_high_s']:.3f})"
            for run, r in rows
            if not r["in_band"]
        ]
        lines.append(f"| {name} | {len(rows) - len(out)} of {len(rows)} | {'; '.join(out)} |")
    return lines


def _md_whole_cost(costs: list[tuple]) -> list[str]:
    """Each bench report's fast arm against litgpt end to end (``costs``: :func:`bench_costs`)."""
    lines = [
        "",
        "## The fast path's whole cost (our benches, end to end)",
        "",
        "Start-up: a run's wall time less litgpt's printed Training Time (loading, compiling every shape ahead, the "
        "final save); the fast arm's from its warmest to its coldest inductor cache (a first run on a machine "
        "compiles cold). Per step: the Training Times over the optimizer steps. Break-even: the optimizer steps "
        "from which the fast arm's whole run is the shorter.",
        "",
    ]
    for e, cost in costs:
        lines.append(f"- `{e.folder}` ({e.device}):" + bench.whole_cost_line(cost)[1].removeprefix("End to end:"))
    warm, cold = start_extra(costs)
    lines += [
        "",
        f"The fast arm's start beyond litgpt's, the median over these reports: {warm:.1f} s warm, {cold:.1f} s cold "
        "(`tunelab.plan.model.fast_step.FAST_START_EXTRA_S`, from which `plan --strategy fast` counts the steps it "
        "takes to pay back).",
    ]
    return lines


def bench_costs(root: Path) -> list[tuple]:
    """(evidence entry, :func:`tunelab.report.bench.whole_cost`) of every bench report with both arms finished."""
    out = []
    for e in evidence.with_role("bench"):
        recs = [(name.split("/")[-2], rec) for name, rec, _ in archived_records(root / e.path("records"))]
        cost = bench.whole_cost(
            [r for n, r in recs if n.startswith("fast-")], [r for n, r in recs if n.startswith("litgpt-")]
        )
        if cost is not None:
            out.append((e, cost))
    return out


def fast_start_extra(root: Path) -> tuple[float, float]:
    """The fast arm's start-up beyond litgpt's, warm and cold, over ``root``'s benches (:func:`start_extra`)."""
    return start_extra(bench_costs(root))


def start_extra(costs: list[tuple]) -> tuple[float, float]:
    """The fast arm's start-up beyond litgpt's, warm and cold: the medians over ``costs`` (:func:`bench_costs`)."""
    return tuple(statistics.median(c["fast_start_s"][i] - c["litgpt_start_s"] for _, c in costs) for i in (0, 1))


def _md_h100(h100: list[dict], fitted: float) -> list[str]:
    """The model in a paragraph, then our H100 Part 1 rows with leave-one-out."""
    lines = [
        "# The kernel-level time model against measured times",
        "",
        "Regenerate with `tunelab plan-accuracy`. Model: `tunelab/plan/model/kernels.py` times every kernel of litgpt's "
        "simulated step (constants fitted on our H100 profile: `kernels.md`); `tunelab/plan/model/runtime.py` "
        "(`Terms.by_cause`) puts the run around it: each micro batch and each optimizer step take their kernels "
        "or the host's launches, whichever is longer, at "
        f"{runtime.LITGPT_HOST_S_PER_OP * 1e6:.1f} us of host time per op in litgpt's loop (the median machine of "
        "those we measured: the host section below), then validations and generated samples. "
        "`tunelab plan` prints it as the time by cause and takes it as its point estimate, and `advise` ranks by it, "
        "wherever it applies (the fitted curve remains for offloaded optimizer steps and optimizers it does not trace).",
        "",
        "## Our H100 Part 1 rows (seconds per optimizer step, steady window)",
        "",
        "NVIDIA H100 80GB HBM3, litgpt 0.5.13, torch 2.11, random weights, the benchmark data; padded tokens per "
        "sample as measured in each row's window. Predicted: at the planner's host constant (this machine is one of "
        f"those it is the median of); leave-one-out: at this machine's own constant ({fitted * 1e6:.1f} us fitted on "
        "these rows) refitted without the row, the model where the host is known.",
        "",
        "| row | recipe | precision | micro x accumulation | padded tokens | measured s | predicted s | error | "
        "leave-one-out s | error | GPU s per micro | ops per micro |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in h100:
        lines.append(
            f"| {r['id']} | {r['recipe']} | {r['precision']} | {r['micro']} x {r['accumulation']} | {r['tokens']:.0f} | "
            f"{r['measured_s']:.3f} | {r['predicted_s']:.3f} | {r['error']:+.1%} | {r['loo_predicted_s']:.3f} | "
            f"{r['loo_error']:+.1%} | {r['gpu_s_per_micro']:.4f} | {r['ops_per_micro']:,} |"
        )
    return lines


def host_by_machine(h100: list[dict], bench: list[dict], steps: dict, lab: dict | None = None) -> dict:
    """{machine: [host us per op, ...]}: what every litgpt run that was host-bound by measurement (GPU busy under
    :data:`HOST_BOUND_UTIL`) implies (:func:`implied_host`), by the machine it ran on: the H100 Part 1 rows
    (``h100``: :func:`h100_items`), each bench report's litgpt runs (``bench``: :func:`bench_items`; one report, one
    machine), the rows of each ``steps`` entry ({key: :func:`steps_rows` of it}) and the lab's host-bound rows (``lab``:
    :func:`lab_hosts`, published Training Times: host-bound by the model, not by a measured utilisation)."""
    out: dict = {}
    if lab:
        out["A100 (the lab's machine, published times)"] = sorted(lab.values())

    def add(machine: str, util, host) -> None:
        if util is not None and util < HOST_BOUND_UTIL and host:
            out.setdefault(machine, []).append(host * 1e6)

    for i in h100:
        add(f"H100-SXM {evidence.entry(H100_ROWS).folder}", i["gpu_util"], i["implied_host"])
    for key, rows in steps.items():
        for r in rows:
            add(
                f"{r['gpu']} {evidence.entry(key).folder}",
                r["gpu_util"],
                r["implied_host_us"] and r["implied_host_us"] / 1e6,
            )
    for it in bench:
        if it["arm"] == "litgpt":
            implied = implied_host(_bench_step(it), it["accumulation"], it["measured_s"])
            add(f"{it['gpu'].name} {it['report']}", it["gpu_util"], implied)
    return out


def central_host(machines: dict) -> float:
    """The planner's host seconds per op (:data:`tunelab.plan.model.runtime.LITGPT_HOST_S_PER_OP`): the median over
    ``machines`` (:func:`host_by_machine`) of each machine's median, so that no machine counts for more than one
    however many runs it holds."""
    return statistics.median(statistics.median(hosts) for hosts in machines.values()) / 1e6


def _md_hosts(machines: dict, steps: dict) -> list[str]:
    """The host time per op every host-bound litgpt run implies, by machine (``machines``: :func:`host_by_machine`),
    beside the probes the ``steps`` entries' records carry ({key: :func:`steps_rows`})."""
    every = [h for hosts in machines.values() for h in hosts]
    if not every:
        return []
    spread = "; ".join(
        f"{m}: {min(h):.0f}" + (f"-{max(h):.0f}" if round(max(h)) != round(min(h)) else "") for m, h in machines.items()
    )
    within = max(max(h) / min(h) - 1 for h in machines.values())
    probes = [
        f"{min(p):.2f}-{max(p):.2f} us on `{evidence.entry(key).folder}`"
        for key, rows in steps.items()
        if len(p := [r["host_op_us"] for r in rows if r["host_op_us"]]) > 1
    ]
    return [
        "",
        "## The host's time per op, by machine",
        "",
        f"Every litgpt run we have whose GPU waited on its host (busy under {HOST_BOUND_UTIL:.0f}%), by machine, in us "
        f"of host time per op: {spread}. From {min(every):.0f} to {max(every):.0f} us, a factor of "
        f"{max(every) / min(every):.1f}: the loop's cost per op is a property of the machine (and of the moment: runs "
        f"on one machine differ by up to {within:.0%}). The eager-dispatch probe the records carry (`host_op_us`) "
        f"does not follow it"
        + (
            f" (it read {'; '.join(probes)}, its highest readings beside the same loop speed as its lowest)"
            if probes
            else ""
        )
        + ": the plan keeps one host constant, does not scale it by a probe, and carries this spread in its band. "
        f"That constant is the median machine: each machine's median, the median over the {len(machines)} machines, "
        f"{central_host(machines) * 1e6:.1f} us (the planner's {runtime.LITGPT_HOST_S_PER_OP * 1e6:.1f}).",
    ]


def _steps_cells(rows: list[dict], h100: list[dict]) -> dict:
    """{column: its cell per row} of a ``steps`` section (:func:`_md_steps`), the H100 machine's figures beside the
    rows of the same id (``h100``: :func:`h100_items`) where it has any."""
    first = {i["id"]: (i["measured_s"], i["implied_host"]) for i in h100}

    def on_h100(r: dict) -> str:
        if r["id"] not in first:
            return "not timed"
        s, host = first[r["id"]]
        return f"{s:.3f}, {fmt(host and host * 1e6, '.1f', 'GPU-bound')}"

    columns = {
        "row": lambda r: r["id"],
        "recipe": lambda r: r["recipe"],
        "precision": lambda r: r["precision"],
        "micro x accumulation": lambda r: f"{r['micro']} x {r['accumulation']}",
        "padded tokens": lambda r: f"{r['tokens']:.0f}",
        "measured s": lambda r: f"{r['measured_s']:.3f}",
        "predicted s": lambda r: f"{r['predicted_s']:.3f}",
        "error": lambda r: f"{r['error']:+.1%}",
        "kernels s": lambda r: f"{r['kernels_s']:.3f}",
        "host us/op implied": _implied,
        "by third: s (us/op)": lambda r: ", ".join(f"{s:.3f} ({fmt(h, '.0f', 'GPU')})" for s, h in r["thirds"]),
        "H100 machine: measured s, host us/op implied": on_h100 if set(first) & {r["id"] for r in rows} else None,
        "host_op_us": lambda r: fmt(r["host_op_us"], ".2f"),
        "device_op_us": lambda r: fmt(r["device_op_us"], ".2f"),
        "SM MHz": lambda r: fmt(r["sm_clock_mhz"], ".0f"),
        "GPU util %": lambda r: fmt(r["gpu_util"], ".0f"),
    }
    return {c: [f(r) for r in rows] for c, f in columns.items() if f is not None}


def _md_steps(e: evidence.Entry, rows: list[dict], h100: list[dict]) -> list[str]:
    """One ``steps`` entry's section: its litgpt runs (:func:`steps_rows`) against the plan on its GPU's table row at
    the planner's host constant, beside the H100 machine's rows of the same id (``h100``:
    :func:`h100_items`); a column empty in every row is left out."""
    if not rows:
        return []
    cells = _steps_cells(rows, h100)
    shown = [c for c, values in cells.items() if any(values)]
    errors = [abs(r["error"]) for r in rows]
    lines = [
        "",
        f"## {e.title} ({e.device}, {e.date}), out of sample",
        "",
        f"{e.software}; random weights, the benchmark data (`{e.path('records')}`). {e.note} Measured: the mean "
        "optimizer step over each run's steady window; predicted: the model on the GPU's table row at the planner's "
        "host constant (the median machine's). 'host us/op implied': the host time per op that would make the model's step equal "
        "the measured one (GPU-bound where the kernels alone take longer), in brackets where the GPU was busy "
        f"{HOST_BOUND_UTIL:.0f}% of the window or more: such a row's gap is the kernel model's, not its host's."
        + (" 'by third': the mean step over each third of the window." if "by third: s (us/op)" in shown else "")
        + (
            " The probes (`host_op_us`: an eager op on the CPU; `device_op_us`: the same op launched on GPU 0) were "
            "taken in the parent just before each launch."
            if "host_op_us" in shown
            else ""
        ),
        "",
        "| " + " | ".join(shown) + " |",
        "|" + "---|" * len(shown),
        *("| " + " | ".join(cells[c][k] for c in shown) + " |" for k in range(len(rows))),
        "",
        f"Mean absolute error {sum(errors) / len(errors):.1%} over {len(rows)} rows, worst {max(errors):.1%}.",
    ]
    by = {r["recipe"].split("/")[-1]: r for r in rows}
    if {"qlora", "lora"} <= set(by):
        lines += ["", _qlora_over_lora(by["qlora"], by["lora"])]
    return lines


def _qlora_over_lora(q: dict, lo: dict) -> str:
    """The QLoRA loop section's closing sentence, from its two rows: the ratio measured and predicted, and what the
    rows' implied host times per op say (only where both were host-bound by measurement)."""
    ratio = (
        f"QLoRA over LoRA: measured {q['measured_s'] / lo['measured_s']:.2f}x, predicted "
        f"{q['predicted_s'] / lo['predicted_s']:.2f}x."
    )
    busy = f"the GPU busy {fmt(q['gpu_util'], '.0f')}% and {fmt(lo['gpu_util'], '.0f')}%"
    hosts = [r["implied_host_us"] for r in (q, lo)]
    if not (q["host_bound"] and lo["host_bound"] and all(hosts)):
        return f"{ratio} Not both host-bound ({busy}): their implied host times do not isolate bitsandbytes' host work."
    apart = max(hosts) / min(hosts) - 1
    constant = runtime.LITGPT_HOST_S_PER_OP * 1e6
    host = (
        f"both under the constant's {constant:.0f} us: the rest of both errors is this machine's host, faster"
        if max(hosts) < constant
        else f"not both under the constant's {constant:.0f} us"
    )
    return (
        f"{ratio} Both host-bound ({busy}): the two rows imply {hosts[0]:.1f} and {hosts[1]:.1f} us of host time per "
        f"op ({apart:.0%} apart), so bitsandbytes' host work per 4-bit matmul and per PagedAdamW tensor, fitted on "
        f"the isolated step, carries into litgpt's loop; {host}."
    )


def _implied(row: dict) -> str:
    """A row's implied host time per op: plain where the row was host-bound, in brackets where its GPU was busy."""
    h = row["implied_host_us"]
    if h is None:
        return "GPU-bound"
    return f"{h:.1f}" if row["host_bound"] else f"({h:.1f})"


def _md_part3(rows: list[dict]) -> list[str]:
    """Our H100 Part 3 micro-batch curve (:func:`part3_rows`), out of sample."""
    lines: list[str] = []
    lines += [
        "",
        "## Our H100 Part 3 micro-batch curve (seconds per iteration: one micro batch and an optimizer step)",
        "",
        "TinyLlama full fine-tuning, bf16-mixed, FSDP on one H100 (litgpt's FSDP strategy; its wrapper's host "
        "work per unit charged as the planner charges FSDP1's, in ops measured on a CPU), steady window. Out of sample: nothing was fitted on these rows. GPU "
        "utilisation (NVML, mean over the window) says which rows the GPU itself bounded.",
        "",
        "| setting | micro | padded tokens | measured s | predicted s | error | bound (model) | GPU util % | "
        "allocator retries |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['setting']} | {r['micro']} | {r['tokens']:.0f} | {r['measured_s']:.3f} | "
            f"{r['predicted_s']:.3f} | {r['error']:+.1%} | {r['bound']} | {r['gpu_util']:.0f} | {r['retries']} |"
        )
    return lines


def _md_bench(items: list[dict], bench: list[dict]) -> list[str]:
    """Our benches (litgpt and the fast path), and the fast path's error by bound; ``items``: :func:`bench_items`
    (the archives read once, for the rows and the refit), ``bench``: their :func:`bench_rows`."""
    lines: list[str] = []
    if not bench:
        return lines

    refit, refit_memory = fit_compiled_host(items), fit_compiled_memory(items)
    lines += [
        "",
        "## Our benches: the fast path and litgpt (seconds per optimizer step, steady window, mean)",
        "",
        "bf16-true, the benchmark data, random weights. Measured: the mean step over the steady window (the window's "
        "time over its steps; the median understates the fast path, whose loss read every 25 iterations makes one "
        "step in about six wait for the GPU's backlog), at the window's padded tokens per sample. The fast path is "
        "timed by `tunelab/plan/model/fast_step.py` (compiled blocks from torch.compile's own graphs, Liger's chunks, "
        "the fused optimizer, launches queued ahead of the GPU); its host time per compiled kernel "
        f"({fast_step.COMPILED_HOST_S_PER_KERNEL * 1e6:.0f} us; a refit gives {refit * 1e6:.0f} us) and its "
        f"compiled kernels' share of the memory rate ({fast_step.COMPILED_MEMORY_EFFICIENCY:.2f}; a refit gives "
        f"{refit_memory:.2f}) are fitted on the runs marked 'in' below. Everything else is out of sample. The "
        "reports:",
        "",
        *(
            f"- `{e.where}` ({e.device}{f', {e.machine} machine' if e.machine else ''}; {e.software}): {e.note}"
            for e in evidence.with_role("bench")
        ),
        "",
        "| report | GPU | run | arm | micro x accumulation | padded tokens | measured s | predicted s | error | "
        "bound (model) | GPU util % | sample |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in bench:
        sample = r["sample"] + ("; blocks partly eager (recompile limit hit)" if r["eager"] else "")
        lines.append(
            f"| {r['report']} | {r['gpu']} | {r['run']} | {r['arm']} | {r['micro']} x {r['accumulation']} | "
            f"{r['tokens']:.0f} | {r['measured_s']:.3f} | {r['predicted_s']:.3f} | {r['error']:+.1%} | "
            f"{r['bound']} | {r['gpu_util']:.0f} | {sample} |"
        )
    lines += [
        "",
        "Fast path as designed (compiled throughout), the widest miss (measured over planned) by what the model says "
        "bounds the run (`fast_step.FAST_MODEL_ERROR`, rounded up): "
        + "; ".join(f"{b}-bound {e:.1%} over {n} runs" for b, (e, n) in fast_errors(bench).items())
        + ". The band `plan` prints either side (`runtime.fast_band`): "
        + "; ".join(f"{b}-bound {runtime.fast_band(b):.1%}" for b in fast_step.FAST_MODEL_ERROR)
        + " (where the GPU bounds it, never narrower than the kernel model's).",
    ]
    return lines


def _token_seconds(gpu_s: float, host_ops: float, host_s_per_op: float, gpu_scale: float = 1.0) -> float:
    """A decoded token's seconds: its kernels (``gpu_scale`` times as long) or its host's ops, the longer."""
    return max(gpu_s * gpu_scale, host_ops * host_s_per_op)


def generate_rows(root: Path = ROOT) -> list[dict]:
    """litgpt's published generation speeds (``configs/published/litgpt-generate.yaml``: a check set, not fitted)
    against the plan's decoded token on the same GPU row: its kernels, its host's ops at litgpt's loop constant
    (:data:`tunelab.plan.model.runtime.LITGPT_HOST_S_PER_OP`) times the decoded token's share of it
    (:data:`tunelab.plan.model.kernels.EVAL_HOST_SHARE`), the longer of the two as the plan counts generation,
    the plan's band around it (:func:`~tunelab.plan.model.runtime.litgpt_band`: the hosts we measured, the kernel
    model's miss) and whether the published time lies inside, and the most host time per op the published time
    allows (all of it, where it exceeds the kernels)."""
    from litgpt import Config

    keys = ("source", "gpu", "model", "precision", "quantize", "new_tokens", "seconds")
    _, table = evidence.published("litgpt-generate", (), keys, root)
    share = {phase: kernels.eval_host_share(phase, "full") for phase in bnb_kernels.EVAL_PYTHON_SHARE}
    rows, then_over_now = [], None
    for n, r in enumerate(table):
        try:
            config, gpu = Config.from_name(str(r["model"])), hardware.lookup(str(r["gpu"]))
            if not all(evidence.positive(r[k]) for k in keys[-2:]):
                raise ValueError("new_tokens and seconds must be numbers above 0")
            if r["quantize"] not in (None, "bnb.nf4"):
                raise ValueError(f"quantize: {r['quantize']!r} is not null or bnb.nf4")
        except ValueError as e:
            raise InputError(f"{evidence.PUBLISHED}/litgpt-generate.yaml: rows[{n}]: {e}; fix: correct it") from None
        st = kernels.step_time(kernels.Step(config, "full", r["precision"], 1, 64), r["gpu"], tables=TRACED)
        gpu_s, ops = st.gpu_by_phase.get("decode", 0.0), st.host_ops("decode")
        bnb_ops, ops_then = 0, None  # bitsandbytes' Python per 4-bit matmul, as the plan counts a QLoRA run's token
        if r["quantize"]:
            bnb_ops = round(bnb_kernels.qlora_work(config, 64, kernels.memory_rate(gpu), 0.0, share)["decode"][2])
            then_over_now = then_over_now or bnb_decode_then_over_now(root)
            ops_then = ops + bnb_ops * then_over_now  # at the bitsandbytes the rows ran
        ops += bnb_ops
        published = r["seconds"] / r["new_tokens"]
        token_s = functools.partial(_token_seconds, gpu_s, ops * share["decode"])
        planned = token_s(runtime.LITGPT_HOST_S_PER_OP)
        low, high = runtime.litgpt_band(planned, token_s)
        if ops_then:  # the same band at the bitsandbytes the row ran
            then_s = functools.partial(_token_seconds, gpu_s, ops_then * share["decode"])
            then_band = runtime.litgpt_band(then_s(runtime.LITGPT_HOST_S_PER_OP), then_s)
        rows.append(
            {
                **r,
                "published_ms": published * 1e3,
                "kernels_ms": gpu_s * 1e3,
                "ops": ops,
                "planned_ms": planned * 1e3,
                "band_ms": (low * 1e3, high * 1e3),
                "inside": low <= published <= high,
                "error": planned / published - 1,
                "implied_host_us": published / ops * 1e6 if ops and published > gpu_s else None,
                "implied_host_then_us": published / ops_then * 1e6 if ops_then and published > gpu_s else None,
                "bnb_then_over_now": then_over_now if r["quantize"] else None,
                "inside_then": then_band[0] <= published <= then_band[1] if ops_then else None,
            }
        )
    return rows


def bnb_decode_then_over_now(root: Path = ROOT) -> float:
    """bitsandbytes 0.41.1's Python per decoded token's 4-bit matmul over 0.50.2's: the medians of the two runs of
    ``scripts/bench_bnb_host.py`` on one CPU (evidence ``cpu-bnb-host``), kernels stubbed."""
    extra = []
    for what in ("results_0.41", "results"):
        where = root / evidence.path("cpu-bnb-host", what, root)
        result = files.read_json(where, 1 << 20, "bitsandbytes host run", links=False)  # an archive: never a link
        try:
            value = result["summary"]["decode_extra_us"]["median"]
        except (KeyError, TypeError):
            value = None
        if not evidence.positive(value):
            raise InputError(
                f"{evidence.path('cpu-bnb-host', what, root)}: summary.decode_extra_us.median is not a finite number "
                "of us above 0; fix: rerun scripts/bench_bnb_host.py into it"
            )
        extra.append(value)
    return extra[0] / extra[1]


CONFIG_HUB = "litgpt-config-hub"
"""The published table of litgpt's config_hub runs (``configs/published/``), its YAMLs in the folder of that name."""


CONFIG_HUB_AS_RAN = {"bnb_keeps_matmul_inputs": True, "qlora_stable_embedding": False}
"""The table's QLoRA runs as they ran (:class:`tunelab.plan.model.case.LoopFeatures`): bitsandbytes 0.42.0, whose
4-bit matmul kept each input for backward, and litgpt before its trainable StableEmbedding."""
SLIDING_WINDOW_AS_RAN = ("none", "whole", "rows")
"""How the litgpt that measured a sliding-window model's rows built its masks (the table's
``sliding_window_as_ran``, per model folder): "none", before litgpt applied sliding windows (the model as
:func:`tunelab.models.without_sliding_window` builds it); "whole", a few whole-mask ops a layer
(``LoopFeatures.sliding_mask_by_row`` False); "rows", row by row as the plan's litgpt does."""


def _sliding_mapping(mapping) -> dict:
    """The table's ``sliding_window_as_ran``: model folders to one of :data:`SLIDING_WINDOW_AS_RAN`; InputError,
    naming the key, for anything else."""
    where = f"{evidence.PUBLISHED}/{CONFIG_HUB}.yaml: sliding_window_as_ran"
    fix = f"fix: a mapping of model folders to one of {', '.join(SLIDING_WINDOW_AS_RAN)}"
    if not isinstance(mapping, dict):
        raise InputError(f"{where}: {type(mapping).__name__} is not a mapping; {fix}")
    for folder, how in mapping.items():
        if not isinstance(folder, str) or not isinstance(how, str) or how not in SLIDING_WINDOW_AS_RAN:
            raise InputError(f"{where}.{folder}: {how!r} is not a way litgpt built the masks; {fix}")
    return mapping


def _sliding_as_ran(mapping: dict, folder: str, config) -> dict:
    """The case changes that plan a row of model ``folder`` (litgpt ``config``) with the masks its litgpt built
    (:data:`SLIDING_WINDOW_AS_RAN`, from the table's checked ``mapping``); InputError for a sliding-window model the
    table does not say of."""
    if not sliding_window_layers(config):
        return {}
    how = mapping.get(folder)
    if how is None:
        raise InputError(
            f"{evidence.PUBLISHED}/{CONFIG_HUB}.yaml: sliding_window_as_ran.{folder}: missing; the model has "
            "sliding-window layers: say how the litgpt that measured it built their masks; fix: one of "
            f"{', '.join(SLIDING_WINDOW_AS_RAN)}"
        )
    if how == "none":
        return {"config": without_sliding_window(config)}
    return {"sliding_mask_by_row": how == "rows"}


STATES = ("weights", "lora_weights", "gradients", "optimizer_states")
"""The plan's terms a run holds from its first optimizer step to its end whatever its data: a published peak below
their sum cannot be the YAML as written."""


def config_hub_rows(root: Path = ROOT) -> list[dict]:
    """litgpt's published runs of its config_hub YAMLs (``configs/published/litgpt-config-hub.yaml``: a check set,
    not fitted), each YAML planned as it is on the table's GPU: the plan's time and band against the table's runtime,
    its peak per device against the table's (``memory_error``; ``states_gb``: the plan's :data:`STATES`), its verdict
    against the table's OOM. A row whose epochs or micro batch differ from its YAML's ran an older YAML (``same_yaml``
    False); one whose published peak lies below the YAML's own :data:`STATES` did not run it (``not_the_yaml``)."""
    keys = ("config", "machine", "epochs", "micro_batch_size", "minutes", "peak_gb")
    head, table = evidence.published(CONFIG_HUB, ("source", "note", "sliding_window_as_ran"), keys, root)
    folder = (root / evidence.PUBLISHED / CONFIG_HUB).resolve()
    sliding = _sliding_mapping(head["sliding_window_as_ran"])
    rows, plans = [], {}
    for n, r in enumerate(table):
        machine = re.fullmatch(r"(\d+)x(\w+)", str(r["machine"]))
        path = (folder / str(r["config"])).resolve()
        counts = all(evidence.positive(r[k], whole=True) for k in keys[2:4])
        numbers = all(r[k] is None or evidence.positive(r[k]) for k in keys[4:])
        try:
            if machine is None or not path.is_relative_to(folder) or path.suffix != ".yaml":
                raise ValueError(f"machine NxGPU and a YAML inside {evidence.PUBLISHED}/{CONFIG_HUB}/")
            if not counts or not numbers:
                raise ValueError("epochs and micro_batch_size whole numbers, minutes and peak_gb numbers or null")
            gpu = hardware.lookup(machine.group(2))
        except ValueError as e:
            raise InputError(f"{evidence.PUBLISHED}/{CONFIG_HUB}.yaml: rows[{n}]: {e}; fix: correct it") from None
        if (path, gpu.name) not in plans:  # one YAML published on several machines: planned once
            try:
                planned = plan_recipe(recipes.load(path), [], gpu=gpu)
                masks = _sliding_as_ran(sliding, path.parent.name, planned.input.config)
                as_ran = replanned(planned, gpu, **CONFIG_HUB_AS_RAN, **masks)
                plans[path, gpu.name] = planned, as_ran, project_recipe(as_ran, gpu)[0]
            except InputError:
                raise
            except ValueError as e:  # the YAML's own values, refused by the planner's range checks
                raise InputError(f"{evidence.PUBLISHED}/{CONFIG_HUB}/{r['config']}: {e}") from None
        planned, as_ran, projection = plans[path, gpu.name]
        st = planned.settings
        published_s = r["minutes"] * 60 if r["minutes"] is not None else None
        lo, hi = projection.seconds_band
        host_us = _hub_host_us(as_ran, gpu, projection, published_s) if published_s else None
        rows.append(
            {
                **r,
                "gpu": gpu.name,
                "devices": st.world_size,
                "strategy": planned.input.strategy,
                "method": planned.input.method,
                "same_yaml": (st.epochs, st.micro_batch_size) == (r["epochs"], r["micro_batch_size"]),
                "note": str(head["note"]),
                "planned_s": projection.seconds,
                "band": (lo, hi),
                "error": projection.seconds / published_s - 1 if published_s else None,
                "inside": lo <= published_s <= hi if published_s else None,
                **_hub_memory(planned, as_ran, r["peak_gb"]),
                "implied_host_us": host_us,
            }
        )
    return rows


def _hub_memory(planned, as_ran, peak_gb: float | None) -> dict:
    """A config_hub row's peak planned as it ran (``as_ran``; ``versions_gb``: ``planned``, at the plan's own
    versions) against the published ``peak_gb``, the plan's :data:`STATES` and the verdict as it ran."""
    peak = as_ran.plan.peak_allocated_bytes / GB
    states = sum(planned.plan.breakdown_bytes.get(k, 0) for k in STATES) / GB
    return {
        "versions_gb": planned.plan.peak_allocated_bytes / GB,
        "planned_gb": peak,
        "memory_error": peak / peak_gb - 1 if peak_gb else None,
        "states_gb": states,
        "not_the_yaml": bool(peak_gb) and peak_gb < states,
        "fits": as_ran.plan.fits,
    }


def _hub_host_us(planned, gpu, projection, published_s: float) -> float | None:
    """The host time per op (us) at which the plan's run takes the published time, for a run the plan says waits on
    its host (its kernels busy under :data:`HOST_BOUND_UTIL` % of the training loop, as :func:`lab_hosts` asks);
    None for one the GPU bounds, or that no host between 1 and 500 us an op explains."""
    if not waits_on_host(projection.seconds_by_cause or {}):
        return None

    def run_s(host_us: float) -> float:
        return project_recipe(planned, gpu, host_us_per_op=host_us)[0].seconds

    return solve(run_s, published_s, 1.0, 500.0, halvings=20)


def _counted(row: dict) -> bool:
    """Whether a config_hub row holds the plan to its band: timed, its YAML as it ran (its epochs, micro batch and
    states)."""
    return row["minutes"] is not None and row["same_yaml"] and not row["not_the_yaml"]


def _md_config_hub_hosts(rows: list[dict]) -> list[str]:
    """The host time per op the counted runs the plan calls host-bound imply, against the hosts the band spans."""
    bound = [r for r in rows if _counted(r) and r["implied_host_us"]]
    if not bound:
        return []
    fast, slow = (h * 1e6 for h in runtime.LITGPT_HOST_S_PER_OP_RANGE)
    names = ", ".join(f"{r['config']} {r['implied_host_us']:.1f}" for r in bound)
    below = [r["config"] for r in bound if r["implied_host_us"] < fast and not r["inside"]]
    return [
        f"The runs the plan says wait on their host (kernels busy under {HOST_BOUND_UTIL:.0f}% of the loop) imply, "
        f"in us of host time per op: {names} (the last column), against the {fast:.0f}-{slow:.0f} of the machines we "
        "measured, the band's span"
        + (f"; {', '.join(below)} lies below the band: its host is faster than any we measured." if below else ".")
        + " A check, not fitted.",
        "",
    ]


def _md_config_hub_memory(rows: list[dict]) -> str:
    """The config_hub peaks summed up by method: the rows as their YAML's states allow, the rest named."""
    peaks = [r for r in rows if r["peak_gb"] and r["same_yaml"]]
    below = [r for r in peaks if r["not_the_yaml"]]
    parts = []
    for method in ("full", "lora", "qlora"):
        compared = [r for r in peaks if not r["not_the_yaml"] and r["method"] == method]
        if compared:
            errors = [r["memory_error"] for r in compared]
            parts.append(
                f"{method} {min(errors):+.1%} to {max(errors):+.1%} ({len(errors)} row{'s' * (len(errors) > 1)})"
            )
            if method == "qlora":
                now = [r["versions_gb"] / r["peak_gb"] - 1 for r in compared]
                parts[-1] += f"; at the plan's versions {min(now):+.0%} to {max(now):+.0%}"
    text = (
        "Peaks planned as they ran (QLoRA: bitsandbytes 0.42.0's 4-bit matmul keeping its inputs, no StableEmbedding: "
        f"`CONFIG_HUB_AS_RAN`) against published, by method: {'; '.join(parts)}."
    )
    if below:
        names = ", ".join(f"{r['config']} ({r['peak_gb']:.2f} GB against {r['states_gb']:.2f})" for r in below)
        text += (
            f" Not compared (time nor memory): {names}, published below the weights, gradients and optimizer states "
            "their YAML holds (the plan's terms that no data changes): those runs were not the YAML as written."
        )
    return text


def _md_config_hub(rows: list[dict]) -> list[str]:
    """The plan against litgpt's published config_hub runs (:func:`config_hub_rows`)."""
    timed = [r for r in rows if _counted(r)]
    inside = [r for r in timed if r["inside"]]
    several = [r for r in timed if r["devices"] > 1]
    lines = [
        "",
        "## litgpt's published config_hub runs (a check set, not fitted)",
        "",
        f"Each row of `configs/published/{CONFIG_HUB}.yaml` (litgpt's table, bf16, Alpaca2k, A10G machines), its YAML "
        "planned as it is: `tunelab plan <yaml> --gpu A10G`, the GPU's own link. The table's runtime is not defined "
        "by litgpt (it may hold loading, the final validation and the save). Peaks: GB (1e9 bytes) allocated per "
        "device, as litgpt prints 'Memory Used'. "
        f"{len(inside)} of {len(timed)} timed runs lie inside the plan's band; "
        f"{sum(1 for r in several if r['inside'])} of {len(several)} on several GPUs. Rows whose epochs or micro "
        "batch differ from the YAML ran an older one: shown, not counted. " + (rows[0]["note"] if rows else ""),
        "",
        *_md_config_hub_hosts(rows),
        _md_config_hub_memory(rows),
        "",
        "| config | machine | devices | strategy | published min | planned min (band) | error | inside | "
        "host us/op implied | published GB | planned GB as ran | memory error | at the plan's versions | fits |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lo, hi = r["band"]
        if r["minutes"] is None:
            inside = "OOM published"
        else:
            inside = "yes" if r["inside"] else "no"
            why = "older YAML" if not r["same_yaml"] else "not the YAML"
            inside += "" if _counted(r) else f" ({why})"
        lines.append(
            f"| {r['config']} | {r['machine']} | {r['devices']} | {r['strategy']} | "
            f"{fmt(r['minutes'], '.2f', 'OOM')} | {r['planned_s'] / 60:.1f} ({lo / 60:.1f}-{hi / 60:.1f}) | "
            f"{fmt(r['error'], '+.0%', '')} | {inside} | {fmt(r['implied_host_us'], '.1f', '')} | "
            f"{fmt(r['peak_gb'], '.2f', 'OOM')} | "
            f"{r['planned_gb']:.2f} | {fmt(r['memory_error'], '+.1%', '')} | {r['versions_gb']:.2f} | "
            f"{'yes' if r['fits'] else 'no'} |"
        )
    return lines


def _md_generate(rows: list[dict]) -> list[str]:
    """The plan's decoded token against litgpt's published generation speeds (:func:`generate_rows`)."""
    loop, share = runtime.LITGPT_HOST_S_PER_OP * 1e6, kernels.eval_host_share("decode", "full")
    lines = [
        "",
        "## The decoded token against litgpt's published generation speeds (a check set, not fitted)",
        "",
        "Each row is cited in `configs/published/litgpt-generate.yaml` (one sample, a short prompt, the time over the "
        "new tokens). Planned: the longer of the decoded token's kernels and its host's ops, as the plan counts each "
        f"generated sample's token: litgpt's training loop constant ({loop:.0f} us an op) times a decoded token's "
        f"share of it ({share:.3f}: without autograd an op costs the host less; measured on a CPU, evidence "
        f"`cpu-eval-host`), {loop * share:.0f} us an op; under NF4, bitsandbytes' Python per 4-bit matmul added as "
        "ops, as the plan counts a QLoRA run's token (bitsandbytes 0.50.2's, measured on a CPU and fitted on a GPU; "
        "these rows ran 0.40-0.41). 'host us/op, at most': the published time over the ops "
        "(equal where the host bounds the token). The runbook's grid times litgpt's `generate` per token (`decode`) "
        "on a lent GPU, which would check the share on a GPU's host.",
        "",
        *_md_generate_band(rows, share),
        "",
        *_md_generate_then(rows),
        "",
        "| source | GPU | model | precision | quantize | new tokens | published ms/token | kernels ms | ops | "
        "planned ms (band) | error | inside | host us/op, at most | the same, bitsandbytes 0.41.1 |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['source']} | {r['gpu']} | {r['model']} | {r['precision']} | {r['quantize'] or ''} | "
            f"{r['new_tokens']} | {r['published_ms']:.1f} | {r['kernels_ms']:.1f} | {r['ops']:,} | "
            f"{r['planned_ms']:.1f} ({r['band_ms'][0]:.1f}-{r['band_ms'][1]:.1f}) | {r['error']:+.0%} | "
            f"{'yes' if r['inside'] else 'no'} | {fmt(r['implied_host_us'], '.1f', 'GPU-bound')} | "
            f"{fmt(r['implied_host_then_us'], '.1f', '')} |"
        )
    return lines


def _md_generate_then(rows: list[dict]) -> list[str]:
    """The host time per op each NF4 row allows over its 16-bit twin's (the same table at the same commit, the same
    model, bf16), at the bitsandbytes the plan models and at the one the rows ran."""

    def table_model(r: dict) -> tuple:  # the published table at its commit (the source before its row), the model
        return r["source"].split(",")[0], r["model"]

    twins = {
        table_model(r): r for r in rows if not r["quantize"] and r["implied_host_us"] and r["precision"] == "bf16-true"
    }
    pairs = [
        (r["implied_host_us"] / twin["implied_host_us"], r["implied_host_then_us"] / twin["implied_host_us"], r)
        for r in rows
        if r["implied_host_then_us"] and (twin := twins.get(table_model(r)))
    ]
    if not pairs:
        return []
    now, then = sorted(p[0] for p in pairs), sorted(p[1] for p in pairs)
    nf4 = [r for r in rows if r["inside_then"] is not None]
    return [
        "The bitsandbytes they ran: the NF4 rows ran 0.40-0.41, whose `gemv_4bit` is a ctypes call from Python, where "
        "0.50.2 dispatches a torch custom op. On one CPU, kernels stubbed (evidence `cpu-bnb-host`), 0.41.1 adds "
        f"{pairs[0][2]['bnb_then_over_now']:.2f}x the Python 0.50.2 adds to a decoded token's 4-bit matmul; the last column "
        "scales bitsandbytes' ops so (the CPU's ratio taken to the GPU's host, which neither run measured). Over its "
        f"16-bit twin's (the same table and commit, the same model; {len(pairs)} pairs), an NF4 row allows "
        f"{now[0]:.2f}-{now[-1]:.2f}x the host time per op at 0.50.2 (median {statistics.median(now):.2f}), "
        f"{then[0]:.2f}-{then[-1]:.2f}x at 0.41.1 (median {statistics.median(then):.2f}): at 0.50.2 each would have "
        "had a faster host than its twin, at the version it ran about its twin's. In the plan's band: "
        f"{sum(r['inside'] for r in nf4)} of the {len(nf4)} NF4 rows at 0.50.2, {sum(r['inside_then'] for r in nf4)} "
        "at 0.41.1's Python. The plan keeps 0.50.2, the version it runs with.",
    ]


def _md_generate_band(rows: list[dict], share: float) -> list[str]:
    """What the published generation times measure, and how many lie inside the plan's band."""
    fast, slow = (h * 1e6 for h in runtime.LITGPT_HOST_S_PER_OP_RANGE)
    inside = sum(r["inside"] for r in rows)
    below = [r for r in rows if not r["inside"] and r["published_ms"] < r["band_ms"][0]]
    return [
        "Band: the plan's band around the token, as `plan` draws it around litgpt's loop (the hosts we measured, "
        f"{fast:.0f}-{slow:.0f} us an op in the loop, {fast * share:.1f}-{slow * share:.1f} us decoding; the kernel "
        f"model's miss of {runtime.KERNEL_MODEL_ERROR:.1%}). What each figure measures: litgpt's `generate/base.py` at "
        "the three commits cited (03f81977, 8641822, 49c7e079) starts its clock before the process's first "
        "`generate` call, with no warm-up, so the time holds the prompt's prefill and every first-use cost of the "
        "process (the first kernel launches, the math library's set-up): an upper bound of a steady decoded token. A "
        "row published below the band's low end is therefore outside whatever those costs were. "
        f"{inside} of {len(rows)} rows lie inside the band; {len(below)} are published faster than its low end "
        "(the host time per op their figure allows is under the fastest host's we measured), "
        f"{len(rows) - inside - len(below)} slower than its high end.",
    ]


def _md_part2() -> list[str]:
    """The lab's Part 2 steps on one and four A100s."""
    lines = [
        "",
        "## The lab's Part 2 rows on A100s (seconds per optimizer step)",
        "",
        "OpenLLaMA 7B full fine-tuning, bf16-true: m1 on one A100, m2-m4 on four joined by PCIe (communication "
        "from `tunelab/plan/model/comm.py` over the link `accuracy.md` uses, exposed as its schedule leaves it: DDP's buckets "
        "beside the backward, FSDP's one unit beside nothing; under FSDP each rank's optimizer step over its quarter "
        "of the parameters). Lab: its time over its steps "
        "(start-up and any validation included). The kernel model is out of sample here; the PCIe link's achieved "
        "share of its peak (the pcie4 row's efficiency) was measured on m2-m4 (`accuracy.md`, left out row by row "
        "there).",
        "",
        "| row | strategy | devices | micro | lab s/step | predicted s/step | error | compute s | exposed communication s |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in part2_rows():
        lines.append(
            f"| {r['id']} | {r['strategy']} | {r['devices']} | {r['micro']} | {r['lab_step_s']:.3f} | "
            f"{r['predicted_s']:.3f} | {r['error']:+.1%} | {r['compute_s']:.3f} | {r['communication_s']:.3f} |"
        )
    return lines


def _md_a100(a100: list[dict]) -> list[str]:
    """The lab's A100 Part 1 runs by cause, out of sample for the kernel model."""
    modelled = [r for r in a100 if r["kernel_s"] is not None]
    mean = sum(abs(r["error"]) for r in modelled) / len(modelled)
    bound = [r for r in modelled if not r["host_bound"]]
    widest = max(bound, key=lambda r: abs(r["error"]))
    lines = [
        "",
        "## The lab's A100 Part 1 rows (litgpt's Training Time of the whole run)",
        "",
        "Out of sample for the kernel model (another GPU, another host CPU: the lab's A100 80GB machine). The fitted "
        "curve was fitted on these rows (in sample). Seconds by cause from `Terms.by_cause`; generation is an upper "
        f"bound (every sample taken to its 100 new tokens). Kernel model: mean absolute error {mean:.1%} over "
        f"{len(modelled)} rows; where its kernels bound the row ({len(bound)} rows; not "
        f"{', '.join(r['id'] for r in modelled if r['host_bound'])}, the host's), its widest miss "
        f"{abs(widest['error']):.1%} ({widest['id']}; its time "
        f"{widest['lab_s'] / widest['kernel_s'] - 1:+.1%} against the "
        "estimate); with our runs the GPU kept busy, the band `plan` prints either side, measured over estimated "
        f"(`runtime.KERNEL_MODEL_ERROR`, {runtime.KERNEL_MODEL_ERROR:.3f}).",
        "",
        "| row | recipe | lab s | kernel model s | error | fitted curve s | " + " | ".join(runtime.CAUSES) + " |",
        "|---|---|---|---|---|---|" + "---|" * len(runtime.CAUSES),
    ]
    for r in a100:
        if r["kernel_s"] is None:
            lines.append(
                f"| {r['id']} | {r['recipe']} | {r['lab_s']:.1f} | not modelled: {r['not_modelled']} |  | "
                f"{r['curve_s']:.1f} |" + " |" * len(runtime.CAUSES)
            )
            continue
        causes = " | ".join(f"{r[c]:.1f}" for c in runtime.CAUSES)
        lines.append(
            f"| {r['id']} | {r['recipe']} | {r['lab_s']:.1f} | {r['kernel_s']:.1f} | {r['error']:+.1%} | "
            f"{r['curve_s']:.1f} | {causes} |"
        )
    return lines


def _md_weak(lab: list, a100: list[dict]) -> list[str]:
    """Where the model is known to be weak, and what it does not model yet; ``lab``: :func:`a100_items`, ``a100``:
    :func:`a100_rows` of them."""
    m = lab_machine(lab)
    worst = max(m["loo"], key=lambda i: abs(m["loo"][i]))
    pairs = "; ".join(
        f"{a} and {b} train alike and differ in their validations and samples: solved together, the lab's machine ran "
        f"their training {train:.2f}x the model's time and their validations and samples {evals:.2f}x"
        for a, b, train, evals in shared_training_pairs(lab, a100)
    )
    return [
        "",
        "Diagnostic (not used by the planner): the lab's machine as two factors against the model, fitted on these "
        f"rows: its host {m['host']:.2f}x our host's time per op, its board {m['gpu']:.3f}x the model's time per "
        f"kernel (an A100 80GB PCIe board at 300 W would run below the SXM table row's clocks). Left out row by "
        f"row: mean absolute error {m['mae']:.1%}, worst {worst} {m['loo'][worst]:+.1%}. s10 (TinyLlama LoRA) "
        "holds the host factor almost alone: left out, the fit cannot see the host. Two machine factors are not "
        "identified by eleven rows; the records now carry the host's op time and the board's steady SM clock, "
        "to measure them instead."
        + (
            f" Rows that train alike: {pairs}. No one factor of the board explains both; the fp32 constants were "
            "fitted on an H200, whose TF32 tensor cores and fp32 attention kernel are not an A100's."
            if pairs
            else ""
        ),
        "",
        "Known weak: the host constant is the median machine's: the lab's A100 machine ran TinyLlama's LoRA "
        "loop at its own host's time per op (s10, its host-bound row: the host section above compares it; not a count "
        "of ops: litgpt 0.5.7, the lab's, dispatches the same ops at micro 4 as 0.5.13 by the same trace); "
        "generation is an upper bound; fp32's elementwise kernels are timed long (the H200's 32-true grid, "
        "`kernels.md`), and the lab's fp32 row s3 ran faster than planned, its s2 slower; small micro batches on a noisy host (Part 3, micro 8-23) "
        "run slower than either bound; allocator retries are not timed (a plan at the edge of memory widens its "
        "band's high end instead: Part 3, micro 47). Not modelled yet: "
        "DDP's all-reduce launches beyond one bucket on the host, FSDP's wrapper kernels on the GPU (only their communication), the gather before a sharded checkpoint "
        "save; the host of a machine other than the median (a factor of nearly 3 over nine machines, the lab's among them, and the probes the "
        "records carry do not predict it: the second-machine section) and a board's clock under its power cap "
        "(`sm_clock_steady_mhz` in the records, not in the plan).",
        "",
    ]


def _kernel_cell(p: float, v: float, e: float | None) -> str:
    return f"{p * 1e3:.1f} / {v * 1e3:.1f} ({e:+.0%})" if e is not None else f"{p * 1e3:.1f} / {v * 1e3:.1f}"


def _grid_lines(root, grid: tuple, gpu: str, day: str, rows: list | None = None) -> list[str]:
    """One grid's section of kernels.md (``rows``: its :func:`tunelab.report.profiles.grid_rows` when planned)."""
    where = evidence.path(*grid)
    if not (root / where).is_file():
        return []
    rows = profiles.grid_rows(root, grid, gpu) if rows is None else rows
    whats = list(dict.fromkeys(w for r in rows for w in r["pairs"]))  # every row's, in order
    fitted = evidence.fitted_shapes(gpu)
    dtypes = ", ".join(sorted({m["dtype"] for m in profiles.read_grid(root / where)}))
    lines = [
        f"## Out of sample: {gpu}, {day}, {len({r['model'] for r in rows})} models",
        "",
        f"Measured: `{where}` (`scripts/gpu/runbook.sh grid`: `scripts/gpu/profile_steps.py`, sequence 437, 10 timed "
        f"steps after 3 warm-up steps, random weights, {dtypes}). Each cell: predicted / measured milliseconds "
        "(error). The optimizer is its phase by CUDA events: the profiler's optimizer kernel time is twice that "
        "phase (on one stream kernels cannot outlast the interval that holds them). A line marked `fit` had its "
        "elementwise kernels (or, on the H200, its shape measured again by op: `"
        + evidence.path(*profiles.GRID_BY_OP)
        + "`) in the fit "
        "of the memory constants (or, at 32-true, the fp32 matmul and attention constants); every other number is "
        "out of sample.",
        "",
        "| model | micro | method | bound (model) | " + " | ".join(whats) + " | ops (model) / kernels launched |",
        "|---|---|---|---|" + "---|" * len(whats) + "---|",
    ]
    for r in rows:
        cells = ["" if w not in r["pairs"] else _kernel_cell(*r["pairs"][w]) for w in whats]
        mark = " (fit)" if (r["model"], r["method"], r["micro"]) in fitted else ""
        lines.append(
            f"| {r['model']}{mark} | {r['micro']} | {r['method']} | {r['bound']} | "
            + " | ".join(cells)
            + f" | {r['ops']:,} / {r['launches']:,} |"
        )
    steps = [r["pairs"]["step"][2] for r in rows]
    gpu_bound = [r["pairs"]["step"][2] for r in rows if r["bound"] == "GPU"]
    lines += [
        "",
        f"Step: {len(steps)} lines, errors {min(steps):+.0%} to {max(steps):+.0%}, mean absolute "
        f"{sum(map(abs, steps)) / len(steps):.0%}; the {len(gpu_bound)} GPU-bound (by the model) "
        + (f"from {min(gpu_bound):+.0%} to {max(gpu_bound):+.0%}. " if gpu_bound else ". ")
        + evidence.entry(grid[0]).notes.get(grid[1], ""),
        "",
    ]
    return lines


def _md_gaps(gaps: list[tuple]) -> list[str]:
    """The fit of :data:`tunelab.plan.model.kernels.KERNEL_GAP_S` (``gaps``: :func:`tunelab.report.profiles.kernel_gaps`)."""
    if not gaps:
        return []
    us = sorted(g * 1e6 for *_, g in gaps)
    return [
        "## The GPU's gap after each kernel (fitted on the grids below)",
        "",
        f"On the {len(gaps)} grid lines whose kernels fill {profiles.GAP_FILL:.0%} or more of their forward, loss "
        "and backward phases (the host kept the GPU's queue full), the phases' wall time (CUDA events) exceeds the "
        f"profiler's kernel time by {us[0]:.2f}-{us[-1]:.2f} us per op the model counts there: the GPU's own "
        "time between two queued kernels. Their median, "
        f"{statistics.median(us):.2f} us (`kernels.KERNEL_GAP_S`: {kernels.KERNEL_GAP_S * 1e6:.2f}), follows each op "
        "of a training forward and backward (the cause 'kernel gaps'); these lines hold it in sample. The lines: "
        + "; ".join(f"`{grid}` {line} {g * 1e6:.2f}" for grid, line, g in gaps)
        + ".",
        "",
    ]


def write_kernels_md(path, root) -> None:
    """``kernels.md``: :func:`tunelab.report.profiles.profile_rows` as a table, with what was fitted and what was not, then
    :func:`tunelab.report.profiles.grid_rows` (out of sample) for each grid of :func:`tunelab.report.evidence.grids`."""

    rows, grids = profiles.profile_rows(root), profiles.every_grid(root)
    lines = [
        "# The kernel-level step model against our H100 profile and the H100 and H200 grids",
        "",
        "Regenerate with `tunelab plan-accuracy`. Model: `tunelab/plan/model/kernels.py` (every ATen op of litgpt's "
        "simulated step, timed by category on the GPU; the step is the longer of the GPU's kernels and the host's "
        "launches; a phase likewise). Measured: `"
        + evidence.path(*profiles.PROFILE)
        + "` (TinyLlama 1.1B, bf16-true, micro 8 x 437 tokens, NVIDIA H100 80GB "
        "HBM3, torch 2.11; phases by CUDA events, kernels by the profiler's self time). Seconds per optimizer step.",
        "",
        "**In sample**: matmul, attention and the for-each optimizer's efficiencies were fitted on the full rows "
        "here, the host time per op on both steps; the memory constants (contiguous and strided elementwise "
        "kernels, the SMs' ceiling) on the elementwise kernels of the full rows here, of the H100 grid's full lines "
        "and of two H200 lines measured by op; LoRA's grouped convolution on one H200 line by op; the for-each "
        "AdamW's host work per tensor on the LoRA optimizer phases here and in the H100 grid. Out of sample: the "
        "LoRA kernel rows here, every unmarked cell of the grids below, the lab's rows (`runtime.md`).",
        "",
        "| method | what | predicted s | measured s | error |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        err = f"{r['rel_error']:+.1%}" if r["rel_error"] is not None else ""
        lines.append(f"| {r['method']} | {r['what']} | {r['predicted_s']:.4f} | {r['measured_s']:.4f} | {err} |")
    host = {r["method"]: (r["ops"], r["host_s"]) for r in rows}
    lines += [
        "",
        "Ops dispatched per step that launch a kernel (extrapolated from one and two blocks) and the host's time at "
        f"{kernels.HOST_S_PER_OP * 1e6:.0f} us an op, the for-each AdamW's work per tensor included: "
        + "; ".join(f"{m} {ops:,} ops, {s:.4f} s" for m, (ops, s) in host.items())
        + ". Known misses: the optimizer's kernels as the profiler counts them (twice the phase by CUDA events), and "
        "the full step's forward and backward phases (the host's share of a phase is not one figure per op).",
        "",
        *_md_gaps(profiles.kernel_gaps(root, grids)),
        *[line for e, what, day, rows in grids for line in _grid_lines(root, (e.id, what), e.device, day, rows)],
    ]
    write_text_atomic(path, "\n".join(lines))


def write_all(out: Path | None = None) -> Path:
    """``tunelab plan-accuracy``: :func:`tunelab.report.accuracy.write_accuracy`'s pages, then kernels.md (the
    kernel-level step model against our H100 profile), runtime.md and runtime-kernel.csv (the kernel-level time
    model against our H100 rows and the lab's A100 times) where the checkout holds their reports (an installed
    tunelab carries none)."""
    out = write_accuracy(out)
    if evidence.entries(ROOT) and (ROOT / evidence.path(*profiles.PROFILE)).is_file():
        write_kernels_md(out / "kernels.md", ROOT)
    if evidence.entries(ROOT) and (ROOT / evidence.path(H100_ROWS, "rows")).is_file():
        write_report(out / "runtime.md", ROOT)
    return out
