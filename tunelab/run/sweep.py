"""Running a sweep (``tunelab sweep``): every row of a sweep file (:mod:`tunelab.sweep_file`) as its own child
process, resumable, with a progress line. Every row ends as a record, whatever happened to it: a run that runs out
of memory, crashes, is killed or times out; a row refused before launch; a full disk. One sweep per directory.
"""

from __future__ import annotations

import errno
import io
import os
import shutil
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from tunelab import checkpoints
from tunelab import record as record_mod
from tunelab.errors import Interrupted
from tunelab.files import Busy, FileRefused, check_target, exclusive_lock, read_json, set_aside, write_json_atomic
from tunelab.paths import ROOT, output_root
from tunelab.progress import ProgressLine
from tunelab.run.resume import DEADLINE_PREFIX, DISK_FULL_PREFIX, resume_state
from tunelab.run.runner import WEIGHT_SUFFIXES, RunError, RunOptions, run
from tunelab.sweep_file import Row, Sweep, SweepError


def sweep_dir_for(sweep: Sweep, out: Path | None) -> Path:
    """The sweep's directory: ``out``, else runs/<sweep name>."""
    return Path(out) if out else output_root() / "runs" / sweep.name


def row_done(base: Path, row: Row) -> tuple[bool, str | None]:
    """Whether row ``row`` of the sweep in ``base`` is recorded with its current settings (see resume_state)."""
    settings = row.strategy_config.settings() if row.strategy_config else None
    return resume_state(base / row.id / "record.json", row.recipe.key, row.overrides(), row.strategy_label, settings)


TEXT_SUFFIXES = (".json", ".jsonl", ".log", ".yaml", ".yml", ".csv", ".txt", ".md")
"""Members :func:`archive` writes with the machine's checkout path taken out (records, logs, litgpt's YAMLs)."""


def archive(sweep_dir: Path, dest: Path, root: Path | None = None) -> Path:
    """A .tar.gz of a sweep directory's records and logs (record.json, stdout/stderr, rank stats, metrics.csv,
    sweep.json), never model weights: small enough to copy back from a machine that returns few, small files. The
    text members (:data:`TEXT_SUFFIXES`) hold paths relative to ``root`` (default: the working directory, the
    checkout) where they named it absolutely: an archive made on a lent machine can be committed as it came back,
    with no path of that machine in it."""
    sweep_dir, dest = Path(sweep_dir), check_target(Path(dest), "--archive")
    prefix = (str(Path(root or Path.cwd()).resolve()).rstrip("/") + "/").encode()
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{dest.name}.", dir=dest.parent)
    os.close(fd)
    with tarfile.open(tmp, "w:gz") as tar:
        for f in sorted(sweep_dir.rglob("*")):
            if (
                not f.is_symlink()
                and f.is_file()
                and not f.name.endswith(WEIGHT_SUFFIXES)
                and not f.name.startswith(".")
                and f.stat().st_size < 32 * 2**20
            ):
                name = str(Path(sweep_dir.name) / f.relative_to(sweep_dir))
                if not f.name.endswith(TEXT_SUFFIXES):
                    tar.add(f, arcname=name)
                    continue
                data = f.read_bytes().replace(prefix, b"")
                info = tar.gettarinfo(str(f), arcname=name)
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    os.chmod(tmp, 0o644)
    check_target(dest, "--archive")
    os.replace(tmp, dest)
    return dest


class DiskFull(SweepError):
    """The disk ran out: the row that hit it is recorded, the sweep stops (a resume after freeing space goes on)."""


def _is_disk_full(e: BaseException) -> bool:
    return (
        isinstance(e, OSError)
        and e.errno == errno.ENOSPC
        or "disk full" in str(e)
        or "No space left on device" in str(e)
    )


def _lock(base: Path):
    """An exclusive lock on ``base/.lock`` (released by the kernel when the holder dies, even by SIGKILL). A second
    sweep on the same directory stops in one line naming the holder."""
    try:
        return exclusive_lock(base / ".lock")
    except Busy as e:
        raise SweepError(f"{base} is being swept by {e}; fix: wait for it to finish, or use another --out") from None


@dataclass
class SweepOptions:
    """How a sweep runs its rows (:func:`run_sweep`)."""

    rerun: bool = False
    """Run every row again, recorded or not."""
    model: str = "auto"
    """Where each row's weights come from (:class:`tunelab.run.runner.RunOptions`)."""
    only: list[str] | None = None
    """Run these rows only (ids)."""
    timeout_s: float | None = None
    """Each row's time limit (None: the sweep file's)."""
    memory_limit_bytes: int | None = None
    """Each row's address-space cap."""
    stream: object = field(default_factory=lambda: sys.stderr)
    """Where progress and notes go (the process's stderr when the options are made)."""
    deadline_s: float | None = None
    """Seconds from now after which no row starts, and a running row is killed (status killed, reason
    'deadline'): for machines that grant commands a fixed time."""
    after_row: Callable[[Path], None] | None = None
    """Run after every row with the sweep directory (the runbook regenerates the report and the archive there, so a
    command killed later still returns what it measured)."""
    prune_checkpoints: bool = False
    """Delete a random-weight checkpoint once no row left needs it."""


def run_sweep(sweep: Sweep, out: Path | None = None, options: SweepOptions | None = None) -> Path:
    """Run every row not already recorded in ``out`` (resume); return the sweep directory. ``options``: how
    (:class:`SweepOptions`)."""
    o = options or SweepOptions()
    missing = sorted(set(o.only or ()) - {r.id for r in sweep.rows})
    if missing:  # before the sweep directory is made: a refused command leaves nothing behind
        raise SweepError(f"--only: no row(s) {missing} in {sweep.path}; fix: ids of its rows")
    base = sweep_dir_for(sweep, out)
    base.mkdir(parents=True, exist_ok=True)
    lock = _lock(base)  # one sweep per directory at a time; released on return, raise, or the process's death
    try:
        return _run_locked(sweep, base, o)
    except KeyboardInterrupt:  # between rows (a row's own interrupt is recorded by the row, see _run_locked)
        recorded = sum(1 for r in sweep.rows if row_done(base, r)[0])
        raise Interrupted(
            f"sweep {sweep.name} stopped between rows: {recorded} of {len(sweep.rows)} rows recorded "
            f"in {base}; run the same command again to go on"
        ) from None
    finally:
        lock.close()  # closing the file releases the flock


def _run_locked(sweep: Sweep, base: Path, o: SweepOptions) -> Path:
    """The sweep under its directory's lock: its description written, then each row not yet recorded, in order,
    until the rows, the deadline or the disk run out."""
    _write_meta(sweep, base, o)
    rows, todo = _rows_to_run(sweep, base, o)
    progress = ProgressLine(len(rows), o.stream)
    done = len(rows) - len(todo)
    if done:
        o.stream.write(f"resuming {sweep.name}: {done} of {len(rows)} rows already recorded in {base}\n")
    t_start = time.monotonic()
    for i, row in enumerate(todo):
        row_timeout = o.timeout_s or sweep.timeout_s
        if o.deadline_s is not None:
            left = o.deadline_s - (time.monotonic() - t_start)
            if left < 1:
                o.stream.write(
                    f"deadline reached: {len(todo) - i} row(s) not started "
                    f"({', '.join(r.id for r in todo[i:])}); run the same command again to go on\n"
                )
                break
            row_timeout = min(row_timeout or left, left)
        progress.started(done, f"{row.id} {row.recipe.key}")
        rec, disk_full = _run_row(sweep, base, o, row, row_timeout, progress, rows)
        if o.deadline_s is not None and rec.status == "killed" and row_timeout is not None:
            if time.monotonic() - t_start >= o.deadline_s - 1:
                rec.error = f"{DEADLINE_PREFIX} the command's time ran out during this row; it runs again on resume"
                record_mod.save(rec, base / row.id / "record.json")
        done += 1
        progress.finished(rec)
        if o.prune_checkpoints and o.model == "random":
            _prune_random_checkpoints(row, todo[i + 1 :], o.stream)
        if _after_row(base, o, disk_full):
            raise DiskFull(
                f"{row.id}: disk full; free space and run the same command again to go on "
                f"({len(todo) - i - 1} row(s) not started)"
            )
    return base


def _write_meta(sweep: Sweep, base: Path, o: SweepOptions) -> None:
    """``sweep.json``: what the directory sweeps (file, rows, weights' source); refused where the directory holds
    runs made with another ``--model`` (resuming them would mix two sources of weights)."""
    meta_path = base / "sweep.json"
    rows = [
        {
            "id": r.id,
            "recipe": r.recipe.key,
            "settings": r.settings,
            "lab": r.lab,
            "note": r.note,
            "strategy": r.strategy,
        }
        for r in sweep.rows
    ]
    meta = {
        "name": sweep.name,
        "file": str(sweep.path.relative_to(ROOT) if sweep.path.is_relative_to(ROOT) else sweep.path),
        "model": o.model,
        "description": sweep.description,
        "lab_hardware": sweep.lab_hardware,
        "rows": rows,
    }
    if meta_path.exists() and not o.rerun:
        try:
            old = read_json(meta_path, what="sweep index")
        except FileRefused as e:
            old = str(e).split("; fix:")[0]  # its own fix is not this one
        if not isinstance(old, dict):
            raise SweepError(
                f"{meta_path}: not a sweep index this command wrote ({str(old)[:200]}); fix: --rerun (rewrites it "
                "and runs every row again) or another --out"
            )
        if old.get("model") != o.model:
            raise SweepError(
                f"{base} holds runs made with --model {old.get('model')}, not {o.model}; fix: resume with the "
                "same choice, or use --rerun or another --out"
            )
    write_json_atomic(meta_path, meta)


def _rows_to_run(sweep: Sweep, base: Path, o: SweepOptions) -> tuple[list[Row], list[Row]]:
    """(the rows asked for, those of them to run): a row already recorded is skipped unless ``--rerun``; a stale or
    unreadable record is set aside, said in one line, and its row runs again."""
    rows = [r for r in sweep.rows if not o.only or r.id in o.only]
    todo = []
    for r in rows:
        done, why = (False, None) if o.rerun else row_done(base, r)
        if why:
            kept = set_aside(base / r.id / "record.json", why)
            o.stream.write(f"{r.id}: {why}: the old record is kept as {kept.name}; running the row again\n")
        if not done:
            todo.append(r)
    return rows, todo


def _run_row(sweep: Sweep, base: Path, o: SweepOptions, row: Row, row_timeout, progress, rows: list[Row]):
    """(the row's record, whether the disk is full): the run, or an error record where it was refused or failed
    before launch (saved where the disk allows); an interrupt ends the sweep in one line."""
    disk_full = False
    try:
        options = RunOptions(
            sweep=sweep.name,
            row_id=row.id,
            model=o.model,
            timeout_s=row_timeout,
            memory_limit_bytes=o.memory_limit_bytes,
            on_progress=progress.show,
            strategy=row.strategy,
            strategy_config=row.strategy_config,
            checked=row.checked,
        )
        rec = run(row.recipe, row.overrides(), base / row.id, options)
    except (Interrupted, KeyboardInterrupt):
        recorded = sum(1 for r in rows if row_done(base, r)[0])
        raise Interrupted(
            f"sweep {sweep.name} stopped during row {row.id}: {recorded} of {len(rows)} rows "
            f"recorded in {base}; run the same command again to go on (row {row.id} runs "
            "again)"
        ) from None
    except (RunError, OSError) as e:  # refused or failed before launch: still a row, with its reason
        disk_full = _is_disk_full(e)
        reason = f"{DISK_FULL_PREFIX}: {e}" if disk_full and not str(e).startswith(DISK_FULL_PREFIX) else str(e)
        rec = record_mod.RunRecord(
            sweep=sweep.name,
            row_id=row.id,
            recipe=row.recipe.key,
            command=row.recipe.command,
            overrides=row.overrides(),
            status="error",
            error=reason,
            method=row.recipe.method,
            started_at="",
            ended_at="",
            wall_s=0.0,
            strategy=row.strategy_label,
        )
        _save_if_possible(rec, base / row.id / "record.json")  # the disk full: the sweep stops after the row
    if rec.status == "error" and not disk_full and "No space left on device" in (rec.error or ""):
        disk_full = True  # the run itself hit the full disk (litgpt saving a checkpoint): the machine's fault
        rec.error = f"{DISK_FULL_PREFIX}: {rec.error}"
        _save_if_possible(rec, base / row.id / "record.json")
    return rec, disk_full


def _save_if_possible(rec, path: Path) -> None:
    """Save ``rec``; nothing where the disk cannot take it (the sweep stops for the full disk after the row)."""
    try:
        record_mod.save(rec, path)
    except OSError:
        pass


def _after_row(base: Path, o: SweepOptions, disk_full: bool) -> bool:
    """Run ``o.after_row`` (the runbook's report and archive); whether the disk is full (``disk_full``: the row
    found it so), which stops the sweep. Its other errors raise, unless the disk is already known to be full."""
    if o.after_row is None:
        return disk_full
    try:
        o.after_row(base)
    except OSError as e:
        if not (disk_full or _is_disk_full(e)):
            raise
        return True
    return disk_full


def _prune_random_checkpoints(row: Row, later: list[Row], stream) -> None:
    """Delete the random-weight checkpoint ``row`` used when no later row uses the same architecture."""

    def arch(r: Row) -> str:
        return Path(str(r.settings.get("checkpoint_dir") or r.recipe.get("checkpoint_dir") or "")).name

    name = arch(row)
    if not name or any(arch(r) == name for r in later):
        return
    try:
        from litgpt import Config  # a random-weight sweep has litgpt imported already

        target = checkpoints.default_dir(Config.from_name(name).name)
    except ValueError:
        return
    if target.is_dir():
        shutil.rmtree(target, ignore_errors=True)
        stream.write(f"removed the random-weight checkpoint {target.name} (no later row uses it)\n")
