"""Liger-Kernel's fused Triton kernels in litgpt's model (a strategy's ``liger`` switch, tunelab's loop, one device).

``liger: loss`` runs the lm_head and the cross-entropy as one fused operation over chunks of positions, so the micro
batch's logits never exist (the logits in the compute dtype, the softmax in fp32, as litgpt's loss on Fabric's fp32
outputs); the loop calls the model's trunk (:func:`tunelab.gpt.hidden_states`) and hands the last norm's output to
it. ``liger: all`` also swaps in Liger's RMSNorm (casting mode "gemma": litgpt's fp32 norm) and SwiGLU; not with
``compile: blocks``, whose inductor kernels fuse them already. Triton's kernels need a CUDA GPU: on a CPU the
switch is off (said in the record), except under ``TRITON_INTERPRET=1``, which the tests use. The loss runs Liger's
kernels (pinned: their arguments are the pinned version's) through :func:`tunelab.gpt.fused_head_loss`, which takes
the count of targets from the host (read once per sample at tokenisation): Liger's own wrapper reads it back from the
GPU in every micro batch, which drains the queue the loop keeps ahead of the GPU.
"""

from __future__ import annotations

import os
import types

import torch

from tunelab.gpt import IGNORE_INDEX, fused_head_loss, head_operands, hidden_states

READS_PER_MICRO_BATCH = 0
"""Values :func:`loss` reads back from the GPU per micro batch (the record's ``fused_loss_reads``): none."""


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


def loss(gpt, input_ids: torch.Tensor, targets: torch.Tensor, counted: int) -> torch.Tensor:
    """litgpt's training loss, fused: the mean cross-entropy of the shifted targets (ignore index -100; ``counted``
    of them are not, a count from the host) over the head's logits, with final-logit softcapping where the
    config has it, the logits never materialised and nothing read back to the host (:func:`tunelab.gpt.
    fused_head_loss` with Liger's kernels)."""
    h, weight, bias = head_operands(gpt, hidden_states(gpt, input_ids)[:, :-1, :])
    x = h.reshape(-1, h.size(-1))
    softcap = gpt.config.final_logit_softcapping
    return fused_head_loss(x, weight, targets[:, 1:].reshape(-1), counted, bias, softcap, LigerKernels)


class LigerKernels:
    """Liger's Triton kernels as :func:`tunelab.gpt.fused_head_loss` runs them, with the arguments Liger's fused
    linear cross-entropy (0.8.5) gives them: its cross-entropy kernel (mean over ``counted``, the logits' gradient
    written over them) and its in-place scaling by the upstream gradient, read on the device."""

    @staticmethod
    def cross_entropy(logits, target, loss_rows, counted: int, softcap) -> None:
        import triton
        from liger_kernel.ops.cross_entropy import liger_cross_entropy_kernel
        from liger_kernel.ops.fused_linear_cross_entropy import MAX_FUSED_SIZE

        rows, vocab = logits.shape
        liger_cross_entropy_kernel[(rows,)](
            X_ptr=logits,
            X_stride=logits.stride(-2),
            Y_ptr=target,
            Y_stride=target.stride(-1),
            weight_ptr=None,
            loss_ptr=loss_rows,
            z_loss_ptr=None,
            loss_stride=loss_rows.stride(-1),
            token_accuracy_ptr=None,
            token_accuracy_stride=0,
            predicted_tokens_ptr=None,
            predicted_tokens_stride=0,
            n_cols=vocab,
            n_non_ignore=counted,
            sum_non_ignore_weight=counted,
            weight_sum=0.0,
            ignore_index=IGNORE_INDEX,
            lse_square_scale=0.0,
            label_smoothing=0.0,
            reduction="mean",
            softcap=softcap,
            RETURN_Z_LOSS=False,
            RETURN_TOKEN_ACCURACY=False,
            RETURN_PREDICTED_TOKENS=False,
            BLOCK_SIZE=min(MAX_FUSED_SIZE, triton.next_power_of_2(vocab)),
            HAS_WEIGHT=False,
            HAS_SOFTCAPPING=softcap is not None,
            HAS_GRADIENTS=True,
            num_warps=_warps(),
        )

    @staticmethod
    def scale(grad, grad_output) -> None:
        import triton
        from liger_kernel.ops.fused_linear_cross_entropy import MAX_FUSED_SIZE
        from liger_kernel.ops.utils import element_mul_kernel

        rows, cols = grad.shape if grad.dim() == 2 else (grad.shape[0], 1)
        element_mul_kernel[(rows,)](
            grad,
            grad.stride(0) if grad.dim() == 2 else grad.stride(-1),
            grad_output,
            cols,
            BLOCK_SIZE=min(MAX_FUSED_SIZE, triton.next_power_of_2(cols)),
            X_col_stride=grad.stride(-1) if grad.dim() == 2 else 1,
            num_warps=_warps(),
        )


def _warps() -> int:
    """The warps Liger's fused linear cross-entropy launches its kernels with (16 on ROCm)."""
    return 16 if torch.version.hip is not None else 32
