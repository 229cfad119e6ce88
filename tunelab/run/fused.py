"""Liger-Kernel's fused Triton kernels in litgpt's model (a strategy's ``liger`` switch, tunelab's loop, one device).

``liger: loss`` runs the lm_head and the cross-entropy as one fused operation over chunks of positions, so the micro
batch's logits never exist (the logits in the compute dtype, the softmax in fp32, as litgpt's loss on Fabric's fp32
outputs); the loop calls the model's trunk (:func:`tunelab.gpt.hidden_states`) and hands the last norm's output to
it. ``liger: all`` also swaps in Liger's RMSNorm (casting mode "gemma": litgpt's fp32 norm) and SwiGLU; not with
``compile: blocks``, whose inductor kernels fuse them already. Triton's kernels need a CUDA GPU: on a CPU the
switch is off (said in the record), except under ``TRITON_INTERPRET=1``, which the tests use. Liger's loss reads
its count of targets to the host once per micro batch (an ``.item()`` inside liger-kernel): the one synchronisation
per iteration the fast loop keeps on a GPU.
"""

from __future__ import annotations

import os
import types

import torch

from tunelab.gpt import head_operands, hidden_states

MODES = ("loss", "all")
"""The strategy key ``liger``'s values: the fused loss alone, or the loss with RMSNorm and SwiGLU."""
IGNORE_INDEX = -100
"""litgpt's ignore index for masked targets (``chunked_cross_entropy``'s default)."""


def unavailable(device: torch.device) -> str | None:
    """Why Liger's kernels cannot run on ``device`` (None when they can): a CUDA GPU, or Triton's interpreter."""
    if device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
        return "Liger's Triton kernels need a CUDA GPU (tests run them under TRITON_INTERPRET=1)"
    try:
        import liger_kernel.transformers.functional  # noqa: F401
    except ImportError as e:  # the pinned stack has it; a hand-made environment may not
        return f"liger-kernel is not importable ({e}); fix: pip install -r requirements.txt"
    return None


def apply(model, mode: str) -> list[str]:
    """Swap litgpt's RMSNorm and SwiGLU forwards for Liger's (``mode == "all"``); the kernels now in use, in words
    (the loss is fused by :func:`loss`, which the loop calls)."""
    used = ["fused linear cross-entropy"]
    if mode != "all":
        return used
    from litgpt.model import LLaMAMLP, RMSNorm

    norms = mlps = 0
    for module in model.modules():
        if isinstance(module, RMSNorm) and module.dim == -1:
            module.forward = types.MethodType(_rms_norm_forward, module)
            norms += 1
        elif isinstance(module, LLaMAMLP):  # GemmaMLP (tanh GELU) is a subclass with its own forward: left alone
            if type(module).forward is LLaMAMLP.forward:
                module.forward = types.MethodType(_swiglu_forward, module)
                mlps += 1
    if norms:
        used.append(f"RMSNorm x{norms}")
    if mlps:
        used.append(f"SwiGLU x{mlps}")
    return used


def _rms_norm_forward(self, x: torch.Tensor) -> torch.Tensor:
    from liger_kernel.transformers.functional import liger_rms_norm

    # not in place: litgpt's residual stream reads the norm's output gradient's storage no more, but a norm whose
    # input is shared (parallel residual) would see its gradient overwritten
    offset = 1.0 if self.add_unit_offset else 0.0
    return liger_rms_norm(x, self.weight, self.eps, offset=offset, casting_mode="gemma", in_place=False)


def _swiglu_forward(self, x: torch.Tensor) -> torch.Tensor:
    from liger_kernel.transformers.functional import liger_swiglu

    return self.proj(liger_swiglu(self.fc_1(x), self.fc_2(x)))


def loss(gpt, input_ids: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """litgpt's training loss, fused: the mean cross-entropy of the shifted targets (ignore index -100) over the
    head's logits, with final-logit softcapping where the config has it, the logits never materialised."""
    from liger_kernel.transformers.functional import liger_fused_linear_cross_entropy

    h, weight, bias = head_operands(gpt, hidden_states(gpt, input_ids)[:, :-1, :])
    return liger_fused_linear_cross_entropy(
        h.reshape(-1, h.size(-1)),
        weight,
        targets[:, 1:].reshape(-1),
        bias,
        ignore_index=IGNORE_INDEX,
        softcap=gpt.config.final_logit_softcapping,
    )
