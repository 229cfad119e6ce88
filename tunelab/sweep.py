"""Sweeps: a YAML of rows (recipe + litgpt overrides + the lab's published figures), run one child process per
row, resumable, with a progress line. Every row ends as a record, whatever happened to it.

Sweep file keys (anything else is refused)::

    name: lab-part1                # the sweep's name (directory and report name)
    description: ...               # free text for the report
    lab_hardware: 1x A100 80GB     # the hardware of the `lab` figures
    gpu: A100-80GB                 # the GPU table row of that hardware (the planner's comparison; rows may differ)
    timeout_s: 1800                # per-run timeout (optional)
    defaults: {key: value}         # litgpt overrides for every row (dotted keys)
    rows:                          # explicit rows
      - id: s3
        recipe: tiny-llama-1.1b/full
        set: {precision: 32-true, train.global_batch_size: 32, train.micro_batch_size: 8}
        lab: {status: ok, memory_gb: 34.82, time_s: 57.19, tok_s: 7646}
        note: gradient accumulation 4
    grid:                          # rows made from axes (the product of every axis)
      - recipe: tiny-llama-1.1b/lora
        set: {...}                 # fixed overrides
        axes: {train.micro_batch_size: [1, 2, 4]}
        id: lora-mbs{train.micro_batch_size}   # optional id template
"""

from __future__ import annotations

import errno
import functools
import itertools
import json
import os
import re
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from tunelab import record as record_mod
from tunelab import yaml_input
from tunelab.errors import InputError, Interrupted
from tunelab.paths import ROOT, output_root
from tunelab.recipes import Recipe, RecipeError, resolve
from tunelab.progress import ProgressLine
from tunelab.runner import INTERRUPTED_PREFIX, RunError, run
from tunelab.settings import override_text, to_overrides
from tunelab.validate import check

SWEEP_KEYS = {"name", "description", "lab_hardware", "gpu", "timeout_s", "defaults", "rows", "grid"}
ROW_KEYS = {"id", "recipe", "set", "lab", "note", "strategy", "gpu"}
GRID_KEYS = {"recipe", "set", "axes", "id", "lab", "note", "strategy", "gpu"}
LAB_KEYS = {"status", "memory_gb", "time_s", "tok_s", "memory_note", "steps", "hardware", "allocated_gib",
            "reserved_gib"}


SAFE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")
"""Sweep names and row ids become directory names: no separators, no '..', nothing hidden or absolute."""


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

    def overrides(self) -> list[str]:
        return to_overrides(self.settings)


@dataclass
class Sweep:
    name: str
    path: Path
    rows: list[Row]
    description: str = ""
    lab_hardware: str = ""
    timeout_s: float | None = None


def _expect(value, kind, where: str, key: str, fix: str):
    """``value`` if it is of ``kind`` (bool is no number), else SweepError naming the file and key."""
    ok = isinstance(value, kind) and not (isinstance(value, bool) and bool not in (kind if isinstance(kind, tuple)
                                                                                   else (kind,)))
    if not ok:
        raise SweepError(f"{where}: {key}: got the {type(value).__name__} {str(value)[:60]!r}; fix: {fix}")
    return value


def _row_problems(where: str, rows: list["Row"]) -> list[str]:
    """What the validator refuses in each row, one line per distinct problem (naming every row it hits)."""
    found: dict[str, list[str]] = {}
    for row in rows:
        result = check(row.recipe, row.overrides())
        for p in result.problems:
            if p.severity == "error" and not (row.strategy and p.key == "eval.interval"):
                found.setdefault(f"{p.key}: {p.message}; fix: {p.fix}", []).append(row.id)
    return [f"{where}: row{'s' if len(ids) > 1 else ''} {', '.join(ids)}: {text}" for text, ids in found.items()]


def load(path: Path | str) -> Sweep:
    """Read and check a sweep file: unknown keys, wrong types and rows litgpt or the validator would refuse stop
    it here, in one line each."""
    path = Path(path)
    if not path.is_file() and SAFE_NAME.fullmatch(str(path)) \
            and (ROOT / "configs" / "sweeps" / f"{path}.yaml").is_file():
        path = ROOT / "configs" / "sweeps" / f"{path}.yaml"
    if not path.is_file():
        raise SweepError(f"no sweep file {path}; fix: give a sweep YAML path or a name under configs/sweeps/")
    where = str(path)
    try:
        raw = yaml_input.load_mapping(path, "a sweep")
    except InputError as e:
        raise SweepError(str(e)) from None
    unknown = set(raw) - SWEEP_KEYS
    if "studies" in raw and "rows" not in raw:
        raise SweepError(f"{where}: a tuning study (studies:), not a sweep; fix: tunelab tune-study {path}")
    if unknown:
        raise SweepError(f"{where}: unknown key(s) {sorted(unknown)}; allowed: {sorted(SWEEP_KEYS)}")
    if "name" not in raw:
        raise SweepError(f"{where}: name: missing; fix: add `name: <sweep-name>`")
    _expect(raw["name"], str, where, "name", "give the sweep a plain name such as lab-part1")
    for key in ("description", "lab_hardware"):
        _expect(raw.get(key, ""), str, where, key, "write it as text")
    timeout = raw.get("timeout_s")
    if timeout is not None and not (_expect(timeout, (int, float), where, "timeout_s", "give seconds > 0") > 0):
        raise SweepError(f"{where}: timeout_s: {timeout} must be > 0; fix: give seconds, or leave it out")
    defaults = _expect(raw.get("defaults") or {}, dict, where, "defaults", "write `defaults: {key: value}`")
    row_specs = _expect(raw.get("rows") or [], list, where, "rows", "write rows as a list (`- id: ...`)")
    grid_specs = _expect(raw.get("grid") or [], list, where, "grid", "write grid as a list (`- recipe: ...`)")
    rows: list[Row] = []

    def make(spec: dict, kind_keys: set, label: str) -> dict:
        bad = set(spec) - kind_keys
        if bad:
            raise SweepError(f"{where}: {label}: unknown key(s) {sorted(bad)}; allowed: {sorted(kind_keys)}")
        if "recipe" not in spec:
            raise SweepError(f"{where}: {label}: recipe: missing")
        _expect(spec["recipe"], str, where, f"{label}: recipe", "give a recipe key such as tiny-llama-1.1b/lora")
        _expect(spec.get("set") or {}, dict, where, f"{label}: set", "write `set: {key: value}`")
        _expect(spec.get("note", ""), str, where, f"{label}: note", "write it as text")
        lab = _expect(spec.get("lab") or {}, dict, where, f"{label}: lab", "write `lab: {key: value}`")
        bad = set(lab) - LAB_KEYS
        if bad:
            raise SweepError(f"{where}: {label}: lab: unknown key(s) {sorted(bad)}; allowed: {sorted(LAB_KEYS)}")
        try:
            recipe = resolve(spec["recipe"])
        except RecipeError as e:
            raise SweepError(f"{where}: {label}: recipe: {e}") from None
        strategy = spec.get("strategy")
        if strategy is not None:
            _expect(strategy, str, where, f"{label}: strategy", "name a file of configs/strategies")
            from tunelab.distributed.strategy import StrategyError, load_strategy

            try:
                load_strategy(strategy)
            except StrategyError as e:
                raise SweepError(f"{where}: {label}: strategy: {e}") from None
        gpu = spec.get("gpu", raw.get("gpu"))
        if gpu is not None:
            from tunelab import hardware

            try:
                hardware.lookup(_expect(gpu, str, where, f"{label}: gpu", "name a row of configs/hardware/gpus.yaml"))
            except ValueError as e:
                raise SweepError(f"{where}: {label}: gpu: {e}") from None
        return {"recipe": recipe, "lab": lab, "note": spec.get("note", ""), "strategy": strategy, "gpu": gpu}

    for i, spec in enumerate(row_specs):
        _expect(spec, dict, where, f"rows[{i}]", "each row is a mapping with id, recipe, set, ...")
        label = f"rows[{i}]" + (f" ({str(spec.get('id'))[:40]})" if spec.get("id") is not None else "")
        if "id" not in spec:
            raise SweepError(f"{where}: {label}: id: missing; fix: give every row an id")
        _expect(spec["id"], (str, int), where, f"{label}: id", "give a plain name")
        base = make(spec, ROW_KEYS, label)
        rows.append(Row(id=str(spec["id"]), settings={**defaults, **(spec.get("set") or {})}, **base))
    for i, spec in enumerate(grid_specs):
        label = f"grid[{i}]"
        _expect(spec, dict, where, label, "each grid entry is a mapping with recipe, set, axes")
        base = make(spec, GRID_KEYS, label)
        axes = _expect(spec.get("axes") or {}, dict, where, f"{label}: axes", "write `axes: {key: [v1, v2]}`")
        if not axes:
            raise SweepError(f"{where}: {label}: axes: missing or empty")
        for k, values in axes.items():
            if not isinstance(values, list) or not values:
                raise SweepError(f"{where}: {label}: axes: {k}: {values!r} is not a non-empty list; "
                                 f"fix: write `{k}: [v1, v2]`")
        template = _expect(spec.get("id", ""), str, where, f"{label}: id", "give an id template such as "
                                                                                "lora-mbs{train.micro_batch_size}")
        keys = list(axes)
        for combo in itertools.product(*(axes[k] for k in keys)):
            point = dict(zip(keys, combo))
            row_id = template or (base["recipe"].slug() + "-" +
                                  "-".join(f"{k.split('.')[-1]}{{{k}}}" for k in keys))
            for k, v in point.items():
                row_id = row_id.replace("{" + k + "}", override_text(v))
            rows.append(Row(id=row_id, settings={**defaults, **(spec.get("set") or {}), **point}, **base))
    if not rows:
        raise SweepError(f"{where}: rows: no rows (give `rows` or `grid`)")
    for name, what in [(str(raw["name"]), "name"), *((r.id, "row id") for r in rows)]:
        if not SAFE_NAME.fullmatch(name):
            shown = name if len(name) <= 60 else f"{name[:40]}... ({len(name)} characters)"
            raise SweepError(f"{where}: {what}: {shown!r} is not a plain name (it becomes a directory: up to 100 "
                             "letters, digits, '.', '_', '-', starting with a letter or digit); fix: rename it")
    ids = [r.id for r in rows]
    dup = sorted({i for i in ids if ids.count(i) > 1})
    if dup:
        raise SweepError(f"{where}: duplicate row id(s) {dup}")
    problems = _row_problems(where, rows)
    if problems:
        raise SweepError("\n".join(problems))
    return Sweep(name=str(raw["name"]), path=path, rows=rows, description=raw.get("description", ""),
                 lab_hardware=raw.get("lab_hardware", ""), timeout_s=timeout)


def with_settings(sweep: Sweep, pairs: list[str]) -> Sweep:
    """The sweep with ``KEY=VALUE`` overrides (YAML values) added to every row, checked like the file's own."""
    extra = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise SweepError(f"--set {pair!r}: expected KEY=VALUE, e.g. --set train.max_steps=5")
        try:
            extra[key.strip().lstrip("-")] = yaml_input.loads(value, f"--set {key.strip()}") if value.strip() \
                else None
        except InputError as e:
            raise SweepError(str(e)) from None
    rows = [Row(id=r.id, recipe=r.recipe, settings={**r.settings, **extra}, lab=r.lab, note=r.note,
                strategy=r.strategy, gpu=r.gpu) for r in sweep.rows]
    problems = _row_problems("--set", rows)
    if problems:
        raise SweepError("\n".join(problems))
    return Sweep(name=sweep.name, path=sweep.path, rows=rows, description=sweep.description,
                 lab_hardware=sweep.lab_hardware, timeout_s=sweep.timeout_s)


def sweep_dir_for(sweep: Sweep, out: Path | None) -> Path:
    return Path(out) if out else output_root() / "runs" / sweep.name


DEADLINE_PREFIX = "deadline:"
DISK_FULL_PREFIX = "disk full"
RERUN_PREFIXES = (DEADLINE_PREFIX, INTERRUPTED_PREFIX)
"""Killed rows whose error starts so were cut short by the command, not by themselves: they run again on resume."""


def _same_overrides(recorded: list, wanted: list[str]) -> bool:
    """Whether a record's overrides are the row's (a random-weight run appends its benchmark data path)."""
    recorded = [str(x) for x in recorded or []]
    extra = recorded[len(wanted):]
    return recorded[:len(wanted)] == wanted and (not extra or (len(extra) == 2 and extra[0] == "--data.json_path"))


def resume_state(record_path: Path, row: Row | None = None) -> tuple[bool, str | None]:
    """(done, why not) for a row on resume. Done: a readable record made with the row's current recipe,
    overrides and strategy, not cut short by --deadline or an interrupt. Not done with a reason: the record is
    corrupt or stale (the caller keeps it aside and reruns the row)."""
    if not record_path.is_file():
        return False, None
    try:
        rec = json.loads(record_path.read_text(encoding="utf-8"))
        if not isinstance(rec, dict) or "status" not in rec:
            raise ValueError("not a run record")
    except (OSError, ValueError) as e:
        return False, f"unreadable record ({str(e)[:80]})"
    if rec.get("status") == "killed" and str(rec.get("error") or "").startswith(RERUN_PREFIXES):
        return False, None
    if rec.get("status") == "error" and str(rec.get("error") or "").startswith(DISK_FULL_PREFIX):
        return False, None  # the machine's fault, not the row's: it runs again once there is space
    if row is not None:
        if rec.get("recipe") != row.recipe.key:
            return False, f"recipe changed ({rec.get('recipe')} -> {row.recipe.key})"
        if not _same_overrides(rec.get("overrides"), row.overrides()):
            return False, (f"settings changed ({' '.join(map(str, rec.get('overrides') or [])) or 'none'} -> "
                           f"{' '.join(row.overrides()) or 'none'})")
        if (rec.get("strategy") or "litgpt") != _strategy_label(row.strategy):
            return False, f"strategy changed ({rec.get('strategy')} -> {_strategy_label(row.strategy)})"
    return True, None


@functools.lru_cache(maxsize=None)
def _strategy_label(strategy: str | None) -> str:
    """What a record says of the row's strategy (read once per sweep, not once per row and resume check)."""
    if not strategy:
        return "litgpt"
    from tunelab.distributed.strategy import load_strategy

    return load_strategy(strategy).describe()


def _set_aside(record_path: Path, why: str) -> Path:
    """Rename a stale or corrupt record out of the report's way, keeping it: record.json.<why>-<time>."""
    kind = "corrupt" if why.startswith("unreadable") else "stale"
    dest = record_path.with_name(f"record.json.{kind}-{time.strftime('%Y%m%d-%H%M%S')}")
    os.replace(record_path, dest)
    return dest


def archive(sweep_dir: Path, dest: Path) -> Path:
    """A .tar.gz of a sweep directory's records and logs (record.json, stdout/stderr, rank stats, metrics.csv,
    sweep.json), never model weights: small enough to copy back from a machine that returns few, small files."""
    import tarfile
    import tempfile

    from tunelab.runner import WEIGHT_SUFFIXES

    sweep_dir, dest = Path(sweep_dir), Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{dest.name}.", dir=dest.parent)
    os.close(fd)
    with tarfile.open(tmp, "w:gz") as tar:
        for f in sorted(sweep_dir.rglob("*")):
            if f.is_file() and not f.name.endswith(WEIGHT_SUFFIXES) and not f.name.startswith(".") \
                    and f.stat().st_size < 32 * 2**20:
                tar.add(f, arcname=str(Path(sweep_dir.name) / f.relative_to(sweep_dir)))
    os.chmod(tmp, 0o644)
    os.replace(tmp, dest)
    return dest


class DiskFull(SweepError):
    """The disk ran out: the row that hit it is recorded, the sweep stops (a resume after freeing space goes on)."""


def _is_disk_full(e: BaseException) -> bool:
    return isinstance(e, OSError) and e.errno == errno.ENOSPC or "disk full" in str(e) \
        or "No space left on device" in str(e)


def _lock(base: Path):
    """An exclusive lock on ``base/.lock`` (flock: released by the kernel when the holder dies, even by SIGKILL).
    A second sweep on the same directory stops in one line naming the holder."""
    import fcntl

    path = base / ".lock"
    f = open(path, "a+")
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.seek(0)
        holder = f.read().strip() or "another process"
        f.close()
        raise SweepError(f"{base} is being swept by {holder}; wait for it to finish, or use another --out") from None
    f.seek(0)
    f.truncate()
    f.write(f"pid {os.getpid()} since {time.strftime('%Y-%m-%d %H:%M:%S')}")
    f.flush()
    return f


def run_sweep(sweep: Sweep, out: Path | None = None, *, rerun: bool = False, model: str = "auto",
              only: list[str] | None = None, timeout_s: float | None = None,
              memory_limit_bytes: int | None = None, stream=sys.stderr, deadline_s: float | None = None,
              after_row: Callable[[Path], None] | None = None, prune_checkpoints: bool = False) -> Path:
    """Run every row not already recorded in ``out`` (resume); return the sweep directory.

    ``deadline_s``: seconds from now after which no row starts, and a running row is killed (status killed,
    reason 'deadline'): for machines that grant commands a fixed time. ``after_row(sweep_dir)`` runs after every
    row (the runbook regenerates the report and the archive there, so a command killed later still returns
    what it measured). ``prune_checkpoints``: delete a random-weight checkpoint once no row left needs it.
    """
    base = sweep_dir_for(sweep, out)
    base.mkdir(parents=True, exist_ok=True)
    lock = _lock(base)  # one sweep per directory at a time; released on return, raise, or the process's death
    try:
        return _run_locked(sweep, base, rerun=rerun, model=model, only=only, timeout_s=timeout_s,
                           memory_limit_bytes=memory_limit_bytes, stream=stream, deadline_s=deadline_s,
                           after_row=after_row, prune_checkpoints=prune_checkpoints)
    except KeyboardInterrupt:  # between rows (a row's own interrupt is recorded by the row, see _run_locked)
        recorded = sum(1 for r in sweep.rows if resume_state(base / r.id / "record.json", r)[0])
        raise Interrupted(f"sweep {sweep.name} stopped between rows: {recorded} of {len(sweep.rows)} rows recorded "
                          f"in {base}; run the same command again to go on") from None
    finally:
        lock.close()  # closing the file releases the flock


def _run_locked(sweep: Sweep, base: Path, *, rerun, model, only, timeout_s, memory_limit_bytes, stream, deadline_s,
                after_row, prune_checkpoints) -> Path:
    meta_path = base / "sweep.json"
    meta = {"name": sweep.name, "file": str(sweep.path.relative_to(ROOT) if sweep.path.is_relative_to(ROOT)
                                            else sweep.path),
            "model": model, "description": sweep.description, "lab_hardware": sweep.lab_hardware,
            "rows": [{"id": r.id, "recipe": r.recipe.key, "settings": r.settings, "lab": r.lab, "note": r.note,
                      "strategy": r.strategy}
                     for r in sweep.rows]}
    if meta_path.is_file() and not rerun:
        old = json.loads(meta_path.read_text())
        if old.get("model") != model:
            raise SweepError(f"{base} holds runs made with --model {old.get('model')}, not {model}: resume with the "
                             "same choice, or use --rerun or another --out")
    record_mod.write_json_atomic(meta_path, meta)
    rows = [r for r in sweep.rows if not only or r.id in only]
    if only:
        missing = set(only) - {r.id for r in sweep.rows}
        if missing:
            raise SweepError(f"--only: no row(s) {sorted(missing)} in {sweep.path}")
    todo = []
    for r in rows:
        done, why = (False, None) if rerun else resume_state(base / r.id / "record.json", r)
        if why:
            kept = _set_aside(base / r.id / "record.json", why)
            stream.write(f"{r.id}: {why}: the old record is kept as {kept.name}; running the row again\n")
        if not done:
            todo.append(r)
    progress = ProgressLine(len(rows), stream)
    done = len(rows) - len(todo)
    if done:
        stream.write(f"resuming {sweep.name}: {done} of {len(rows)} rows already recorded in {base}\n")
    t_start = time.monotonic()
    for i, row in enumerate(todo):
        row_timeout = timeout_s or sweep.timeout_s
        if deadline_s is not None:
            left = deadline_s - (time.monotonic() - t_start)
            if left < 1:
                stream.write(f"deadline reached: {len(todo) - i} row(s) not started "
                             f"({', '.join(r.id for r in todo[i:])}); run the same command again to go on\n")
                break
            row_timeout = min(row_timeout or left, left)
        progress.started(done, f"{row.id} {row.recipe.key}")
        disk_full = False
        try:
            rec = run(row.recipe, row.overrides(), base / row.id, sweep=sweep.name, row_id=row.id, model=model,
                      timeout_s=row_timeout, memory_limit_bytes=memory_limit_bytes,
                      on_progress=progress.show, strategy=row.strategy)
        except (Interrupted, KeyboardInterrupt):
            recorded = sum(1 for r in rows if resume_state(base / r.id / "record.json", r)[0])
            raise Interrupted(f"sweep {sweep.name} stopped during row {row.id}: {recorded} of {len(rows)} rows "
                              f"recorded in {base}; run the same command again to go on (row {row.id} runs "
                              "again)") from None
        except (RunError, OSError) as e:  # refused or failed before launch: still a row, with its reason
            disk_full = _is_disk_full(e)
            reason = f"{DISK_FULL_PREFIX}: {e}" if disk_full and not str(e).startswith(DISK_FULL_PREFIX) else str(e)
            rec = record_mod.RunRecord(sweep=sweep.name, row_id=row.id, recipe=row.recipe.key,
                                       command=row.recipe.command, overrides=row.overrides(), status="error",
                                       error=reason, method=row.recipe.method, started_at="", ended_at="",
                                       wall_s=0.0, strategy=_strategy_label(row.strategy))
            try:
                record_mod.save(rec, base / row.id / "record.json")
            except OSError:
                pass  # the disk is full: nothing can be written, the sweep stops below
        if rec.status == "error" and not disk_full and "No space left on device" in (rec.error or ""):
            disk_full = True  # the run itself hit the full disk (litgpt saving a checkpoint): the machine's fault
            rec.error = f"{DISK_FULL_PREFIX}: {rec.error}"
            try:
                record_mod.save(rec, base / row.id / "record.json")
            except OSError:
                pass
        if deadline_s is not None and rec.status == "killed" and row_timeout is not None \
                and time.monotonic() - t_start >= deadline_s - 1:
            rec.error = f"{DEADLINE_PREFIX} the command's time ran out during this row; it runs again on resume"
            record_mod.save(rec, base / row.id / "record.json")
        done += 1
        progress.finished(rec)
        if prune_checkpoints and model == "random":
            _prune_random_checkpoints(row, todo[i + 1:], stream)
        if after_row is not None:
            try:
                after_row(base)
            except OSError as e:
                if not (disk_full or _is_disk_full(e)):
                    raise
                disk_full = True
        if disk_full:
            raise DiskFull(f"{row.id}: disk full; free space and run the same command again to go on "
                           f"({len(todo) - i - 1} row(s) not started)")
    return base


def _prune_random_checkpoints(row: Row, later: list[Row], stream) -> None:
    """Delete the random-weight checkpoint ``row`` used when no later row uses the same architecture."""
    import shutil

    from tunelab import checkpoints

    def arch(r: Row) -> str:
        return Path(str(r.settings.get("checkpoint_dir") or r.recipe.get("checkpoint_dir") or "")).name

    name = arch(row)
    if not name or any(arch(r) == name for r in later):
        return
    try:
        from litgpt import Config

        target = checkpoints.default_dir(Config.from_name(name).name)
    except ValueError:
        return
    if target.is_dir():
        shutil.rmtree(target, ignore_errors=True)
        stream.write(f"removed the random-weight checkpoint {target.name} (no later row uses it)\n")
