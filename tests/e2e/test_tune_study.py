"""Tuning studies (tunelab tune-study, configs/sweeps/lab-part3.yaml): the file is checked in one line per problem,
the settings run as real probes (tunelab's multi-device loop under FSDP, the tiny model, CPU), a second call reuses
every probe, and the report reads the records back: the tables, the reference figures, predicted vs probed, the
CSV in fixed columns, the plot, and the probes a time limit cut short."""

from __future__ import annotations

import csv
import json
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.conftest import ROOT, cpu_env
from tests.tune.test_tune_study import STUDY, _write
from tunelab.report import study as study_report


def test_prefetch_under_a_strategy_that_is_not_fsdp_is_refused_before_any_probe(tmp_path):
    study = json.loads(json.dumps(STUDY))
    study["studies"][0]["strategy"] = "ddp"
    p = subprocess.run(
        [sys.executable, "-m", "tunelab", "tune-study", str(_write(tmp_path, study)), "--out", str(tmp_path / "runs")],
        cwd=ROOT,
        env=cpu_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1, p.stderr
    assert "backward_prefetch needs an FSDP strategy" in p.stderr and not (tmp_path / "runs" / "tiny-fsdp").exists()


EXAMPLE = "tunelab tune-study lab-part3 --only cpu-example"
PRINTED = {EXAMPLE}
"""The `tunelab --help` example test_the_cpu_example_runs_for_real_resumes_and_reports runs (capped at micro batch
1); tests/e2e/test_printed_commands.py checks it is the printed one."""


@pytest.mark.slow  # 1.5 min on 2 cores; CI keeps the study's logic in-process (tests/tune/test_tune_study.py) and its refusal here
def test_the_cpu_example_runs_for_real_resumes_and_reports(tmp_path):
    """`tunelab --help`'s example, the shipped study's CPU example (tiny-deep, FSDP over 2 processes), with every
    setting capped at micro batch 1 (--max-micro 1: one probe each) and its output in a temporary folder."""
    runs, report = tmp_path / "runs", tmp_path / "report"
    cmd = [
        sys.executable,
        "-m",
        *shlex.split(EXAMPLE),
        "--max-micro",
        "1",
        "--out",
        str(runs),
        "--report-dir",
        str(report),
    ]
    p = subprocess.run(cmd, cwd=ROOT, env=cpu_env(), capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    for setting in ("ac-off-prefetch-none", "ac-on-prefetch-none", "ac-on-prefetch-pre"):
        rec = json.loads((runs / "cpu-example" / setting / "mbs1" / "record.json").read_text())
        assert rec["status"] == "ok" and rec["strategy_file"].endswith(f"strategy-{setting}.yaml")
        assert rec["device_count"] == 2 and rec["model_name"] == "tunelab-tiny-deep"
        strat = yaml.safe_load(Path(rec["strategy_file"]).read_text())
        assert strat["activation_checkpointing"] is ("ac-on" in setting)
        assert strat["backward_prefetch"] == ("BACKWARD_PRE" if setting.endswith("pre") else None)
    md = (report / "results.md").read_text()
    assert "**CPU example, not a GPU measurement**" in md
    assert "| cpu-example | fsdp | 1 |" in md and "| 1 * | ok |" in md  # the best starred
    assert "Reference, the study's own table (4x V100 16GB" in md and "| 7 * | 14736 | 86.2 +/- 9.7 |" in md
    assert "| 1 of the probes 1 (from fsdp-ac's best when it ran) |" in md
    with open(report / "results.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0]) == study_report.COLUMNS and len(rows) == 3
    assert (report / "tune.png").stat().st_size > 10_000
    assert json.loads((runs / "tune-study.json").read_text())["name"] == "lab-part3"

    # the same command again: nothing runs, every probe is reused
    again = subprocess.run(cmd, cwd=ROOT, env=cpu_env(), capture_output=True, text=True, timeout=300)
    assert again.returncode == 0 and again.stderr.count("[recorded earlier: not run again]") == 3, again.stderr[-2000:]
    assert "iter 0 step 0" not in again.stderr

    # a probe recorded with other settings runs again; the record it replaces is kept aside, not lost
    rec_path = runs / "cpu-example" / "ac-off-prefetch-none" / "mbs1" / "record.json"
    rec = json.loads(rec_path.read_text())
    rec["overrides"] = [*rec["overrides"], "--train.seed", "7"]
    rec_path.write_text(json.dumps(rec))
    third = subprocess.run(cmd, cwd=ROOT, env=cpu_env(), capture_output=True, text=True, timeout=300)
    assert third.returncode == 0 and third.stderr.count("[recorded earlier: not run again]") == 2, third.stderr[-2000:]
    kept = list(rec_path.parent.glob("record.json.stale-*"))
    assert len(kept) == 1 and json.loads(kept[0].read_text())["overrides"][-1] == "7"
    assert json.loads(rec_path.read_text())["status"] == "ok"

    # a probe cut short by a time limit is reported as not finished (and is not a fit)
    cut = runs / "cpu-example" / "ac-on-prefetch-none" / "mbs2" / "record.json"
    cut.parent.mkdir()
    rec = json.loads((runs / "cpu-example" / "ac-on-prefetch-none" / "mbs1" / "record.json").read_text())
    rec.update(status="killed", error="deadline: the command's time ran out", micro_batch_size=2, row_id="mbs2")
    cut.write_text(json.dumps(rec))
    p = subprocess.run(
        [sys.executable, "-m", "tunelab", "report", str(runs), "--out", str(report)],
        cwd=ROOT,
        env=cpu_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 0, p.stderr
    md = (report / "results.md").read_text()
    assert (
        "| cpu-example | fsdp-ac | 1; search cut at 2 |" in md
        and "Not finished" in md
        and "| 2 | killed: deadline" in md
    )
