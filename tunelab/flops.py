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


_PLAIN = dict(n_expert=0, norm_qk=False, post_attention_norm=False, post_mlp_norm=False, mlp_class_name=None)


def count_params(config) -> tuple[int, int]:
    """(all parameters, token-embedding parameters) of a litgpt Config.

    Arithmetic for the dense decoder layouts (LLaMA/SwiGLU, GPT-NeoX/GELU MLP, RMSNorm/LayerNorm; checked against
    litgpt's own model in the tests); other layouts (MoE, extra norms) are counted on the meta device.
    """
    c = config
    simple = (getattr(c, "n_expert", 0) == 0 and not getattr(c, "norm_qk", False)
              and not getattr(c, "post_attention_norm", False) and not getattr(c, "post_mlp_norm", False)
              and c.mlp_class_name in ("LLaMAMLP", "GptNeoxMLP", "GemmaMLP")
              and c.norm_class_name in ("RMSNorm", "LayerNorm") and not getattr(c, "shared_attention_norm", False))
    if not simple:
        import torch
        from litgpt.model import GPT

        with torch.device("meta"):
            model = GPT(c)
        return sum(p.numel() for p in model.parameters()), model.transformer.wte.weight.numel()
    d, hs, inter = c.n_embd, c.head_size, c.intermediate_size
    q, kv = c.n_head * hs, c.n_query_groups * hs
    bias = 1 if c.bias else 0
    attn_bias = 1 if (c.bias or getattr(c, "attn_bias", False)) else 0
    attn = d * (q + 2 * kv) + attn_bias * (q + 2 * kv) + q * d + bias * d
    if c.mlp_class_name in ("LLaMAMLP", "GemmaMLP"):
        mlp = 3 * d * inter + bias * (2 * inter + d)
    else:
        mlp = 2 * d * inter + bias * (inter + d)
    norm = d * (2 if c.norm_class_name == "LayerNorm" else 1)
    layer = attn + mlp + 2 * norm
    emb = c.padded_vocab_size * d
    head = c.padded_vocab_size * d + (c.padded_vocab_size if getattr(c, "lm_head_bias", False) else 0)
    return c.n_layer * layer + norm + emb + head, emb


def load_config(checkpoint_dir):
    """The litgpt Config of a checkpoint directory (its model_config.yaml, else litgpt's config of its name).

    Reads litgpt's ``config.py`` on its own (it imports nothing of litgpt), so planning does not pay for importing
    torch and Lightning: ~50 ms instead of ~4 s.
    """
    import importlib.util
    import sys
    from pathlib import Path

    if "litgpt" in sys.modules:
        from litgpt.config import Config
    else:
        mod = sys.modules.get("tunelab._litgpt_config")
        if mod is None:
            spec = importlib.util.find_spec("litgpt")
            path = Path(next(iter(spec.submodule_search_locations))) / "config.py"
            spec = importlib.util.spec_from_file_location("tunelab._litgpt_config", path)
            mod = importlib.util.module_from_spec(spec)
            sys.modules["tunelab._litgpt_config"] = mod
            spec.loader.exec_module(mod)
        Config = mod.Config
    ckpt = Path(checkpoint_dir)
    cfg_file = ckpt / "model_config.yaml"
    if cfg_file.is_file():  # read as plain data here (litgpt's Config.from_file would pass anything to Config)
        import dataclasses

        from tunelab import yaml_input
        from tunelab.errors import InputError

        raw = yaml_input.load_mapping(cfg_file, "model_config.yaml")
        unknown = set(raw) - {f.name for f in dataclasses.fields(Config)}
        if unknown:
            raise InputError(f"{cfg_file}: unknown key(s) {sorted(unknown)[:5]}: not fields of litgpt's Config; "
                             "fix: use the model_config.yaml `litgpt download` writes")
        try:
            return Config(**raw)
        except Exception as e:  # noqa: BLE001 - litgpt's __post_init__ does arithmetic on whatever it is given
            raise InputError(f"{cfg_file}: litgpt's Config refuses it ({type(e).__name__}: {e}); fix: use the "
                             "model_config.yaml `litgpt download` writes") from None
    try:
        return Config.from_name(ckpt.name)
    except ValueError:
        from tunelab.errors import InputError

        raise InputError(f"{checkpoint_dir}: {ckpt.name!r} is not a model litgpt knows and the "
                         "directory holds no model_config.yaml; fix: name a litgpt config (checkpoints/<org>/<name> as "
                         "`litgpt download` writes it, e.g. checkpoints/meta-llama/Llama-2-7b-hf) or a downloaded "
                         "checkpoint") from None


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
