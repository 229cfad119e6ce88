"""What the parent hands every rank of tunelab's loop (``handoff.json`` in the run folder): the method, litgpt's
arguments as the parent resolved and checked them once, and the strategy file's keys. Each rank loads them instead of
parsing the recipe again, so every rank trains exactly what was validated, planned and recorded. Plain JSON; a path
travels as ``{"path": "..."}`` and comes back a ``Path``."""

from __future__ import annotations

from pathlib import Path

from tunelab.files import read_json, write_json_atomic
from tunelab.strategies import StrategyConfig, strategy_from_mapping

NAME = "handoff.json"
"""The file's name in the run folder."""
MAX_BYTES = 1 << 20
"""The largest hand-off file a rank reads."""
METHODS = ("full", "lora")
"""The loop's methods (QLoRA never runs under a strategy file)."""


def _tagged(value, where: str):
    """``value`` as plain JSON, a ``Path`` tagged; ValueError naming ``where`` for anything else."""
    if isinstance(value, Path):
        return {"path": str(value)}
    if isinstance(value, dict):
        if "path" in value and len(value) == 1:
            raise ValueError(f"{where}: a mapping with the single key 'path' would read back as a path")
        return {str(k): _tagged(v, f"{where}.{k}") for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_tagged(v, f"{where}[{i}]") for i, v in enumerate(value)]
    if value is None or isinstance(value, bool | int | float | str):
        return value
    raise ValueError(f"{where}: a {type(value).__name__} cannot be handed to the ranks as JSON")


def _untagged(value):
    """The inverse of :func:`_tagged`."""
    if isinstance(value, dict):
        if set(value) == {"path"} and isinstance(value["path"], str):
            return Path(value["path"])
        return {k: _untagged(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_untagged(v) for v in value]
    return value


def write(run_dir: Path, method: str, args: dict, strategy: StrategyConfig) -> Path:
    """Write the hand-off into ``run_dir`` (atomically) and return its path."""
    data = {"method": method, "args": _tagged(args, "args"), "strategy": strategy.settings()}
    return write_json_atomic(Path(run_dir) / NAME, data)


def read(path: str | Path) -> tuple[str, dict, StrategyConfig]:
    """(method, litgpt's resolved arguments, the strategy) from a hand-off file; ValueError naming what is wrong."""
    data = read_json(Path(path), MAX_BYTES, what="hand-off file")
    if not isinstance(data, dict) or set(data) != {"method", "args", "strategy"}:
        raise ValueError(f"{path}: a hand-off holds exactly method, args and strategy")
    if data["method"] not in METHODS or not isinstance(data["args"], dict):
        raise ValueError(f"{path}: method must be one of {METHODS} and args a mapping")
    return data["method"], _untagged(data["args"]), strategy_from_mapping(data["strategy"], path)
