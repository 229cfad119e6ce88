"""Resume: whether a run record already answers a run (a sweep row, a tune-batch probe), so the run is skipped.

A record answers a run when it is readable, was made with the run's recipe, overrides and strategy, and was not cut
short by the command itself (a ``--deadline``, Ctrl-C or SIGTERM, a full disk: those rows run again). A record
that is unreadable or was made with other settings is kept aside (:func:`tunelab.files.set_aside`) by the caller.
"""

from __future__ import annotations

import os
from pathlib import Path

from tunelab.files import read_json
from tunelab.record import ALLOC_CONF_ENV
from tunelab.run.gpu_monitor import this_device
from tunelab.strategies import load_strategy

INTERRUPTED_PREFIX = "interrupted:"
"""Start of the error of a run stopped by Ctrl-C or SIGTERM."""
DEADLINE_PREFIX = "deadline:"
"""Start of the error of a run killed because the command's ``--deadline`` ran out."""
DISK_FULL_PREFIX = "disk full"
"""Start of the error of a run that hit a full disk (the machine's fault, not the run's)."""
RERUN_PREFIXES = (DEADLINE_PREFIX, INTERRUPTED_PREFIX)
"""Killed runs whose error starts so were cut short by the command, not by themselves: they run again."""


def same_overrides(recorded: list, wanted: list[str]) -> bool:
    """Whether a record's overrides are the run's (a random-weight run appends its benchmark data path)."""
    recorded = [str(x) for x in recorded or []]
    extra = recorded[len(wanted) :]
    return recorded[: len(wanted)] == wanted and (not extra or (len(extra) == 2 and extra[0] == "--data.json_path"))


def strategy_label(strategy: str | None) -> str:
    """What a record says of a strategy file or name (its description), or 'litgpt' for litgpt's own command."""
    return load_strategy(strategy).describe() if strategy else "litgpt"


def strategy_settings(strategy: str | None) -> dict | None:
    """Every key of a strategy file or name as a record keeps it (``StrategyConfig.settings``), None for litgpt's
    own command."""
    return load_strategy(strategy).settings() if strategy else None


def settings_changed(recorded: dict | None, wanted: dict | None) -> str | None:
    """The strategy keys that differ between a record and the run, in words (None: the same, or a record made before
    records kept them, which is judged by its description alone)."""
    if recorded is None or wanted is None:
        return None
    keys = sorted(k for k in set(recorded) | set(wanted) if recorded.get(k) != wanted.get(k))
    return ", ".join(f"{k}: {recorded.get(k)!r} -> {wanted.get(k)!r}" for k in keys) or None


def resume_state(
    record_path: Path,
    recipe: str | None = None,
    overrides: list[str] | None = None,
    strategy: str | None = None,
    settings: dict | None = None,
) -> tuple[bool, str | None]:
    """(done, why not) for a run whose record would be ``record_path``. Done: a readable record, not cut short by
    the command, made on this machine's device (a record from an H100 carried to an H200 is run again), with ``recipe``, ``overrides``, ``strategy`` (a label, see :func:`strategy_label`) and the
    strategy's ``settings`` (:func:`strategy_settings`) when they are given. Not done with a reason: the record is
    corrupt or stale (the caller keeps it aside and runs again)."""
    if not record_path.is_file():
        return False, None
    try:
        rec = read_json(record_path, what="run record")
        if not isinstance(rec, dict) or "status" not in rec:
            raise ValueError("not a run record")
    except (OSError, ValueError) as e:
        return False, f"unreadable record ({str(e)[:80]})"
    if rec.get("status") == "killed" and str(rec.get("error") or "").startswith(RERUN_PREFIXES):
        return False, None
    if rec.get("status") == "error" and str(rec.get("error") or "").startswith(DISK_FULL_PREFIX):
        return False, None  # the machine's fault, not the row's: it runs again once there is space
    here = this_device()
    if rec.get("device_name") and rec["device_name"] != here:  # a record from another GPU answers nothing here
        return False, f"device changed ({rec['device_name']} -> {here})"
    alloc = os.environ.get(ALLOC_CONF_ENV) or None
    if (rec.get("allocator_conf") or None) != alloc:  # the allocator's setting changes the step and the reserve
        return False, f"allocator setting changed ({rec.get('allocator_conf')} -> {alloc})"
    compiled = (rec.get("strategy_settings") or {}).get("compile")
    if compiled and "recompile_limit_hits" not in rec:  # its blocks may have run eagerly unseen (an older loop)
        return False, "made before torch.compile's recompile-limit hits were counted"
    if recipe is not None and rec.get("recipe") != recipe:
        return False, f"recipe changed ({rec.get('recipe')} -> {recipe})"
    if overrides is not None and not same_overrides(rec.get("overrides"), overrides):
        return False, (
            f"settings changed ({' '.join(map(str, rec.get('overrides') or [])) or 'none'} -> "
            f"{' '.join(overrides) or 'none'})"
        )
    if strategy is not None and (rec.get("strategy") or "litgpt") != strategy:
        return False, f"strategy changed ({rec.get('strategy')} -> {strategy})"
    changed = settings_changed(rec.get("strategy_settings"), settings)
    if changed:
        return False, f"strategy file changed ({changed})"
    return True, None
