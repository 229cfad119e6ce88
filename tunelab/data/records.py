"""Reading an Alpaca-format dataset, the one way tunelab does it (validation, the planner's ``--dataset``, the
tiny model's tokenizer): what ``litgpt.data.JSON`` accepts, checked before anything is built.

A dataset is a ``.json`` file holding a list of records, a ``.jsonl`` file with one record per line, or a
directory with ``train.json(l)`` and ``val.json(l)``. A record is a mapping with the text keys ``instruction`` and
``output`` (``input`` optional). Files are read through :func:`tunelab.files.read_bytes`: regular files only, at
most :data:`tunelab.files.DATASET_MAX_BYTES`; a bad one is :class:`~tunelab.errors.InputError`, one line naming the
file, the record and the fix.
"""

from __future__ import annotations

import functools
import os
import stat
from pathlib import Path

from tunelab import files
from tunelab.errors import InputError
from tunelab.paths import display_path

COUNT_MAX_BYTES = 256 * 2**20
"""Largest dataset file that validation reads to count and check its records (256 MiB); a larger one is left to
litgpt, and the checks that need its size say they were skipped."""
FIX = "fix: an Alpaca-format list of {instruction, input, output} records (.json), one per line (.jsonl), or a "
FIX += "directory with train.json and val.json"


def split_files(path: Path) -> list[Path]:
    """The files a dataset path stands for: itself (a regular file), or a directory's train and val files;
    InputError for anything else (a device, a FIFO, a directory without both splits)."""
    path = Path(path)
    try:
        mode = os.stat(path).st_mode
    except OSError as e:
        raise InputError(f"{path}: cannot be read ({e.strerror or e}); {FIX}") from None
    if stat.S_ISDIR(mode):
        found = []
        for split in ("train", "val"):
            match = [path / f"{split}{ext}" for ext in (".json", ".jsonl") if (path / f"{split}{ext}").is_file()]
            if not match:
                raise InputError(f"{path}: a dataset directory without {split}.json or {split}.jsonl; {FIX}")
            found.append(match[0])
        return found
    if not stat.S_ISREG(mode):
        raise InputError(f"{path}: is not a regular file (a device, FIFO or socket); {FIX}")
    if path.suffix not in (".json", ".jsonl"):
        raise InputError(f"{path}: litgpt reads .json or .jsonl files, not {path.suffix or 'a file without suffix'}")
    return [path]


def read(path: Path, limit: int = files.DATASET_MAX_BYTES) -> list[dict]:
    """The records of one dataset file, each checked; InputError naming the file and record otherwise."""
    path = Path(path)
    text = files.read_text(path, limit, "dataset")
    if path.suffix == ".jsonl":
        records = []
        for i, line in enumerate(text.splitlines(), 1):
            if line.strip():
                records.append(_parse(line, path, f"line {i}"))
    else:
        records = _parse(text, path, "the file")
        if not isinstance(records, list):
            raise InputError(f"{path}: holds a JSON {type(records).__name__}, not a list of records; {FIX}")
    if not records:
        raise InputError(f"{path}: holds no records; {FIX}")
    for i, r in enumerate(records):
        if not isinstance(r, dict):
            raise InputError(f"{path}: record {i}: a {type(r).__name__}, not a mapping; {FIX}")
        for key in ("instruction", "output", "input"):
            if (key in r and not isinstance(r[key], str)) or (key != "input" and key not in r):
                raise InputError(f"{path}: record {i}: {key!r} missing or not text; {FIX}")
    return records


def count(path: Path) -> tuple[int | None, str]:
    """(records before litgpt's validation split, where the figure comes from) of a dataset path: a file's records,
    or a directory's train file's (its val file is checked too); every file read and checked when each is at most
    :data:`COUNT_MAX_BYTES`, else (None, why); InputError for a dataset litgpt would refuse."""
    parts = split_files(path)
    return _count(tuple(str(p) for p in parts), tuple(_stamp(p) for p in parts))


def _stamp(path: Path) -> tuple[int, int]:
    st = os.stat(path)
    return st.st_mtime_ns, st.st_size


@functools.lru_cache(maxsize=16)
def _count(names: tuple[str, ...], stamps: tuple) -> tuple[int | None, str]:
    """Cached by the files' modification times and sizes: validation and the schedule ask for the same count."""
    counts, parts = [], [Path(n) for n in names]
    for part in parts:
        size = part.stat().st_size
        if size > COUNT_MAX_BYTES:
            return (
                None,
                f"{display_path(part)} has {size:,} bytes, more than is read to count records here ({COUNT_MAX_BYTES:,})",
            )
        counts.append(len(read(part, COUNT_MAX_BYTES)))
    return counts[0], f"{counts[0]:,} records of {display_path(parts[0])}"


def _parse(text: str, path: Path, where: str):
    return files.parse_json(text, f"{path}: {where}", FIX.removeprefix("fix: "))
