"""bitsandbytes' own work in litgpt's QLoRA step on a GPU, read from its code, beside the step the trace records.

Under ``--quantize bnb.nf4`` every linear holds NF4 weights; bitsandbytes 0.50.2's ``MatMul4Bit`` dequantizes each
weight with one ``kDequantizeBlockwise`` kernel in the forward and one in the backward (to float16, then the compute
dtype), ``PagedAdamW`` runs one kernel per trainable tensor, and each of these costs the host its Python. This
module adds those kernels and the host's ops to the traced LoRA step; the rates are fitted on one H200 grid and
checked out of sample there (``reports/planner-accuracy/kernels.md``). A generated token (one row) takes bitsandbytes'
fused ``gemv_4bit`` instead: its Python is counted, its kernel is timed as the traced 16-bit matmul it replaces (not
modelled: its own rate). Not modelled either: litgpt's StableEmbedding's own kernels."""

from __future__ import annotations

import math

from tunelab.models import count_params

NF4_BLOCK = 64
"""Weights per absmax block of Lightning's nf4 mode (bitsandbytes' default block size)."""
DEQUANT_BYTES_PER_WEIGHT = 0.5 + 4 / NF4_BLOCK + 2
"""Bytes one dequantization moves per weight: the packed 4-bit weight and its block's fp32 absmax read, a 16-bit
weight written."""
DEQUANT_EFFICIENCY = 0.58
"""Fraction of :func:`tunelab.plan.model.kernels.memory_rate` ``kDequantizeBlockwise`` reaches over
:data:`DEQUANT_BYTES_PER_WEIGHT`. Fitted on OpenLLaMA 7B's forward dequantizations at micro 4 (evidence
``h200-grid-qlora``); out of sample its float16 ones in backward and TinyLlama's."""
FORWARD_HOST_OPS_PER_MATMUL = 6.7
"""The host's work per 4-bit matmul in the forward pass beyond the ops the trace records and the dequantization's
launch (bitsandbytes' Python: ``Linear4bit.forward``, ``matmul_4bit``, the autograd function, the custom op's
dispatch to its CUDA kernel through ctypes), in dispatched ops (:data:`tunelab.plan.model.kernels.HOST_S_PER_OP` each).
Fitted on TinyLlama's QLoRA line at micro 4 (evidence ``h200-grid-qlora``; launch-bound: its forward's host clock
against its LoRA twin's on the same machine), each op at the twin's host time per op; TinyLlama at micro 1, also
launch-bound, is out of sample (the host's clock varies from process to process by as much as the two differ)."""
BACKWARD_HOST_OPS_PER_MATMUL = 2.0
"""The same for the backward pass (the autograd function's backward, ``dequantize_4bit``'s Python, beyond the
traced cast): fitted with :data:`FORWARD_HOST_OPS_PER_MATMUL` on the same line's backward (evidence
``h200-grid-qlora``); micro 1 implies none."""
EVAL_PYTHON_SHARE = {"validation": 0.805, "decode": 0.772}
"""bitsandbytes' Python per 4-bit matmul in a validation batch (no gradients) and in a generated token (one row,
inference mode: ``gemv_4bit`` in place of the dequantization, no autograd function) as a share of the training
forward's (:data:`FORWARD_HOST_OPS_PER_MATMUL`). Measured on a CPU with bitsandbytes' kernels stubbed, so that only
Python and dispatch are timed (evidence ``cpu-bnb-host``, scripts/bench_bnb_host.py: the median over reps); a test
recomputes them from the archive."""
PAGED_ADAMW_BYTES_PER_ELEMENT = 22
"""Bytes ``kOptimizer32bit2State`` moves per element of a 16-bit parameter: the parameter read and written, its
gradient read, two fp32 states read and written."""
PAGED_ADAMW_HOST_OPS_PER_TENSOR = 1.7
"""The host's work per trainable tensor of bitsandbytes' ``PagedAdamW`` step beyond its kernel's launch (its Python
loop: state lookup, prefetch check, the update's custom op through ctypes), in dispatched ops. Fitted on TinyLlama's
QLoRA optimizer phase at micro 4 (evidence ``h200-grid-qlora``); out of sample TinyLlama at micro 1 and 16 and
OpenLLaMA 7B at micro 4: the optimizer phase is launch-bound in all of them."""


def litgpt_optimizer(method: str) -> str:
    """The optimizer litgpt's script steps for ``method`` with its default AdamW: bitsandbytes' PagedAdamW under
    QLoRA (``instantiate_bnb_optimizer``), torch's AdamW otherwise."""
    return "PagedAdamW" if method == "qlora" else "AdamW"


def linears_per_block(config) -> int:
    """The ``torch.nn.Linear`` layers of one litgpt block: the fused qkv and the projection, and the MLP's (three for
    LLaMA's and Gemma's gated MLPs and the mixture of experts' router-free count, two for GPT's)."""
    return 2 + (3 if config.mlp_class_name in ("LLaMAMLP", "GemmaMLP", "LLaMAMoE") else 2)


def quantized(config, tokens: float) -> dict:
    """{phase: (weights dequantized, 4-bit matmuls)} of one micro batch (forward, backward), one validation batch
    and one generated token: every block's linears once, the head once per 128-token chunk in training, once whole
    in validation and decode; a generated token's matmuls are ``gemv_4bit`` kernels, none dequantized."""
    total, emb = count_params(config)
    head = config.padded_vocab_size * config.n_embd
    body, matmuls = total - emb - head, config.n_layer * linears_per_block(config)
    chunks = math.ceil(tokens / 128)
    train = (body + head * chunks, matmuls + chunks)
    return {"forward": train, "backward": train, "validation": (body + head, matmuls + 1), "decode": (0, matmuls + 1)}


def qlora_work(config, tokens: float, memory_rate: float, min_kernel_s: float, eval_host_share: dict) -> dict:
    """{phase: (GPU seconds, kernels, host ops beyond the kernels)} bitsandbytes adds to a QLoRA micro batch
    (:func:`quantized`) on a GPU whose eager kernels move ``memory_rate`` bytes/s
    (:func:`tunelab.plan.model.kernels.memory_rate`), each at least ``min_kernel_s``; a generated token adds only
    the Python of its 4-bit matmuls. A validation batch's and a generated token's host ops are counted in their
    phase's ops, which the plan charges at ``eval_host_share`` (by phase) of a training op: their Python
    (:data:`EVAL_PYTHON_SHARE` of the forward's) is divided by it."""
    rate = memory_rate * DEQUANT_EFFICIENCY
    host = {"forward": FORWARD_HOST_OPS_PER_MATMUL, "backward": BACKWARD_HOST_OPS_PER_MATMUL}
    for phase, share in EVAL_PYTHON_SHARE.items():
        host[phase] = FORWARD_HOST_OPS_PER_MATMUL * share / eval_host_share[phase]
    out = {}
    for phase, (weights, n) in quantized(config, tokens).items():
        kernels = n if weights else 0
        seconds = max(weights * DEQUANT_BYTES_PER_WEIGHT / rate, kernels * min_kernel_s)
        out[phase] = (seconds, kernels, n * host[phase])
    return out


def paged_adamw(numels: list, rate: float, min_kernel_s: float) -> tuple:
    """(GPU seconds, kernels, host ops beyond the kernels) of one ``PagedAdamW`` step over trainable tensors of
    ``numels`` elements on a GPU whose contiguous kernels move ``rate`` bytes/s: a kernel per tensor (at least
    ``min_kernel_s``)."""
    seconds = sum(max(n * PAGED_ADAMW_BYTES_PER_ELEMENT / rate, min_kernel_s) for n in numels)
    return seconds, len(numels), len(numels) * PAGED_ADAMW_HOST_OPS_PER_TENSOR
