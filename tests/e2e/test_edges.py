"""The edges around the validated core, tried as a hostile but realistic user would, against the real ``tunelab``
CLI as subprocesses: writing through what is not a plain file, names from records that become paths, records and
indexes of the wrong type or range, reads that could block or never end, numbers out of range, concurrency, and
the messages of each. Every refusal is one line with a non-zero exit and no traceback; nothing outside the output
directory changes; no command hangs (each runs under a timeout that only a hang reaches); no row is dropped.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import stat
import subprocess
from pathlib import Path

import pytest

from tests.conftest import REFUSAL_HALVES, ROOT, beside_checkout, refusals_of_half, tunelab_cli

R = "tiny-llama-1.1b/lora"
HANG_GUARD_S = 300
"""A command still running after this long is a hang (the slowest case here answers in a few seconds)."""


def tunelab(*args, cwd=ROOT) -> subprocess.CompletedProcess:
    try:
        return tunelab_cli(*args, cwd=cwd, timeout=HANG_GUARD_S)
    except subprocess.TimeoutExpired:
        return subprocess.CompletedProcess(args, -1, "", f"HANG: still running after {HANG_GUARD_S} s")


def _record(**fields) -> dict:
    from tunelab.record import RunRecord

    return {**RunRecord(status="ok", row_id="r", recipe=R, device_type="cpu", device_name="cpu").to_dict(), **fields}


@pytest.fixture(scope="module")
def world(tmp_path_factory, tiny_ckpt):
    """The crafted files every case points at, and the files outside the output directories that must not change."""
    tmp = tmp_path_factory.mktemp("edges")
    f: dict[str, Path] = {"tmp": tmp, "ckpt": tiny_ckpt}

    def write(name, text):
        p = tmp / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
        f[name] = p
        return p

    def fifo(name):
        p = tmp / name
        p.parent.mkdir(parents=True, exist_ok=True)
        os.mkfifo(p)
        f[name] = p
        return p

    def link(name, target):
        p = tmp / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.symlink_to(target)
        f[name] = p
        return p

    outside = write("outside.txt", "precious\n")
    fifo("fifo")
    fifo("fifo.yaml")
    fifo("fifo.json")
    link("link.json", outside)
    link("zero.json", "/dev/zero")
    # write targets with a link, FIFO or device in the way
    link("sweep-locked/.lock", outside)
    link("tune-locked/.lock", outside)
    link("run-log/stdout.log", outside)
    (tmp / "outside-dir").mkdir()
    link("run-out/litgpt", tmp / "outside-dir")
    # sweep directories for report: one broken record per row
    sweep = tmp / "sweep"
    bad = {
        "str-number": _record(peak_allocated_bytes="5"),
        "int-text": _record(device_name=3),
        "list-mapping": _record(versions=[]),
        "nan": _record(mfu=math.nan),
        "inf": _record(tok_s_real=math.inf),
        "negative": _record(wall_s=-3.0),
        "bool-count": _record(iters=True),
        "rank-missing": _record(ranks=[{}]),
        "gpus-text": _record(gpus=["x"]),
    }
    for rid, rec in bad.items():
        (sweep / rid).mkdir(parents=True)
        (sweep / rid / "record.json").write_text(json.dumps({**rec, "row_id": rid}))
    (sweep / "good").mkdir()
    (sweep / "good" / "record.json").write_text(json.dumps(_record(row_id="good", tok_s_padded=10.0)))
    (sweep / "list").mkdir()
    (sweep / "list" / "record.json").write_text("[1, 2]")
    (sweep / "fifo").mkdir()
    os.mkfifo(sweep / "fifo" / "record.json")
    (sweep / "device").mkdir()
    (sweep / "device" / "record.json").symlink_to("/dev/zero")
    (sweep / "huge").mkdir()
    with open(sweep / "huge" / "record.json", "wb") as h:
        h.truncate(17 * 2**20)  # sparse: larger than a record may be, no disk used
    f["sweep"], f["sweep-rows"] = sweep, sorted(p.name for p in sweep.iterdir())
    for name, meta in {
        "meta-list": [1, 2],
        "meta-lab-text": {"name": "m", "rows": [{"id": "good", "lab": {"allocated_gib": "x"}}]},
        "meta-lab-list": {"name": "m", "rows": [{"id": "good", "lab": [1]}]},
        "meta-name-int": {"name": 5, "rows": "x"},
        "meta-rows-junk": {"name": "m", "rows": [1, {"id": 3}, {"id": "good", "lab": {"time_s": -1}}]},
    }.items():
        d = tmp / name / "good"
        d.mkdir(parents=True)
        (d / "record.json").write_text(json.dumps(_record(row_id="good")))
        (tmp / name / "sweep.json").write_text(json.dumps(meta))
        f[name] = tmp / name
    (tmp / "study-index-list" / "mbs1").mkdir(parents=True)
    (tmp / "study-index-list" / "tune-study.json").write_text("[]")
    f["study-index-list"] = tmp / "study-index-list"
    # calibration records with figures no run can have
    for i, mfu in enumerate([-0.5, 0.0, "0.5", 7.0]):
        d = tmp / "calib" / f"r{i}"
        d.mkdir(parents=True)
        (d / "record.json").write_text(
            json.dumps(_record(model_name="tiny-llama-1.1b", method="lora", precision="bf16-true", mfu=mfu))
        )
    f["calib"] = tmp / "calib"
    shutil.copytree(tmp / "calib", tmp / "calib-good")
    (tmp / "calib-good" / "r9").mkdir()
    (tmp / "calib-good" / "r9" / "record.json").write_text(
        json.dumps(
            _record(
                model_name="tiny-llama-1.1b",
                method="lora",
                precision="bf16-true",
                mfu=0.3,
                device_type="cuda",
                device_name="NVIDIA H100 80GB HBM3",
            )
        )
    )
    f["calib-good"] = tmp / "calib-good"
    # model_config.yaml and checkpoint directories
    for name, text in {
        "ckpt-neg": "n_layer: -5\n",
        "ckpt-block0": "block_size: 0\n",
        "ckpt-str": "n_embd: '64'\n",
    }.items():
        write(f"{name}/model_config.yaml", "name: tiny-llama-1.1b\n" + text)
    (tmp / "ckpt-fifo").mkdir()
    os.mkfifo(tmp / "ckpt-fifo" / "model_config.yaml")
    f["ckpt-fifo"] = tmp / "ckpt-fifo"
    shutil.copytree(tiny_ckpt, tmp / "ckpt-fifo-weights")
    (tmp / "ckpt-fifo-weights" / "lit_model.pth").unlink()
    os.mkfifo(tmp / "ckpt-fifo-weights" / "lit_model.pth")
    f["ckpt-fifo-weights"] = tmp / "ckpt-fifo-weights"
    # datasets
    write("data-object.json", '{"instruction": "a", "output": "b"}')
    write("data-empty.json", "[]")
    write("data-no-instruction.json", '[{"input": "", "output": "b"}]')
    write("data-number-output.json", '[{"instruction": "a", "output": 5}]')
    write("data-broken.json", '[{"instruction": "a", ')
    write("data-lines.jsonl", '{"instruction": "a", "output": "b"}\nnot json\n')
    write("data.txt", "instruction output\n")
    (tmp / "data-dir").mkdir()
    write("data-dir/train.json", '[{"instruction": "a", "output": "b"}]')
    # strategies
    write("strategies/param-dtype.yaml", "name: fsdp\nmixed_precision: {param_dtype: nope}\n")
    write("strategies/mp-key.yaml", "name: fsdp\nmixed_precision: {weights: bfloat16}\n")
    write("strategies/bucket.yaml", "name: ddp\nbucket_cap_mb: " + "1" + "0" * 30 + "\n")
    write("strategies/log-interval.yaml", "name: single\nlog_interval: 10000000\n")
    # sweep and YAML files
    row = "  - id: a\n    recipe: tiny-llama-1.1b/lora\n"
    write("sweep-lab-text.yaml", f"name: x\nrows:\n{row}    lab: {{memory_gb: '34'}}\n")
    write("sweep-lab-pair.yaml", f"name: x\nrows:\n{row}    lab: {{allocated_gib: [1]}}\n")
    write("sweep-lab-status.yaml", f"name: x\nrows:\n{row}    lab: {{status: 1}}\n")
    axes = "{train.micro_batch_size: [" + ", ".join(map(str, range(1, 51))) + "], train.max_steps: ["
    axes += ", ".join(map(str, range(1, 51))) + "]}"
    write("sweep-grid.yaml", f"name: x\ngrid:\n  - recipe: tiny-llama-1.1b/lora\n    axes: {axes}\n")
    write("sweep-control.yaml", "name: x\nrows:\n  - id: a\x01\n    recipe: tiny-llama-1.1b/lora\n")
    write("recipe-control.yaml", "checkpoint_dir: checkpoints/x\n\x07\n")
    (tmp / "big.yaml").write_bytes(b"a: " + b"x" * (5 * 2**20) + b"\n")
    f["big.yaml"] = tmp / "big.yaml"
    f["outside-before"] = {p: p.read_bytes() for p in [outside]}
    return f


def cases(f: dict) -> list[tuple[str, list, str]]:
    """(label, argv, a fragment the one refusal line must hold)."""
    t = f["tmp"]
    ck = f["ckpt"]
    return [
        # 1. writing through what is not a plain file
        ("data out /dev/null", ["data", "generate", "--out", "/dev/null"], "is a device"),
        ("data out /dev/stdout", ["data", "generate", "--out", "/dev/stdout"], "--out"),
        ("data out empty", ["data", "generate", "--out", ""], "an empty path"),
        ("data out FIFO", ["data", "generate", "--out", f["fifo"]], "FIFO"),
        ("data out symlink", ["data", "generate", "--out", f["link.json"]], "symbolic link"),
        ("benchmark data out device", ["data", "generate", "--benchmark", "--out", "/dev/null"], "is a device"),
        (
            "sweep archive /dev/null",
            ["sweep", "lab-part1", "--only", "s2", "--model", "tiny", "--archive", "/dev/null"],
            "--archive",
        ),
        (
            "sweep archive symlink",
            ["sweep", "lab-part1", "--only", "s2", "--model", "tiny", "--archive", f["link.json"]],
            "symbolic link",
        ),
        (
            "sweep lock symlink",
            ["sweep", "lab-part1", "--only", "s2", "--model", "tiny", "--out", t / "sweep-locked"],
            "lock file",
        ),
        ("tune-batch lock symlink", ["tune-batch", R, "--model", "tiny", "--out", t / "tune-locked"], "lock file"),
        ("run log symlink", ["run", R, "--model", "tiny", "--out", t / "run-log"], "symbolic link"),
        ("run litgpt dir symlink", ["run", R, "--model", "tiny", "--out", t / "run-out"], "symbolic link"),
        # 3. indexes of the wrong shape
        ("tune-study index a list", ["report", f["study-index-list"]], "tune-study.json"),
        # 3. sweep files with lab figures of the wrong type
        ("lab figure text", ["sweep", f["sweep-lab-text.yaml"]], "memory_gb"),
        ("lab pair of one", ["sweep", f["sweep-lab-pair.yaml"]], "allocated_gib"),
        ("lab status number", ["sweep", f["sweep-lab-status.yaml"]], "status"),
        # 4. reads that could block or never end
        ("strategy FIFO", ["run", R, "--strategy", f["fifo.yaml"]], "FIFO"),
        ("strategy directory", ["run", R, "--strategy", t], "directory"),
        ("sweep FIFO", ["sweep", f["fifo.yaml"]], "FIFO"),
        ("study FIFO", ["tune-study", f["fifo.yaml"]], "FIFO"),
        ("recipe FIFO", ["plan", f["fifo.yaml"]], "FIFO"),
        ("recipe device", ["validate", "/dev/zero"], "device"),
        ("recipe too large", ["validate", f["big.yaml"]], "more than a YAML file may have"),
        ("model_config FIFO", ["plan", R, "--checkpoint_dir", f["ckpt-fifo"]], "FIFO"),
        (
            "weights FIFO",
            ["run", R, "--model", "checkpoint", "--checkpoint_dir", f["ckpt-fifo-weights"], "--out", t / "r1"],
            "not a regular file",
        ),
        ("plan dataset FIFO", ["plan", R, "--checkpoint_dir", ck, "--dataset", f["fifo.json"]], "regular file"),
        ("plan dataset device", ["plan", R, "--checkpoint_dir", ck, "--dataset", f["zero.json"]], "regular file"),
        ("data file FIFO", ["validate", R, "--data.json_path", f["fifo.json"]], "regular file"),
        ("data file device", ["validate", R, "--data.json_path", f["zero.json"]], "regular file"),
        ("data file an object", ["validate", R, "--data.json_path", f["data-object.json"]], "JSON dict"),
        ("data dir without val", ["validate", R, "--data.json_path", f["data-dir/train.json"].parent], "val.json"),
        ("data file .txt", ["validate", R, "--data.json_path", f["data.txt"]], ".jsonl"),
        ("data file broken JSON", ["validate", R, "--data.json_path", f["data-broken.json"]], "not valid JSON"),
        ("data JSONL bad line", ["validate", R, "--data.json_path", f["data-lines.jsonl"]], "line 2"),
        ("data --n huge", ["data", "generate", "--n", "2000000"], "--n"),
        ("grid of 2,500 rows", ["sweep", f["sweep-grid.yaml"]], "2,500 rows"),
        # 5. numbers
        ("memory limit inf", ["run", R, "--memory-limit-gb", "inf"], "--memory-limit-gb"),
        ("memory limit 1e400", ["run", R, "--memory-limit-gb", "1e400"], "--memory-limit-gb"),
        ("memory limit rounds to 0", ["run", R, "--memory-limit-gb", "1e-12"], "--memory-limit-gb"),
        ("memory limit nan", ["tune-batch", R, "--memory-limit-gb", "nan"], "--memory-limit-gb"),
        ("timeout inf", ["run", R, "--timeout", "inf"], "--timeout"),
        ("timeout 1e30", ["sweep", "lab-part1", "--timeout", "1e30"], "--timeout"),
        ("tokens inf", ["plan", R, "--tokens", "inf"], "--tokens"),
        ("tokens nan", ["plan", R, "--tokens", "nan"], "--tokens"),
        ("tokens per sample 1e300", ["plan", R, "--tokens-per-sample", "1e300"], "--tokens-per-sample"),
        ("mfu range nan", ["plan", R, "--mfu-range", "nan", "0.5"], "--mfu-range"),
        ("max micro 1e10", ["tune-batch", R, "--max-micro", "10000000000"], "--max-micro"),
        ("n_layer -5", ["plan", R, "--checkpoint_dir", f["ckpt-neg/model_config.yaml"].parent], "n_layer"),
        ("block_size 0", ["validate", R, "--checkpoint_dir", f["ckpt-block0/model_config.yaml"].parent], "block_size"),
        ("n_embd text", ["plan", R, "--checkpoint_dir", f["ckpt-str/model_config.yaml"].parent], "n_embd"),
        ("param_dtype nope", ["plan", R, "--strategy", f["strategies/param-dtype.yaml"]], "param_dtype"),
        ("mixed precision key", ["plan", R, "--strategy", f["strategies/mp-key.yaml"]], "weights"),
        ("bucket 1e30", ["plan", R, "--strategy", f["strategies/bucket.yaml"]], "bucket_cap_mb"),
        ("log interval 1e7", ["run", R, "--strategy", f["strategies/log-interval.yaml"]], "log_interval"),
        (
            "global batch over the data",
            ["validate", R, "--train.global_batch_size", "1024", "--train.micro_batch_size", "4"],
            "global_batch_size",
        ),
        (
            "run global batch over the data",
            ["run", R, "--model", "tiny", "--train.global_batch_size", "1024", "--out", t / "r2"],
            "global_batch_size",
        ),
        # 8. messages
        ("sweep control character", ["sweep", f["sweep-control.yaml"]], "sweep-control.yaml:3"),
        ("recipe control character", ["plan", f["recipe-control.yaml"]], "U+0007"),
        (
            "plan dataset without instruction",
            ["plan", R, "--checkpoint_dir", ck, "--dataset", f["data-no-instruction.json"]],
            "'instruction'",
        ),
        ("plan dataset empty", ["plan", R, "--checkpoint_dir", ck, "--dataset", f["data-empty.json"]], "no records"),
        (
            "plan dataset output a number",
            ["plan", R, "--checkpoint_dir", ck, "--dataset", f["data-number-output.json"]],
            "'output'",
        ),
    ]


THROUGH_LITGPT = {
    "sweep lock symlink",
    "tune-batch lock symlink",
    "run log symlink",
    "run litgpt dir symlink",
    "data file FIFO",
    "data file device",
    "data file an object",
    "data dir without val",
    "data file .txt",
    "data file broken JSON",
    "data JSONL bad line",
    "block_size 0",
    "global batch over the data",
    "run global batch over the data",
}
"""The cases refused after litgpt is imported (its parser or data module, a model: 6 to 8 s of CPU each, most of this
sweep's time): -m slow. CI runs the others (under a second each); the writer's refusal of links, devices and FIFOs
is also tried in-process (tests/cli/test_edges.py)."""


@REFUSAL_HALVES
def test_every_edge_is_refused_in_one_line(world, half):
    every = cases(world)
    assert len(every) >= 55
    before_root = beside_checkout()
    refusals_of_half(every, THROUGH_LITGPT, half, tunelab, workers=3)
    # nothing outside changed: the devices are devices, the linked file is whole, nothing beside the checkout
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode)
    for path, data in world["outside-before"].items():
        assert path.read_bytes() == data
    assert not list((world["tmp"] / "outside-dir").iterdir())
    assert stat.S_ISFIFO(os.lstat(world["fifo"]).st_mode) and os.path.islink(world["link.json"])
    assert beside_checkout() == before_root
    assert not (world["tmp"] / "r1" / "stdout.log").exists() and not (world["tmp"] / "r2" / "stdout.log").exists()


def test_a_report_over_broken_records_keeps_every_row(world, tmp_path):
    """Records of the wrong type or range, a list, a FIFO, a device and a 17 MiB file: each a row marked
    unreadable (with the field that is wrong), the good row beside them; nothing hangs."""
    proc = tunelab("report", world["sweep"], "--out", tmp_path / "rep")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    md = (tmp_path / "rep" / "results.md").read_text()
    for rid in world["sweep-rows"]:
        assert rid in md, rid
    broken = [r for r in world["sweep-rows"] if r != "good"]
    assert md.count("unreadable record.json") >= len(broken)
    for why in (
        "peak_allocated_bytes is a str",
        "device_name is a int",
        "versions is a list",
        "mfu = nan",
        "tok_s_real = inf",
        "wall_s = -3.0",
        "FIFO",
        "a device",
        "17,825,792 bytes",
    ):
        assert why in md, why
    csv_rows = (tmp_path / "rep" / "results.csv").read_text().splitlines()
    assert len(csv_rows) == 1 + len(world["sweep-rows"])


@pytest.mark.parametrize(
    "name, note",
    [
        ("meta-list", "sweep.json unreadable"),
        ("meta-lab-text", "allocated_gib"),
        ("meta-lab-list", "lab is not a mapping"),
        ("meta-name-int", "not a sweep.json"),
        ("meta-rows-junk", "time_s"),
    ],
)
def test_a_report_over_a_bad_sweep_index_says_so(world, tmp_path, name, note):
    """sweep.json of the wrong shape: the report is written, its record's row kept, the problem in a note."""
    proc = tunelab("report", world[name], "--out", tmp_path / "rep")
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    md = (tmp_path / "rep" / "results.md").read_text()
    assert "good" in md and note in md


def test_calibration_passes_over_impossible_figures(world):
    """Negative, zero, text and >1 MFU in records: none is used; the projection stays the default range, finite.
    The same directory with one real record beside them: that one is used."""
    proc = tunelab("plan", R, "--gpu", "H100-SXM", "--calibrate", world["calib"], "--json")
    assert proc.returncode == 0, proc.stderr
    proj = json.loads(proc.stdout)["projection"]
    assert proj["mfu_source"].startswith("default range")
    # and says so: the four were passed over (text and 7.0 refused by the record schema; -0.5 and 0 unusable)
    assert (
        "no usable record" in proj["mfu_source"]
        and "2 record(s) passed over: unreadable or mistyped" in (proj["mfu_source"])
        and "2 record(s) passed over: no MFU in (0, 1]" in proj["mfu_source"]
    )
    assert all(math.isfinite(proj[k]) and proj[k] > 0 for k in ("seconds_low", "seconds_high", "power_w"))
    proc = tunelab("plan", R, "--gpu", "H100-SXM", "--calibrate", world["calib-good"], "--json")
    assert proc.returncode == 0, proc.stderr
    source = json.loads(proc.stdout)["projection"]["mfu_source"]
    assert source.startswith("measured MFU 30.0%") and "passed over" in source


def test_two_tune_batch_searches_never_share_a_directory(tmp_path):
    """While one search holds ``--out`` (its lock), a second on it stops in one line naming the holder, before
    probing anything."""
    from tunelab.files import exclusive_lock

    out = tmp_path / "probes"
    out.mkdir()
    held = exclusive_lock(out / ".lock")
    try:
        proc = tunelab("tune-batch", R, "--model", "tiny", "--out", out, "--max-micro", "2")
    finally:
        held.close()
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "is being searched by pid" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    assert not list(out.glob("mbs*"))


def test_the_build_lock_stays_inside_the_checkpoint(tmp_path):
    """build-model --out leaves nothing beside the directory it builds."""
    proc = tunelab("build-model", "tiny", "--out", tmp_path / "m")
    assert proc.returncode == 0, proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m"]


def test_validate_goes_on_after_a_broken_recipe(world):
    """A recipe with a control character is one line; the recipe after it is still validated."""
    proc = tunelab("validate", world["recipe-control.yaml"], R)
    assert proc.returncode == 1 and "Traceback" not in proc.stdout + proc.stderr
    assert "U+0007" in proc.stdout and f"ok  {R}" in proc.stdout


@pytest.mark.slow  # 15 s on 2 cores (a tune-batch search of real probes); checked here alone
def test_a_search_stopped_by_the_data_says_why_and_what_it_found(tmp_path):
    """A search whose micro batches would outgrow the training split (10 of 20 samples, half held out) stops at it
    and says so: the largest probed is 10 (it stopped with an error at 16 before); the probes' records are kept."""
    records = json.loads((ROOT / "data" / "alpaca_tunelab.json").read_text())[:20]
    (tmp_path / "small.json").write_text(json.dumps(records))
    out = tmp_path / "probes"
    proc = tunelab(
        "tune-batch",
        R,
        "--model",
        "tiny",
        "--start",
        "8",
        "--steps",
        "2",
        "--out",
        out,
        "--data.json_path",
        tmp_path / "small.json",
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "search capped at 10: 10 training samples on 1 device(s)" in proc.stdout and "Traceback" not in proc.stderr
    assert (out / "mbs8" / "record.json").is_file() and (out / "mbs10" / "record.json").is_file()
    assert not (out / "mbs16").exists()
