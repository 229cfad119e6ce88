"""``tunelab report SWEEP_DIR``: the run records of a sweep -> results.csv, results.md and PNG plots.

Fixed columns, every row kept (OOM, error and killed rows included, with their reason), every unit stated, the
lab's published figure beside ours with the hardware of each.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

from tunelab import hardware
from tunelab import record as record_mod
from tunelab.files import read_json, save_figure, write_csv, write_text_atomic
from tunelab.paths import report_dir, slug
from tunelab.plan import stored
from tunelab.recipes import resolve
from tunelab.settings import resolve as resolve_settings
from tunelab.sweep_file import SweepError, check_lab
from tunelab.units import GB, GIB

# (column, header in Markdown, how to get it from a record dict + lab dict)
COLUMNS = [
    "sweep",
    "row_id",
    "recipe",
    "strategy",
    "method",
    "model_source",
    "model_name",
    "precision",
    "quantize",
    "micro_batch_size",
    "global_batch_size",
    "accumulation",
    "device_count",
    "device_name",
    "status",
    "error",
    "peak_allocated_gb",
    "peak_reserved_gb",
    "alloc_retries",
    "nvml_peak_used_gb",
    "peak_rss_gb",
    "step_time_s",
    "tok_s_padded",
    "tok_s_real",
    "tok_s_padded_per_device",
    "samples_s",
    "padding_pct",
    "litgpt_training_time_s",
    "litgpt_tok_s",
    "litgpt_memory_gb",
    "flops_per_token",
    "achieved_tflops_per_device",
    "peak_tflops_per_device",
    "peak_basis",
    "mfu",
    "mfu_padded",
    "steady_window_s",
    "gpu_util_steady_mean",
    "gpu_util_steady_std",
    "power_steady_w",
    "energy_steady_j",
    "energy_steady_j_per_1k_tokens",
    "gpu_util_mean",
    "gpu_util_std",
    "power_mean_w",
    "energy_j",
    "energy_j_per_1k_tokens",
    "peak_loaded_gb",
    "peak_first_step_gb",
    "planner_peak_gb",
    "planner_error_pct",
    "planner_fits",
    "planner_source",
    "loss_first",
    "loss_last",
    "val_loss_final",
    "wall_s",
    "iters",
    "optimizer_steps",
    "warmup_steps_excluded",
    "lab_status",
    "lab_memory_gb",
    "lab_time_s",
    "lab_tok_s",
    "lab_hardware",
    "not_run_reason",
]

DEFINITIONS = """\
| column | definition |
|---|---|
| status | ok / oom (out of memory: CUDA OOM, or the CPU allocator under the run's memory limit) / error / killed (signal or timeout); failed rows keep their last error line |
| alloc. GB | peak of `torch.cuda.max_memory_allocated()`, max over ranks, GB = 1e9 bytes (what litgpt prints as "Memory Used"; the lab's figure) |
| reserved GB | peak of `torch.cuda.max_memory_reserved()` (caching allocator, >= allocated), max over ranks, GB = 1e9 bytes |
| retries | `num_alloc_retries` summed over ranks: cudaMalloc failures that forced a cache flush (steps slow down) |
| NVML GB | peak used memory NVML saw per GPU (all processes, CUDA context included), GB = 1e9 bytes |
| RSS GB | peak resident host memory of a rank (`ru_maxrss`), max over ranks, GB = 1e9 bytes: the memory figure on CPU |
| step s | median optimizer-step time over the steady state: warm-up steps (first 10%, at least 1 when >= 3 steps) and the last iteration excluded, and the time paused inside the loop (validation, samples, step saves) |
| tok/s padded | steady-state tokens/s fed to the model, padding included, summed over ranks (the lab's tok/s counts these) |
| tok/s real | the same without padding tokens (prompt template + text) |
| padding % | share of fed tokens that were padding, whole run |
| litgpt s / litgpt tok/s | litgpt's own printed "Training Time" (whole fit loop: warm-up and in-loop validation included) and "Tok/sec" (padded tokens / that time), kept beside ours |
| FLOPs/token | training FLOPs per token: full 6N + attention, LoRA/QLoRA 4N_base + 6N_lora + attention (N excludes the embedding; attention 12*L*H*Q*T) |
| TFLOP/s | FLOPs/token x real tok/s per device / 1e12 |
| MFU | model FLOPs utilisation on **real** tokens: FLOPs/token x real tok/s per device over the device's dense peak for the math the run did (configs/hardware/gpus.yaml; `peak basis`: bf16 for bf16-true/-mixed, TF32 for 32-true since litgpt sets float32 matmul precision 'high'); empty on CPU or an unknown device |
| MFU padded | the same on **padded** tokens: the work the GPU actually computed, padding included (>= MFU; the gap is the padding share) |
| util %, power W, J/1k tok (steady) | NVML, sampled in the parent at the stated rate, over the **steady-state window** (the optimizer steps the tok/s figures use, warm-up excluded; NVML samples and iteration timestamps share one monotonic clock): mean ± std utilisation over GPUs, summed mean power, summed energy per 1,000 real tokens trained in the window. Empty on CPU: never estimated |
| J/1k tok (run) | energy from launch to exit (imports, checkpoint load, validation, saving included) per 1,000 real training tokens: what the whole command cost, inflated on short runs |
| plan GB | `tunelab plan`'s predicted peak allocated for the run, with its error against the measurement: the plan its record stored before it launched (the same settings, on the GPU it found); † a record from before plans were stored, planned when the report is written from its recipe, overrides and GPU |
| loaded / 1st step GB | peak allocated up to the first training batch (model loaded, quantized, litgpt's 2-batch sanity validation done) and up to the end of the first optimizer step; the run's peak is the alloc. column |
| lab | the lab's published figure for the same settings, on the lab's hardware (`docs/lab.md`); Part 2 rows: the *current* allocated memory per GPU the lab printed (GiB converted to GB; a range is min-max over GPUs), not a peak |
"""


def _f(x, nd=2):
    if x is None or x == "":
        return ""
    if isinstance(x, float):
        return f"{x:,.{nd}f}"
    if isinstance(x, int):
        return f"{x:,}"
    return str(x)


def row_of(rec: record_mod.RunRecord, lab: dict, lab_hardware: str) -> dict:
    """One report row (results.csv's columns) for a record, with the lab's figures beside it."""
    nvml = max((g.peak_used_bytes or 0 for g in rec.gpus), default=0) or None
    padding = (1 - rec.tokens_real / rec.tokens_padded) * 100 if rec.tokens_padded and rec.tokens_real else None
    d = rec.to_dict()
    row = {c: d.get(c) for c in COLUMNS if c in d}
    lab_mem = lab.get("memory_gb")
    if lab_mem is None and lab.get("allocated_gib") is not None:  # Part 2: current allocated per GPU, GiB
        a = lab["allocated_gib"]
        lab_mem = f"{a[0] * GIB / GB:.2f}-{a[1] * GIB / GB:.2f}" if isinstance(a, list) else round(a * GIB / GB, 2)
    phases = rec.ranks[0].phase_peak_allocated if rec.ranks else {}
    row.update(
        {
            "peak_loaded_gb": phases["loaded"] / GB if phases.get("loaded") else None,
            "peak_first_step_gb": phases["first_step"] / GB if phases.get("first_step") else None,
            "peak_allocated_gb": rec.peak_allocated_bytes / GB if rec.peak_allocated_bytes is not None else None,
            "peak_reserved_gb": rec.peak_reserved_bytes / GB if rec.peak_reserved_bytes is not None else None,
            "alloc_retries": rec.num_alloc_retries,
            "nvml_peak_used_gb": nvml / GB if nvml else None,
            "peak_rss_gb": rec.peak_rss_bytes / GB if rec.peak_rss_bytes else None,
            "padding_pct": padding,
            "lab_status": lab.get("status"),
            "lab_memory_gb": lab_mem,
            "lab_time_s": lab.get("time_s"),
            "lab_tok_s": lab.get("tok_s"),
            "lab_hardware": lab.get("hardware", lab_hardware) if lab else None,
        }
    )
    row.update(planner_columns(rec))
    return row


def planner_columns(rec: record_mod.RunRecord) -> dict:
    """The planner's prediction for a GPU row, and its error: the plan stored in its record before the run, else
    (a record from before plans were stored) today's planner on its recipe, overrides and GPU, said so in
    ``planner_source`` (tunelab.plan.stored.of_record)."""
    gpu = hardware.identify(rec.device_name) if rec.device_type == "cuda" and rec.device_name else None
    if gpu is None:
        return {}
    plan, source = stored.of_record(rec, gpu)
    if plan is None:
        return {"planner_source": source}
    out = {"planner_peak_gb": plan.peak_allocated_bytes / GB, "planner_fits": plan.fits, "planner_source": source}
    if rec.peak_allocated_bytes and rec.status == "ok":
        out["planner_error_pct"] = (
            (plan.peak_allocated_bytes - rec.peak_allocated_bytes) / rec.peak_allocated_bytes * 100
        )
    return out


def _readable_rows(meta: dict, path: Path) -> list[dict]:
    """sweep.json's rows that can be read: each a mapping with a text id; a lab block that is not a mapping of
    the lab's figures is dropped from its row with a note in the report (the row and its record stay)."""
    rows, notes = [], []
    for i, row in enumerate(meta.get("rows") or []):
        if not isinstance(row, dict) or not isinstance(row.get("id"), str):
            notes.append(f"rows[{i}] is not a row with a text id")
            continue
        lab = row.get("lab") or {}
        try:
            if not isinstance(lab, dict):
                raise SweepError("lab is not a mapping; fix: write `lab: {key: value}`")
            check_lab(lab, str(path), f"row {row['id']}: lab")
        except SweepError as e:
            notes.append(str(e))
            row = {**row, "lab": {}}
        rows.append(row)
    if notes:
        meta["note"] = "; ".join(filter(None, [meta.get("note"), "sweep.json: " + "; ".join(notes)[:600]]))
    return rows


UNREADABLE = "unreadable record.json"
"""The error of a row whose record could not be read (kept as a row, never dropped)."""


def load_sweep_dir(sweep_dir: Path) -> tuple[dict, list[record_mod.RunRecord]]:
    """(sweep.json's contents, the records in the sweep's order) of a sweep directory; a record that cannot be
    read is a row marked unreadable, never dropped."""
    sweep_dir = Path(sweep_dir)
    meta_path = sweep_dir / "sweep.json"
    if not sweep_dir.is_dir():
        what = "is not a directory" if sweep_dir.exists() else "no such sweep directory"
        raise FileNotFoundError(f"{sweep_dir}: {what}; fix: give the folder `tunelab sweep` or `tune-study` wrote")
    try:
        meta = read_json(meta_path, what="sweep index") if meta_path.exists() else {"name": sweep_dir.name, "rows": []}
        if not isinstance(meta, dict) or not isinstance(meta.get("rows", []), list):
            raise ValueError("not a sweep.json")
    except (OSError, ValueError) as e:
        meta = {
            "name": sweep_dir.name,
            "rows": [],
            "note": f"sweep.json unreadable ({e}): row order and lab figures are missing",
        }
    for key in ("name", "description", "lab_hardware", "file", "note"):
        if key in meta and not isinstance(meta[key], str):
            bad = type(meta.pop(key)).__name__
            meta["note"] = "; ".join(filter(None, [meta.get("note"), f"sweep.json: {key} is a {bad}, not text"]))
    meta["rows"] = _readable_rows(meta, sweep_dir / "sweep.json")
    records = []
    order = [r.get("id") for r in meta.get("rows", [])]
    for path in sorted(sweep_dir.glob("*/record.json")):
        try:
            records.append(record_mod.load(path))
        except (OSError, ValueError, TypeError) as e:  # kept as a row that says so: nothing dropped silently
            records.append(
                record_mod.RunRecord(
                    row_id=path.parent.name,
                    status="error",
                    error=f"{UNREADABLE} ({type(e).__name__}: {str(e)[:120]})",
                )
            )
    records.sort(key=lambda r: (order.index(r.row_id) if r.row_id in order else len(order), r.row_id))
    return meta, records


def environment(records: list[record_mod.RunRecord]) -> list[str]:
    """The report's environment lines: devices, driver, CUDA and package versions of the records."""
    seen = [r for r in records if r.device_name] or records
    if not seen:
        return ["(no records)"]
    r = seen[0]
    v = r.versions or {}
    lines = [
        f"- device: {r.device_name} ({r.device_type}), {r.device_count} rank(s) per run"
        + (f", driver {r.driver}" if r.driver else "")
        + (f", CUDA {r.cuda}" if r.cuda else ""),
        "- software: "
        + ", ".join(
            f"{k} {v[k] or 'not installed'}"
            for k in ("python", "torch", "litgpt", "lightning", "bitsandbytes", "deepspeed", "tunelab")
            if k in v
        ),
        f"- tunelab commit: {r.git_sha}; runs from {min(x.started_at for x in seen if x.started_at) if any(x.started_at for x in seen) else '?'}"
        f" to {max(x.ended_at for x in seen if x.ended_at) if any(x.ended_at for x in seen) else '?'} (UTC)",
        f"- model source: {', '.join(sorted({x.model_source for x in records if x.model_source})) or 'none chosen'}"
        + (
            f" ({unchosen} row(s) refused before a model was chosen)"
            if (unchosen := sum(not x.model_source for x in records))
            else ""
        )
        + (
            f"; NVML sampled at {r.sample_hz:g} Hz"
            if r.sample_hz
            else "; no NVML (no GPU): GPU utilisation, power and energy are absent"
        ),
    ]
    probes = [x.host_op_us for x in seen if x.host_op_us]
    if probes:  # what a host-bound step follows (older records lack it)
        cpus = sorted({x.host_cpu for x in seen if x.host_cpu})
        launch = [x.device_op_us for x in seen if x.device_op_us]
        on_gpu = f"; on GPU 0 with its launch {min(launch):.2f}-{max(launch):.2f} us (`device_op_us`)" if launch else ""
        lines.append(
            f"- host: {', '.join(cpus) or '?'}; eager dispatch {min(probes):.2f}-{max(probes):.2f} us per op "
            f"(`gpu_monitor.host_op_us`, before each run){on_gpu}"
        )
    clocks = [x for x in seen if x.sm_clock_steady_mhz]
    if clocks:
        top = max((x.sm_clock_max_mhz or 0) for x in clocks)
        lines.append(
            f"- SM clock, steady window: {min(x.sm_clock_steady_mhz for x in clocks):,.0f}-"
            f"{max(x.sm_clock_steady_mhz for x in clocks):,.0f} MHz"
            + (f" (max {top:,.0f})" if top else "")
            + "; held down by power or heat in "
            + f"{min(x.clock_capped_steady_share or 0 for x in clocks):.0%}-"
            + f"{max(x.clock_capped_steady_share or 0 for x in clocks):.0%} of the samples"
        )
    return lines


def markdown(meta: dict, records: list[record_mod.RunRecord], rows: list[dict]) -> str:
    """results.md: environment, definitions of every metric, the table beside the lab's, failed rows; one function
    per section."""
    missing = [r for r in meta.get("rows", []) if r["id"] not in {x.row_id for x in records}]
    out = [
        *_md_head(meta, records),
        *_md_environment(meta, records),
        *_md_summary(meta, records, missing),
        *_md_results(records, rows, missing),
        *_md_notes(records, rows),
        *_md_phases(records, rows),
        *_md_failed(records),
        *_md_settings(records),
        *_md_definitions_and_plots(records),
    ]
    return "\n".join(out)


def _md_head(meta: dict, records: list) -> list[str]:
    """The title, the tiny model's warning, the sweep's description and note."""
    out = [f"# {meta.get('name', 'sweep')}: reproduced report", ""]
    if any(r.model_source == "tiny" for r in records):
        n = next((r.n_params for r in records if r.model_source == "tiny" and r.n_params), None)
        size = f"{n / 1e6:.2f} M parameters" if n else "a few hundred thousand parameters"
        out += [
            f"> **Example report: embedded tiny model (2 layers, {size}) on CPU.** It shows the "
            "pipeline and the columns; its memory and speed say nothing about the real models. The lab's "
            "figures are for the real models on the lab's GPU, beside ours only for layout.",
            "",
        ]
    if meta.get("description"):
        out += [meta["description"], ""]
    if meta.get("note"):
        out += [f"> Note: {meta['note']}", ""]
    return out


def _md_environment(meta: dict, records: list) -> list[str]:
    """## Environment."""
    return [
        "## Environment",
        "",
        *environment(records),
        f"- lab figures: {meta.get('lab_hardware') or 'none'} (`docs/lab.md`)",
        f"- sweep file: `{meta.get('file', '?')}`; rows: {len(records)} recorded of {len(meta.get('rows', [])) or len(records)}",
        "",
    ]


def _md_summary(meta: dict, records: list, missing: list) -> list[str]:
    """## Summary: rows by status, rows not run and why."""
    counts = {s: sum(r.status == s for r in records) for s in record_mod.STATUSES}
    out = ["## Summary", "", "Rows by status: " + ", ".join(f"{k} {v}" for k, v in counts.items() if v) + ".", ""]
    if missing:
        reason = meta.get("not_run_reason") or "no record in the sweep directory"
        out += [f"Not run ({len(missing)}): {', '.join(r['id'] for r in missing)}: {reason}.", ""]
    return out


RESULT_HEADER = [
    "row",
    "recipe",
    "precision",
    "micro/global",
    "status",
    "{mem}",
    "reserved GB",
    "retries",
    "plan GB (err)",
    "step s",
    "tok/s padded",
    "tok/s real",
    "padding %",
    "litgpt s",
    "litgpt tok/s",
    "TFLOP/s",
    "MFU (padded)",
    "util % (steady)",
    "power W (steady)",
    "J/1k tok (steady)",
    "J/1k tok (run)",
    "lab status",
    "lab GB",
    "lab s",
    "lab tok/s",
]
"""The results table's columns ({mem}: RSS on a CPU, allocated on a GPU)."""


def _md_results(records: list, rows: list[dict], missing: list) -> list[str]:
    """## Results: one line per recorded row, then the rows not run with the lab's figures."""
    cpu = all(r.device_type == "cpu" for r in records if r.device_name)
    header = [h.format(mem="RSS GB" if cpu else "alloc. GB") for h in RESULT_HEADER]
    table = [[str(c) for c in _result_cells(row, rec, cpu)] for row, rec in zip(rows, records)]
    for r in missing:
        lab = r.get("lab") or {}
        table.append(
            [
                r["id"],
                r.get("recipe", ""),
                "",
                "",
                "not run",
                *[""] * 16,
                _f(lab.get("status")),
                _f(lab.get("memory_gb")),
                _f(lab.get("time_s")),
                _f(lab.get("tok_s"), 0),
            ]
        )
    keep = [i for i, h in enumerate(header) if h in ("row", "recipe", "status") or any(line[i] for line in table)]
    dropped = [h for i, h in enumerate(header) if i not in keep]
    out = ["## Results", ""]
    if dropped:
        out += [f"Left out, empty in every row here: {', '.join(dropped)}.", ""]
    out += ["| " + " | ".join(header[i] for i in keep) + " |", "|" + "---|" * len(keep)]
    out += ["| " + " | ".join(line[i] for i in keep) + " |" for line in table]
    return out


def _result_cells(row: dict, rec, cpu: bool) -> list:
    """One recorded row's cells in :data:`RESULT_HEADER`'s order."""
    mem = row["peak_rss_gb"] if cpu else row["peak_allocated_gb"]
    util = (
        f"{rec.gpu_util_steady_mean:.0f} ± {rec.gpu_util_steady_std:.0f}"
        if rec.gpu_util_steady_mean is not None and rec.gpu_util_steady_std is not None
        else _f(rec.gpu_util_steady_mean, 0)
    )
    mfu = f"{rec.mfu:.1%} ({rec.mfu_padded:.1%})" if rec.mfu is not None and rec.mfu_padded is not None else ""
    plan = ""
    if row.get("planner_peak_gb") is not None:
        plan = (
            f"{row['planner_peak_gb']:.2f}"
            + (
                f" ({row['planner_error_pct']:+.1f}%)"
                if row.get("planner_error_pct") is not None
                else f" ({'fits' if row.get('planner_fits') else 'OOM'})"
            )
            + (" †" if row.get("planner_source") == stored.TODAYS else "")
        )
    precision, micro, global_batch = rec.precision, rec.micro_batch_size, rec.global_batch_size
    if precision is None or micro is None:  # refused before it ran: the recipe's own settings
        precision, micro, global_batch = _recipe_settings(rec)
    return [
        rec.row_id,
        rec.recipe,
        (precision or "") + (f" {rec.quantize}" if rec.quantize else ""),
        f"{micro}/{global_batch}" if micro is not None else "",
        rec.status,
        _f(mem, 3 if cpu else 2),
        _f(row["peak_reserved_gb"]),
        _f(row["alloc_retries"]),
        plan,
        _f(rec.step_time_s, 3),
        _f(rec.tok_s_padded, 0),
        _f(rec.tok_s_real, 0),
        _f(row["padding_pct"], 1),
        _f(rec.litgpt_training_time_s),
        _f(rec.litgpt_tok_s, 0),
        _f(rec.achieved_tflops_per_device, 1),
        mfu,
        util,
        _f(rec.power_steady_w, 0),
        _f(rec.energy_steady_j_per_1k_tokens, 1),
        _f(rec.energy_j_per_1k_tokens, 1),
        _f(row["lab_status"]),
        _f(row["lab_memory_gb"]),
        _f(row["lab_time_s"]),
        _f(row["lab_tok_s"], 0),
    ]


def _recipe_settings(rec) -> tuple:
    """(precision, micro batch, global batch) of a record's recipe with its overrides, as resolved now (a row refused
    before it ran records none); Nones where the recipe no longer resolves."""

    try:
        s = resolve_settings(resolve(rec.recipe), [str(o) for o in rec.overrides or []])
    except Exception:  # noqa: BLE001 - a report never stops on a row it cannot resolve
        return None, None, None
    return s.precision, s.micro_batch_size, s.global_batch_size


def _md_notes(records: list, rows: list[dict]) -> list[str]:
    """Where the plan column came from, and the MFU peaks used."""
    out = []
    sources = {row.get("planner_source") for row in rows if row.get("planner_peak_gb") is not None}
    if sources:
        out += [
            "",
            "Plan: "
            + "; ".join(
                filter(
                    None,
                    [
                        "the plan each record stored before its run" if stored.STORED in sources else "",
                        f"† {stored.TODAYS}: the record predates stored plans, so its recipe and overrides were planned now"
                        if stored.TODAYS in sources
                        else "",
                    ],
                )
            )
            + ".",
        ]
    peaks = {
        f"{r.precision}: {r.peak_basis} {r.peak_tflops_per_device:g} TFLOP/s"
        for r in records
        if r.peak_basis and r.peak_tflops_per_device is not None
    }
    if peaks:
        out += ["", "MFU peaks used: " + "; ".join(sorted(peaks)) + "."]
    return out


def _md_phases(records: list, rows: list[dict]) -> list[str]:
    """### Memory by phase, where the ranks recorded it."""
    if not any(r.ranks and r.ranks[0].phase_peak_allocated for r in records):
        return []
    out = [
        "",
        "### Memory by phase",
        "",
        "| row | loaded GB | after 1st step GB | peak GB | plan GB |",
        "|---|---|---|---|---|",
    ]
    for row, rec in zip(rows, records):
        if rec.ranks and rec.ranks[0].phase_peak_allocated:
            out.append(
                f"| {rec.row_id} | {_f(row['peak_loaded_gb'])} | {_f(row['peak_first_step_gb'])} | "
                f"{_f(row['peak_allocated_gb'])} | {_f(row.get('planner_peak_gb'))} |"
            )
    return out


def _md_failed(records: list) -> list[str]:
    """## Rows that did not finish, with their error."""
    failed = [r for r in records if r.status != "ok"]
    if not failed:
        return []
    return ["", "## Rows that did not finish", ""] + [
        f"- **{r.row_id}** ({r.recipe}): {r.status}: `{(r.error or '').replace('`', '')[:300]}`" for r in failed
    ]


def _md_settings(records: list) -> list[str]:
    """## Settings of each row: its overrides, strategy and model."""
    return [
        "",
        "## Settings of each row",
        "",
        "| row | overrides on the recipe | strategy | model |",
        "|---|---|---|---|",
    ] + [
        f"| {r.row_id} | `{' '.join(r.overrides) or '(recipe as is)'}` | {r.strategy} | {r.model_name} "
        f"({r.model_source}) |"
        for r in records
    ]


def _md_definitions_and_plots(records: list) -> list[str]:
    """## Definitions and ## Plots, and the files beside the report."""
    out = [
        "",
        "## Definitions",
        "",
        DEFINITIONS,
        "## Plots",
        "",
        "![peak memory per row](memory.png)",
        "",
        "![throughput per row](throughput.png)",
        "",
    ]
    if any(r.device_count > 1 for r in records):
        out += ["![memory by rank](memory_by_rank.png)", ""]
    if any(r.ranks and r.ranks[0].phase_peak_allocated for r in records):
        out += ["![memory by phase](memory_phases.png)", ""]
    out += ["Files: `results.csv` (every column, every row), the run records under the sweep directory.", ""]
    return out


def _marks(ax, values: list, **style) -> None:
    """A reference mark over each bar that has a value (None: no mark)."""
    ax.scatter([i for i, v in enumerate(values) if v is not None], [v for v in values if v is not None], **style)


def plots(records: list[record_mod.RunRecord], rows: list[dict], out_dir: Path) -> list[Path]:
    """memory.png, throughput.png (and memory by phase and by rank when the records have them)."""
    import matplotlib

    matplotlib.use("Agg")
    cpu = all(r.device_type == "cpu" for r in records if r.device_name)
    style = _PlotStyle(
        cpu=cpu,
        long_labels=max((len(r.row_id) for r in records), default=0) > 6,
        device=next((r.device_name for r in records if r.device_name), ""),
    )
    made = [
        _memory_plot(records, rows, out_dir, style),
        _throughput_plot(records, rows, out_dir, style),
        _phases_plot(records, rows, out_dir, style),
        _ranks_plot(records, out_dir),
    ]
    return [p for p in made if p is not None]


@dataclass
class _PlotStyle:
    """What every plot of a sweep report shares."""

    cpu: bool
    """Every record ran on a CPU (memory is peak RSS, the model a tiny one)."""
    long_labels: bool
    """Row ids longer than 6 characters: tick labels rotated."""
    device: str
    """The device the rows ran on, for the titles."""

    def xticks(self, ax, positions, names) -> None:
        ax.set_xticks(
            list(positions),
            names,
            fontsize=7,
            rotation=30 if self.long_labels else 0,
            ha="right" if self.long_labels else "center",
        )


_STATUS_COLORS = {"ok": "tab:blue", "oom": "tab:red", "error": "tab:gray", "killed": "tab:orange"}


def _saved(fig, path: Path) -> Path:
    """``fig`` laid out, written to ``path`` and closed (:func:`tunelab.files.save_figure`)."""
    fig.tight_layout()
    return save_figure(fig, path)


def _memory_plot(records, rows: list[dict], out_dir: Path, style: _PlotStyle) -> Path:
    """memory.png: each row's peak (RSS on CPU), the lab's and the plan's beside it, failures named."""
    import matplotlib.pyplot as plt

    cpu = style.cpu
    fig, ax = plt.subplots(figsize=(max(6, 0.7 * len(records) + 2), 4))
    mem = [(row["peak_rss_gb"] if cpu else row["peak_allocated_gb"]) or 0 for row in rows]
    ax.bar(range(len(records)), mem, color=[_STATUS_COLORS.get(r.status, "k") for r in records])
    lab = [row["lab_memory_gb"] if isinstance(row["lab_memory_gb"], (int, float)) else None for row in rows]
    if any(v is not None for v in lab) and not cpu:
        _marks(ax, lab, marker="_", s=400, color="black", label="lab (A100 80GB)", zorder=3)
    plan = [row.get("planner_peak_gb") for row in rows]
    if any(v is not None for v in plan):
        _marks(ax, plan, marker="x", s=50, color="tab:green", label="tunelab plan (same GPU)", zorder=4)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8)
    for i, r in enumerate(records):
        if r.status != "ok":
            ax.text(
                i,
                max(mem[i], 0) + 0.01 * (max(mem) or 1),
                r.status.upper(),
                ha="center",
                fontsize=7,
                color=_STATUS_COLORS.get(r.status, "k"),
            )
    style.xticks(ax, range(len(records)), [f"{r.row_id}\n{r.method}" for r in records])
    ax.set_ylabel("peak RSS per process, GB (1e9 B)" if cpu else "peak allocated per GPU, GB (1e9 B)")
    ax.set_title("Peak memory per row" + (" (tiny model, CPU)" if cpu else f" ({style.device})"))
    return _saved(fig, out_dir / "memory.png")


def _throughput_plot(records, rows: list[dict], out_dir: Path, style: _PlotStyle) -> Path:
    """throughput.png: steady tok/s on padded and real tokens, the lab's beside them."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(max(6, 0.7 * len(records) + 2), 4))
    x = range(len(records))
    ax.bar([i - 0.2 for i in x], [r.tok_s_padded or 0 for r in records], width=0.4, label="ours, padded")
    ax.bar([i + 0.2 for i in x], [r.tok_s_real or 0 for r in records], width=0.4, label="ours, real")
    if not style.cpu and any(row["lab_tok_s"] for row in rows):
        _marks(
            ax,
            [row["lab_tok_s"] or None for row in rows],
            marker="_",
            s=400,
            color="black",
            label="lab, padded (A100)",
            zorder=3,
        )
    style.xticks(ax, x, [f"{r.row_id}\n{r.method}" for r in records])
    ax.set_ylabel("steady-state tokens/s, summed over ranks")
    ax.set_title("Throughput per row" + (" (tiny model, CPU)" if style.cpu else f" ({style.device})"))
    ax.legend(fontsize=8)
    return _saved(fig, out_dir / "throughput.png")


def _phases_plot(records, rows: list[dict], out_dir: Path, style: _PlotStyle) -> Path | None:
    """memory_phases.png, where the memory comes in: after loading, after the first optimizer step, at the peak
    (None without the phases in the records)."""
    import matplotlib.pyplot as plt

    phased = [(row, r) for row, r in zip(rows, records) if r.ranks and r.ranks[0].phase_peak_allocated]
    if not phased:
        return None
    fig, ax = plt.subplots(figsize=(max(6, 0.8 * len(phased) + 2), 4.2))
    keys = [
        ("peak_loaded_gb", "first training batch (model loaded)"),
        ("peak_first_step_gb", "after the first optimizer step"),
        ("peak_allocated_gb", "run peak"),
    ]
    for j, (key, label) in enumerate(keys):
        ax.bar(
            [i + (j - 1) * 0.27 for i in range(len(phased))],
            [row.get(key) or 0 for row, _ in phased],
            width=0.27,
            label=label,
            color=f"C{j}",
        )
    style.xticks(ax, range(len(phased)), [f"{r.row_id}\n{r.method}" for _, r in phased])
    ax.set_ylabel("peak allocated up to the phase, GB (1e9 B)")
    ax.set_title(f"Memory by phase ({style.device})")
    ax.legend(fontsize=8)
    return _saved(fig, out_dir / "memory_phases.png")


def _ranks_plot(records, out_dir: Path) -> Path | None:
    """memory_by_rank.png: each multi-device row's peak per rank (None without such a row)."""
    import matplotlib.pyplot as plt

    multi = [r for r in records if r.device_count > 1 and r.ranks]
    if not multi:
        return None
    fig, ax = plt.subplots(figsize=(max(6, 1.2 * len(multi) + 2), 4))
    for i, r in enumerate(multi):
        vals = [(k.peak_allocated_bytes or k.peak_rss_bytes or 0) / GB for k in sorted(r.ranks, key=lambda k: k.rank)]
        for j, v in enumerate(vals):
            ax.bar(
                i + (j - (len(vals) - 1) / 2) * 0.8 / len(vals),
                v,
                width=0.8 / len(vals),
                color=f"C{j}",
                label=f"rank {j}" if i == 0 else None,
            )
    ax.set_xticks(range(len(multi)), [r.row_id for r in multi])
    ax.set_ylabel("peak memory per rank, GB (1e9 B)")
    ax.set_title("Memory by rank (multi-device rows)")
    ax.legend(fontsize=8)
    return _saved(fig, out_dir / "memory_by_rank.png")


def default_report_dir(meta: dict, records: list[record_mod.RunRecord]) -> Path:
    """reports/<date>-<sweep name>[-<device>] (:func:`tunelab.paths.report_dir`)."""
    return report_dir(slug(meta.get("name"), "sweep"), next((r for r in records if r.device_name), None))


def write_report(sweep_dir: Path, out_dir: Path | None = None, not_run_reason: str | None = None) -> Path:
    """Write results.csv, results.md and the plots of a sweep directory; returns the report directory."""
    meta, records = load_sweep_dir(sweep_dir)
    if not records:
        one = Path(sweep_dir) / "record.json"  # `tunelab run --out DIR` writes DIR/record.json: one run's folder
        fix = (
            f"; fix: tunelab report {Path(sweep_dir).parent} (the folder above it)"
            if one.is_file()
            else "; fix: give the folder `tunelab sweep` or `tune-study` wrote"
        )
        raise FileNotFoundError(f"no run records (*/record.json) under {sweep_dir}{fix}")
    for rec in records:  # said where the user sees it, not only in a table row
        if (rec.error or "").startswith(UNREADABLE):
            print(
                f"{Path(sweep_dir) / rec.row_id / 'record.json'}: {rec.error}; reported as an error row",
                file=sys.stderr,
            )
    if not_run_reason:
        meta["not_run_reason"] = not_run_reason
    labs = {r["id"]: r.get("lab") or {} for r in meta.get("rows", [])}
    rows = [row_of(rec, labs.get(rec.row_id, {}), meta.get("lab_hardware", "")) for rec in records]
    recorded = {rec.row_id for rec in records}
    not_run = [
        {
            "sweep": meta.get("name"),
            "row_id": r["id"],
            "recipe": r.get("recipe"),
            "status": "not run",
            "not_run_reason": meta.get("not_run_reason") or "no record in the sweep directory",
            "lab_status": (r.get("lab") or {}).get("status"),
            "lab_memory_gb": (r.get("lab") or {}).get("memory_gb"),
            "lab_time_s": (r.get("lab") or {}).get("time_s"),
            "lab_tok_s": (r.get("lab") or {}).get("tok_s"),
        }
        for r in meta.get("rows", [])
        if r["id"] not in recorded
    ]
    out_dir = Path(out_dir) if out_dir else default_report_dir(meta, records)
    write_csv(out_dir / "results.csv", [*rows, *not_run], COLUMNS)
    write_text_atomic(out_dir / "results.md", markdown(meta, records, rows))
    plots(records, rows, out_dir)
    return out_dir
