"""What autograd keeps for backward in litgpt's models, derived op by op from the ``Config`` (no LLaMA assumptions).

Bytes per block and for the head, for ``n = micro x T`` tokens: each term is a tensor litgpt's code saves, counted
once per storage, as :mod:`tunelab.plan.trace.measure` counts them on a real forward
(``tests/e2e/test_activations.py`` compares the two per family). Covered: RMSNorm and LayerNorm (and Gemma's post
norms), the inputs of trainable linears, fused SDPA (flash and memory-efficient layouts, a head size padded to a
multiple of 8, GQA/MQA expansion, partial rotary), softcapped attention by the math path, SwiGLU/GeGLU/GELU MLPs,
LoRA's dropout and adapter inputs (and its zero-padded partial qkv), the chunked loss's log-softmax in fp32, a
frozen embedding's first block, and mixed precision per tensor dtype. Not modelled (said where a plan uses them):
mixture-of-experts MLPs, latent attention, an explicit attention mask. The terms and where each comes from:
docs/planner.md, "Memory"."""

from __future__ import annotations

from dataclasses import dataclass

from tunelab.settings import LITGPT_LORA_R, LORA_TARGETS


@dataclass
class SavedBytes:
    """Bytes autograd keeps: per block, for the first block, and for the head and loss."""

    per_layer: float
    """A block after the first (its input carries a gradient)."""
    first_layer: float
    head: float
    """Final norm, lm_head input, loss (the logits themselves and their gradient are a peak term, not saved)."""
    notes: tuple = ()
    head_norm: float = 0
    """What the final norm keeps, and a LoRA head's adapter input: the part of ``head`` a fused linear
    cross-entropy (Liger's) keeps too (it saves gradients instead of the head's input and the log-softmax)."""

    def total(self, n_layer: int) -> float:
        return self.first_layer + self.per_layer * (n_layer - 1) + self.head


def saved_bytes(
    c,
    method: str,
    s: int,
    micro: int,
    seq: int,
    targets=LORA_TARGETS,
    lora_r: int = LITGPT_LORA_R,
    device: str = "cuda",
    mixed: bool = False,
    logits_bytes: int = 4,
    attention_output_view: bool = False,
    flash_pad: bool = False,
    frozen_weights_grad: bool = False,
) -> SavedBytes:
    """Bytes autograd keeps for ``micro`` sequences of ``seq`` tokens (see the module docstring); ``targets``: the
    names of the LoRA targets that are on; ``mixed``: autocast with fp32 weights (``s`` is then the 16-bit compute
    dtype's bytes); ``logits_bytes``: the bytes per element of the logits the loss sees (default 4: Lightning
    Fabric, which runs litgpt's scripts, converts the model's outputs to fp32 under every precision);
    ``attention_output_view``: attention runs CUDA's memory-efficient kernel (fp32), whose output is laid out so
    that the projection's input is a view of it, not a copy (flash, cuDNN and torch's CPU kernel: a copy);
    ``flash_pad``: CUDA's flash kernel with a head size that is not a multiple of 8 (OpenLLaMA 3B's 100): torch's
    SDPA pads q, k and v to new tensors first, and the kernel keeps those and its padded output instead;
    ``frozen_weights_grad``: LoRA under FSDP1 (``use_orig_params``), whose frozen weights are, during the forward,
    views of a flat parameter that needs a gradient: every matmul keeps its input for its weight's gradient as in
    full fine-tuning, beside the adapters' own (the root unit's weights too when the head is a target)."""
    full = method == "full"
    on = set(targets)
    wt = full or frozen_weights_grad  # the blocks' own weights take a gradient
    wt_root = full or (frozen_weights_grad and "head" in on)  # the embedding, final norm and head do

    def lora(k: str) -> bool:
        return not full and k in on

    n = micro * seq
    d, inter, hs, nh, ng = c.n_embd, c.intermediate_size, c.head_size, c.n_head, c.n_query_groups
    qw = nh * hs
    mask_b = 1 if device == "cuda" else s
    notes = []
    gated = c.mlp_class_name in ("LLaMAMLP", "GemmaMLP")  # fc_1 and fc_2 both read the norm's output
    mlp_inputs = 2 if gated else 1  # linears reading the MLP's normalised input
    # a norm's weight is cast to fp32 (a new tensor) unless it already is (mixed); Gemma's 1 + w is always new
    norm_weight_copy = 4 * d if (not mixed or "Gemma" in c.name) else 0

    def norm(weight_trains: bool, input_needs_grad: bool = True, residual: bool = True, again: bool = False) -> float:
        """``residual``: it normalises the residual stream (fp32 under mixed), not a sublayer's 16-bit output;
        ``again``: a second norm of the same input (a parallel residual's norm_2), whose input is already kept
        unless the norm makes its own fp32 copy of it (RMSNorm of a 16-bit input)."""
        if not (weight_trains or input_needs_grad):
            return 0  # nothing needs a gradient through it (LoRA's first block: a frozen embedding feeds it)
        if c.norm_class_name == "LayerNorm":  # autocast runs layer_norm in fp32: its input, fp32 under mixed
            kept_input = 0 if again else (4 if mixed and residual else s) * d
            return (kept_input + 2 * (4 if device == "cuda" else s)) * n
        if c.norm_class_name != "RMSNorm":
            notes.append(f"norm {c.norm_class_name}: counted as RMSNorm")
        own_copy = not again or (not mixed and s < 4)  # x.float() of a 16-bit input is a new tensor each time
        return (4 * d * own_copy + 4) * n + norm_weight_copy + (4 * d * n if weight_trains else 0)

    def linear_inputs(k: int) -> float:
        """Full fine-tuning: what ``k`` trainable linears reading one normalised input keep. -true: that input, one
        storage. Mixed: it is fp32 and each linear keeps its own 16-bit cast (autocast caches weights only)."""
        return s * d * n * (k if mixed else min(k, 1))

    def lora_in(width: int, outs: int = 1, input_needs_grad: bool = True) -> float:
        """dropout mask (only when its input needs a gradient) + dropout output + lora_A output(s)"""
        return ((mask_b if input_needs_grad else 0) + s) * width * n + s * lora_r * outs * n

    def block(first: bool) -> float:
        grad_in = wt_root or not first  # LoRA's first block: its input (a frozen embedding's output) needs no gradient
        b = norm(wt, input_needs_grad=grad_in)
        qkv_targets = sum(bool(lora(k)) for k in ("query", "key", "value"))
        attn_grad = grad_in or qkv_targets > 0  # q, k, v need a gradient: attention keeps its inputs
        if wt:
            b += linear_inputs(1 + (mlp_inputs if c.shared_attention_norm else 0))  # qkv's (+ the MLP's) input
        if qkv_targets:
            b += lora_in(d, qkv_targets, input_needs_grad=grad_in)
            if qkv_targets < 3:  # zero_pad's index_copy_ keeps the adapters' output and a copy of its int64 index
                width = hs * sum(w for k, w in (("query", nh), ("key", ng), ("value", ng)) if lora(k))
                b += s * n * width + 8 * width
        if not attn_grad:
            pass  # a first LoRA block without q, k, v adapters: nothing in its attention needs a gradient
        elif c.attention_logit_softcapping is not None:
            b += 3 * s * qw * n  # q, k and v (k, v expanded to every head)
            b += (2 * s + 4) * nh * seq * n  # tanh of the scores, fp32 softmax, its cast: T per head per token
        elif flash_pad:  # padded copies of q, k, v (every head) and the padded output; not q, k, v themselves
            b += 4 * s * nh * (-(-hs // 8) * 8) * n + 4 * nh * n
        else:
            if ng == nh:  # MHA: k roped (a new tensor), v a view of the whole fused qkv output
                kv = s * qw * n + s * (nh + 2 * ng) * hs * n
            else:  # GQA / MQA: k and v expanded to every head
                kv = 2 * s * qw * n
            b += s * qw * n + kv + s * qw * n + 4 * nh * n  # q, k and v, the output, fp32 log-sum-exp
        if wt and not attention_output_view:
            b += s * qw * n  # the output's reshaped copy: the projection's input
        if lora("projection"):
            b += lora_in(qw, input_needs_grad=attn_grad)
        attn_out_grad = attn_grad or lora("projection")
        if c.post_attention_norm:
            b += norm(wt, input_needs_grad=attn_out_grad, residual=False)
        # the MLP's input: the block input (parallel residual) or the block input plus the attention's output
        mlp_in_grad = grad_in or (attn_out_grad and not c.parallel_residual)
        if not c.shared_attention_norm:
            b += norm(wt, input_needs_grad=mlp_in_grad, again=c.parallel_residual)
            if wt:
                b += linear_inputs(mlp_inputs)  # norm_2's output: fc_1 / fc_2 input
        if lora("mlp"):
            b += lora_in(d, input_needs_grad=mlp_in_grad) * (2 if gated else 1)
        if not (mlp_in_grad or lora("mlp")):
            return b  # a frozen MLP with no gradient through its input keeps nothing
        if gated:
            b += 3 * s * inter * n
            if wt:
                b += s * inter * n
            if lora("mlp"):
                b += lora_in(inter)
        elif c.mlp_class_name == "GptNeoxMLP":
            b += s * inter * n  # the GELU's input
            if wt:
                b += s * inter * n
            if lora("mlp"):
                b += lora_in(inter)
        else:
            notes.append(f"MLP {c.mlp_class_name}: not modelled (counted as SwiGLU)")
            b += 4 * s * inter * n
        if c.post_mlp_norm:
            b += norm(wt, residual=False)
        return b

    per = block(first=False)
    first = block(first=True)
    v = c.padded_vocab_size
    head_norm = norm(wt_root) + (lora_in(d) if lora("head") else 0)
    head = head_norm + (s * d * n if wt_root else 0)
    positions = micro * (seq - 1)
    # log-softmax per chunk in the logits' dtype (fp32 under Fabric), int64 targets
    head += logits_bytes * v * positions + 8 * positions
    if c.final_logit_softcapping is not None:
        head += s * v * positions  # tanh of the logits
    if c.attention_logit_softcapping is not None:
        notes.append("attention softcapping: scores kept (T x T per head), on every device")
    return SavedBytes(
        per_layer=per, first_layer=first, head=head, notes=tuple(dict.fromkeys(notes)), head_norm=head_norm
    )
