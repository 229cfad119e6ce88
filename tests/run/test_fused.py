"""Liger-Kernel's fused kernels in litgpt's model (a strategy's ``liger`` switch, tunelab/run/fused.py).

Liger's kernels are Triton's. On this CPU they run under Triton's interpreter (``TRITON_INTERPRET=1``, set before
Triton is imported, hence a subprocess): the fused linear cross-entropy, litgpt's loss without the logits, is
compared with litgpt's own forward and ``chunked_cross_entropy`` (loss and every gradient). Liger's RMSNorm and
SwiGLU kernels take float arguments the interpreter cannot pass: their comparison needs a GPU (marked ``gpu``).
"""

from __future__ import annotations

import pytest

from tunelab.strategies import StrategyError, load_strategy


def test_the_switch_is_refused_where_it_cannot_run(tmp_path):
    """One line each, before any model is built: a wrapped model (the fused loss bypasses the wrapper's forward),
    Liger's norms inside compiled blocks, and a value that is not a mode."""
    with pytest.raises(StrategyError, match="liger: loss under ddp.*name: single"):
        _strategy(tmp_path, "name: ddp\nliger: loss\n").check({})
    with pytest.raises(StrategyError, match="liger: all with compile: blocks"):
        _strategy(tmp_path, "name: single\ncompile: blocks\nliger: all\n").check({})
    with pytest.raises(StrategyError, match=r"liger: 'fused' is not a choice; fix: one of \('loss', 'all', None\)"):
        _strategy(tmp_path, "name: single\nliger: fused\n")
    _strategy(tmp_path, "name: single\ncompile: blocks\nliger: loss\n").check({"lora_head": True})


def _strategy(tmp_path, text: str):
    path = tmp_path / "s.yaml"
    path.write_text(text)
    return load_strategy(path)
