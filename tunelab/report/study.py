"""The report of a tuning study (``tunelab report runs/lab-part3``): per study and setting, the probes in the
columns of the FSDP tuning tables the project reproduces, the best micro batch starred, the planner's predicted
largest micro batch beside the probed one, the study's own reference tables beside ours, a plot and a CSV.

Everything is read back from the probe records (``<dir>/<study>/<setting>/mbs<N>/record.json``), not from the
summaries a search writes at its end: a search cut by a time limit still reports every probe it finished, and the
probes it did not reach are named.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from tunelab import hardware
from tunelab import record as record_mod
from tunelab.files import save_figure, write_csv, write_text_atomic
from tunelab.paths import report_dir, slug
from tunelab.plan.recipe import plan_recipe
from tunelab.recipes import resolve
from tunelab.report.sweep import environment
from tunelab.tune.study import Setting, Study, StudyFile, study_overrides
from tunelab.units import GB, to_gb

COLUMNS = [
    "study",
    "setting",
    "activation_checkpointing",
    "backward_prefetch",
    "devices",
    "micro_batch_size",
    "status",
    "error",
    "best",
    "peak_allocated_gb",
    "peak_reserved_gb",
    "peak_rss_gb",
    "gpu_util_mean",
    "gpu_util_std",
    "tflops_per_device_real",
    "tflops_per_device_padded",
    "mfu_padded",
    "iter_time_ms",
    "tok_s_padded",
    "tok_s_real",
    "num_alloc_retries",
    "optimizer_steps",
    "warmup_steps_excluded",
    "device_name",
    "record",
]
"""results.csv: one row per probe, these columns in this order (GB = 1e9 bytes; TFLOP/s and tok/s per device
unless named; iteration time and tok/s over the steady window, warm-up excluded)."""


@dataclass
class SettingResult:
    """One setting of one study as read back from its probe records."""

    study: Study
    setting: Setting
    probes: list[tuple[int, record_mod.RunRecord, Path]]
    predicted: int | None

    @property
    def fitting(self) -> list[int]:
        return [m for m, r, _ in self.probes if r.status == "ok"]

    @property
    def largest(self) -> int | None:
        return max(self.fitting, default=None)

    @property
    def best(self) -> int | None:
        clean = [
            (r.tok_s_padded, m)
            for m, r, _ in self.probes
            if r.status == "ok" and not r.num_alloc_retries and r.tok_s_padded
        ]
        return max(clean)[1] if clean else None

    @property
    def smallest_failing(self) -> int | None:
        return min((m for m, r, _ in self.probes if r.status == "oom"), default=None)

    @property
    def unfinished(self) -> list[int]:
        return [m for m, r, _ in self.probes if r.status not in ("ok", "oom")]


def _padded_tflops(r: record_mod.RunRecord) -> float | None:
    if r.flops_per_token and r.tok_s_padded_per_device:
        return r.flops_per_token * r.tok_s_padded_per_device / 1e12
    return None


def collect(sf: StudyFile, base: Path) -> list[SettingResult]:
    """Every setting of every study with probes under ``base``, with the planner's predicted largest micro batch."""
    out = []
    for study in sf.studies:
        for st in study.settings:
            sub = base / study.id / st.dir_name
            probes = []
            for path in sorted(sub.glob("mbs*/record.json")):
                named = re.fullmatch(r"mbs([1-9][0-9]*)", path.parent.name)
                if named is None:  # not a directory tune-batch makes (mbs008 beside mbs8 would be a second row)
                    continue
                try:
                    rec = record_mod.load(path)
                except (OSError, ValueError) as e:  # kept as a row that says so: no probe dropped silently
                    rec = record_mod.RunRecord(
                        row_id=path.parent.name, status="error", error=f"unreadable record.json ({str(e)[:120]})"
                    )
                m = int(named.group(1))  # the micro batch its directory was made for
                if rec.micro_batch_size not in (None, m):
                    rec = record_mod.RunRecord(
                        row_id=path.parent.name,
                        status="error",
                        error=f"its record ran micro batch {rec.micro_batch_size}, not {m}",
                    )
                probes.append((m, rec, path))
            if not probes:
                continue
            probes.sort(key=lambda x: x[0])
            predicted = None
            strategy_file = sub / f"strategy-{st.dir_name}.yaml"
            if study.gpu and strategy_file.is_file():
                try:
                    extra = study_overrides(study)
                    plan = plan_recipe(
                        resolve(study.recipe),
                        extra,
                        gpu=hardware.lookup(study.gpu),
                        strategy=str(strategy_file),
                        activation_checkpointing=st.activation_checkpointing,
                    ).plan
                    predicted = plan.max_micro_batch_size
                except (ValueError, OSError):
                    predicted = None
            out.append(SettingResult(study, st, probes, predicted))
    return out


def _reference(sf: StudyFile, res: SettingResult) -> list[dict]:
    """The study's table for a setting: its 3B table for models above ~2B parameters where one exists."""
    if not res.study.recipe.startswith("tiny") and f"{res.setting.id}-3b" in sf.lab:
        return sf.lab[f"{res.setting.id}-3b"]
    return sf.lab.get(res.setting.id) or []


def _f(x, fmt: str, scale: float = 1.0) -> str:
    if x is None:
        return ""
    if fmt == ".1f" and 0 < abs(x * scale) < 0.05:  # a CPU's TFLOP/s: three digits, not 0.0
        fmt = ".3f"
    return format(x * scale, fmt)


def _setting_words(st: Setting) -> str:
    return (
        f"activation checkpointing {'on' if st.activation_checkpointing else 'off'}, backward prefetch "
        f"{st.backward_prefetch or 'as the strategy file'}"
    )


def markdown(sf: StudyFile, results: list[SettingResult], base: Path) -> str:
    """results.md of a tuning study: per setting the probes beside the study's reference table."""
    records = [r for res in results for _, r, _ in res.probes]
    lines = _head(sf, records, base) + _summary(sf, results)
    for res in results:
        lines += _setting_section(sf, res)
    lines += ["## Plot", "", "![tok/s and memory by micro batch](tune.png)", ""]
    return "\n".join(lines)


def _head(sf: StudyFile, records: list, base: Path) -> list[str]:
    """The title, the CPU caveat where the probes ran on a CPU, the environment and what the columns mean."""
    cpu = all(r.device_type == "cpu" for r in records if r.device_name)
    lines = [f"# {sf.name}: {sf.description}", ""]
    if cpu:
        lines += [
            "**CPU example, not a GPU measurement**: the probes ran on this machine's CPU with a small model "
            "under an address-space cap per process (what 'fits' means without a GPU). Memory is peak RSS; "
            "GPU utilisation and TFLOP/s against a GPU peak do not apply. The tables show the method, not "
            "GPU figures.",
            "",
        ]
    shown = base if not base.is_absolute() else base.name
    return lines + [
        "## Environment",
        "",
        *environment(records),
        f"- probe records: {shown} (this report again: "
        f"`tunelab report {shown} --study {sf.name}`; in a report directory, unpack records.tgz first)",
        "",
        "Columns: micro batch per device; peak allocated and reserved by the CUDA caching allocator, rank 0, "
        "GB = 1e9 bytes (on CPU: peak RSS); NVML GPU utilisation over the steady window, mean +/- std; "
        "TFLOP/s per device from the model's FLOPs on real tokens and on padded tokens (what the GPU "
        "computed; the recomputation of activation checkpointing is not counted); MFU on padded tokens; "
        "iteration time and tok/s over the steady window (the first step excluded as warm-up); allocator "
        "retries (`num_alloc_retries`). `*` the best micro batch: the highest tok/s among probes that fit "
        "without allocator retries.",
        "",
    ]


def _summary(sf: StudyFile, results: list[SettingResult]) -> list[str]:
    """One row per setting: the largest micro batch that fits, the planner's, the best and its figures."""
    lines = [
        "## Summary",
        "",
        "| study | setting | largest that fits (probed) | planner predicted | best | tok/s padded "
        "at best | TFLOP/s real / padded at best | peak allocated at best, GB | reference (study): best, "
        "TFLOP/s |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for res in results:
        best = next((r for m, r, _ in res.probes if m == res.best), None)
        largest = res.largest
        bound = "" if res.smallest_failing is None else f" ({res.smallest_failing} runs out)"
        gaps = ""
        if largest is not None and res.smallest_failing is not None and res.smallest_failing - largest > 1:
            gaps = f"; {largest + 1}..{res.smallest_failing - 1} not probed"
        elif largest is not None and res.smallest_failing is None and res.unfinished:
            gaps = f"; search cut at {max(res.unfinished)}"
        ref_best = next((row for row in _reference(sf, res) if row.get("best")), None)
        ref_text = "" if not ref_best else f"{ref_best['micro']}, {ref_best.get('tflops', '')}"
        if res.setting.at_best_of:  # not a search: the best micro batch of another setting, probed again
            bound, gaps, largest = (
                "",
                "",
                f"{largest if largest is not None else 'none'} of the probes "
                f"{', '.join(str(m) for m, _, _ in res.probes)} (from {res.setting.at_best_of}'s best when it ran)",
            )
        lines.append(
            f"| {res.study.id} | {res.setting.id} | {largest if largest is not None else 'none'}{bound}{gaps} | "
            f"{res.predicted if res.predicted is not None else ''} | {res.best or ''} | "
            f"{_f(best.tok_s_padded if best else None, ',.0f')} | "
            f"{_f(best.achieved_tflops_per_device if best else None, '.1f')} / "
            f"{_f(_padded_tflops(best) if best else None, '.1f')} | "
            f"{_f((best.peak_allocated_bytes or best.peak_rss_bytes) if best else None, '.2f', 1e-9)} | {ref_text} |"
        )
    return lines + [""]


def _setting_section(sf: StudyFile, res: SettingResult) -> list[str]:
    """A setting's probes, its verdict and the study's reference table."""
    st, study = res.setting, res.study
    lines = [
        f"## {study.id} / {st.id}",
        "",
        f"{study.note or study.recipe} - {study.strategy}, {study.devices} device(s), "
        f"{_setting_words(st)}; overrides: {' '.join(f'{k}={v}' for k, v in study.set.items()) or 'none'}; "
        f"{study.steps} optimizer steps per probe.",
        "",
        "| micro | status | alloc GB | reserved GB | GPU util % | TFLOP/s/dev real | TFLOP/s/dev padded | "
        "MFU padded | iter ms | tok/s padded | retries | steps measured |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    lines += [_probe_row(m, r, m == res.best) for m, r, _ in res.probes]
    lines += ["", _verdict(res), ""]
    return lines + _reference_table(sf, res)


def _probe_row(m: int, r: record_mod.RunRecord, best: bool) -> str:
    """One probe's row (figures only where it ran)."""
    alloc = r.peak_allocated_bytes if r.device_type == "cuda" else r.peak_rss_bytes
    util = (
        "" if r.gpu_util_steady_mean is None else f"{r.gpu_util_steady_mean:.0f} +/- {r.gpu_util_steady_std or 0:.0f}"
    )
    status = r.status if r.status in ("ok", "oom") else f"{r.status}: {(r.error or '')[:60]}"
    ok = r.status == "ok"
    return (
        f"| {m}{' *' if best else ''} | {status} | {_f(alloc, '.2f', 1e-9)} | "
        f"{_f(r.peak_reserved_bytes, '.2f', 1e-9)} | "
        f"{util if ok else ''} | {_f(r.achieved_tflops_per_device if ok else None, '.1f')} | "
        f"{_f(_padded_tflops(r) if ok else None, '.1f')} | {_f(r.mfu_padded if ok else None, '.1%')} | "
        f"{_f(r.iter_time_s if ok else None, '.0f', 1000)} | {_f(r.tok_s_padded if ok else None, ',.0f')} | "
        f"{'' if r.num_alloc_retries is None else r.num_alloc_retries} | "
        f"{'' if not ok or r.optimizer_steps is None else r.optimizer_steps - (r.warmup_steps_excluded or 0)} |"
    )


def _verdict(res: SettingResult) -> str:
    """The setting's largest fitting and best micro batch, the planner's, and what did not finish."""
    st = res.setting
    verdict = f"Largest that fits: {res.largest if res.largest is not None else 'none'}"
    if st.at_best_of:
        verdict = (
            f"Not a full search: {st.at_best_of}'s best micro batch (when this ran) probed with this setting "
            f"(and, had it not fit, smaller ones). Largest that fits among "
            f"{', '.join(str(m) for m, _, _ in res.probes)}: {res.largest if res.largest is not None else 'none'}"
        )
    if res.predicted is not None:
        verdict += f" (planner predicted {res.predicted} on {res.study.gpu})"
    verdict += f"; best: {res.best if res.best is not None else 'none without allocator retries'}."
    if res.unfinished:
        verdict += (
            f" Not finished (cut by a time limit or an error; a rerun of the study probes them again): "
            f"{', '.join(map(str, res.unfinished))}."
        )
    return verdict


def _reference_table(sf: StudyFile, res: SettingResult) -> list[str]:
    """The study's own published table for this setting (none where it published none)."""
    ref = _reference(sf, res)
    if not ref:
        return []
    big = f"{res.setting.id}-3b" in sf.lab and not res.study.recipe.startswith("tiny")
    lines = [
        f"Reference, the study's own table ({sf.lab_hardware}{'; its 3B model' if big else ''}): "
        "another model on another GPU, compare the shape.",
        "",
        "| batch | memory MB | GPU util % | TFLOP/s | iter ms | note |",
        "|---|---|---|---|---|---|",
    ]
    for row in ref:
        util = "" if row.get("util") is None else f"{row['util']} +/- {row.get('util_std', '')}"
        lines.append(
            f"| {row['micro']}{' *' if row.get('best') else ''} | "
            f"{row.get('memory_mb', row.get('status', ''))} | {util} | {row.get('tflops', '')} | "
            f"{row.get('iter_ms', '')} | {row.get('note', '')} |"
        )
    return lines + [""]


def plot(results: list[SettingResult], out_dir: Path) -> Path | None:
    """tune.png: tok/s and peak memory against the micro batch, per study."""
    if not results:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    studies = list(dict.fromkeys(res.study.id for res in results))
    fig, axes = plt.subplots(len(studies), 2, figsize=(11, 3.6 * len(studies)), squeeze=False)
    for row, sid in enumerate(studies):
        ax_t, ax_m = axes[row]
        for res in (r for r in results if r.study.id == sid):
            ok = [(m, r) for m, r, _ in res.probes if r.status == "ok"]
            if not ok:
                continue
            ms = [m for m, _ in ok]
            (line,) = ax_t.plot(ms, [r.tok_s_padded or 0 for _, r in ok], marker="o", label=res.setting.id)
            retry = [(m, r.tok_s_padded or 0) for m, r in ok if r.num_alloc_retries]
            if retry:
                ax_t.scatter(*zip(*retry), marker="x", s=70, color="red", zorder=3)
            cpu = ok[0][1].device_type == "cpu"
            ax_m.plot(
                ms,
                [((r.peak_rss_bytes if cpu else r.peak_allocated_bytes) or 0) / GB for _, r in ok],
                marker="o",
                color=line.get_color(),
                label=res.setting.id,
            )
            if res.smallest_failing is not None:
                ax_m.axvline(res.smallest_failing, color=line.get_color(), linestyle=":", linewidth=1)
        ax_t.set_title(f"{sid}: padded tok/s (x: allocator retries)", fontsize=9)
        ax_m.set_title(f"{sid}: peak memory, GB (dotted: first out-of-memory probe)", fontsize=9)
        for ax in (ax_t, ax_m):
            ax.set_xscale("log", base=2)
            ax.set_xlabel("micro batch per device")
            ax.legend(fontsize=7)
    fig.tight_layout()
    return save_figure(fig, out_dir / "tune.png")


def default_report_dir(sf: StudyFile, results: list[SettingResult]) -> Path:
    """reports/<date>-<study name>[-<device>] (:func:`tunelab.paths.report_dir`)."""
    rec = next((r for res in results for _, r, _ in res.probes if r.device_name), None)
    return report_dir(slug(sf.name, "study"), rec)


def write_report(base: Path, sf: StudyFile, out_dir: Path | None = None) -> Path:
    """Write results.csv, results.md and tune.png of a tuning study's directory; returns the report directory."""
    results = collect(sf, base)
    if not results:
        raise FileNotFoundError(
            f"no probe records (<study>/<setting>/mbs<N>/record.json) under {base} for the studies of {sf.path}; "
            "fix: give the folder `tunelab tune-study` wrote for this file"
        )
    out_dir = Path(out_dir) if out_dir else default_report_dir(sf, results)
    rows = []
    for res in results:
        for m, r, path in res.probes:
            ok = r.status == "ok"
            rows.append(
                {
                    "study": res.study.id,
                    "setting": res.setting.id,
                    "activation_checkpointing": res.setting.activation_checkpointing,
                    "backward_prefetch": res.setting.backward_prefetch,
                    "devices": res.study.devices,
                    "micro_batch_size": m,
                    "status": r.status,
                    "error": r.error,
                    "best": m == res.best,
                    "peak_allocated_gb": to_gb(r.peak_allocated_bytes, 3),
                    "peak_reserved_gb": to_gb(r.peak_reserved_bytes, 3),
                    "peak_rss_gb": to_gb(r.peak_rss_bytes, 3),
                    "gpu_util_mean": r.gpu_util_steady_mean if ok else None,
                    "gpu_util_std": r.gpu_util_steady_std if ok else None,
                    "tflops_per_device_real": r.achieved_tflops_per_device if ok else None,
                    "tflops_per_device_padded": _padded_tflops(r) if ok else None,
                    "mfu_padded": r.mfu_padded if ok else None,
                    "iter_time_ms": None if not ok or r.iter_time_s is None else r.iter_time_s * 1000,
                    "tok_s_padded": r.tok_s_padded if ok else None,
                    "tok_s_real": r.tok_s_real if ok else None,
                    "num_alloc_retries": r.num_alloc_retries,
                    "optimizer_steps": r.optimizer_steps,
                    "warmup_steps_excluded": r.warmup_steps_excluded,
                    "device_name": r.device_name,
                    "record": str(path.relative_to(base)),
                }
            )
    write_csv(out_dir / "results.csv", rows, COLUMNS)
    write_text_atomic(out_dir / "results.md", markdown(sf, results, base))
    plot(results, out_dir)
    return out_dir
