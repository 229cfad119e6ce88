"""Sweep files: a YAML of rows (recipe + litgpt overrides + the lab's published figures), read and checked here; every
row is resolved by litgpt's own parser once, when the file is loaded. Keys (anything else is refused)::

    name: lab-part1        description: ...        lab_hardware: 1x A100 80GB        gpu: A100-80GB
    timeout_s: 1800        defaults: {train.epochs: 1}                   # overrides for every row
    rows: [{id: s3, recipe: tiny-llama-1.1b/full, set: {precision: 32-true},
            lab: {status: ok, memory_gb: 34.82, time_s: 57.19, tok_s: 7646}, note: ...}]
    grid: [{recipe: tiny-llama-1.1b/lora, set: {...}, axes: {train.micro_batch_size: [1, 2, 4]},
            id: "lora-mbs{train.micro_batch_size}"}]                      # the product of every axis

``lab`` holds the published figures; ``gpu`` is the GPU table row the planner compares them with."""

from __future__ import annotations

import functools
import itertools
import math
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from tunelab import hardware, yaml_input
from tunelab.errors import InputError
from tunelab.paths import CONFIGS_DIR, SAFE_NAME
from tunelab.recipes import Recipe, RecipeError, resolve
from tunelab.settings import override_text, to_overrides
from tunelab.strategies import StrategyConfig, StrategyError, load_strategy, world_of
from tunelab.validate import Result, check

SWEEP_KEYS = {"name", "description", "lab_hardware", "gpu", "timeout_s", "defaults", "rows", "grid"}
ROW_KEYS = {"id", "recipe", "set", "lab", "note", "strategy", "gpu"}
GRID_KEYS = {"recipe", "set", "axes", "id", "lab", "note", "strategy", "gpu"}
LAB_KEYS = {
    "status",
    "memory_gb",
    "time_s",
    "tok_s",
    "memory_note",
    "steps",
    "hardware",
    "allocated_gib",
    "reserved_gib",
}


class SweepError(InputError):
    """A sweep file that cannot run: every message names the file, the row and the key."""


@dataclass
class Row:
    """One run of a sweep."""

    id: str
    recipe: Recipe
    settings: dict
    """Dotted litgpt keys -> values (defaults merged in)."""
    lab: dict = field(default_factory=dict)
    note: str = ""
    strategy: str | None = None
    """A configs/strategies file or name: run under tunelab's multi-device loop (None: litgpt's own command)."""
    gpu: str | None = None
    """The GPU table row the lab ran this row on (what plan-accuracy plans it for); None: not stated."""
    strategy_config: StrategyConfig | None = field(default=None, repr=False)
    """The strategy file, loaded once when the sweep file was read."""
    checked: Result | None = field(default=None, repr=False)
    """What the validator said of the row (litgpt's parser ran once, when the sweep file was read)."""

    def overrides(self) -> list[str]:
        return to_overrides(self.settings)

    @property
    def strategy_label(self) -> str:
        """What a record says of the row's strategy (StrategyConfig.describe(), or 'litgpt')."""
        return self.strategy_config.describe() if self.strategy_config else "litgpt"


@dataclass
class Sweep:
    """A sweep file: its name, its rows and what the report says about them."""

    name: str
    path: Path
    rows: list[Row]
    description: str = ""
    lab_hardware: str = ""
    timeout_s: float | None = None


def _expect(value, kind, where: str, key: str, fix: str):
    """``value`` if it is of ``kind`` (bool is no number), else SweepError naming the file and key."""
    ok = isinstance(value, kind) and not (
        isinstance(value, bool) and bool not in (kind if isinstance(kind, tuple) else (kind,))
    )
    if not ok:
        raise SweepError(f"{where}: {key}: got the {type(value).__name__} {str(value)[:60]!r}; fix: {fix}")
    return value


MAX_ROWS = 1_000
"""Rows a sweep may have (rows and grid points together): each is checked by litgpt's parser when the file is
loaded (about 0.1 s a row) and is a training run."""


def _check_rows(where: str, rows: list[Row]) -> list[str]:
    """Validate every row once (litgpt's parser and tunelab's rules), keeping each row's result; the problems that
    stop a launch, one line per distinct problem (naming every row it hits)."""
    found: dict[str, list[str]] = {}
    t0 = last = time.monotonic()
    for i, row in enumerate(rows):
        if (
            len(rows) >= 50 and time.monotonic() - last > 5
        ):  # a large grid: say how far the check is (litgpt's parser per row)
            last = time.monotonic()
            print(f"checking sweep rows: {i}/{len(rows)} ({last - t0:.0f} s)", file=sys.stderr, flush=True)
        row.checked = check(row.recipe, row.overrides())
        for line in row.checked.blocking(under_strategy=bool(row.strategy), with_file=False):
            found.setdefault(line, []).append(row.id)
    return [f"{where}: row{'s' if len(ids) > 1 else ''} {', '.join(ids)}: {text}" for text, ids in found.items()]


def find(path: Path | str) -> Path:
    """A sweep file from a path or a name under configs/sweeps/ (``lab-part1``); SweepError when there is none."""
    path = Path(path)
    named = CONFIGS_DIR / "sweeps" / f"{path}.yaml"
    if not path.exists() and SAFE_NAME.fullmatch(str(path)) and named.is_file():
        path = named
    if not path.exists():  # what is there but is no regular file is refused by the reader, by name
        raise SweepError(f"no sweep file {path}; fix: give a sweep YAML path or a name under configs/sweeps/")
    return path


def _header(raw: dict, where: str) -> dict:
    """The file's top-level keys, checked: name, description, lab_hardware, timeout_s, defaults."""
    unknown = set(raw) - SWEEP_KEYS
    if "studies" in raw and "rows" not in raw:
        raise SweepError(f"{where}: a tuning study (studies:), not a sweep; fix: tunelab tune-study {where}")
    if unknown:
        raise SweepError(
            f"{where}: unknown key(s) {sorted(unknown)}; fix: remove them or use one of {sorted(SWEEP_KEYS)}"
        )
    if "name" not in raw:
        raise SweepError(f"{where}: name: missing; fix: add `name: <sweep-name>`")
    _expect(raw["name"], str, where, "name", "give the sweep a plain name such as lab-part1")
    for key in ("description", "lab_hardware"):
        _expect(raw.get(key, ""), str, where, key, "write it as text")
    timeout = raw.get("timeout_s")
    if timeout is not None and not (
        math.isfinite(_expect(timeout, (int, float), where, "timeout_s", "give seconds > 0")) and timeout > 0
    ):
        raise SweepError(
            f"{where}: timeout_s: {timeout} must be a finite number > 0; fix: give seconds, or leave it out"
        )
    return {
        "name": raw["name"],
        "description": raw.get("description", ""),
        "lab_hardware": raw.get("lab_hardware", ""),
        "timeout_s": timeout,
        "defaults": _expect(raw.get("defaults") or {}, dict, where, "defaults", "write `defaults: {key: value}`"),
    }


def _row_base(spec: dict, kind_keys: set, label: str, where: str, default_gpu) -> dict:
    """What a row and a grid entry share: recipe, lab figures, note, strategy (loaded once), GPU row."""
    bad = set(spec) - kind_keys
    if bad:
        raise SweepError(
            f"{where}: {label}: unknown key(s) {sorted(bad)}; fix: remove them or use one of {sorted(kind_keys)}"
        )
    if "recipe" not in spec:
        raise SweepError(f"{where}: {label}: recipe: missing; fix: add `recipe: <key>`, e.g. tiny-llama-1.1b/lora")
    _expect(spec["recipe"], str, where, f"{label}: recipe", "give a recipe key such as tiny-llama-1.1b/lora")
    _expect(spec.get("set") or {}, dict, where, f"{label}: set", "write `set: {key: value}`")
    _expect(spec.get("note", ""), str, where, f"{label}: note", "write it as text")
    lab = _expect(spec.get("lab") or {}, dict, where, f"{label}: lab", "write `lab: {key: value}`")
    bad = set(lab) - LAB_KEYS
    if bad:
        raise SweepError(
            f"{where}: {label}: lab: unknown key(s) {sorted(bad)}; fix: remove them or use one of {sorted(LAB_KEYS)}"
        )
    check_lab(lab, where, f"{label}: lab")
    try:
        recipe = resolve(spec["recipe"])
    except RecipeError as e:
        raise SweepError(f"{where}: {label}: recipe: {e}") from None
    strategy, strategy_config = spec.get("strategy"), None
    if strategy is not None:
        _expect(strategy, str, where, f"{label}: strategy", "name a file of configs/strategies")
        try:
            strategy_config = load_strategy(strategy)
            strategy_config.check_world(world_of(spec.get("set") or {}))  # a grid's: when its rows run
        except StrategyError as e:
            raise SweepError(f"{where}: {label}: strategy: {e}") from None
    gpu = spec.get("gpu", default_gpu)
    if gpu is not None:
        try:
            hardware.lookup(_expect(gpu, str, where, f"{label}: gpu", "name a row of configs/hardware/gpus.yaml"))
        except ValueError as e:
            raise SweepError(f"{where}: {label}: gpu: {e}") from None
    return {
        "recipe": recipe,
        "lab": lab,
        "note": spec.get("note", ""),
        "strategy": strategy,
        "gpu": gpu,
        "strategy_config": strategy_config,
    }


def _explicit_rows(specs: list, defaults: dict, where: str, default_gpu) -> list[Row]:
    rows = []
    for i, spec in enumerate(specs):
        _expect(spec, dict, where, f"rows[{i}]", "each row is a mapping with id, recipe, set, ...")
        label = f"rows[{i}]" + (f" ({str(spec.get('id'))[:40]})" if spec.get("id") is not None else "")
        if "id" not in spec:
            raise SweepError(f"{where}: {label}: id: missing; fix: give every row an id")
        _expect(spec["id"], (str, int), where, f"{label}: id", "give a plain name")
        base = _row_base(spec, ROW_KEYS, label, where, default_gpu)
        rows.append(Row(id=str(spec["id"]), settings={**defaults, **(spec.get("set") or {})}, **base))
    return rows


def _grid_rows(specs: list, defaults: dict, where: str, default_gpu) -> list[Row]:
    """Rows made from axes: the product of every axis, ids from the entry's template."""
    rows = []
    for i, spec in enumerate(specs):
        label = f"grid[{i}]"
        _expect(spec, dict, where, label, "each grid entry is a mapping with recipe, set, axes")
        base = _row_base(spec, GRID_KEYS, label, where, default_gpu)
        axes = _expect(spec.get("axes") or {}, dict, where, f"{label}: axes", "write `axes: {key: [v1, v2]}`")
        if not axes:
            raise SweepError(f"{where}: {label}: axes: missing or empty; fix: give `axes: {{key: [value, ...]}}`")
        for k, values in axes.items():
            if not isinstance(values, list) or not values:
                raise SweepError(
                    f"{where}: {label}: axes: {k}: {values!r} is not a non-empty list; fix: write `{k}: [v1, v2]`"
                )
        template = _expect(
            spec.get("id", ""),
            str,
            where,
            f"{label}: id",
            "give an id template such as lora-mbs{train.micro_batch_size}",
        )
        keys = list(axes)
        n = math.prod(len(axes[k]) if isinstance(axes[k], list) else 1 for k in keys)
        if n > MAX_ROWS:
            raise SweepError(
                f"{where}: {label}: axes give {n:,} rows, more than a sweep runs ({MAX_ROWS:,}); fix: fewer values, "
                "or split the grid into several sweeps"
            )
        for combo in itertools.product(*(axes[k] for k in keys)):
            point = dict(zip(keys, combo))
            row_id = template or (base["recipe"].slug() + "-" + "-".join(f"{k.split('.')[-1]}{{{k}}}" for k in keys))
            for k, v in point.items():
                row_id = row_id.replace("{" + k + "}", override_text(v))
            rows.append(Row(id=row_id, settings={**defaults, **(spec.get("set") or {}), **point}, **base))
    return rows


def check_lab(lab: dict, where: str, label: str) -> None:
    """The lab's figures: text for status and hardware, a non-negative number (or a [min, max] pair of them for
    the GiB figures) for the rest; a string figure would train the row and then break its report."""
    for key, value in lab.items():
        if key in ("status", "hardware"):
            ok = isinstance(value, str)
        elif key.endswith("_gib") and isinstance(value, list):
            ok = len(value) == 2 and all(_figure(v) for v in value)
        else:
            ok = _figure(value)
        if not ok:
            want = "text" if key in ("status", "hardware") else "a non-negative number"
            raise SweepError(f"{where}: {label}: {key}: {value!r} is not {want}; fix: write the lab's figure as {want}")


def _figure(v) -> bool:
    return type(v) in (int, float) and math.isfinite(v) and v >= 0


def _check_names(name: str, rows: list[Row], where: str) -> None:
    """Names become directories: plain names only, no duplicate row ids (nor two that differ only in case: one
    folder on the case-insensitive disks of macOS and Windows)."""
    for text, what in [(name, "name"), *((r.id, "row id") for r in rows)]:
        if not SAFE_NAME.fullmatch(text):
            shown = text if len(text) <= 60 else f"{text[:40]}... ({len(text)} characters)"
            raise SweepError(
                f"{where}: {what}: {shown!r} is not a plain name (it becomes a directory: up to 100 "
                "letters, digits, '.', '_', '-', starting with a letter or digit); fix: rename it"
            )
    folded = [r.id.casefold() for r in rows]
    dup = sorted({r.id for r in rows if folded.count(r.id.casefold()) > 1})
    if dup:
        raise SweepError(f"{where}: duplicate row id(s) {dup} (case aside: one folder each); fix: rename all but one")


def parse_set(pairs: list[str]) -> dict:
    """``--set KEY=VALUE`` pairs (YAML values) as {dotted key: value}; SweepError for a malformed one."""
    extra = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise SweepError(f"--set {pair!r}: not KEY=VALUE; fix: e.g. --set train.max_steps=5")
        try:
            extra[key.strip().lstrip("-")] = yaml_input.loads(value, f"--set {key.strip()}") if value.strip() else None
        except InputError as e:
            raise SweepError(str(e)) from None
    return extra


def load(path: Path | str, extra: list[str] | None = None) -> Sweep:
    """Read and check a sweep file, with ``extra`` ``KEY=VALUE`` overrides (``--set``) added to every row: unknown
    keys, wrong types and rows litgpt or the validator would refuse stop it here, in one line each. Every row is
    resolved by litgpt's parser once, here (the result is kept in ``Row.checked``)."""
    path = find(path)
    where = str(path)
    try:
        raw = yaml_input.load_mapping(path, "a sweep")
    except InputError as e:
        raise SweepError(str(e)) from None
    head = _header(raw, where)
    row_specs = _expect(raw.get("rows") or [], list, where, "rows", "write rows as a list (`- id: ...`)")
    grid_specs = _expect(raw.get("grid") or [], list, where, "grid", "write grid as a list (`- recipe: ...`)")
    rows = _explicit_rows(row_specs, head["defaults"], where, raw.get("gpu")) + _grid_rows(
        grid_specs, head["defaults"], where, raw.get("gpu")
    )
    if not rows:
        raise SweepError(f"{where}: rows: no rows; fix: give `rows` (a list of runs) or `grid` (recipes x axes)")
    if len(rows) > MAX_ROWS:
        raise SweepError(f"{where}: {len(rows):,} rows, more than a sweep runs ({MAX_ROWS:,}); fix: split it")
    _check_names(str(head["name"]), rows, where)
    if extra:
        added = parse_set(extra)
        for row in rows:
            row.settings = {**row.settings, **added}
    problems = _check_rows(f"{where} with --set {' '.join(extra)}" if extra else where, rows)
    if problems:
        raise SweepError("\n".join(problems))
    return Sweep(
        name=str(head["name"]),
        path=path,
        rows=rows,
        description=head["description"],
        lab_hardware=head["lab_hardware"],
        timeout_s=head["timeout_s"],
    )


def lab_rows(name: str) -> tuple[Row, ...]:
    """The rows of one of the project's lab sweeps (``lab-part1``, ``lab-part2``): what plan-accuracy compares. Read
    and checked once per process and file version (each row goes through litgpt's parser: about 0.1 s)."""
    path = CONFIGS_DIR / "sweeps" / f"{name}.yaml"
    return _lab_rows(path, path.stat().st_mtime_ns)


@functools.lru_cache(maxsize=4)
def _lab_rows(path: Path, mtime_ns: int) -> tuple[Row, ...]:
    return tuple(load(path).rows)
