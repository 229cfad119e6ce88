"""Tuning studies (``configs/sweeps/lab-part3.yaml``): several ``tune-batch`` searches, one per strategy setting,
read from one file, run with ``tunelab tune-study`` and reported by ``tunelab report``.

A study names a recipe, a strategy, a device count, overrides and a list of settings (activation checkpointing,
backward prefetch, the micro batches to search and to add as table rows). Every probe lands in
``<out>/<study id>/<setting dir>/mbs<N>/record.json`` (the setting directory is
:func:`tunelab.tune.batch.variant_name`), so that a second call reuses every probe already recorded. The file's
``lab`` section holds the reference tables the report prints beside ours.
"""

from __future__ import annotations

import math
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from tunelab import checkpoints, hardware, settings, yaml_input
from tunelab.errors import InputError
from tunelab.files import read_json, write_json_atomic
from tunelab.paths import ROOT, SAFE_NAME
from tunelab.recipes import resolve
from tunelab.run.runner import RunOptions
from tunelab.strategies import StrategyError, load_strategy
from tunelab.tune.batch import PREFETCH, Probes, planned_start, probe_problems, strategy_variant, tune, variant_name
from tunelab.units import GB

STUDY_FILE_KEYS = {"name", "description", "lab_hardware", "studies", "lab"}
STUDY_KEYS = {
    "id",
    "recipe",
    "strategy",
    "devices",
    "gpu",
    "steps",
    "set",
    "note",
    "settings",
    "checkpoint",
    "memory_limit_gb",
}
SETTING_KEYS = {"id", "activation_checkpointing", "backward_prefetch", "max_micro", "also", "start", "at_best_of"}
LAB_ROW_KEYS = {"micro", "memory_mb", "util", "util_std", "tflops", "iter_ms", "status", "best", "note"}


class StudyError(InputError):
    """A tuning-study file that cannot be run as written (file: key: what; fix: how)."""


@dataclass
class Setting:
    """One setting of a study: activation checkpointing, backward prefetch, the micro batches to search."""

    id: str
    activation_checkpointing: bool
    backward_prefetch: str | None
    """A key of tunelab.tune.batch.PREFETCH (none, pre, post), or None: the strategy file's own."""
    max_micro: int = 1024
    also: list[int] = field(default_factory=list)
    start: int | None = None
    at_best_of: str | None = None
    """Probe only the best micro batch of that (earlier) setting, as the study's third table did."""

    @property
    def dir_name(self) -> str:
        return variant_name(self.activation_checkpointing, self.backward_prefetch)


@dataclass
class Study:
    """One study: a recipe under a strategy on some devices, and its settings."""

    id: str
    recipe: str
    strategy: str
    devices: int
    settings: list[Setting]
    gpu: str | None = None
    steps: int = 3
    set: dict = field(default_factory=dict)
    note: str = ""
    checkpoint: str | None = None
    """A model tunelab builds here (tiny, tiny-deep) instead of the recipe's checkpoint."""
    memory_limit_gb: float | None = None


@dataclass
class StudyFile:
    """A tuning-study file: its studies and the reference tables the report prints beside ours."""

    path: Path
    name: str
    description: str
    lab_hardware: str
    studies: list[Study]
    lab: dict
    """Reference tables by setting id: lists of {micro, memory_mb, util, util_std, tflops, iter_ms, status, ...}."""


def _expect(value, kind, where: str, key: str, fix: str):
    ok = isinstance(value, kind) and not (
        isinstance(value, bool) and bool not in (kind if isinstance(kind, tuple) else (kind,))
    )
    if not ok:
        raise StudyError(f"{where}: {key}: got the {type(value).__name__} {str(value)[:60]!r}; fix: {fix}")
    return value


def _unknown(spec: dict, allowed: set, where: str, label: str) -> None:
    bad = set(spec) - allowed
    if bad:
        raise StudyError(
            f"{where}: {label}: unknown key(s) {sorted(bad)}; fix: remove them or use one of {sorted(allowed)}"
        )


def _positive_int(value, where: str, key: str) -> int:
    if not (_expect(value, int, where, key, "give a whole number >= 1") >= 1):
        raise StudyError(f"{where}: {key}: {value} must be >= 1; fix: give a whole number >= 1")
    return value


def load(path: Path | str) -> StudyFile:
    """Read and check a study file; every problem is one StudyError line naming the file and key."""
    path = Path(path)
    if (
        not path.exists()
        and SAFE_NAME.fullmatch(str(path))
        and (ROOT / "configs" / "sweeps" / f"{path}.yaml").is_file()
    ):
        path = ROOT / "configs" / "sweeps" / f"{path}.yaml"
    if not path.exists():  # what is there but is no regular file is refused by the reader, by name
        raise StudyError(f"no study file {path}; fix: give a study YAML path or a name under configs/sweeps/")
    where = str(path)
    raw = yaml_input.load_mapping(path, "a tuning study")
    _unknown(raw, STUDY_FILE_KEYS, where, "top level")
    if "studies" not in raw:
        raise StudyError(
            f"{where}: studies: missing; fix: a tuning study lists `studies:` (a sweep file has `rows:`: "
            "run it with tunelab sweep)"
        )
    name = _expect(raw.get("name", path.stem), str, where, "name", "give the study a plain name")
    if not SAFE_NAME.fullmatch(name):
        raise StudyError(f"{where}: name: {name!r} is not a plain name; fix: letters, digits, '.', '_', '-'")
    studies, seen = [], set()
    for i, spec in enumerate(_expect(raw["studies"], list, where, "studies", "write a list (`- id: ...`)")):
        studies.append(_study(spec, f"studies[{i}]", seen, where))
    lab = _lab(raw.get("lab"), where)
    return StudyFile(
        path=path,
        name=name,
        description=str(raw.get("description", "")),
        lab_hardware=str(raw.get("lab_hardware", "")),
        studies=studies,
        lab=lab,
    )


def _study(spec, label: str, seen: set, where: str) -> Study:
    """One entry of ``studies:`` (``seen``: the ids before it, this one added)."""
    _expect(spec, dict, where, label, "write `- {id: ..., recipe: ..., settings: [...]}`")
    _unknown(spec, STUDY_KEYS, where, label)
    for key in ("id", "recipe", "strategy", "settings"):
        if key not in spec:
            raise StudyError(f"{where}: {label}: {key}: missing; fix: add it (see configs/sweeps/lab-part3.yaml)")
    sid = _expect(spec["id"], str, where, f"{label}: id", "give a plain id")
    if not SAFE_NAME.fullmatch(sid) or sid in seen:
        raise StudyError(f"{where}: {label}: id {sid!r} is repeated or not a plain name; fix: a unique plain id")
    seen.add(sid)
    label = f"study {sid}"
    settings: list[Setting] = []
    for j, st in enumerate(_expect(spec["settings"], list, where, f"{label}: settings", "write a list")):
        setting = _setting(st, f"{label}: settings[{j}]", settings, where)
        settings.append(setting)
    limit = spec.get("memory_limit_gb")
    if limit is not None and not (
        0 < _expect(limit, (int, float), where, f"{label}: memory_limit_gb", "GB > 0") < 1e6
    ):  # .inf and 1e400 (inf) too: an address-space cap is a finite number of bytes
        raise StudyError(
            f"{where}: {label}: memory_limit_gb: {limit} is not a size; fix: a finite number of GB above 0"
        )
    steps = _positive_int(spec.get("steps", 3), where, f"{label}: steps")
    if steps < 2:
        raise StudyError(f"{where}: {label}: steps: too few; fix: give 2 or more (the first is warm-up)")
    return Study(
        id=sid,
        recipe=_expect(spec["recipe"], str, where, f"{label}: recipe", "a recipe key"),
        strategy=_expect(spec["strategy"], str, where, f"{label}: strategy", "a configs/strategies name"),
        devices=_positive_int(spec.get("devices", 1), where, f"{label}: devices"),
        settings=settings,
        gpu=_expect(
            spec.get("gpu"),
            (str, type(None)),
            where,
            f"{label}: gpu",
            "a configs/hardware/gpus.yaml row such as H100-SXM",
        ),
        steps=steps,
        set=_expect(spec.get("set") or {}, dict, where, f"{label}: set", "write `set: {key: value}`"),
        note=_expect(spec.get("note", ""), str, where, f"{label}: note", "text"),
        checkpoint=_expect(
            spec.get("checkpoint"), (str, type(None)), where, f"{label}: checkpoint", "tiny or tiny-deep"
        ),
        memory_limit_gb=limit,
    )


def _setting(st, slabel: str, earlier: list[Setting], where: str) -> Setting:
    """One entry of a study's ``settings:`` (``earlier``: the settings before it)."""
    _expect(st, dict, where, slabel, "write `- {id: ..., activation_checkpointing: ...}`")
    _unknown(st, SETTING_KEYS, where, slabel)
    if "id" not in st:
        raise StudyError(f"{where}: {slabel}: id: missing; fix: add `id: <name>` (letters, digits, . _ -)")
    prefetch = st.get("backward_prefetch")
    if prefetch is not None and prefetch not in PREFETCH:
        raise StudyError(
            f"{where}: {slabel}: backward_prefetch: {prefetch!r}; fix: one of "
            f"{', '.join(PREFETCH)}, or leave it out (the strategy file's)"
        )
    setting_ids = {e.id for e in earlier}
    best_of = st.get("at_best_of")
    if best_of is not None and best_of not in setting_ids:
        raise StudyError(
            f"{where}: {slabel}: at_best_of: {best_of!r} is not an earlier setting of this "
            f"study; fix: one of {sorted(setting_ids) or 'none yet'}"
        )
    also = _expect(st.get("also") or [], list, where, f"{slabel}: also", "a list of micro batches")
    setting = Setting(
        id=_expect(st["id"], str, where, f"{slabel}: id", "a plain id"),
        activation_checkpointing=_expect(
            st.get("activation_checkpointing", False),
            bool,
            where,
            f"{slabel}: activation_checkpointing",
            "true or false",
        ),
        backward_prefetch=prefetch,
        max_micro=_positive_int(st.get("max_micro", 1024), where, f"{slabel}: max_micro"),
        also=[_positive_int(m, where, f"{slabel}: also") for m in also],
        start=None if st.get("start") is None else _positive_int(st["start"], where, f"{slabel}: start"),
        at_best_of=best_of,
    )
    if setting.dir_name in {e.dir_name for e in earlier}:
        raise StudyError(
            f"{where}: {slabel}: the same activation checkpointing and prefetch as an earlier "
            "setting; fix: change one, or remove the row"
        )
    return setting


def _lab(lab, where: str) -> dict:
    """The file's ``lab:`` section: the study's published rows per setting, each with its micro batch."""
    lab = _expect(lab or {}, dict, where, "lab", "write `lab: {setting id: [rows]}`")
    for key, rows in lab.items():
        for k, row in enumerate(_expect(rows, list, where, f"lab: {key}", "a list of rows")):
            _expect(row, dict, where, f"lab: {key}[{k}]", "write `{micro: N, ...}`")
            _unknown(row, LAB_ROW_KEYS, where, f"lab: {key}[{k}]")
            _positive_int(row.get("micro"), where, f"lab: {key}[{k}]: micro")  # the row's key in the report
            if row.get("iter_ms") is not None:  # the retry stretch divides by it (runtime.EDGE_STRETCH)
                ms = _expect(row["iter_ms"], (int, float), where, f"lab: {key}[{k}]: iter_ms", "give milliseconds")
                if not (math.isfinite(ms) and ms > 0):
                    raise StudyError(f"{where}: lab: {key}[{k}]: iter_ms: {ms} is not a time; fix: milliseconds > 0")
    return lab


def check(sf: StudyFile, only: list[str] | None) -> list[Study]:
    """The studies to run (``--only`` ids), each checked before any probe: recipe, strategy, GPU row, models."""
    known = [s.id for s in sf.studies]
    for sid in only or []:
        if sid not in known:
            raise StudyError(f"{sf.path}: --only {sid}: no such study; fix: one of {', '.join(known)}")
    chosen = [s for s in sf.studies if not only or s.id in only]
    for s in chosen:
        where = f"{sf.path}: study {s.id}"
        try:
            recipe = resolve(s.recipe)
            strategy = load_strategy(s.strategy)
            if s.gpu:
                hardware.lookup(s.gpu)
            if s.checkpoint and s.checkpoint not in checkpoints.EMBEDDED:
                raise ValueError(
                    f"checkpoint: {s.checkpoint!r} is not a model tunelab builds here; fix: one of "
                    f"{', '.join(checkpoints.EMBEDDED)} (real architectures: --weights random)"
                )
        except (InputError, ValueError) as e:
            raise StudyError(f"{where}: {e}") from None
        extra = study_overrides(s)
        try:
            resolved = settings.resolve(recipe, extra)
            strategy.check(resolved.args)  # what its probes' loop refuses (QLoRA, 16-mixed, ...)
        except StrategyError as e:
            raise StudyError(f"{where}: strategy {s.strategy}: {e}") from None
        except InputError as e:  # a key of its `set` litgpt has no argument for
            raise StudyError(f"{where}: set: {e}") from None
        world = resolved.world_size
        problems = probe_problems(recipe, extra, world, s.steps, strategy=True)
        if problems:
            raise StudyError(f"{where}: set: {'; '.join(problems)}")
        if any(st.backward_prefetch for st in s.settings) and not strategy.kind.prefetches:
            raise StudyError(
                f"{where}: backward_prefetch needs an FSDP strategy, and {s.strategy} is {strategy.name}; fix: an "
                "FSDP strategy, or leave backward_prefetch out"
            )
    return chosen


def study_overrides(study: Study) -> list[str]:
    """The litgpt overrides every probe of a study starts from: its ``set`` and its device count."""
    return [*settings.to_overrides(study.set), "--devices", str(study.devices)]


def _label(study: Study, st) -> str:
    """A setting as the tuner's progress and report name it: the study, the setting and its switches."""
    return (
        f"{study.id}: {st.id} ({study.strategy}, activation checkpointing "
        f"{'on' if st.activation_checkpointing else 'off'}, backward prefetch {st.backward_prefetch or 'as the file'})"
    )


def run_study(
    sf: StudyFile,
    study: Study,
    out: Path,
    *,
    model: str,
    max_micro: int | None = None,
    deadline: float | None = None,
    timeout_s: float | None = None,
    stream=sys.stderr,
) -> list:
    """Every setting of one study, in order; returns the TuneResults. ``max_micro`` caps every setting (a
    rehearsal); ``deadline`` (time.monotonic()) stops before a setting that would start after it."""
    recipe = resolve(study.recipe)
    extra = study_overrides(study)
    if study.checkpoint:
        ckpt = checkpoints.build(study.checkpoint)  # built once, in tunelab's checkpoint cache
        extra += ["--checkpoint_dir", str(ckpt)]
        model = "checkpoint"
    world = settings.resolve(recipe, extra).world_size
    limit = int(study.memory_limit_gb * GB) if study.memory_limit_gb else None
    gpu = hardware.lookup(study.gpu) if study.gpu else None
    results, by_id = [], {}
    for st in study.settings:
        if deadline is not None and time.monotonic() > deadline:
            stream.write(f"{study.id}/{st.id}: not started (deadline)\n")
            continue
        sub = out / study.id / st.dir_name
        strategy = str(strategy_variant(study.strategy, st.activation_checkpointing, sub, st.backward_prefetch))
        cap = min(st.max_micro, max_micro or st.max_micro)
        also = [m for m in st.also if m <= cap]
        predicted, start, why = planned_start(recipe, extra, gpu, strategy, st.activation_checkpointing, model)
        if st.at_best_of:
            best = by_id.get(st.at_best_of)
            if best is None or not best.best:
                stream.write(f"{study.id}/{st.id}: not probed ({st.at_best_of} has no best micro batch)\n")
                continue
            start, why, cap = best.best, f"the best micro batch of {st.at_best_of}", best.best
        elif st.start:
            start, why = st.start, "the study's start"
        res = tune(
            recipe,
            extra,
            sub,
            RunOptions(model=model, memory_limit_bytes=limit, timeout_s=timeout_s, strategy=strategy),
            Probes(max_micro=cap, steps=study.steps, world=world, also=also),
            start=start,
            start_reason=why,
            setting=_label(study, st),
            predicted_largest=predicted,
        )
        by_id[st.id] = res
        results.append(res)
    return results


def write_index(sf: StudyFile, out: Path) -> Path:
    """``<out>/tune-study.json``: which study file the directory holds (the report reads the file from there)."""
    path = sf.path.resolve()
    shown = str(path.relative_to(ROOT.resolve())) if path.is_relative_to(ROOT.resolve()) else str(path)
    return write_json_atomic(
        out / "tune-study.json", {"name": sf.name, "study_file": shown, "written": time.strftime("%Y-%m-%dT%H:%M:%S")}
    )


def resolve_index_path(index: dict) -> Path:
    """The study file a tune-study.json names (relative to the project when it was written inside it)."""
    path = Path(index.get("study_file") or "")
    return path if path.is_absolute() else ROOT / path


def read_index(out: Path) -> dict | None:
    """The tune-study.json a study directory holds (:func:`tunelab.files.read_json`), None when it has none;
    StudyError naming the file when it is not an index tune-study wrote (the report needs ``--study FILE``)."""
    path = out / "tune-study.json"
    if not os.path.lexists(path):
        return None
    try:
        index = read_json(path, what="tune-study index")
    except InputError as e:
        raise StudyError(f"{e}; or give the study with --study FILE") from None
    if not isinstance(index, dict) or not isinstance(index.get("study_file"), str) or not index["study_file"]:
        raise StudyError(
            f"{path}: not an index tune-study wrote (a mapping with the text key study_file); fix: give the study "
            "with --study FILE"
        )
    return index
