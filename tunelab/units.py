"""The units of the numbers tunelab prints and writes, and the one formatter of a figure that may be missing.

Every GB in tunelab's output is 1e9 bytes (:data:`GB`); GiB (2^30 bytes, :data:`GIB`) is always named as such.
Billions of parameters and GFLOPs divide by :data:`BILLION`. Tables, reports and the CLI format through
:func:`fmt` and :func:`gb`, so a missing value prints the same way everywhere."""

from __future__ import annotations

GB = 1e9
"""Bytes per GB (decimal, as GPU vendors and litgpt's "Memory Used" count)."""
GIB = 2**30
"""Bytes per GiB (binary, as nvidia-smi's MiB and the lab's sheets count)."""
BILLION = 1e9
"""A count in billions: parameters (B), FLOPs (GFLOPs)."""


def fmt(value, spec: str = ".2f", missing: str = "", scale: float = 1.0) -> str:
    """``value`` times ``scale`` formatted by ``spec`` (Python's format mini-language); ``missing`` when it is None."""
    return missing if value is None else format(value * scale, spec)


def figure(x: float) -> str:
    """Two decimals with thousands separators, or three significant figures below 1 (a short run's hours and dollars
    are not 0.00)."""
    return f"{x:,.2f}" if x >= 1 or x == 0 else f"{x:.3g}"


def duration(seconds: float) -> str:
    """Seconds as a person reads them: 0.26 s, 42 s, 12.5 min, 3.2 h, 2,380 days."""
    if seconds < 1:
        return f"{seconds:.2g} s"
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    if seconds < 72 * 3600:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:,.0f} days"


def energy(joules: float) -> str:
    """Joules as Wh, kWh or MWh."""
    wh = joules / 3600
    for unit, scale in (("Wh", 1.0), ("kWh", 1e3)):
        if wh < 1000 * scale:
            return f"{wh / scale:.3g} {unit}"
    mwh = wh / 1e6
    return f"{mwh:.3g} MWh" if mwh < 1000 else f"{mwh:,.0f} MWh"


def tokens(count: float, what: str = "tokens") -> str:
    """A token count as M or B ``what`` (e.g. "padded tokens")."""
    return f"{count / 1e6:.2f} M {what}" if count < 1e9 else f"{count / 1e9:,.2f} B {what}"


def size(nbytes: float) -> str:
    """Bytes as a person reads them, in steps of 1e3 (GB = 1e9 bytes): 0 B, 512 B, 3.4 MB, 13.5 GB, 1.2 TB."""
    for unit in ("B", "kB", "MB", "GB"):
        if abs(nbytes) < 999.5:
            return f"{nbytes:.3g} {unit}"
        nbytes /= 1e3
    return f"{nbytes:,.3g} TB" if abs(nbytes) < 999.5 else f"{nbytes:,.0f} TB"


def gb(nbytes, spec: str = ".2f", missing: str = "") -> str:
    """``nbytes`` in GB (1e9 bytes) formatted by ``spec``; ``missing`` when it is None."""
    return fmt(nbytes, spec, missing, 1 / GB)


def to_gb(nbytes, ndigits: int | None = None) -> float | None:
    """``nbytes`` as a number of GB (1e9 bytes), rounded to ``ndigits`` when given; None stays None (a CSV or JSON
    column named ``*_gb``)."""
    if nbytes is None:
        return None
    return nbytes / GB if ndigits is None else round(nbytes / GB, ndigits)
