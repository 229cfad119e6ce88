"""Traces of litgpt's model kept across processes: what a trace on fake tensors or through torch.compile's own
graphs yields (sizes, kernel lists), as JSON under the cache directory (``paths.cache_dir()``), keyed by what made
it plus torch's and litgpt's versions, with a checksum of the value. Nothing read there is executed; a file for
another key (one swapped in from another entry), one that does not read (a FIFO, a symbolic link, a partial write, a
number that is not finite), one whose value does not match its checksum or its consumer's check (edited, poisoned)
or one that cannot be written is made again, in the process. A folder that is a link is neither read nor written
(the trace is made in the process). Two writers at once each write a whole file and rename it into place."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable

from tunelab import files, paths
from tunelab.errors import InputError


def cached_json(
    folder: str, key: list, make: Callable[[], object], what: str, valid: Callable[[object], bool] | None = None
) -> object:
    """``make()``'s JSON value, kept under the cache directory's ``folder/`` for ``key`` (JSON-able; torch's and
    litgpt's versions are added to it): read back where a file for the same key and checksum is there and
    ``valid(value)`` holds, else made and written atomically. ``what`` names the file in a refusal."""
    import litgpt
    import torch

    full = json.dumps([*key, torch.__version__, getattr(litgpt, "__version__", "")], default=str)
    where = paths.cache_dir() / folder
    if files.unwritable_dir(where):  # a link in the folder's place: the trace stays in this process
        return make()
    path = where / (hashlib.sha256(full.encode()).hexdigest()[:32] + ".json")
    try:
        raw = json.loads(files.read_text(path, 64 << 20, what, links=False), parse_constant=_not_finite)
        if raw["key"] == full and raw["sum"] == _digest(raw["value"]) and (valid is None or valid(raw["value"])):
            return raw["value"]
    except (OSError, ValueError, KeyError, TypeError, IndexError, AttributeError):
        pass
    value = make()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        files.write_text_atomic(path, json.dumps({"key": full, "sum": _digest(value), "value": value}))
    except (OSError, InputError):
        pass
    return value


def _digest(value) -> str:
    """The checksum of a JSON value (SHA-256 of its canonical text)."""
    return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()


def _not_finite(name: str):
    """A trace holds sizes and times, never NaN or Infinity: a file with one was not written here (ValueError)."""
    raise ValueError(f"{name} in a trace")


def tuples(value):
    """``value`` with every list made a tuple (JSON keeps tuples as lists)."""
    if isinstance(value, list):
        return tuple(tuples(v) for v in value)
    if isinstance(value, dict):
        return {k: tuples(v) for k, v in value.items()}
    return value
