"""scripts/bench_wrapper_host.py: an FSDP wrapper's host work per unit, in ops of the plain loop, as the planner
charges it (its arithmetic on known timings, a real short run as a child process, bad input in one line)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest

from tests.conftest import ROOT

sys.path.insert(0, str(ROOT / "scripts"))
import bench_wrapper_host as bench  # noqa: E402


def _phase(seconds: float, ops: int) -> dict:
    return {"forward_s": seconds, "backward_s": 2 * seconds, "ops": {"forward": ops, "backward": 2 * ops}}


def test_op_equivalents_are_the_wrappers_extra_seconds_over_the_plain_loops_seconds_per_op():
    """Plain: 10 ms at 2 blocks and 40 ms at 8 for 100 and 400 ops (0.1 ms an op); wrapped: 14 ms and 50 ms. The
    wrapper adds (36 - 30) / 6 = 1 ms a block (10 ops) and 14 - 10 - 2 x 1 = 2 ms beside (20 ops); the backward,
    twice every time and count, takes twice the seconds at the same time per op: 20 and 40 ops."""
    rep = {
        "plain-2": _phase(0.010, 100),
        "plain-8": _phase(0.040, 400),
        "wrapped-2": _phase(0.014, 90),
        "wrapped-8": _phase(0.050, 360),
    }
    got = bench.derived(rep)
    for phase, scale in (("forward", 1), ("backward", 2)):
        assert got[phase]["ops_per_unit"] == pytest.approx(10 * scale)
        assert got[phase]["ops_fixed"] == pytest.approx(20 * scale)
        assert got[phase]["us_per_op"] == pytest.approx(100)
    summary = bench.summary([rep, rep])
    assert summary["ops_per_unit"] == {"median": pytest.approx(30), "min": pytest.approx(30), "max": pytest.approx(30)}
    # a checkpointed wrapper's seconds at the unchecked loop's time per op: 20 ms over 400 ops, 0.05 ms an op
    rep |= {"reference-2": _phase(0.005, 100), "reference-8": _phase(0.025, 500)}
    got = bench.derived(rep)
    assert got["forward"]["ops_per_unit"] == pytest.approx(20) and got["forward"]["us_per_op"] == pytest.approx(50)


def test_a_short_run_writes_its_reps_and_table_and_bad_cases_are_one_line(tmp_path):
    out = tmp_path / "wrapper.json"
    cmd = [sys.executable, str(ROOT / "scripts" / "bench_wrapper_host.py"), "--reps", "1", "--iters", "2"]
    proc = subprocess.run(
        [*cmd, "--warmup", "0", "--cases", "litgpt-fsdp1:1", "--json-out", str(out)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(out.read_text())
    (case,) = result["cases"].values()
    assert case["world"] == 1 and len(case["reps"]) == 1 and case["method"] == "full"
    assert set(case["reps"][0]) == {f"{run}-{n}" for run in ("plain", "wrapped", "reference") for n in (2, 8)}
    assert all(math.isfinite(v["median"]) for v in case["summary"].values())
    assert "| litgpt-fsdp1 | 1 | full | bf16-mixed |" in out.with_suffix(".md").read_text()
    for bad in ("nope:2", "fsdp:0", "fsdp"):
        proc = subprocess.run([*cmd, "--cases", bad], capture_output=True, text=True, timeout=120)
        assert proc.returncode == 2 and "--cases" in proc.stderr and "Traceback" not in proc.stderr, bad
    os.mkfifo(tmp_path / "piped.md")  # the table's place: refused before anything runs, the FIFO never opened
    for target, words in ((tmp_path / "piped.json", "FIFO"), (tmp_path / "out.txt", "a .json file")):
        proc = subprocess.run([*cmd, "--json-out", str(target)], capture_output=True, text=True, timeout=120)
        assert proc.returncode == 2 and words in proc.stderr and "Traceback" not in proc.stderr, target
