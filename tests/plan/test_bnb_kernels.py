"""QLoRA's step on a GPU (tunelab/plan/model/bnb_kernels.py with the traced step): bitsandbytes' constants are the fit to
the H200 QLoRA grid's stated lines, and the rest of that grid holds out of sample; the kernel counts follow
bitsandbytes' code (one dequantization per 4-bit matmul forward, one backward, the head per 128-token chunk)."""

from __future__ import annotations

import pytest

from tests.conftest import ROOT
from tunelab.plan.model import bnb_kernels, kernels
from tunelab.plan.trace.tables import TRACED
from tunelab.report import evidence, profiles

SEQ = 437


def _lines() -> dict:
    return {
        (m["model"], m["method"], m["micro"]): m for m in profiles.read_grid(ROOT / evidence.path(*profiles.GRID_QLORA))
    }


def _rows() -> dict:
    return {
        (r["model"], r["method"], r["micro"]): r["pairs"] for r in profiles.grid_rows(ROOT, profiles.GRID_QLORA, "H200")
    }


def _step(model: str, method: str, micro: int):
    from litgpt import Config

    optimizer = "PagedAdamW" if method == "qlora" else "AdamW"
    return kernels.step_time(
        kernels.Step(
            Config.from_name(model), method, "bf16-true", micro, SEQ, optimizer, profiles.lora_profiled(method)
        ),
        "H200",
        tables=TRACED,
    )  # the adapters the grid's lines ran


def test_constants_are_the_fit_to_the_stated_lines():
    """DEQUANT_EFFICIENCY from OpenLLaMA 7B's dequantization kernels at micro 4; the host's work per 4-bit matmul
    (forward, backward) and per PagedAdamW tensor from TinyLlama's QLoRA phases at micro 4 against its LoRA twin's
    host time per op on the same machine, less the ops the model already counts there."""
    from litgpt import Config

    from tunelab import hardware
    from tunelab.models import lora_tensor_numels
    from tunelab.settings import LORA_TARGETS

    lines = _lines()
    seven = Config.from_name("open_llama_7b")
    weights = sum(w for p, (w, _) in bnb_kernels.quantized(seven, SEQ).items() if p != "validation")
    measured = lines[("open_llama_7b", "qlora", 4)]["kernels"]["dequantization"]
    rate = kernels.memory_rate(hardware.lookup("H200"))
    assert weights * bnb_kernels.DEQUANT_BYTES_PER_WEIGHT / measured / rate == pytest.approx(
        bnb_kernels.DEQUANT_EFFICIENCY, abs=0.01
    )

    tiny = Config.from_name("tiny-llama-1.1b")
    lora, qlora = lines[("tiny-llama-1.1b", "lora", 4)]["host_phases"], lines[("tiny-llama-1.1b", "qlora", 4)]
    twin, st = _step("tiny-llama-1.1b", "lora", 4), _step("tiny-llama-1.1b", "qlora", 4)
    per_op = (lora["forward"] + lora["loss"] + lora["backward"]) / (
        twin.host_ops("forward") + twin.host_ops("backward")
    )
    n = bnb_kernels.quantized(tiny, SEQ)["forward"][1]
    tensors = len(lora_tensor_numels(tiny, 32, LORA_TARGETS))
    h = qlora["host_phases"]
    fitted = {
        "forward": ((h["forward"] + h["loss"]) / per_op - st.host_ops("forward")) / n
        + bnb_kernels.FORWARD_HOST_OPS_PER_MATMUL,
        "backward": (h["backward"] / per_op - st.host_ops("backward")) / n + bnb_kernels.BACKWARD_HOST_OPS_PER_MATMUL,
        "optimizer": (h["optimizer"] / per_op - st.host_ops("optimizer")) / tensors
        + bnb_kernels.PAGED_ADAMW_HOST_OPS_PER_TENSOR,
    }
    assert fitted["forward"] == pytest.approx(bnb_kernels.FORWARD_HOST_OPS_PER_MATMUL, abs=0.05)
    assert fitted["backward"] == pytest.approx(bnb_kernels.BACKWARD_HOST_OPS_PER_MATMUL, abs=0.05)
    assert fitted["optimizer"] == pytest.approx(bnb_kernels.PAGED_ADAMW_HOST_OPS_PER_TENSOR, abs=0.05)


def test_dequantization_kernels_are_counted_from_bitsandbytes_code():
    """One dequantization per 4-bit matmul forward and one backward, the head's per 128-token chunk: as many
    kernels as the profiler counted on every QLoRA line (at micro 1 one head chunk of 53 rows took bitsandbytes'
    fused kernel instead: one fewer); TinyLlama 22 x 5 + 4 a pass, OpenLLaMA 7B 32 x 5 + 4."""
    from litgpt import Config

    q = bnb_kernels.quantized(Config.from_name("tiny-llama-1.1b"), SEQ)
    assert q["forward"][1] == q["backward"][1] == 22 * 5 + 4 and q["validation"][1] == 22 * 5 + 1
    for (model, method, micro), m in _lines().items():
        if method != "qlora":
            assert "dequantization" not in m["launches"]
            continue
        st = _step(model, method, micro)
        counted = sum(bnb_kernels.quantized(Config.from_name(model), SEQ)[p][1] for p in ("forward", "backward"))
        assert st.gpu_by_category["dequantization"] > 0
        assert counted - (micro == 1) == m["launches"]["dequantization"], (model, micro)


def test_qlora_lines_hold_out_of_sample():
    """The lines no constant was fitted on: dequantization kernels within 12%, the elementwise kernels (the
    backward's float16 -> bfloat16 casts timed as unvectorized copies among them) within 3% on TinyLlama, the
    launch-bound optimizer phases (PagedAdamW's Python, tensor by tensor) within 6%, TinyLlama's launch-bound step at
    micro 1 within 5%, OpenLLaMA 7B's at micro 8 within 15%."""
    rows = _rows()
    fitted = evidence.fitted_shapes("H200")
    for key, pairs in rows.items():
        if key[1] == "qlora" and key not in fitted:
            assert abs(pairs["dequantization"][2]) <= 0.12, key
    for micro in (1, 4, 16):
        assert abs(rows[("tiny-llama-1.1b", "qlora", micro)]["elementwise, loss, copies"][2]) <= 0.03, micro
    for key in (("tiny-llama-1.1b", "qlora", 1), ("open_llama_7b", "qlora", 4)):
        assert abs(rows[key]["optimizer (phase)"][2]) <= 0.06, key
    assert abs(rows[("tiny-llama-1.1b", "qlora", 1)]["step"][2]) <= 0.05
    assert abs(rows[("open_llama_7b", "qlora", 8)]["step"][2]) <= 0.15


def test_qlora_plans_by_cause_on_the_lab_row():
    """The lab's s13 (OpenLLaMA 7B QLoRA on an A100, out of sample): within 10% and inside its band, no longer the
    kernel model's widest miss on the lab's rows (it was -15% while a generated token's 4-bit matmuls cost the host
    nothing), with dequantization, the host's launches and generation as causes; its generated tokens take longer
    than LoRA's twin (s12), all else of their decode alike."""
    from tunelab.plan.model import runtime
    from tunelab.report.runtime_accuracy import a100_rows

    rows = {r["id"]: r for r in a100_rows() if r["kernel_s"] is not None and not r["host_bound"]}
    s13 = rows["s13"]
    assert abs(s13["error"]) <= 0.10 and s13 != max(rows.values(), key=lambda r: abs(r["error"]))
    assert s13["lab_s"] <= s13["kernel_s"] * (1 + runtime.KERNEL_MODEL_ERROR)  # the band holds it
    assert s13["dequantization"] > 0 and s13["host launches"] > 0
    assert s13["generation"] > 1.5 * rows["s12"]["generation"]


def test_a_generated_tokens_4bit_matmuls_cost_the_host_their_measured_python():
    """A generated token (one row) runs bitsandbytes' ``gemv_4bit``: no dequantization kernel, but its Python per
    4-bit matmul, at the archived CPU measurement's share of the forward's (evidence ``cpu-bnb-host``, the medians
    over its reps), counted among the decode phase's ops, which the plan charges at the decode share of a training
    op; a validation batch likewise. The decoded token's GPU time stays the traced 16-bit matmul's."""
    import json

    from litgpt import Config

    result = json.loads((ROOT / evidence.path("cpu-bnb-host", "results", ROOT)).read_text())
    assert len(result["reps"]) >= 5
    for phase, share in bnb_kernels.EVAL_PYTHON_SHARE.items():
        assert share == round(result["summary"][f"{phase}_ratio"]["median"], 3) and 0.5 < share < 1
    q, lo = _step("open_llama_7b", "qlora", 4), _step("open_llama_7b", "lora", 4)
    matmuls = 32 * 5 + 1
    for phase in ("decode", "validation"):
        python = bnb_kernels.FORWARD_HOST_OPS_PER_MATMUL * bnb_kernels.EVAL_PYTHON_SHARE[phase]
        added = q.host_ops_by_phase[phase] - lo.host_ops_by_phase[phase]
        kernels_added = q.ops_by_phase.get(phase, 0) - lo.ops_by_phase.get(phase, 0)
        assert added - kernels_added == round(matmuls * python / kernels.eval_host_share(phase, "qlora")), phase
    share = {phase: kernels.eval_host_share(phase, "qlora") for phase in bnb_kernels.EVAL_PYTHON_SHARE}
    work = bnb_kernels.qlora_work(Config.from_name("open_llama_7b"), SEQ, 4.8e12, kernels.MIN_KERNEL_S, share)
    assert work["decode"][:2] == (0, 0) and work["validation"][1] == matmuls  # gemv_4bit: the matmul's own kernel


def test_litgpt_loop_carries_the_constants_out_of_sample():
    """litgpt's own loop on another H200 process (reports/2026-11-27-qlora-time-h200/, TinyLlama micro 4 x 4): the
    QLoRA row within 15% at the H100 machine's host constant, QLoRA over LoRA within 10% of the measured ratio
    (1.44x), and the two rows imply host times per op within 10% of each other: bitsandbytes' host work, fitted on
    the isolated step, is what the loop pays too."""
    from tunelab.report.runtime_accuracy import steps_rows

    rows = {r["recipe"]: r for r in steps_rows(ROOT, "h200-qlora-time")}
    q, lo = rows["tiny-llama-1.1b/qlora"], rows["tiny-llama-1.1b/lora"]
    assert q["host_bound"] and lo["host_bound"]
    assert abs(q["error"]) <= 0.15
    ratio = (q["predicted_s"] / lo["predicted_s"]) / (q["measured_s"] / lo["measured_s"])
    assert abs(ratio - 1) <= 0.10, ratio
    assert q["implied_host_us"] == pytest.approx(lo["implied_host_us"], rel=0.10)
