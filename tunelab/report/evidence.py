"""The archived GPU measurements (``reports/evidence.yaml``): one entry per report folder, with its device, date,
software, what it holds and what the planner fits on it or holds it to. The accuracy reports read every folder
through here, so a new measurement is an entry and a folder, not code."""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field, fields
from pathlib import Path

from tunelab import files, yaml_input
from tunelab.errors import InputError
from tunelab.paths import ROOT

MANIFEST = "reports/evidence.yaml"
"""The manifest, relative to the checkout."""
ROLES = ("memory", "bench", "steps")
"""What an entry's ``roles`` may name: ``memory`` (accuracy.md's own rows), ``bench`` (runtime.md's benches),
``steps`` (runtime.md's litgpt runs held to the plan out of sample, one section each, headed by its ``title``)."""


@dataclass(frozen=True)
class Entry:
    """One archived measurement (a folder under reports/)."""

    id: str
    """Its key in the manifest, which code and reports name it by."""
    folder: str
    """The folder under reports/."""
    device: str
    """The GPU table row it ran on; ``cpu`` for host work measured on a CPU (in ops of the plain loop)."""
    date: str
    """The day it was measured."""
    software: str
    """The stack that ran it (torch, litgpt, ...)."""
    holds: dict = field(default_factory=dict)
    """{what: file name}: the files of the folder that are read (records, rows, profile, grid, ...)."""
    used_for: str = ""
    """What the planner fits on it or holds it to, and where that is shown."""
    machine: str | None = None
    """Which lent machine of that device, where known (hosts differ between machines)."""
    roles: tuple = ()
    """Which accuracy tables read it (:data:`ROLES`)."""
    title: str = ""
    """The heading of its own section, where a table gives it one (``steps``)."""
    note: str = ""
    """What a reader needs beside its table: how it was run, what stands out in it."""
    notes: dict = field(default_factory=dict)
    """{what it holds: what the table made of that file shows, in words} (a kernel grid's reading)."""
    fitted: frozenset = frozenset()
    """(model, method, micro) of a grid's lines a constant was fitted on (:func:`fitted_shapes`)."""

    def path(self, what: str) -> str:
        """The file it holds as ``what``, relative to the checkout (``reports/<folder>/<file>``)."""
        if what not in self.holds:
            raise EvidenceMissing(
                f"{MANIFEST}: {self.id} holds no {what!r} (it holds {', '.join(self.holds)}); fix: add it"
            )
        return f"reports/{self.folder}/{self.holds[what]}"

    @property
    def where(self) -> str:
        """Its folder, as reports cite it."""
        return f"reports/{self.folder}/"


@functools.cache
def entries(root: Path = ROOT) -> dict[str, Entry]:
    """Every entry of ``root``'s manifest, in its order; empty where the checkout has none (an installed tunelab
    carries no reports). A key the schema does not know, a missing one or a folder outside reports/: InputError."""
    path = root / MANIFEST
    if not path.exists() and not path.is_symlink():
        return {}  # what is there but is no regular file (a FIFO, a link) is refused by the reader
    raw = yaml_input.loads(files.read_text(path, yaml_input.MAX_BYTES, "the evidence manifest", links=False), MANIFEST)
    if not isinstance(raw, dict):
        raise InputError(f"{MANIFEST}: a mapping of entries (name: folder, device, ...); fix: restore it")
    known = {f.name for f in fields(Entry)} - {"id"}
    out = {}
    for key, value in raw.items():
        if not isinstance(value, dict) or set(value) - known or {"folder", "device", "date", "software"} - set(value):
            raise InputError(
                f"{MANIFEST}: {key}: not an entry; fix: give folder, device, date and software, keys of {sorted(known)}"
            )
        folder = str(value["folder"])
        if "/" in folder or folder.startswith("."):
            raise InputError(
                f"{MANIFEST}: {key}: folder {folder[:60]!r} is not a name; fix: one folder name under reports/"
            )
        if not isinstance(value.get("holds") or {}, dict):
            raise InputError(
                f"{MANIFEST}: {key}: holds: not a mapping; fix: map what to a file name, e.g. {{records: records.tgz}}"
            )
        holds = {str(k): str(v) for k, v in (value.get("holds") or {}).items()}
        if any("/" in v or v.startswith(".") for v in holds.values()):
            raise InputError(f"{MANIFEST}: {key}: holds a path; fix: name files of the entry's own folder only")
        roles = value.get("roles") or []
        if not isinstance(roles, list) or set(map(str, roles)) - set(ROLES):
            raise InputError(
                f"{MANIFEST}: {key}: roles: {str(roles)[:60]} is not a list of roles; fix: each one of {', '.join(ROLES)}"
            )
        notes = value.get("notes") or {}
        if not isinstance(notes, dict) or set(map(str, notes)) - set(holds):
            raise InputError(f"{MANIFEST}: {key}: notes: a mapping of what it holds to words; fix: name a holds key")
        fitted = value.get("fitted") or []
        if not isinstance(fitted, list) or not all(
            isinstance(f, list) and len(f) == 3 and positive(f[2], whole=True) for f in fitted
        ):
            raise InputError(f"{MANIFEST}: {key}: fitted: a list of [model, method, micro]; fix: write it so")
        if "steps" in roles and not value.get("title"):
            raise InputError(f"{MANIFEST}: {key}: a steps entry needs a title (its section's heading); fix: add one")
        out[str(key)] = Entry(
            str(key),
            folder,
            str(value["device"]),
            str(value["date"]),
            str(value["software"]),
            holds,
            str(value.get("used_for", "")),
            value.get("machine"),
            tuple(map(str, roles)),
            str(value.get("title", "")),
            " ".join(str(value.get("note", "")).split()),
            {str(k): " ".join(str(v).split()) for k, v in notes.items()},
            frozenset((str(m), str(method), int(micro)) for m, method, micro in fitted),
        )
    return out


def positive(value, whole: bool = False) -> bool:
    """Whether ``value`` is a finite number above 0 (``whole``: a whole number of 1 or more), never a bool: what a
    count, a time or a size in a manifest entry, a published table or an archived result (JSON parses Infinity) must
    be."""
    kinds = int if whole else int | float
    return isinstance(value, kinds) and not isinstance(value, bool) and 0 < value < math.inf


class EvidenceMissing(InputError, KeyError):
    """An entry, or a file of one, that the manifest lacks (one line: the manifest, the name, the fix)."""

    def __str__(self) -> str:
        return str(self.args[0])


def entry(key: str, root: Path = ROOT) -> Entry:
    """The manifest's entry ``key``; :class:`EvidenceMissing` naming the manifest for one it lacks."""
    try:
        return entries(root)[key]
    except KeyError:
        raise EvidenceMissing(f"{MANIFEST}: no entry {key!r}; fix: restore it (git checkout -- {MANIFEST})") from None


def path(key: str, what: str, root: Path = ROOT) -> str:
    """The file entry ``key`` holds as ``what``, relative to the checkout."""
    return entry(key, root).path(what)


def with_role(role: str, root: Path = ROOT) -> list[Entry]:
    """The entries a table of ``role`` (:data:`ROLES`) reads, in the manifest's order."""
    return [e for e in entries(root).values() if role in e.roles]


def grids(root: Path = ROOT) -> list[tuple[Entry, str, str]]:
    """(entry, what, label) of every kernel grid in the manifest, in its order: ``what`` a ``holds`` key ``grid`` or
    ``grid <kind>``, ``label`` the entry's date and that kind."""
    return [
        (e, what, e.date + (f", {what.split(' ', 1)[1]}" if " " in what else ""))
        for e in entries(root).values()
        for what in e.holds
        if what == "grid" or what.startswith("grid ")
    ]


def fitted_shapes(device: str, root: Path = ROOT) -> set:
    """(model, method, micro) of every grid line on ``device`` that a constant was fitted on, over every entry of
    that device (a shape measured again by op on one machine counts as fitted on the device's grids)."""
    return {shape for e in entries(root).values() if e.device == device for shape in e.fitted}


PUBLISHED = "configs/published"
"""Published tables (the literature's, litgpt's), one YAML data file each, relative to the checkout."""


def published(name: str, keys: tuple, row_keys: tuple, root: Path = ROOT) -> tuple[dict, list[dict]]:
    """(the table's own ``keys``, its rows) of ``configs/published/<name>.yaml``, read bounded, never through a
    link; a missing key or a row whose keys are not ``row_keys``: one line naming the file and the fix."""
    where = f"{PUBLISHED}/{name}.yaml"
    raw = yaml_input.loads(files.read_text(root / where, yaml_input.MAX_BYTES, "published table", links=False), where)
    fix = f"fix: restore it (git checkout -- {where})"
    if not isinstance(raw, dict) or set(raw) != {*keys, "rows"}:
        raise InputError(f"{where}: needs exactly {', '.join((*keys, 'rows'))}; {fix}")
    rows = raw["rows"]
    if not isinstance(rows, list) or not rows or any(not isinstance(r, dict) or set(r) != set(row_keys) for r in rows):
        raise InputError(f"{where}: rows: a list of {{{', '.join(row_keys)}}}; {fix}")
    for n, values in [(None, raw), *enumerate(rows)]:
        for k, v in values.items():
            if isinstance(v, float) and not math.isfinite(v):
                raise InputError(f"{where}: {'' if n is None else f'rows[{n}].'}{k}: {v} is not a number; {fix}")
    return {k: raw[k] for k in keys}, rows
