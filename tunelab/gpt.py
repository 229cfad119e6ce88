"""litgpt's GPT taken apart at the head: the trunk's output and the head's operands, for a loss that fuses the head
(Liger's fused linear cross-entropy in :mod:`tunelab.run.fused`) and for the planner's simulation of it
(:mod:`tunelab.plan.trace.simulate`). Imports torch only when called.
"""

from __future__ import annotations

import functools


def hidden_states(gpt, idx):
    """The final norm's output of litgpt's ``GPT.forward(idx)`` for training (no KV cache, the causal mask):
    embedding (scaled where the config says), every block with RoPE's cos/sin, ``ln_f``; the head is the loss's."""
    import torch

    c = gpt.config
    t = idx.size(1)
    if gpt.max_seq_length < t:
        raise ValueError(f"Cannot forward sequence of length {t}, max seq length is only {gpt.max_seq_length}.")
    cos, sin = gpt.cos[:t].unsqueeze(0), gpt.sin[:t].unsqueeze(0)
    x = gpt.transformer.wte(idx)
    if c.scale_embeddings:
        x = x * torch.tensor(c.n_embd**0.5, dtype=x.dtype)
    for i, block in enumerate(gpt.transformer.h):
        if c.rope_indices is not None:
            x = block(x, cos[..., c.rope_indices[i]], sin[..., c.rope_indices[i]], None, None, None)
        else:
            x = block(x, cos, sin, None, None, None)
    return gpt.transformer.ln_f(x)


def head_operands(gpt, h) -> tuple:
    """(input, weight, bias) whose product is the head's logits: the final norm's output and the head's weight; a
    LoRA head (``lora_head``, not merged) appends its adapter as extra columns, ``[h, s * dropout(h) @ A^T]`` times
    ``[W, B]``, which is litgpt's ``h @ W^T + s * (dropout(h) @ A^T @ B^T)`` (LoRA dropout included) with the
    gradient reaching A and B through the concatenations."""
    import torch

    head = gpt.lm_head
    linear = getattr(head, "linear", head)
    if getattr(head, "r", 0) > 0 and not getattr(head, "merged", False):
        adapter = (head.lora_dropout(h) @ head.lora_A.transpose(0, 1)) * head.scaling
        return torch.cat((h, adapter), -1), torch.cat((linear.weight, head.lora_B), 1), linear.bias
    return h, linear.weight, linear.bias


IGNORE_INDEX = -100
"""litgpt's ignore index for targets the loss leaves out (``chunked_cross_entropy``'s default)."""


def fused_loss_chunk_rows(positions: int, vocab: int, hidden: int) -> int:
    """Rows (positions) per chunk of the fused head and loss (:func:`fused_head_loss`, Liger's rule at
    ``chunk_mem_const`` 1): the positions split into ``ceil(vocab / hidden)`` parts, rounded up to a power of two, at
    most all of them, so one chunk's logits (rows x vocabulary) are about the size of the input (positions x hidden)."""
    parts = -(-vocab // hidden)
    rows = 1 << max(0, (-(-positions // parts) - 1).bit_length())
    return min(rows, positions)


def fused_head_loss(x, weight, target, counted: int, bias=None, softcap=None, kernels=None):
    """The mean cross-entropy of ``x @ weight.T (+ bias)`` over the ``counted`` rows whose ``target`` is not ignored,
    without the logits of every row at once and without reading anything back to the host (``counted`` comes from
    the batch's host copy): the rows in chunks (:func:`fused_loss_chunk_rows`), each chunk's logits made by a matmul
    and turned in place by ``kernels.cross_entropy(logits, target_chunk, loss_rows, counted, softcap)`` into the
    gradient of the mean loss (its rows' losses written into ``loss_rows``), multiplied into the input's gradient
    and accumulated into the weight's (and a trainable bias's); backward scales the saved gradients by the upstream
    one on the device (``kernels.scale``). Liger's own wrapper, with the same kernels, reads the count back from the
    device (``.item()``) and compares the upstream gradient with 1 (``torch.equal``): two synchronisations per micro
    batch. ``kernels`` None: the allocations alone (the planner's simulated step, on fake tensors)."""
    return _fused_function().apply(x, weight, target, counted, bias, softcap, kernels)


@functools.cache
def _fused_function():
    """The autograd function behind :func:`fused_head_loss`, made once (torch imported then)."""
    import torch

    class FusedHeadLoss(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, weight, target, counted, bias, softcap, kernels):
            rows, hidden = x.shape
            chunk = fused_loss_chunk_rows(rows, weight.shape[0], hidden)
            grad_input = torch.zeros_like(x)
            grad_weight = torch.zeros_like(weight) if weight.requires_grad else None
            grad_bias = torch.zeros_like(bias) if bias is not None and bias.requires_grad else None
            loss_rows = torch.zeros(rows, dtype=torch.float32, device=x.device)
            for start in range(0, rows, chunk):
                x_chunk = x[start : start + chunk]
                logits = x_chunk @ weight.t()
                if bias is not None:
                    logits.add_(bias)
                if kernels is not None:  # the logits become their gradient in place
                    rows_of = slice(start, start + chunk)
                    kernels.cross_entropy(logits, target[rows_of], loss_rows[rows_of], counted, softcap)
                grad_input[start : start + chunk] = logits @ weight
                if grad_weight is not None:
                    _accumulate(grad_weight, logits.t(), x_chunk)
                if grad_bias is not None:
                    grad_bias += logits.sum(0)
                del logits
            ctx.kernels = kernels
            ctx.save_for_backward(grad_input, grad_weight, grad_bias)
            return loss_rows.sum()

        @staticmethod
        def backward(ctx, grad_output):
            grads = ctx.saved_tensors
            if ctx.kernels is not None:
                for g in grads:
                    if g is not None:
                        ctx.kernels.scale(g, grad_output)
            return grads[0], grads[1], None, None, grads[2], None, None

    return FusedHeadLoss


def _accumulate(into, a, b) -> None:
    """``into += a @ b`` without a weight-sized temporary: in place where the dtypes agree; an fp32 accumulator of
    16-bit products (autocast) by ``addmm``'s ``out_dtype`` on an Ampere or newer GPU, as Liger does, else through
    the product."""
    import torch

    b = b.to(a.dtype)
    if into.dtype == a.dtype:
        into.addmm_(a, b)
    elif into.device.type == "cuda" and torch.cuda.get_device_capability(into.device)[0] >= 8:
        torch.addmm(into, a, b, out_dtype=into.dtype, out=into)
    else:
        into += a @ b
