"""The edges around the validated core, tried as a hostile but realistic user would, against the real ``tunelab``
CLI as subprocesses: writing through what is not a plain file, names from records that become paths, records and
indexes of the wrong type or range, reads that could block or never end, numbers out of range, concurrency, and
the messages of each. Every refusal is one line with a non-zero exit and no traceback; nothing outside the output
directory changes; no command hangs (each runs under a timeout that only a hang reaches); no row is dropped.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from tests.conftest import ROOT


def test_report_names_from_records_never_leave_reports(tmp_path, monkeypatch):
    """A sweep.json name and a record's device name with '../' make plain directory names under reports/."""
    from tunelab.record import RunRecord
    from tunelab.report import study as study_report
    from tunelab.report.sweep import default_report_dir

    rec = RunRecord(device_type="cuda", device_name="../../../../tmp/x GPU")
    out = default_report_dir({"name": "../../../etc/evil"}, [rec])
    assert out.parent == ROOT / "reports" and "/" not in out.name and not out.name.startswith(".")
    assert out.resolve().is_relative_to((ROOT / "reports").resolve())

    class Study:
        name = "../../up"

    class Res:
        probes = [(1, rec, None)]

    out = study_report.default_report_dir(Study(), [Res()])
    assert out.resolve().is_relative_to((ROOT / "reports").resolve()) and "/" not in out.name
    from tunelab.recipes import resolve
    from tunelab.report import bench as bench_report
    from tunelab.tune import bench

    arm = bench.Arm("litgpt", None)
    arm.records = [(0, rec, None)]  # a reused record whose device name climbs out (bench took it as it was)
    out = bench_report.default_report_dir(resolve("tiny-llama-1.1b/lora"), [bench.Phase("recipe", [arm])])
    assert out.parent == ROOT / "reports" and "/" not in out.name and out.name.endswith("-tmp-x")
    ok = RunRecord(device_type="cuda", device_name="NVIDIA H100 80GB HBM3")
    assert default_report_dir({"name": "lab"}, [ok]).name.endswith("-lab-h100")  # one spelling: the first word


def test_the_writer_refuses_links_devices_and_fifos(tmp_path):
    """The one writer: a link in the target's place is refused (its target untouched), as are devices and
    FIFOs; a regular file is replaced whole."""
    from tunelab import files

    target = tmp_path / "t.txt"
    target.write_text("keep")
    (tmp_path / "l.txt").symlink_to(target)
    os.mkfifo(tmp_path / "p")
    for bad in (tmp_path / "l.txt", tmp_path / "p", Path("/dev/null")):
        with pytest.raises(files.FileRefused):
            files.write_text_atomic(bad, "x")
    assert target.read_text() == "keep" and stat.S_ISCHR(os.stat("/dev/null").st_mode)
    files.write_text_atomic(target, "new")
    assert target.read_text() == "new" and not list(tmp_path.glob(".*.tmp"))
    with pytest.raises(files.FileRefused, match="symbolic link"):
        files.open_output(tmp_path / "l.txt")
    with pytest.raises(files.FileRefused, match="more than"):
        files.read_bytes(target, limit=2)


def test_plan_strategies_stopped_midway_keeps_the_rows_it_finished(tmp_path, monkeypatch):
    """plan-strategies writes its report after every row (the whole report takes about 40 minutes): stopped by
    Ctrl-C at the second row, the first is in strategies.csv beside the rows kept from the earlier report."""
    from tunelab import cli
    from tunelab.report import strategy_checks as sc

    done = []

    def check(family, method, strategy, world, precision=None):
        if done:
            raise KeyboardInterrupt
        done.append(world)
        return sc.Row(family[0], method, "bf16-true", strategy, world, 1, 1e9, 1e9, "backward", 0.0, 0.0, 1.0, 0, 0)

    monkeypatch.setattr(sc, "check", check)
    earlier = sc.Row("Phi-2", "lora", "bf16-true", "ddp", 8, 1, 2e9, 2e9, "backward", 0.0, 0.0, 1.0, 0, 0)
    sc.write([earlier], tmp_path)
    argv = [
        "plan-strategies",
        "--out",
        str(tmp_path),
        "--strategies",
        "fsdp2",
        "--worlds",
        "2,4",
        "--families",
        "TinyLlama 1.1B",
        "--methods",
        "full",
        "--keep",
    ]
    assert cli.main(argv) == 130
    rows = sc.read(tmp_path / "strategies.csv")
    assert [(r.family, r.strategy, r.world) for r in rows] == [("TinyLlama 1.1B", "fsdp2", 2), ("Phi-2", "ddp", 8)]


@pytest.mark.parametrize("kind", ["fifo", "link outside", "foreign"])
def test_plan_strategies_refuses_a_deepspeed_table_that_is_not_its_own_before_simulating(tmp_path, kind):
    """``deepspeed.csv`` in ``--out`` is read back into every strategies.md the command writes: a FIFO (which would
    block a read), a link leading outside, or another table is refused in one line before any simulation, and the
    file it points to is left as it was."""
    from tests.cli.test_hostile import _run

    out = tmp_path / "out"
    out.mkdir()
    outside = tmp_path / "outside.csv"
    outside.write_text("family,model,world,params,planned_bytes,measured_bytes,seconds\nX,x,2,1,1,1,1\n")
    target = out / "deepspeed.csv"
    if kind == "fifo":
        os.mkfifo(target)
    elif kind == "link outside":
        target.symlink_to(outside)
    else:
        target.write_text("family,world\nGemma 2B,2\n")
    code, text = _run(
        [
            "plan-strategies",
            "--strategies",
            "ddp",
            "--worlds",
            "8",
            "--families",
            "TinyLlama 1.1B",
            "--methods",
            "full",
            "--out",
            out,
        ]
    )
    lines = [ln for ln in text.splitlines() if ln.strip()]
    assert code != 0 and "Traceback" not in text, text[-1000:]
    assert len(lines) == 1 and "deepspeed.csv" in lines[0] and "fix:" in lines[0], lines
    assert not (out / "strategies.md").exists() and not (out / "strategies.csv").exists()
    assert outside.read_text().startswith("family,model") and (kind != "link outside" or target.is_symlink())
