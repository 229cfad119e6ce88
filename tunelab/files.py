"""Every file tunelab writes goes through here: atomically (temporary file in the same directory, fsync, rename),
so that a reader, a crash or a full disk sees the old file or the new one, never half of one.

* :func:`write_text_atomic`, :func:`write_json_atomic`, :func:`write_csv` (rows with fixed columns),
  :func:`save_figure` (a matplotlib figure, written like the others);
* :func:`set_aside`: a stale or corrupt record renamed out of the way, kept, never deleted;
* :func:`exclusive_lock`: one holder of a directory at a time (flock: the kernel releases it when the holder dies).
"""

from __future__ import annotations

import csv
import io
import json
import os
import time
from pathlib import Path


def write_text_atomic(path: Path, text: str) -> Path:
    """Write ``text`` to ``path`` through a temp file in the same directory, fsync, then an atomic rename."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    return _replace_with(path, lambda f: f.write(text.encode("utf-8")))


def write_json_atomic(path: Path, data, indent: int | None = 2) -> Path:
    """Write JSON to ``path`` atomically (see :func:`write_text_atomic`)."""
    return write_text_atomic(path, json.dumps(data, indent=indent, default=str))


def write_csv(path: Path, rows: list[dict], columns: list[str] | None = None) -> Path:
    """Rows as a CSV file with ``columns`` in that order (default: the first row's keys); None is written empty."""
    columns = columns or list(rows[0])
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=columns, extrasaction="ignore")
    w.writeheader()
    for row in rows:
        w.writerow({k: ("" if row.get(k) is None else row.get(k)) for k in columns})
    return write_text_atomic(path, buf.getvalue())


def save_figure(fig, path: Path, dpi: int = 110) -> Path:
    """A matplotlib figure as PNG, atomically (a kill or a full disk leaves the previous plot whole)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    return _replace_with(path, lambda f: fig.savefig(f, format="png", dpi=dpi))


def _replace_with(path: Path, write) -> Path:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:  # a full disk, an interrupt: the old file stays whole and no temporary file is left
        tmp.unlink(missing_ok=True)
        raise
    return path


def set_aside(record_path: Path, why: str) -> Path:
    """Rename a stale or corrupt record out of the report's way, keeping it: ``record.json.<corrupt|stale>-<time>``
    (``why`` starting with 'unreadable' means corrupt)."""
    kind = "corrupt" if why.startswith("unreadable") else "stale"
    dest = record_path.with_name(f"{record_path.name}.{kind}-{time.strftime('%Y%m%d-%H%M%S')}")
    os.replace(record_path, dest)
    return dest


class Busy(Exception):
    """Another live process holds the lock; the message names it."""


def exclusive_lock(path: Path):
    """An open file holding an exclusive flock on ``path`` (close it to release; the kernel releases it when the
    holder dies, even by SIGKILL). :class:`Busy` naming the holder's pid when another process holds it."""
    import fcntl

    f = open(path, "a+")
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.seek(0)
        holder = f.read().strip() or "another process"
        f.close()
        raise Busy(holder) from None
    f.seek(0)
    f.truncate()
    f.write(f"pid {os.getpid()} since {time.strftime('%Y-%m-%d %H:%M:%S')}")
    f.flush()
    return f
