"""Training FLOPs per token, by formula, for full fine-tuning and LoRA/QLoRA (shared by the collector and planner).

N is the number of parameters that take part in a token's matrix products: every parameter but the token
embedding (a lookup) and, in a mixture of experts, the routed experts the token does not reach (the active
parameters, as MoE MFU is counted). Per token, a matmul with a weight of n parameters costs 2n FLOPs forward, 2n
for the input gradient and 2n for the weight gradient:

* full:        6 N                         + attention
* LoRA/QLoRA:  4 N_base + 6 N_lora         + attention   (the frozen base needs forward and input gradients only;
               QLoRA's dequantization is not counted: it is overhead, not model FLOPs)
* attention:   12 x n_layer x n_head x head_size x T per token, T the (padded) sequence length: QK^T and AV,
               forward plus backward, counted without the causal half (the PaLM convention).
"""

from __future__ import annotations

from dataclasses import dataclass

from tunelab.models import count_params, inactive_expert_params


@dataclass
class FlopsPerToken:
    """Training FLOPs per token and what they were counted from."""

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


def flops_per_token(config, seq_len: float, method: str = "full", lora_params: int = 0) -> FlopsPerToken:
    """Training FLOPs per token of ``config`` at sequence length ``seq_len`` (see the module docstring);
    ``method`` full or lora (``lora_params``: the adapters' trainable parameters)."""
    total, emb = count_params(config)
    skipped = inactive_expert_params(config)
    n = total - emb - skipped
    skips = f"{skipped:,} in experts a token skips" if skipped else ""
    attention = 12.0 * config.n_layer * config.n_head * config.head_size * seq_len
    if method == "full":
        value = 6.0 * n + attention
        formula = (
            f"6N + attention; N={n:,} (embedding{skips and ' and ' + skips} excluded), "
            f"attention 12*L*H*Q*T with T={seq_len:.0f}"
        )
    else:
        value = 4.0 * n + 6.0 * lora_params + attention
        formula = (
            f"4N_base + 6N_lora + attention; N_base={n:,}{skips and f' ({skips} excluded)'}, "
            f"N_lora={lora_params:,}, attention 12*L*H*Q*T with T={seq_len:.0f}"
        )
    return FlopsPerToken(total=value, matmul_params=n, lora_params=lora_params, attention=attention, formula=formula)


def mfu(flops_per_tok: float, tok_s_per_device: float, peak_flops: float | None) -> float | None:
    """Model FLOPs utilisation (nanoGPT): flops_per_token x tokens/s per device / peak FLOP/s; None if no peak."""
    if not peak_flops or tok_s_per_device is None:
        return None
    return flops_per_tok * tok_s_per_device / peak_flops
