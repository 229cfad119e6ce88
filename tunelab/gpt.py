"""litgpt's GPT taken apart at the head: the trunk's output and the head's operands, for a loss that fuses the head
(Liger's fused linear cross-entropy in :mod:`tunelab.run.fused`) and for the planner's simulation of it
(:mod:`tunelab.plan.trace.simulate`). Imports torch only when called.
"""

from __future__ import annotations


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
