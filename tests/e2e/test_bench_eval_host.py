"""scripts/bench_eval_host.py: the host's time per op of litgpt's validation batch and decoded token against its
training step, as the planner's EVAL_HOST_SHARE takes it (its arithmetic on known timings, a real short run, bad
input in one line)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest

from tests.conftest import ROOT

sys.path.insert(0, str(ROOT / "scripts"))
import bench_eval_host as bench  # noqa: E402


def _model(training: float, validation: float, decode: float, ops: int) -> dict:
    seconds = {"training_s": training, "validation_s": validation, "decode_s": decode}
    return {**seconds, "ops": {"training": 3 * ops, "validation": ops, "decode": ops}}


def test_each_phases_share_is_its_time_per_op_growth_over_the_training_steps():
    """Training: 30 ms at 2 blocks and 90 ms at 8 for 300 and 900 ops (0.1 ms an op); validation 10 and 25 ms over
    100 and 300 ops (0.075 ms: 0.75 of training's); decode 8 and 18 ms (0.05 ms: 0.5). What runs once a step (the
    head, the sampling) cancels in the growth."""
    rep = {"full-2": _model(0.030, 0.010, 0.008, 100), "full-8": _model(0.090, 0.025, 0.018, 300)}
    got = bench.derived(rep, "full")
    assert got["training_us_per_op"] == pytest.approx(100)
    assert got["validation_ratio"] == pytest.approx(0.75) and got["decode_ratio"] == pytest.approx(0.5)
    slower = {"full-2": _model(0.030, 0.010, 0.008, 100), "full-8": _model(0.090, 0.025, 0.028, 300)}
    summary = bench.summary([rep, slower, rep], "full")
    assert summary["decode_ratio"] == {
        "median": pytest.approx(0.5),
        "min": pytest.approx(0.5),
        "max": pytest.approx(1.0),
    }


def test_a_short_run_writes_its_reps_and_table_and_bad_input_is_one_line(tmp_path):
    out = tmp_path / "eval.json"
    cmd = [sys.executable, str(ROOT / "scripts" / "bench_eval_host.py"), "--reps", "1", "--iters", "2"]
    proc = subprocess.run([*cmd, "--warmup", "0", "--json-out", str(out)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(out.read_text())
    assert len(result["reps"]) == 1 and set(result["methods"]) == {"full", "lora"}
    assert set(result["reps"][0]) == {f"{m}-{n}" for m in ("full", "lora") for n in (2, 8)}
    ops = result["reps"][0]["lora-8"]["ops"]
    assert ops["training"] > ops["validation"] > 0 and ops["decode"] > 0
    assert all(math.isfinite(v["median"]) for st in result["methods"].values() for v in st.values())
    assert "| full |" in out.with_suffix(".md").read_text()
    proc = subprocess.run([*cmd, "--reps", "0"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "--reps" in proc.stderr and "Traceback" not in proc.stderr
    os.mkfifo(tmp_path / "piped.md")  # the table's place: refused before anything runs, the FIFO never opened
    for target, words in ((tmp_path / "piped.json", "FIFO"), (tmp_path / "out.txt", "a .json file")):
        proc = subprocess.run([*cmd, "--json-out", str(target)], capture_output=True, text=True, timeout=120)
        assert proc.returncode == 2 and words in proc.stderr and "Traceback" not in proc.stderr, target
