"""A model's litgpt ``Config`` and the arithmetic on it that every stage shares: parameter counts (all, embedding,
LoRA adapters). Reading a Config costs no torch import (``tunelab plan`` answers in a fraction of a second).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import math
import sys
from pathlib import Path

from tunelab import yaml_input
from tunelab.errors import InputError
from tunelab.settings import LORA_TARGETS


def count_params(config) -> tuple[int, int]:
    """(all parameters, token-embedding parameters) of a litgpt Config.

    Arithmetic for the dense decoder layouts (LLaMA/SwiGLU, GPT-NeoX/GELU MLP, RMSNorm/LayerNorm; checked against
    litgpt's own model in the tests); other layouts (MoE, extra norms) are counted on the meta device.
    """
    c = config
    simple = (
        getattr(c, "n_expert", 0) == 0
        and not getattr(c, "norm_qk", False)
        and not getattr(c, "post_attention_norm", False)
        and not getattr(c, "post_mlp_norm", False)
        and c.mlp_class_name in ("LLaMAMLP", "GptNeoxMLP", "GemmaMLP")
        and c.norm_class_name in ("RMSNorm", "LayerNorm")
        and not getattr(c, "shared_attention_norm", False)
    )
    if not simple:
        return _counted_on_meta(_config_key(c), c)
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


def inactive_expert_params(config) -> int:
    """Parameters of the routed experts a token does not reach: in each mixture-of-experts layer all but
    ``n_expert_per_token`` of its ``n_expert`` experts (litgpt's ``LLaMAMoE``: gated MLPs of ``moe_intermediate_size``;
    its shared experts, router and ``first_k_dense_replace`` dense layers reach every token); 0 for a dense model."""
    c = config
    if not getattr(c, "n_expert", 0):
        return 0
    inner = getattr(c, "moe_intermediate_size", None) or c.intermediate_size
    per_expert = 3 * c.n_embd * inner + (2 * inner + c.n_embd if c.bias else 0)
    layers = c.n_layer - (getattr(c, "first_k_dense_replace", None) or 0)
    return layers * (c.n_expert - c.n_expert_per_token) * per_expert


def _config_key(config) -> str:
    return json.dumps(dataclasses.asdict(config), sort_keys=True, default=str)


_META_COUNTS: dict = {}


def _counted_on_meta(key: str, config) -> tuple[int, int]:
    """:func:`count_params` of litgpt's model built on the meta device, once per config (an MoE of thousands of
    experts takes seconds to build, and the micro batch search asks many times)."""
    if key not in _META_COUNTS:
        import torch
        from litgpt.model import GPT

        with torch.device("meta"):
            model = GPT(config)
        _META_COUNTS[key] = (sum(p.numel() for p in model.parameters()), model.transformer.wte.weight.numel())
    return _META_COUNTS[key]


_POSITIVE_INTS = (
    "n_layer",
    "n_head",
    "n_embd",
    "block_size",
    "vocab_size",
    "padded_vocab_size",
    "padding_multiple",
    "n_query_groups",
    "head_size",
    "intermediate_size",
    "moe_intermediate_size",
)
"""model_config.yaml keys that count something: positive integers (``n_layer: -5`` would plan a negative model,
``block_size: 0`` a model that holds no token)."""


def load_config(checkpoint_dir):
    """The litgpt Config of a checkpoint directory (its model_config.yaml, else litgpt's config of its name).

    Reads litgpt's ``config.py`` on its own (it imports nothing of litgpt), so planning does not pay for importing
    torch and Lightning: ~50 ms instead of ~4 s.
    """
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
    if cfg_file.exists():  # plain data, read here: litgpt's Config.from_file would pass anything to Config (and
        # a FIFO or a device in its place is refused by the reader)
        raw = yaml_input.load_mapping(cfg_file, "model_config.yaml")
        unknown = set(raw) - {f.name for f in dataclasses.fields(Config)}
        if unknown:
            raise InputError(
                f"{cfg_file}: unknown key(s) {sorted(unknown)[:5]}: not fields of litgpt's Config; "
                "fix: use the model_config.yaml `litgpt download` writes"
            )
        for key in _POSITIVE_INTS:
            value = raw.get(key)
            if value is not None and (type(value) is not int or not 0 < value <= 10**7):
                raise InputError(
                    f"{cfg_file}: {key}: {value!r} is not a positive integer (at most 1e7); fix: use the "
                    "model_config.yaml `litgpt download` writes"
                )
        try:
            return Config(**raw)
        except Exception as e:  # noqa: BLE001 - litgpt's __post_init__ does arithmetic on whatever it is given
            raise InputError(
                f"{cfg_file}: litgpt's Config refuses it ({type(e).__name__}: {e}); fix: use the "
                "model_config.yaml `litgpt download` writes"
            ) from None
    try:
        return Config.from_name(ckpt.name)
    except ValueError:
        raise InputError(
            f"{checkpoint_dir}: {ckpt.name!r} is not a model litgpt knows and the "
            "directory holds no model_config.yaml; fix: name a litgpt config (checkpoints/<org>/<name> as "
            "`litgpt download` writes it, e.g. checkpoints/meta-llama/Llama-2-7b-hf) or a downloaded "
            "checkpoint"
        ) from None


def lora_tensor_shapes(config, r: int, targets=LORA_TARGETS) -> list[tuple[int, int]]:
    """(rows, columns) of each trainable tensor LoRA adds (litgpt.lora: the fused qkv has one lora_A of r rows per
    enabled q, k, v and one lora_B over their outputs; every other adapted linear an A of r x in and a B of
    out x r)."""
    targets = set(targets)
    d = config.n_embd
    q = config.n_head * config.head_size
    kv = config.n_query_groups * config.head_size
    per_layer = []
    outs = [w for k, w in (("query", q), ("key", kv), ("value", kv)) if k in targets]
    if outs:
        per_layer += [(r * len(outs), d), (sum(outs), r)]
    if "projection" in targets:
        per_layer += [(r, q), (d, r)]
    if "mlp" in targets:
        if config.mlp_class_name in ("LLaMAMLP", "GemmaMLP"):
            linears = [(d, config.intermediate_size)] * 2 + [(config.intermediate_size, d)]
        else:
            linears = [(d, config.intermediate_size), (config.intermediate_size, d)]
        for n_in, n_out in linears:
            per_layer += [(r, n_in), (n_out, r)]
    head = [(r, d), (config.padded_vocab_size, r)] if "head" in targets else []
    return per_layer * config.n_layer + head


def lora_tensor_numels(config, r: int, targets=LORA_TARGETS) -> list[int]:
    """Elements of each trainable tensor LoRA adds (:func:`lora_tensor_shapes`)."""
    return [rows * cols for rows, cols in lora_tensor_shapes(config, r, targets)]


_TENSORS: dict = {}


def param_tensor_shapes(config) -> list[tuple[int, ...]]:
    """Shape of each parameter tensor of litgpt's model for ``config`` (LoRA's excluded: :func:`lora_tensor_shapes`),
    in the model's order, from the model built on the meta device (no memory), once per config."""
    key = repr(config)
    if key not in _TENSORS:
        import torch
        from litgpt.model import GPT

        with torch.device("meta"):
            _TENSORS[key] = [tuple(p.shape) for p in GPT(config).parameters()]
    return _TENSORS[key]


def param_tensor_numels(config) -> list[int]:
    """Elements of each parameter tensor of litgpt's model for ``config`` (:func:`param_tensor_shapes`)."""
    return [math.prod(shape) for shape in param_tensor_shapes(config)]


def trainable_shapes(config, lora: tuple | None) -> list[tuple[int, ...]]:
    """Shapes of the tensors the optimizer steps: LoRA's adapters (``lora``: (rank, targets)) or, where ``lora`` is
    None (full fine-tuning), every parameter of the model."""
    return param_tensor_shapes(config) if lora is None else lora_tensor_shapes(config, *lora)


def lora_param_count(config, r: int, targets=LORA_TARGETS) -> int:
    """Trainable parameters LoRA adds for rank ``r`` on ``targets`` (names of litgpt's ``lora_*`` switches that are
    on: tunelab.settings.LORA_TARGETS)."""
    return sum(lora_tensor_numels(config, r, targets))


def sliding_window_layers(config) -> int:
    """Layers of a litgpt ``config`` that attend within a sliding window (``sliding_window_indices``)."""
    if not getattr(config, "sliding_window_size", None):
        return 0
    return sum(1 for flag in getattr(config, "sliding_window_indices", None) or [] if flag)


def without_sliding_window(config):
    """``config`` (a litgpt Config) with every layer attending causally over the whole sequence, as litgpt built the
    model before it applied sliding windows (its commit 916a84ca): no window, no mask, its causal flash attention."""
    return dataclasses.replace(config, sliding_window_size=None, sliding_window_indices=None)
