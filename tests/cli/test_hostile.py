"""The project's own hostile suite: generated bad values for each option of the subcommands a user types first (and
for each key of the tables a user edits), each refused in one line with a non-zero exit: no traceback, no
"unexpected" line, no process left behind, nothing written beside the checkout or into its output folders.

Property-based (hypothesis), seeded (``derandomize``): a failure prints the generated argument list and reproduces.
The commands run in-process through ``tunelab.cli.main`` (the same code as the console script, without a Python
start per case), so a few hundred cases take about a minute. ``test_bad_inputs.py`` keeps the hand-made cases
that need files (FIFOs, tags, alias bombs) and real subprocesses."""

from __future__ import annotations

import math
import os
import subprocess

import psutil
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from tests.conftest import ROOT, beside_checkout, tunelab_here

R, M = "tiny-llama-1.1b/lora", "tiny-llama-1.1b"
SETTINGS = settings(
    derandomize=True, deadline=None, database=None, max_examples=100, suppress_health_check=list(HealthCheck)
)
TRIED: dict[str, int] = {}
"""Generated cases run per test (the closing note quotes the total)."""

# values no integer option takes: text, fractions, non-finite and out-of-range numbers, empty and blank strings
NOT_INT = st.one_of(
    st.sampled_from(["", " ", "ten", "1.5", "1e400", "nan", "inf", "-inf", "0x10", "--", "½", "1,2"]),
    st.integers(max_value=0).map(str),
    st.integers(min_value=10**13, max_value=10**40).map(str),
    st.text(alphabet="abcxyz!@#%^&*()[]{}<>?/\\|;:'\" \t", min_size=1, max_size=12),
)
NOT_POSITIVE = st.one_of(
    st.sampled_from(["", "nan", "inf", "-inf", "1e400", "-1e400", "zero", "0", "-0.0"]),
    st.floats(max_value=0, allow_nan=False).map(repr),
    st.text(alphabet="abc!@# ", min_size=1, max_size=10),
)
# names no table has: unknown words, paths out of the checkout, control and odd characters, very long names
NOT_A_NAME = st.one_of(
    st.sampled_from(["", "../../etc/passwd", "/dev/zero", "nul\x01", "x" * 5000, "ü-gpu", "*", ".", "-"]),
    st.text(alphabet="qwzjk-_.", min_size=1, max_size=16).map(lambda s: "zz" + s),
)


def _run(argv: list[str]) -> tuple[int, str]:
    """(exit code, stdout + stderr) of ``tunelab ARGV`` in-process."""
    code, out, err = tunelab_here(*argv)
    return code, (out + err).strip()


class _NoChild(subprocess.Popen):
    """A refused command starts no process: one that tries (a run let through) fails the case at once instead of
    training in the test process."""

    def __init__(self, args, *a, **kw):
        raise AssertionError(f"a bad input started a process: {args!r}"[:300])


@pytest.fixture(scope="module")
def untouched(tmp_path_factory):
    """What must not change while the suite runs: the checkout's parent, the checkout's output folders, and the
    process's children (none may be started, none left). pytest's own temp folder is made first: a case that asks
    for ``tmp_path`` makes it otherwise, inside the window, when this file runs alone."""
    tmp_path_factory.getbasetemp()

    def snapshot():
        outputs = {p: sorted(os.listdir(ROOT / p)) if (ROOT / p).is_dir() else None for p in ("runs", "reports")}
        return beside_checkout(), outputs

    _run(["plan", R])  # the imports a first plan makes (some probe the system with a subprocess) before the guard
    before, popen = snapshot(), subprocess.Popen
    subprocess.Popen = _NoChild
    try:
        yield
    finally:
        subprocess.Popen = popen
    assert snapshot() == before, "a refused command wrote beside the checkout or into runs/ or reports/"
    assert not psutil.Process().children(recursive=True), "a refused command left a process behind"


def refused(name: str, argv: list[str], fragment: str) -> None:
    """The case's contract: non-zero exit, exactly one line, naming ``fragment``, no traceback or internal error."""
    TRIED[name] = TRIED.get(name, 0) + 1
    code, out = _run(argv)
    lines = [ln for ln in out.splitlines() if ln.strip()]
    assert code != 0, (argv, out[-300:])
    assert "Traceback" not in out and "unexpected" not in out, (argv, out[-600:])
    assert len(lines) == 1, (argv, out[-600:])
    assert fragment in lines[0], (argv, fragment, lines[0][:300])


INT_OPTIONS = [
    (["plan", R], "--devices"),
    (["advise", M], "--max-devices"),
    (["bench", R], "--pairs"),
    (["bench", R], "--max-micro"),
    (["tune-batch", R], "--steps"),
    (["tune-batch", R], "--start"),
    (["validate", R], "--devices"),
    (["run", R], "--nnodes"),
    (["run", R], "--master-port"),
    (["tune-study", "configs/sweeps/lab-part3.yaml"], "--max-micro"),
]


@SETTINGS
@given(case=st.sampled_from(INT_OPTIONS), value=NOT_INT)
def test_integer_options_refuse_what_is_not_a_count(untouched, case, value):
    prefix, option = case
    refused("integer options", [*prefix, option, value], option.lstrip("-"))


LITGPT_KEYS = ["--train.micro_batch_size", "--train.global_batch_size", "--train.max_steps", "--devices", "--num_nodes"]


@SETTINGS
@given(
    command=st.sampled_from(["plan", "validate"]),
    key=st.sampled_from(LITGPT_KEYS),
    value=NOT_INT.filter(lambda v: v != "0x10"),
)
def test_recipe_overrides_refuse_what_is_not_a_count(untouched, command, key, value):
    """The litgpt-style keys a user overrides most, on the planner and the validator (before any model is built).
    Their values are read as YAML, as litgpt's parser reads them, where 0x10 is the integer 16: not generated; an
    empty train.max_steps is litgpt's None (no limit) and a huge one a cap the epochs reach first: valid values."""
    if key == "--train.max_steps" and (not value.strip() or value.isdigit()):
        return  # (0 too: litgpt's "no limit")
    gpu = ["--gpu", "H100-SXM"] if command == "plan" else []  # the time projection too, where steps are counted
    refused("recipe overrides", [command, R, *gpu, key, value], key.lstrip("-").split(".")[-1])


FLOAT_OPTIONS = [
    (["plan", R], ["--tokens"]),
    (["plan", R], ["--mfu-range", "0.3"]),
    (["plan", R], ["--host-us-per-op"]),
    (["advise", M], ["--tokens"]),
    (["advise", M], ["--host-us-per-op"]),
    (["bench", R], ["--timeout"]),
    (["bench", R], ["--deadline"]),
    (["run", R], ["--timeout"]),
    (["run", R], ["--memory-limit-gb"]),
    (["sweep", "configs/sweeps/lab-part1.yaml"], ["--deadline"]),
    (["tune-study", "configs/sweeps/lab-part3.yaml"], ["--deadline"]),
]


@SETTINGS
@given(case=st.sampled_from(FLOAT_OPTIONS), value=NOT_POSITIVE)
def test_quantities_refuse_what_is_not_a_positive_finite_number(untouched, case, value):
    prefix, option = case
    refused("quantities", [*prefix, *option, value], option[0].lstrip("-"))


NAME_OPTIONS = [
    (["plan", R], "--gpu", "GPU"),
    (["plan", R], "--strategy", "strateg"),
    (["plan", R], "--interconnect", "interconnect"),
    (["advise", M], "--gpus", "GPU"),
    (["plan-strategies"], "--families", "--families"),
    (["plan-strategies"], "--strategies", "--strategies"),
    (["plan-strategies"], "--precisions", "--precisions"),
    (["plan-families"], "--families", "--families"),
]


@SETTINGS
@given(case=st.sampled_from(NAME_OPTIONS), value=NOT_A_NAME)
def test_names_that_no_table_holds_are_refused(untouched, case, value):
    prefix, option, fragment = case
    refused("names", [*prefix, option, value], fragment)


@SETTINGS
@given(value=st.sampled_from([".inf", ".nan", "bf17", "'[1]'", "16", "'{a: 1}'", "true", "fp16"]))
def test_a_precision_lightning_does_not_name_is_one_line(untouched, value):
    """The plan's precision, from a recipe's override (as from a YAML's ``precision:``): anything but one of
    Lightning's full names is refused in one line naming the key, before any model is built (was: an internal
    KeyError from the tracer)."""
    refused("precision", ["plan", R, "--gpu", "H100-SXM", "--precision", value], "precision")


@SETTINGS
@given(
    key=st.sampled_from(["memory_gib", "peak_tflops", "bandwidth_gbs", "sms", "boost_mhz", "tdp_w"]),
    value=st.one_of(
        st.sampled_from([".nan", ".inf", "-.inf", "-1", "0", "'12'", "[1, 2]", "{a: 1}", "null", "1e400", "true"]),
        st.floats(max_value=0, allow_nan=False).map(repr),
    ),
)
def test_a_gpu_table_row_with_a_bad_number_is_one_line(untouched, monkeypatch, tmp_path_factory, key, value):
    """The GPU table a user edits: a row whose number is not a finite positive one (or a mapping where numbers
    belong) is refused when the table is loaded, naming the file, the row and the key, before anything is planned."""
    import yaml

    from tunelab import hardware

    table = yaml.safe_load((ROOT / "configs" / "hardware" / "gpus.yaml").read_text())
    row = table["gpus"]["L4"]
    if key not in row:
        return  # a key this row does not carry: nothing to break
    bad = yaml.safe_load(f"v: {value}")["v"]
    if bad is None and key in ("sms", "boost_mhz"):
        return  # optional keys: null says "not published"
    if key == "peak_tflops":
        row[key] = {**row[key], "bf16": bad}
    else:
        row[key] = bad
    path = tmp_path_factory.mktemp("gpus") / "gpus.yaml"
    path.write_text(yaml.safe_dump(table))
    monkeypatch.setattr(hardware, "GPU_TABLE", path)
    hardware.table.cache_clear()
    try:
        if isinstance(bad, (int, float)) and not isinstance(bad, bool) and math.isfinite(bad) and bad > 0:
            return  # '12' as text, true... parsed to a valid number by YAML: not a bad value
        refused("gpu table", ["plan", R, "--gpu", "L4"], "L4")
    finally:
        hardware.table.cache_clear()


BAD_NUMBER = st.one_of(
    st.sampled_from([".nan", ".inf", "-.inf", "-1", "0", "1e400", "'text'", "[1, 2]", "{a: 1}", "null", "true"]),
    st.floats(max_value=0, allow_nan=False).map(repr),
)


@SETTINGS
@given(key=st.sampled_from(["gbs", "efficiency", "latency_us"]), value=BAD_NUMBER)
def test_a_link_table_row_with_a_bad_number_is_one_line(untouched, link_table, key, value):
    """The link table a user edits (configs/hardware/links.yaml): a bandwidth, efficiency or latency that is not a
    number in range is refused when the table is loaded, naming the file and the row, before anything is planned.
    (A latency of 0 is allowed: no latency modelled.)"""
    import yaml

    table = yaml.safe_load((ROOT / "configs" / "hardware" / "links.yaml").read_text())
    bad = yaml.safe_load(f"v: {value}")["v"]
    if key == "latency_us" and type(bad) in (int, float) and bad == 0:
        return
    table["links"]["nvlink4"][key] = bad
    link_table(yaml.safe_dump(table))
    refused("link table", ["plan", R, "--gpu", "H100-SXM", "--devices", "2", "--strategy", "ddp"], "nvlink4")


@SETTINGS
@given(key=st.sampled_from(["usd_per_hour", "source", "date"]), value=BAD_NUMBER)
def test_a_price_file_with_a_bad_row_is_one_line(untouched, tmp_path_factory, key, value):
    """A user's price file (`advise --prices FILE`): a price that is not a positive number, or a source or date that
    is not text, is refused in one line naming the file and the GPU, before anything is ranked."""
    import yaml

    table = yaml.safe_load((ROOT / "configs" / "hardware" / "prices.yaml").read_text())
    bad = yaml.safe_load(f"v: {value}")["v"]
    if key != "usd_per_hour" and isinstance(bad, str):
        return  # text is what a source or date is
    table["prices"]["L4"][key] = bad
    path = tmp_path_factory.mktemp("prices") / "prices.yaml"
    path.write_text(yaml.safe_dump(table))
    refused("price file", ["advise", M, "--gpus", "L4", "--max-devices", "1", "--prices", path], "L4")


def _strategy_fields() -> list[str]:
    from dataclasses import fields

    from tunelab.strategies import StrategyConfig

    return [f.name for f in fields(StrategyConfig) if f.name not in ("name", "description")]


@pytest.mark.parametrize("key", _strategy_fields())
@settings(SETTINGS, max_examples=12)
@given(
    base=st.sampled_from(["ddp", "fsdp", "fsdp2", "deepspeed-zero3", "fast"]),
    value=st.one_of(
        st.sampled_from([{"a": 1}, [1, 2], "zz-unknown", -7, 0, float("nan"), float("inf"), "", True, 10**40]),
        st.floats(allow_nan=True, allow_infinity=True),
        st.text(max_size=12),
        st.integers(min_value=-(10**6), max_value=10**6),
    ),
)
def test_a_strategy_file_with_any_value_under_any_key_is_planned_or_one_line(
    untouched, tmp_path_factory, base, key, value
):
    """Every key of a strategy file, any value: the file is planned (the value is one the key takes) or refused in
    one line naming the key, never an internal error; always refused: a list or a mapping under a key whose type
    is neither (every key but mixed_precision and extra), a value outside a key's choices, an integer key's value that is not a
    whole number from 1 to its bound (1e12 at most, whatever the bound), a boolean key's value that is not true or
    false."""
    import yaml

    from tunelab.paths import CONFIGS_DIR

    TRIED["strategy keys"] = TRIED.get("strategy keys", 0) + 1
    raw = yaml.safe_load((CONFIGS_DIR / "strategies" / f"{base}.yaml").read_text())
    raw[key] = value
    path = tmp_path_factory.mktemp("strategy") / "s.yaml"
    path.write_text(yaml.safe_dump(raw))
    devices = ["--devices", "1"] if raw.get("name") == "single" else ["--devices", "2"]
    code, out = _run(["plan", R, *devices, "--strategy", path])
    assert "Traceback" not in out and "unexpected" not in out, (key, value, out[-600:])
    from dataclasses import fields

    from tunelab.strategies import CHOICES, RANGES, StrategyConfig

    kind = {f.name: str(f.type) for f in fields(StrategyConfig)}[key]
    must_refuse = (
        (isinstance(value, dict) and "dict" not in kind)
        or (isinstance(value, list) and "list" not in kind)
        or (key in CHOICES and not any(value == c and type(value) is type(c) for c in CHOICES[key]))
    )
    if kind.startswith("int") and value is not None and key not in CHOICES:  # counts and sizes: whole, 1 or more
        must_refuse = must_refuse or type(value) is not int or value < 1 or value > 10**12
    if key in RANGES and value is not None:  # ... and at most their bound
        must_refuse = must_refuse or not (type(value) is int and 1 <= value <= RANGES[key])
    if kind == "bool":
        must_refuse = must_refuse or type(value) is not bool
    if must_refuse:
        assert code != 0, (key, value, out[-300:])
    if code != 0:
        lines = [ln for ln in out.splitlines() if ln.strip()]
        assert len(lines) == 1 and key in lines[0], (key, value, out[-600:])


ANY_YAML = st.one_of(
    st.sampled_from([None, "", " ", True, 0, -1, 10**40, float("nan"), float("inf"), [], {}, "../../x", "x" * 3000]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(min_value=-(10**6), max_value=10**6),
    st.text(max_size=12),
    st.lists(st.one_of(st.integers(), st.text(max_size=4)), max_size=3),
    st.dictionaries(st.text(max_size=6), st.one_of(st.integers(), st.text(max_size=4)), max_size=2),
)
"""Any value a YAML file can hold under a key: scalars of every type, non-finite numbers, lists and mappings."""
SWEEP_PLACES = (
    [("file", k) for k in ("name", "description", "lab_hardware", "gpu", "timeout_s", "defaults", "rows", "grid")]
    + [("row", k) for k in ("id", "recipe", "set", "lab", "note", "strategy", "gpu")]
    + [
        ("set", "train.micro_batch_size"),
        ("set", "precision"),
        ("set", "zz.unknown"),
        ("lab", "status"),
        ("lab", "memory_gb"),
        ("lab", "time_s"),
        ("grid", "axes"),
        ("grid", "id"),
        ("axis", "train.micro_batch_size"),
    ]
)
"""Where a generated value goes in a sweep file: a top-level key, a row's key, a row's override, a row's lab
figure, a grid entry's key, an axis's values."""


@pytest.mark.parametrize("place", SWEEP_PLACES, ids=lambda p: ".".join(p))
@settings(SETTINGS, max_examples=10)
@given(value=ANY_YAML)
def test_a_sweep_file_with_any_value_anywhere_is_read_or_refused_in_one_line(untouched, tmp_path_factory, place, value):
    """A sweep file a user edits, any value under any key (of the file, a row, its overrides, its lab figures, a
    grid and its axes): `tunelab sweep` reads it or refuses it naming the file, never an internal error, and starts
    no run (`--only` names no row, so a file that reads is refused after it, before anything is made)."""
    import yaml

    TRIED["sweep keys"] = TRIED.get("sweep keys", 0) + 1
    where, key = place
    raw = {"name": "hostile", "rows": [{"id": "r1", "recipe": R, "set": {"train.max_steps": 1}, "lab": {}}]}
    if where == "file":
        raw[key] = value
    elif where == "row":
        raw["rows"][0][key] = value
    elif where in ("set", "lab"):
        raw["rows"][0][where][key] = value
    else:
        entry = {"recipe": R, "axes": {"train.micro_batch_size": [1, 2]}, "id": "g{train.micro_batch_size}"}
        if where == "axis":
            entry["axes"] = {key: value}
        else:
            entry[key] = value
        raw["grid"] = [entry]
    folder = tmp_path_factory.mktemp("sweep")
    (folder / "s.yaml").write_text(yaml.safe_dump(raw, allow_unicode=True))
    code, out = _run(["sweep", folder / "s.yaml", "--only", "zz-none", "--out", folder / "runs", "--no-report"])
    lines = [ln for ln in out.splitlines() if ln.strip()]
    assert code != 0 and "Traceback" not in out and "unexpected" not in out, (place, value, out[-600:])
    assert lines and all(str(folder / "s.yaml") in ln or "--only" in ln for ln in lines), (place, value, out[-600:])
    assert not (folder / "runs").exists(), (place, value)
    number = type(value) in (int, float) and math.isfinite(value)
    must_refuse = {  # values a key never takes: refused by name, whatever else the file holds
        ("file", "timeout_s"): value is not None and not (number and value > 0),
        ("file", "name"): not isinstance(value, str),
        ("set", "train.micro_batch_size"): not (type(value) is int and value >= 1),
        ("row", "recipe"): not isinstance(value, str),
    }.get(place, False)
    if must_refuse:
        assert "--only" not in out and key in out, (place, value, out[-600:])


def _a_real_record() -> dict:
    """A GPU run's record as the collector wrote it (our H200 bench's litgpt arm, from its committed archive)."""
    import json
    import tarfile

    archive = ROOT / "reports" / "2026-11-26-bench-tiny-llama-1.1b-lora-h200-compiled" / "records.tgz"
    with tarfile.open(archive) as tar:
        return json.load(tar.extractfile("bench/tiny-llama-1.1b-lora/litgpt-0/record.json"))


def _record_fields() -> list[str]:
    from dataclasses import fields

    from tunelab.record import RunRecord

    return [f.name for f in fields(RunRecord)]


@settings(SETTINGS, max_examples=80)
@given(key=st.sampled_from(_record_fields()), value=ANY_YAML)
@example(key="tok_s_padded", value=10**40)  # a whole number too large for C: as a float, plotted
@example(key="peak_tflops_per_device", value=None)  # a peak basis without its figure
@example(key="schema_version", value=None)  # a record the schema refuses
def test_a_record_with_any_value_under_any_field_is_reported_or_skipped_by_name(
    untouched, tmp_path_factory, key, value
):
    """`tunelab report` over a directory whose one record has a generated value under any field: the report is
    written (the value is one the field takes) or the record is passed over with a line naming it and the field,
    never an internal error."""
    import json

    TRIED["record fields"] = TRIED.get("record fields", 0) + 1
    rec = _a_real_record()
    rec[key] = value
    folder = tmp_path_factory.mktemp("report")
    (folder / "runs" / "r1").mkdir(parents=True)
    (folder / "runs" / "r1" / "record.json").write_text(json.dumps(rec))
    code, out = _run(["report", folder / "runs", "--out", folder / "rep"])
    assert "Traceback" not in out and "unexpected" not in out, (key, value, out[-600:])
    from tunelab.record import RunRecord

    try:
        RunRecord.from_dict(rec)
    except ValueError:  # a record the schema refuses: named, not reported as a run
        assert "r1" in out and key in out, (key, value, out[-600:])
    else:
        assert code == 0 and (folder / "rep" / "results.md").is_file(), (key, value, out[-600:])


EMPTY = st.one_of(st.sampled_from(["", " ", ",", " , ", ",,", "\t"]), st.text(alphabet=", \t", max_size=8))
"""Values that name nothing: an unset shell variable, separators only."""
LIST_OPTIONS = [
    (["advise", M], "--gpus"),
    (["advise", M], "--precision"),
    (["advise", M], "--strategies"),
    (["plan-strategies"], "--strategies"),
    (["plan-strategies"], "--worlds"),
    (["plan-strategies"], "--families"),
    (["plan-strategies"], "--methods"),
    (["plan-strategies"], "--precisions"),
    (["plan-families"], "--families"),
    (["sweep", "configs/sweeps/lab-part1.yaml"], "--only"),
    (["tune-study", "configs/sweeps/lab-part3.yaml"], "--only"),
    (["advise", M], "--data"),
]
FOLDER_OPTIONS = [
    (["run", R], "--out"),
    (["sweep", "configs/sweeps/lab-part1.yaml"], "--out"),
    (["bench", R], "--out"),
    (["bench", R], "--report-dir"),
    (["tune-batch", R], "--out"),
    (["advise", M], "--write"),
    (["plan-accuracy"], "--out"),
    (["plan-families"], "--out"),
    (["plan-strategies"], "--out"),
    (["build-model", "tiny"], "--out"),
    (["plan", R], "--dataset"),
    (["plan", R], "--calibrate"),
    (["advise", M], "--prices"),
    (["sweep", "configs/sweeps/lab-part1.yaml"], "--archive"),
]


@SETTINGS
@given(case=st.sampled_from(LIST_OPTIONS), value=EMPTY)
def test_a_list_option_that_names_nothing_is_refused(untouched, case, value):
    """Every comma-separated option: given but naming nothing is one line, never "all" or "none"."""
    prefix, option = case
    refused("empty lists", [*prefix, option, value], option)


@SETTINGS
@given(case=st.sampled_from(FOLDER_OPTIONS), value=st.sampled_from(["", " ", "\t", "  "]))
def test_a_folder_option_given_empty_is_refused(untouched, case, value):
    """Every folder a command writes into: an empty or blank path (it would mean the current folder) is one line."""
    prefix, option = case
    refused("empty folders", [*prefix, option, value], option)


def test_the_suite_tried_what_it_says():
    """Runs last in this file (pytest keeps file order): every generated test ran its cases."""
    assert set(TRIED) >= {
        "integer options",
        "recipe overrides",
        "quantities",
        "names",
        "strategy keys",
        "link table",
        "price file",
        "sweep keys",
        "record fields",
        "empty lists",
        "empty folders",
        "precision",
    }, TRIED
    print(f"hostile suite: {sum(TRIED.values())} generated cases: {TRIED}")
