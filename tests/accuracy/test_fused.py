"""Liger-Kernel's fused kernels in litgpt's model (a strategy's ``liger`` switch, tunelab/run/fused.py).

Liger's kernels are Triton's. On this CPU they run under Triton's interpreter (``TRITON_INTERPRET=1``, set before
Triton is imported, hence a subprocess): the fused linear cross-entropy, litgpt's loss without the logits, is
compared with litgpt's own forward and ``chunked_cross_entropy`` (loss and every gradient). Liger's RMSNorm and
SwiGLU kernels take float arguments the interpreter cannot pass: their comparison needs a GPU (marked ``gpu``).
"""

from __future__ import annotations

import pytest

from tunelab.plan.trace.tables import TRACED


def test_the_plan_counts_the_fused_loss_as_the_simulated_step_holds():
    """The planner's fused-loss term (``liger_loss_bytes``) against the simulated step running Liger's allocations
    (its Python code, the Triton kernel in place), for a 32k and a 128k vocabulary, full and LoRA (adapted head),
    bf16-true and bf16-mixed (autocast's weight copies): within 1%; and the fused plan is the smaller by at least
    the micro batch's fp32 logits (what the fused loss exists to remove)."""
    from litgpt import Config

    from tunelab.plan.model import memory
    from tunelab.plan.trace.simulate import simulate

    for name, method, precision, accumulation in (
        ("tiny-llama-1.1b", "full", "bf16-true", 2),
        ("tiny-llama-1.1b", "lora", "bf16-true", 1),
        ("Llama-3.2-1B", "lora", "bf16-mixed", 1),
        ("Llama-3.2-1B", "full", "bf16-mixed", 2),
    ):
        c = Config.from_name(name)
        x = memory.PlanInput.of(
            config=c,
            method=method,
            precision=precision,
            micro_batch_size=4,
            seq_len=512,
            accumulation=accumulation,
            fabric=False,
            fused_loss=True,
            tables=TRACED,
        )
        sim = simulate(x)
        planned = memory.predict(x).peak_allocated_bytes
        assert planned == pytest.approx(sim.peak_bytes, rel=0.01), (name, method, precision, sim.peak_phase)
        plain = memory.predict(x.changed(fused_loss=False))
        if plain.peak_allocated_bytes > planned:  # not when the optimizer step is the peak of both
            assert plain.peak_allocated_bytes - planned >= 4 * 512 * c.padded_vocab_size * 4 * 0.9
