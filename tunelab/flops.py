"""Training FLOPs per token, by formula, for full fine-tuning and LoRA/QLoRA (shared by the collector and planner).

N is the number of parameters that take part in matrix products: every parameter but the token embedding
(a lookup). Per token, a matmul with a weight of n parameters costs 2n FLOPs forward, 2n for the input gradient
and 2n for the weight gradient:

* full:        6 N                         + attention
* LoRA/QLoRA:  4 N_base + 6 N_lora         + attention   (the frozen base needs forward and input gradients only;
               QLoRA's dequantization is not counted: it is overhead, not model FLOPs)
* attention:   12 x n_layer x n_head x head_size x T per token, T the (padded) sequence length: QK^T and AV,
               forward plus backward, counted without the causal half (the PaLM convention).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class FlopsPerToken:
    total: float
    """Training FLOPs per token."""
    matmul_params: int
    """N: parameters in matrix products (embedding excluded)."""
    lora_params: int
    """Trainable LoRA parameters (0 for full)."""
    attention: float
    """The attention term per token."""
    formula: str
    """Human-readable statement of what was counted."""


def count_params(config) -> tuple[int, int]:
    """(all parameters, token-embedding parameters) of a litgpt Config, counted on the meta device."""
    import torch
    from litgpt.model import GPT

    with torch.device("meta"):
        model = GPT(config)
    total = sum(p.numel() for p in model.parameters())
    return total, model.transformer.wte.weight.numel()


def lora_param_count(config, r: int, targets: dict) -> int:
    """Trainable parameters LoRA adds for rank ``r`` on the given targets (keys as litgpt's lora_* flags)."""
    d, L = config.n_embd, config.n_layer
    q = config.n_head * config.head_size
    kv = config.n_query_groups * config.head_size
    per_layer = 0
    if targets.get("query"):
        per_layer += r * (d + q)
    if targets.get("key"):
        per_layer += r * (d + kv)
    if targets.get("value"):
        per_layer += r * (d + kv)
    if targets.get("projection"):
        per_layer += r * (q + d)
    if targets.get("mlp"):
        n_mlp = 3 if config.mlp_class_name in ("LLaMAMLP", "GemmaMLP") else 2
        per_layer += n_mlp * r * (d + config.intermediate_size)
    head = r * (d + config.padded_vocab_size) if targets.get("head") else 0
    return L * per_layer + head


def flops_per_token(config, seq_len: float, method: str = "full", lora_params: int = 0) -> FlopsPerToken:
    total, emb = count_params(config)
    n = total - emb
    attention = 12.0 * config.n_layer * config.n_head * config.head_size * seq_len
    if method == "full":
        value = 6.0 * n + attention
        formula = f"6N + attention; N={n:,} (embedding excluded), attention 12*L*H*Q*T with T={seq_len:.0f}"
    else:
        value = 4.0 * n + 6.0 * lora_params + attention
        formula = (f"4N_base + 6N_lora + attention; N_base={n:,}, N_lora={lora_params:,}, "
                   f"attention 12*L*H*Q*T with T={seq_len:.0f}")
    return FlopsPerToken(total=value, matmul_params=n, lora_params=lora_params, attention=attention, formula=formula)


def mfu(flops_per_tok: float, tok_s_per_device: float, peak_flops: float | None) -> float | None:
    """Model FLOPs utilisation (nanoGPT): flops_per_token x tokens/s per device / peak FLOP/s; None if no peak."""
    if not peak_flops or tok_s_per_device is None:
        return None
    return flops_per_tok * tok_s_per_device / peak_flops
