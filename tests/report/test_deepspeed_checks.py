"""DeepSpeed run for real against the plan, per family (tunelab.report.deepspeed_checks): the shrunk models keep their
family's shape, the table reads back what it wrote and refuses a foreign one in a line, the section names the
worst row. DeepSpeed itself runs in tests/e2e/test_deepspeed_memory.py."""

from __future__ import annotations

import pytest

from tunelab.errors import InputError
from tunelab.report import deepspeed_checks as dc
from tunelab.run.deepspeed_probe import scaled


def test_a_shrunk_family_keeps_its_shape():
    """Gemma 2B keeps one key-value group and its 256k vocabulary's share of the model; Phi-2 its biases,
    LayerNorm, parallel residual and partial rotary; every block stays."""
    gemma, phi = scaled("gemma-2b", 16), scaled("phi-2", 16)
    assert (gemma.n_layer, gemma.n_embd, gemma.n_query_groups, gemma.padded_vocab_size) == (18, 128, 1, 16000)
    assert gemma.head_size * gemma.n_head == gemma.n_embd
    assert (phi.n_layer, phi.bias, phi.norm_class_name, phi.parallel_residual) == (32, True, "LayerNorm", True)
    assert phi.rope_n_elem == int(phi.head_size * 0.4)
    x = dc.plan_input("gemma-2b", 4)
    assert (x.options.zero_stage, x.world, x.options.reduce_bucket_size) == (2, 4, 781_250)


def test_zero3_runs_and_is_planned_with_deepspeeds_defaults_shrunk_alike():
    """ZeRO-3's element counts shrink with the matrices (/ 16^2), in the probe's DeepSpeed config and in the plan
    alike; it is measured by the profiler (MemTracker keeps its released parameters alive), ZeRO-2 by MemTracker."""
    x = dc.plan_input("tiny-llama-1.1b", 2, 3)
    assert x.options.zero_stage == 3 and x.options.zero3_param_persistence_threshold == 390
    assert x.options.zero3_max_live_parameters == x.options.zero3_max_reuse_distance == 3_906_250
    case = dc.probe_case("tiny-llama-1.1b", 3)
    assert case["measure"] == "profiler" and case["zero"]["stage3_prefetch_bucket_size"] == 195_312
    assert case["zero"]["stage3_param_persistence_threshold"] == x.options.zero3_param_persistence_threshold
    assert "measure" not in dc.probe_case("tiny-llama-1.1b", 2)


def test_the_table_reads_back_and_refuses_a_foreign_one(tmp_path):
    found = [
        dc.ZeroRow("Gemma 2B", "gemma-2b", 2, 5_000_000, 201.4e6, 201.34e6, 90.0),
        dc.ZeroRow("Phi-2", "phi-2", 4, 4_000_000, 141.5e6, 144.08e6, 90.0),
        dc.ZeroRow("Phi-2", "phi-2", 4, 4_000_000, 90.0e6, 100.0e6, 120.0, 3),
    ]
    dc.write(found, tmp_path)
    assert dc.read(tmp_path / dc.CSV_NAME) == found
    text = "\n".join(dc.section(found))
    assert "Worst: ZeRO-2 -1.8% (Phi-2 on 4); ZeRO-3 -10.0% (Phi-2 on 4)" in text
    assert "| Gemma 2B | gemma-2b | ZeRO-2 | 2 | 5,000,000 | 201.40 | 201.34 | +0.0% |" in text
    assert dc.section([]) == []
    (tmp_path / "other.csv").write_text("family,world\nGemma 2B,2\n")
    with pytest.raises(InputError, match="other.csv: not a deepspeed.csv"):
        dc.read(tmp_path / "other.csv")
