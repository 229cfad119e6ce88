"""Every file tunelab reads back or writes goes through here.

Reading (:func:`read_bytes`, :func:`read_text`, :func:`read_json`): regular files only, opened non-blocking and
checked before a byte is read (a FIFO, a device or a directory is refused without blocking), and bounded (a file
over its limit is refused, never read whole); a refusal is :class:`FileRefused`, one line naming the file and the
fix. Writing (:func:`write_text_atomic`, :func:`write_json_atomic`, :func:`write_csv`, :func:`save_figure`): a
temporary file in the same directory, created exclusively and never through a link, fsynced and renamed, so a crash
or a full disk leaves the old file or the new one, never a torn one. docs/reliability.md."""

from __future__ import annotations

import csv
import errno
import fcntl
import io
import json
import os
import stat
import tempfile
import time
from pathlib import Path

from tunelab.errors import InputError
from tunelab.units import GIB

RECORD_MAX_BYTES = 16 * 2**20
"""Largest JSON index or record read back (16 MiB: a record is a few KiB, a rank file with every iteration's
timing of a long run a few MiB)."""
DATASET_MAX_BYTES = 2 * GIB
"""Largest dataset file read (2 GiB; the shipped one is 0.2 MiB, Alpaca 22 MiB)."""


class FileRefused(InputError):
    """A file that is not what it should be (not a regular file, too large, not text, a link in a write's way)."""


def kind(mode: int) -> str:
    """What a file of ``mode`` (``os.lstat``'s) is, in words: a directory, a FIFO, a device, a link, ..."""
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a FIFO (named pipe)"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISLNK(mode):
        return "a symbolic link"
    return "not a regular file"


def read_bytes(
    path: Path | str, limit: int = RECORD_MAX_BYTES, what: str = "file", shown: str | None = None, links: bool = True
) -> bytes:
    """The bytes of a regular file of at most ``limit`` bytes; :class:`FileRefused` (one line) otherwise.

    Opened with O_NONBLOCK, so a FIFO in the file's place is refused at once instead of waiting for a writer; with
    ``links=False`` a symbolic link in the file's place is refused too (O_NOFOLLOW: not followed, at no race)."""
    shown = shown or str(path)
    flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0) | (0 if links else getattr(os, "O_NOFOLLOW", 0))
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        raise FileRefused(f"{shown}: no such {what}; fix: give the path of an existing {what}") from None
    except IsADirectoryError:
        raise FileRefused(f"{shown}: is a directory, not a {what}; fix: give the {what} itself") from None
    except OSError as e:
        if not links and e.errno == errno.ELOOP:
            raise FileRefused(f"{shown}: is a symbolic link, not a {what}; fix: put the file itself there") from None
        raise FileRefused(
            f"{shown}: cannot be read ({e.strerror or e}); fix: check the path and its permissions"
        ) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise FileRefused(f"{shown}: is {kind(st.st_mode)}, not a {what}; fix: give a regular file")
        if st.st_size > limit:
            raise FileRefused(
                f"{shown}: {st.st_size:,} bytes is more than a {what} may have ({limit:,}); fix: give the right file"
            )
        os.set_blocking(fd, True)
        chunks, total = [], 0
        while True:  # bounded even if the file grows while it is read
            chunk = os.read(fd, min(1 << 20, limit + 1 - total))
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
            if total > limit:
                raise FileRefused(f"{shown}: more than {limit:,} bytes (it grew while read); fix: give the right file")
        return b"".join(chunks)
    except OSError as e:
        raise FileRefused(f"{shown}: cannot be read ({e.strerror or e}); fix: check the file") from None
    finally:
        os.close(fd)


def read_tail(path: Path | str, limit: int = 256 * 2**20) -> str:
    """The last ``limit`` bytes of a regular file as text (undecodable bytes replaced): a log, read however long it
    grew; '' when it is missing or not a regular file."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        return ""
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return ""
        os.set_blocking(fd, True)
        os.lseek(fd, max(0, st.st_size - limit), os.SEEK_SET)
        chunks, total = [], 0
        while total < limit and (chunk := os.read(fd, min(1 << 20, limit - total))):
            chunks.append(chunk)
            total += len(chunk)
        return b"".join(chunks).decode("utf-8", errors="replace")
    finally:
        os.close(fd)


def read_text(
    path: Path | str, limit: int = RECORD_MAX_BYTES, what: str = "file", shown: str | None = None, links: bool = True
) -> str:
    """:func:`read_bytes` decoded as UTF-8; :class:`FileRefused` for text that is not UTF-8."""
    shown = shown or str(path)
    try:
        return read_bytes(path, limit, what, shown, links).decode("utf-8")
    except UnicodeDecodeError:
        raise FileRefused(f"{shown}: not UTF-8 text, so not a {what}; fix: give the right file") from None


def read_json(
    path: Path | str,
    limit: int = RECORD_MAX_BYTES,
    what: str = "JSON file",
    shown: str | None = None,
    links: bool = True,
):
    """A JSON file's data (:func:`read_text`, ``links`` as there); :class:`FileRefused` naming the line when it is not
    valid JSON.

    ``NaN`` and ``Infinity`` parse (json.dumps writes them for a diverged loss); the callers check ranges."""
    shown = shown or str(path)
    return parse_json(read_text(path, limit, what, shown, links), shown, f"give a complete {what}")


def parse_json(text: str, shown: str, fix: str):
    """JSON text's data; :class:`FileRefused` naming ``shown`` and the line when it is not valid JSON."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise FileRefused(f"{shown}: not valid JSON ({e.msg}, line {e.lineno}); fix: {fix}") from None
    except RecursionError:
        raise FileRefused(f"{shown}: JSON nested too deeply; fix: {fix}") from None


def check_target(path: Path | str, what: str = "output") -> Path:
    """``path`` if a file may be written there: nothing there yet, or a regular file (not a link); else
    :class:`FileRefused` naming what is in the way. An empty path is refused too (it would mean the current
    directory)."""
    if str(path) == "":
        raise FileRefused(f"{what}: an empty path; fix: give a file name")
    path = Path(path)
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return path
    except OSError as e:
        raise FileRefused(f"{path}: cannot be checked ({e.strerror or e}); fix: give another {what}") from None
    if not stat.S_ISREG(st.st_mode):
        raise FileRefused(
            f"{path}: is {kind(st.st_mode)}; tunelab writes regular files only and never through links or "
            f"devices; fix: give another {what} path"
        )
    return path


def write_text_atomic(path: Path, text: str) -> Path:
    """Write ``text`` to ``path`` through a temp file in the same directory, fsync, then an atomic rename."""
    return _replace_with(Path(path), lambda f: f.write(text.encode("utf-8")))


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


def write_atomic(path: Path, write) -> Path:
    """``write(binary_file)`` into ``path`` atomically, never through a link or device (see :func:`write_text_atomic`):
    for writers that take a file object, such as ``torch.save``."""
    return _replace_with(Path(path), write)


def save_figure(fig, path: Path, dpi: int = 110) -> Path:
    """A matplotlib figure as PNG, atomically (a kill or a full disk leaves the previous plot whole), then closed
    (pyplot holds every figure it made until it is), written or not."""
    import matplotlib.pyplot as plt

    try:
        return _replace_with(Path(path), lambda f: fig.savefig(f, format="png", dpi=dpi))
    finally:
        plt.close(fig)


_CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)


def _replace_with(path: Path, write) -> Path:
    check_target(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.unlink(missing_ok=True)  # a temporary file a killed writer of this pid left (never followed: unlink)
    try:
        with os.fdopen(os.open(tmp, _CREATE, 0o644), "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        check_target(path)  # nothing slipped into the target's place meanwhile
        os.replace(tmp, path)
    except BaseException:  # a full disk, an interrupt: the old file stays whole and no temporary file is left
        tmp.unlink(missing_ok=True)
        raise
    return path


def open_output(path: Path, mode: str = "w"):
    """A text file opened for writing (``"w"``) or appending (``"a"``) that is a regular file or new, never a
    link, FIFO or device (:class:`FileRefused`): for logs written as they grow."""
    fd = _open_regular(path, os.O_WRONLY | (os.O_APPEND if mode == "a" else os.O_TRUNC), "output")
    return os.fdopen(fd, mode, newline="")


def _open_regular(path: Path, flags: int, what: str) -> int:
    """A descriptor of ``path`` opened with ``flags`` (created if missing), never through a link, refused
    (:class:`FileRefused`) unless it is a regular file; opened non-blocking, so a FIFO never waits."""
    check_target(path, what)
    extra = os.O_CREAT | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0) | os.O_NONBLOCK
    try:
        fd = os.open(path, flags | extra, 0o644)
    except OSError as e:
        raise FileRefused(f"{path}: the {what} cannot be opened ({e.strerror or e}); fix: give another path") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise FileRefused(f"{path}: the {what} is not a regular file; fix: remove what is there")
    os.set_blocking(fd, True)
    return fd


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
    holder dies, even by SIGKILL). :class:`Busy` naming the holder's pid when another process holds it;
    :class:`FileRefused` when ``path`` is a link, FIFO or device (it is never followed or truncated)."""
    f = os.fdopen(_open_regular(path, os.O_RDWR, "lock file"), "r+")
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.seek(0)
        holder = f.read(200).strip() or "another process"
        f.close()
        raise Busy(holder) from None
    f.seek(0)
    f.truncate()
    f.write(f"pid {os.getpid()} since {time.strftime('%Y-%m-%d %H:%M:%S')}")
    f.flush()
    return f


def unwritable(path: Path) -> str | None:
    """Why a file cannot be written at ``path`` (its directory is created if missing), or None; leaves nothing."""
    if str(path) == "":
        return "an empty path"
    path = Path(path)
    if path.is_dir():
        return "is a directory"
    try:
        check_target(path)
    except FileRefused as e:
        return str(e).split(": ", 1)[-1].split("; fix:")[0]
    blocker = next((q for q in path.parents if q.exists()), None)
    if blocker is not None and not blocker.is_dir():
        return f"{blocker} is a file, not a folder"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path.parent, prefix=f".{path.name}.probe."):
            pass
    except OSError as e:
        return f"cannot be written ({e.strerror or e})"
    return None


def unwritable_dir(folder: Path, names: tuple | list = ()) -> str | None:
    """Why files cannot be written into ``folder`` (a link or a file in its place, or one of ``names`` inside it that
    cannot be written: :func:`unwritable`), or None."""
    if folder.is_symlink() or (folder.exists() and not folder.is_dir()):
        return "is not a folder (tunelab never writes through links)"
    for name in names:
        if why := unwritable(folder / name):
            return f"{name} {why}"
    return None
