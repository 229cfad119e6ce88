"""scripts/bench_bnb_host.py: bitsandbytes' Python per 4-bit matmul in a validation batch and a decoded token against
the training forward's, as the planner's EVAL_PYTHON_SHARE takes it (its arithmetic on known timings, a real short
run with the kernels stubbed, bad input in one line)."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest

from tests.conftest import ROOT

sys.path.insert(0, str(ROOT / "scripts"))
import bench_bnb_host as bench  # noqa: E402


def _rep(forward: tuple, validation: tuple, decode: tuple) -> dict:
    return {p: {"linear": t[0], "nf4": t[1]} for p, t in zip(bench.PHASES, (forward, validation, decode))}


def test_each_phases_share_is_its_added_python_over_the_forwards():
    """Forward: the plain layer 20 us, the 4-bit one 60 (40 added); validation 10 and 40 (30: 0.75); decode 5 and 25
    (20: 0.5). What the plain layer costs cancels."""
    rep = _rep((20e-6, 60e-6), (10e-6, 40e-6), (5e-6, 25e-6))
    got = bench.derived(rep)
    assert got["forward_extra_us"] == pytest.approx(40)
    assert got["validation_ratio"] == pytest.approx(0.75) and got["decode_ratio"] == pytest.approx(0.5)
    slower = _rep((20e-6, 60e-6), (10e-6, 40e-6), (5e-6, 45e-6))
    assert bench.summary([rep, slower, rep])["decode_ratio"] == {
        "median": pytest.approx(0.5),
        "min": pytest.approx(0.5),
        "max": pytest.approx(1.0),
    }


def test_a_short_run_writes_its_reps_and_table_and_bad_input_is_one_line(tmp_path):
    out = tmp_path / "bnb.json"
    cmd = [sys.executable, str(ROOT / "scripts" / "bench_bnb_host.py"), "--reps", "1", "--iters", "20"]
    proc = subprocess.run([*cmd, "--warmup", "2", "--json-out", str(out)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(out.read_text())
    assert len(result["reps"]) == 1 and set(result["reps"][0]) == set(bench.PHASES)
    rep = result["reps"][0]
    assert all(rep[p]["nf4"] > rep[p]["linear"] > 0 for p in bench.PHASES)  # bitsandbytes' Python on top
    assert all(math.isfinite(v["median"]) for v in result["summary"].values())
    assert result["bitsandbytes"] and "| forward us |" in out.with_suffix(".md").read_text()
    for bad, words in ((["--iters", "0"], "--iters"), (["--json-out", str(tmp_path / "out.txt")], "a .json file")):
        proc = subprocess.run([*cmd, *bad], capture_output=True, text=True, timeout=120)
        assert proc.returncode == 2 and words in proc.stderr and "Traceback" not in proc.stderr, bad


def test_the_4bit_layer_is_the_one_litgpts_bnb_nf4_builds():
    """litgpt's ``--quantize bnb.nf4`` is Lightning's ``nf4`` mode: NF4 without double quantization (``nf4-dq`` would
    add a dequantization of the absmax, and its Python, to every call). The layer measured is quantized alike."""
    import torch
    from lightning.fabric.plugins.precision.bitsandbytes import BitsandbytesPrecision

    lightning = BitsandbytesPrecision("nf4", dtype=torch.bfloat16)._linear_cls(8, 8, bias=False)
    measured = bench._layers()["nf4"]
    assert measured.weight.quant_state.nested is False and measured.weight.quant_state.quant_type == "nf4"
    assert measured.weight.compress_statistics == lightning.weight.compress_statistics is False
    assert measured.weight.quant_type == lightning.weight.quant_type == "nf4"


def test_the_version_decides_the_stubs_and_an_unmeasured_one_is_one_line(monkeypatch, capsys):
    """bitsandbytes 0.40-0.41 call their CUDA library through ctypes (stubbed by a library whose every kernel does
    nothing); 0.43 on register torch custom ops; 0.42 (ctypes, a state object) and anything before 0.40 are refused."""
    import importlib.metadata

    for found, legacy in (("0.40.2", True), ("0.41.1", True), ("0.43.0", False), ("0.50.2", False)):
        monkeypatch.setattr(importlib.metadata, "version", lambda name, v=found: v)
        assert bench._legacy() is legacy, found
    for found in ("0.42.0", "0.39.1"):
        monkeypatch.setattr(importlib.metadata, "version", lambda name, v=found: v)
        with pytest.raises(SystemExit) as e:
            bench._legacy()
        assert str(e.value).startswith("bench_bnb_host.py: error:") and found in str(e.value), found
    assert bench._NoKernels().cgemm_4bit_inference_naive_bf16(1, 2, 3) is None
