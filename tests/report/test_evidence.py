"""The evidence manifest (reports/evidence.yaml): every archived measurement listed once, with what it holds, and
no measurement named in code by its date or folder."""

from __future__ import annotations

import ast
import re

import pytest

from tests.conftest import ROOT
from tunelab import hardware
from tunelab.errors import InputError
from tunelab.report import evidence

DATED = re.compile(r"\b20\d\d-[01]\d-[0-3]\d\b")


def test_every_entry_names_a_folder_and_files_that_are_there_on_a_known_gpu():
    entries = evidence.entries(ROOT)
    assert len(entries) >= 16
    for e in entries.values():
        assert (ROOT / e.where).is_dir(), e.id
        for what in e.holds:
            assert (ROOT / e.path(what)).is_file(), (e.id, what)
        assert e.device == "cpu" or hardware.lookup(e.device).name == e.device
        assert DATED.fullmatch(e.date) and e.software and e.used_for, e.id


def test_every_dated_report_folder_with_measurements_is_in_the_manifest():
    """A GPU report folder (its name ends in the device) holding records, a grid or a profile is an entry."""
    listed = {e.folder for e in evidence.entries(ROOT).values()}
    held = ("records.tgz", "profile-grid.jsonl", "profile.md")
    for folder in (ROOT / "reports").iterdir():
        gpu = folder.name.rsplit("-", 1)[-1] in ("h100", "h200") or "-h200-" in folder.name
        if DATED.match(folder.name) and gpu and any((folder / f).is_file() for f in held):
            assert folder.name in listed, folder.name


def test_no_date_and_no_dated_report_folder_in_the_package():
    found = [
        f"{path.relative_to(ROOT)}:{n}"
        for path in (ROOT / "tunelab").rglob("*.py")
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if DATED.search(line)
    ]
    assert not found, found


def test_the_tables_read_what_the_manifest_lists(tmp_path):
    """A new entry is read by the tables of its role, in the manifest's order; a bad entry is one line."""
    (tmp_path / "reports").mkdir()
    manifest = tmp_path / evidence.MANIFEST
    manifest.write_text(
        "b:\n  folder: f2\n  device: H200\n  date: 2027-01-02\n  software: torch\n  roles: [memory]\n"
        "  holds: {records: records.tgz, grid QLoRA: g.jsonl}\n"
        "a:\n  folder: f1\n  device: H100-SXM\n  date: 2027-01-01\n  software: torch\n  roles: [bench, memory]\n"
    )
    assert [e.id for e in evidence.with_role("memory", tmp_path)] == ["b", "a"]
    assert [e.id for e in evidence.with_role("bench", tmp_path)] == ["a"]
    assert [(e.id, what, label) for e, what, label in evidence.grids(tmp_path)] == [
        ("b", "grid QLoRA", "2027-01-02, QLoRA")
    ]
    assert evidence.path("b", "records", tmp_path) == "reports/f2/records.tgz"
    manifest.write_text(
        manifest.read_text() + "  fitted: [[m, full, 8]]\nc:\n  folder: f3\n  device: H200\n"
        "  date: 2027-01-03\n  software: torch\n  fitted: [[n, lora, 4]]\n"
    )
    evidence.entries.cache_clear()
    assert evidence.fitted_shapes("H200", tmp_path) == {("n", "lora", 4)}
    assert evidence.fitted_shapes("H100-SXM", tmp_path) == {("m", "full", 8)}
    with pytest.raises(KeyError, match="holds no 'rows'"):
        evidence.path("b", "rows", tmp_path)
    bad_entries = (
        ("../out", ""),
        ("f", "  roles: [everything]\n"),
        ("f", "  colour: red\n"),
        ("f", "  notes: {grid: x}\n"),
        ("f", "  fitted: [tiny]\n"),
        ("f", "  fitted: [[tiny, full, eight]]\n"),
    )
    for folder, bad in bad_entries:
        evidence.entries.cache_clear()
        manifest.write_text(f"c:\n  folder: {folder}\n  device: H200\n  date: 2027-01-01\n  software: torch\n{bad}")
        with pytest.raises(InputError, match=r"reports/evidence.yaml: c: "):
            evidence.entries(tmp_path)
    evidence.entries.cache_clear()


def test_a_bad_manifest_is_one_line_naming_it(tmp_path):
    """Wrong types, a FIFO or a link where the manifest is, an entry or a file it lacks: one line naming the manifest
    and the fix, never a traceback."""
    import os

    (tmp_path / "reports").mkdir()
    manifest = tmp_path / evidence.MANIFEST
    base = "c:\n  folder: f\n  device: H200\n  date: 2027-01-01\n  software: torch\n"
    for bad in ("  holds: [records.tgz]\n", "  roles: memory\n", "  holds: {records: ../x.tgz}\n"):
        evidence.entries.cache_clear()
        manifest.write_text(base + bad)
        with pytest.raises(InputError, match=r"reports/evidence.yaml: c: .*"):
            evidence.entries(tmp_path)
    for odd in ("fifo", "link"):
        evidence.entries.cache_clear()
        manifest.unlink()
        if odd == "fifo":
            os.mkfifo(manifest)
        else:
            (tmp_path / "outside.yaml").write_text(base)
            manifest.symlink_to(tmp_path / "outside.yaml")
        with pytest.raises(InputError):
            evidence.entries(tmp_path)
    evidence.entries.cache_clear()
    manifest.unlink()
    manifest.write_text(base)
    for call in (lambda: evidence.entry("nope", tmp_path), lambda: evidence.path("c", "rows", tmp_path)):
        with pytest.raises(InputError, match="fix:") as e:
            call()
        assert "\n" not in str(e.value) and not str(e.value).startswith("'")
    evidence.entries.cache_clear()


def test_a_new_steps_entry_is_a_section_of_runtime_md_without_python(tmp_path):
    """A measurement of litgpt's steps added to the manifest (role ``steps``, a title, a note) and its archive are
    read and given their own section, titled and noted from the manifest; a steps entry without a title is one line.
    (Here the second machine's archive again, under a new name.)"""
    import shutil

    from tunelab.report import runtime_accuracy

    (tmp_path / "reports" / "new").mkdir(parents=True)
    shutil.copy(ROOT / evidence.path("h200-part1", "records"), tmp_path / "reports" / "new" / "records.tgz")
    manifest = tmp_path / evidence.MANIFEST
    entry = "x:\n  folder: new\n  device: H200\n  date: 2027-01-01\n  software: torch 9\n  roles: [steps]\n"
    manifest.write_text(entry + "  holds: {records: records.tgz}\n  title: Once more\n  note: Noted here.\n")
    try:
        assert [e.id for e in evidence.with_role("steps", tmp_path)] == ["x"]
        rows = runtime_accuracy.steps_rows(tmp_path, "x")
        assert [r["id"] for r in rows] == ["s1", "s2", "s3", "s4", "s5", "s10"]
        assert [r["measured_s"] for r in rows] == [
            r["measured_s"] for r in runtime_accuracy.steps_rows(ROOT, "h200-part1")
        ]
        md = "\n".join(runtime_accuracy._md_steps(evidence.entry("x", tmp_path), rows, []))
        assert md.startswith("\n## Once more (H200, 2027-01-01), out of sample\n\ntorch 9;")
        assert "Noted here." in md and "`reports/new/records.tgz`" in md and "| s10 | tiny-llama-1.1b/lora |" in md
        assert "H100 machine: measured s" not in md  # no H100 row of the same id given: the column is left out
        unprobed = [{**r, "host_op_us": None, "device_op_us": None} for r in rows]  # a column empty in every row
        header = runtime_accuracy._md_steps(evidence.entry("x", tmp_path), unprobed, [])[5]
        assert "| SM MHz |" in header and "host_op_us" not in header and "device_op_us" not in header
        evidence.entries.cache_clear()
        manifest.write_text(entry)
        with pytest.raises(InputError, match="reports/evidence.yaml: x: a steps entry needs a title"):
            evidence.entries(tmp_path)
    finally:
        evidence.entries.cache_clear()


def test_a_grids_reading_is_the_manifests_words_in_its_kernels_section():
    """What a kernel grid's table shows, in words, is data (``notes`` keyed by the file it holds), printed under
    that grid's table in kernels.md: a new grid brings its own words, no Python."""
    from tunelab.report import runtime_accuracy

    words = evidence.entry("h200-grid-qlora", ROOT).notes["grid QLoRA"]
    assert words.startswith("QLoRA against LoRA on one machine")
    lines = runtime_accuracy._grid_lines(ROOT, ("h200-grid-qlora", "grid QLoRA"), "H200", "2026-11-27, QLoRA")
    assert any(words in line for line in lines)


def test_the_published_multinode_table_is_data_read_in_one_checked_place(tmp_path):
    """The FSDP study's multi-node rows are a data file (configs/published/), not constants in code: the report's
    rows are its rows; a file with a key missing, a row that is not numbers or a link in its place is one line."""
    import os

    from tunelab.report import accuracy

    study = accuracy.multinode_study(ROOT)
    assert study.gpu == "V100-16GB" and [r[0] for r in study.rows] == [4, 8, 16]
    rows = accuracy.multinode_rows()
    assert [(r["gpus"], r["study_step_s"]) for r in rows] == [(n, s) for n, _, s in study.rows]
    where = tmp_path / accuracy.MULTINODE_TABLE
    where.parent.mkdir(parents=True)
    text = (ROOT / accuracy.MULTINODE_TABLE).read_text()
    bad_texts = (
        text.replace("param_bytes: 2\n", ""),
        text.replace("params_b: 4.4", "params_b: many"),
        text.replace("params_b: 4.4", "params_b: .nan"),
        text.replace("iteration_ms: 15717", "iteration_ms: .inf"),
        text.replace("tokens_per_gpu: 2048", "tokens_per_gpu: .inf"),
    )
    for bad in bad_texts:
        where.write_text(bad)
        with pytest.raises(InputError, match=r"configs/published/fsdp-multinode.yaml: .*fix:") as e:
            accuracy.multinode_study(tmp_path)
        assert "\n" not in str(e.value)
    where.unlink()
    os.mkfifo(where)  # a FIFO in its place: refused, never waited on
    with pytest.raises(InputError, match="FIFO"):
        accuracy.multinode_study(tmp_path)
    where.unlink()
    (tmp_path / "outside.yaml").write_text(text)
    os.symlink(tmp_path / "outside.yaml", where)
    with pytest.raises(InputError):
        accuracy.multinode_study(tmp_path)


FITTED = re.compile(r"\b([Ff]itted (on|with|by)|[Mm]easured (on|by|in)|[Cc]hosen on)\b|\(fitted\b")
"""What a docstring of the model's constants says when the constant comes from a measurement."""


def _documented_constants(path) -> list[tuple[str, str]]:
    """(name, docstring) of each module-level constant of ``path`` with a docstring under it."""
    body = ast.parse(path.read_text(encoding="utf-8")).body
    out = []
    for node, doc in zip(body, body[1:]):
        target = node.targets[0] if isinstance(node, ast.Assign) else getattr(node, "target", None)
        text = doc.value.value if isinstance(doc, ast.Expr) and isinstance(doc.value, ast.Constant) else None
        if isinstance(target, ast.Name) and isinstance(text, str):
            out.append((target.id, text))
    return out


def test_every_fitted_constant_of_the_model_names_its_evidence():
    """A constant of the plan's model fitted or measured names where: an entry of the evidence manifest (``id``)
    or a published table under configs/; a figure cited from elsewhere says it is not ours ("not measured by
    us"). The reports recompute each fit; the docstring says which archive to look in."""
    ids = set(evidence.entries(ROOT))
    missing = []
    for path in sorted((ROOT / "tunelab" / "plan" / "model").rglob("*.py")):
        for name, text in _documented_constants(path):
            if not FITTED.search(text) or "not measured by us" in text.lower():
                continue
            tables = [p for p in re.findall(r"configs/[\w/.-]+\.yaml", text) if (ROOT / p).is_file()]
            if not (ids & set(re.findall(r"``([a-z0-9-]+)``", text)) or tables):
                missing.append(f"{path.relative_to(ROOT)}: {name}")
    assert not missing, missing


def test_a_positive_figure_is_a_finite_number_above_0():
    """Counts, times and sizes read from the manifest, published tables and archived JSON (which parses NaN and
    Infinity): a finite number above 0, never a bool; ``whole``: an int of 1 or more."""
    assert evidence.positive(0.5) and evidence.positive(3) and evidence.positive(2, whole=True)
    for bad in (0, -1, float("inf"), float("nan"), True, "3", None):
        assert not evidence.positive(bad), bad
    assert not evidence.positive(2.0, whole=True)
