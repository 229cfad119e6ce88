"""Traces of litgpt's model kept across processes: what a trace on fake tensors or through torch.compile's own
graphs yields (sizes, kernel lists), as JSON under the cache directory (``paths.cache_dir()``), keyed by what made
it plus torch's and litgpt's versions. Nothing read there is executed; a file for another key, one that does not
read (a FIFO, a link, a partial write) or one that cannot be written is made again, in the process."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable


def cached_json(folder: str, key: list, make: Callable[[], object], what: str) -> object:
    """``make()``'s JSON value, kept under the cache directory's ``folder/`` for ``key`` (JSON-able; torch's and
    litgpt's versions are added to it): read back where a file for the same key is there, else made and written
    atomically. ``what`` names the file in a refusal."""
    import litgpt
    import torch

    from tunelab import files, paths
    from tunelab.errors import InputError

    full = json.dumps([*key, torch.__version__, getattr(litgpt, "__version__", "")], default=str)
    path = paths.cache_dir() / folder / (hashlib.sha256(full.encode()).hexdigest()[:32] + ".json")
    try:
        raw = json.loads(files.read_text(path, 64 << 20, what))
        if raw["key"] == full:
            return raw["value"]
    except (OSError, ValueError, KeyError, TypeError):
        pass
    value = make()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        files.write_text_atomic(path, json.dumps({"key": full, "value": value}))
    except (OSError, InputError):
        pass
    return value


def tuples(value):
    """``value`` with every list made a tuple (JSON keeps tuples as lists)."""
    if isinstance(value, list):
        return tuple(tuples(v) for v in value)
    if isinstance(value, dict):
        return {k: tuples(v) for k, v in value.items()}
    return value
