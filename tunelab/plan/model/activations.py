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


@dataclass(frozen=True)
class Forward:
    """One training forward as :func:`saved_bytes` counts it: the model, what trains, the shape, and how its kernels
    lay out what they keep."""

    config: object
    """litgpt's ``Config``."""
    method: str
    """``full`` or ``lora``."""
    dtype_bytes: int
    """Bytes per element of the compute dtype (the 16-bit one under mixed precision)."""
    micro: int
    """Sequences per micro batch."""
    seq: int
    """Tokens per sequence."""
    lora_targets: tuple = LORA_TARGETS
    """The names of the LoRA targets that are on."""
    lora_r: int = LITGPT_LORA_R
    """LoRA's rank."""
    mixed: bool = False
    """Autocast over fp32 weights."""
    logits_bytes: int = 4
    """Bytes per element of the logits the loss sees (Lightning Fabric, which runs litgpt's scripts, converts the
    model's outputs to fp32 under every precision)."""
    attention_output_view: bool = False
    """Attention runs CUDA's memory-efficient kernel (fp32), whose output is laid out so that the projection's input
    is a view of it, not a copy (flash, cuDNN and torch's CPU kernel: a copy)."""
    flash_pad: bool = False
    """CUDA's flash kernel with a head size that is not a multiple of 8 (OpenLLaMA 3B's 100): torch's SDPA pads q, k
    and v to new tensors first, and the kernel keeps those and its padded output instead."""
    frozen_weights_grad: str = ""
    """LoRA under FSDP1 (``use_orig_params``), whose frozen weights are, during the forward, views of a flat parameter
    that needs a gradient: every matmul keeps its input for its weight's gradient as in full fine-tuning, beside the
    adapters' own; "blocks" (every block's weights) or "all" (the root unit's too)
    (:meth:`tunelab.plan.model.strategies.base.Strategy.frozen_weights_grad`)."""
    device: str = "cuda"
    """Where it runs (CUDA's dropout mask is one byte an element; elsewhere the dtype's)."""


def saved_bytes(forward: Forward) -> SavedBytes:
    """Bytes autograd keeps for ``forward.micro`` sequences of ``forward.seq`` tokens (see the module docstring)."""
    c, s, k = forward.config, forward.dtype_bytes, _Kept(forward)
    per, first = k.block(False), k.block(True)
    head_norm = k.norm(k.wt_root) + (k.lora_in(c.n_embd) if k.lora("head") else 0)
    head = head_norm + (s * c.n_embd * k.n if k.wt_root else 0)
    positions = forward.micro * (forward.seq - 1)
    # log-softmax per chunk in the logits' dtype (fp32 under Fabric), int64 targets
    head += forward.logits_bytes * c.padded_vocab_size * positions + 8 * positions
    if c.final_logit_softcapping is not None:
        head += s * c.padded_vocab_size * positions  # tanh of the logits
    if c.attention_logit_softcapping is not None:
        k.notes.append("attention softcapping: scores kept (T x T per head), on every device")
    return SavedBytes(
        per_layer=per, first_layer=first, head=head, notes=tuple(dict.fromkeys(k.notes)), head_norm=head_norm
    )


class _Kept:
    """The terms :func:`saved_bytes` adds up for one forward, ``n`` tokens: each sublayer's kept tensors."""

    def __init__(self, f: Forward) -> None:
        self.f, self.c, self.s, self.mixed = f, f.config, f.dtype_bytes, f.mixed
        self.n, self.on = f.micro * f.seq, set(f.lora_targets)
        self.full = f.method == "full"
        self.wt = self.full or bool(f.frozen_weights_grad)  # the blocks' own weights take a gradient
        self.wt_root = self.full or f.frozen_weights_grad == "all"  # the embedding, final norm, head do
        self.cuda = f.device == "cuda"
        self.mask_b = 1 if self.cuda else self.s
        self.notes: list[str] = []
        self.gated = self.c.mlp_class_name in ("LLaMAMLP", "GemmaMLP")  # fc_1 and fc_2 both read the norm's output
        self.mlp_inputs = 2 if self.gated else 1  # linears reading the MLP's normalised input
        # a norm's weight is cast to fp32 (a new tensor) unless it already is (mixed); Gemma's 1 + w is always new
        self.norm_weight_copy = 4 * self.c.n_embd if (not self.mixed or "Gemma" in self.c.name) else 0

    def lora(self, k: str) -> bool:
        return not self.full and k in self.on

    def norm(self, weight_trains: bool, input_needs_grad: bool = True, residual: bool = True, again: bool = False):
        """``residual``: it normalises the residual stream (fp32 under mixed), not a sublayer's 16-bit output;
        ``again``: a second norm of the same input (a parallel residual's norm_2), whose input is already kept
        unless the norm makes its own fp32 copy of it (RMSNorm of a 16-bit input)."""
        c, s, n, d = self.c, self.s, self.n, self.c.n_embd
        if not (weight_trains or input_needs_grad):
            return 0  # nothing needs a gradient through it (LoRA's first block: a frozen embedding feeds it)
        if c.norm_class_name == "LayerNorm":  # autocast runs layer_norm in fp32: its input, fp32 under mixed
            kept_input = 0 if again else (4 if self.mixed and residual else s) * d
            return (kept_input + 2 * (4 if self.cuda else s)) * n
        if c.norm_class_name != "RMSNorm":
            self.notes.append(f"norm {c.norm_class_name}: counted as RMSNorm")
        own_copy = not again or (not self.mixed and s < 4)  # x.float() of a 16-bit input is a new tensor each time
        return (4 * d * own_copy + 4) * n + self.norm_weight_copy + (4 * d * n if weight_trains else 0)

    def linear_inputs(self, k: int) -> float:
        """Full fine-tuning: what ``k`` trainable linears reading one normalised input keep. -true: that input, one
        storage. Mixed: it is fp32 and each linear keeps its own 16-bit cast (autocast caches weights only)."""
        return self.s * self.c.n_embd * self.n * (k if self.mixed else min(k, 1))

    def lora_in(self, width: int, outs: int = 1, input_needs_grad: bool = True) -> float:
        """dropout mask (only when its input needs a gradient) + dropout output + lora_A output(s)"""
        s, n = self.s, self.n
        return ((self.mask_b if input_needs_grad else 0) + s) * width * n + s * self.f.lora_r * outs * n

    def block(self, first: bool) -> float:
        """One block: its first norm, the attention, the second norm and the MLP."""
        c, wt = self.c, self.wt
        grad_in = self.wt_root or not first  # LoRA's first block: its input (a frozen embedding's output) needs none
        b = self.norm(wt, input_needs_grad=grad_in)
        attn, attn_out_grad = self.attention(grad_in)
        b += attn
        if c.post_attention_norm:
            b += self.norm(wt, input_needs_grad=attn_out_grad, residual=False)
        # the MLP's input: the block input (parallel residual) or the block input plus the attention's output
        mlp_in_grad = grad_in or (attn_out_grad and not c.parallel_residual)
        if not c.shared_attention_norm:
            b += self.norm(wt, input_needs_grad=mlp_in_grad, again=c.parallel_residual)
            if wt:
                b += self.linear_inputs(self.mlp_inputs)  # norm_2's output: fc_1 / fc_2 input
        return b + self.mlp(mlp_in_grad)

    def attention(self, grad_in: bool) -> tuple:
        """(bytes, whether its output needs a gradient) of the attention sublayer after its norm."""
        c, s, n, d, lora = self.c, self.s, self.n, self.c.n_embd, self.lora
        seq, flash_pad, attention_output_view = self.f.seq, self.f.flash_pad, self.f.attention_output_view
        hs, nh, ng = c.head_size, c.n_head, c.n_query_groups
        qw, b = nh * hs, 0
        qkv_targets = sum(bool(lora(k)) for k in ("query", "key", "value"))
        attn_grad = grad_in or qkv_targets > 0  # q, k, v need a gradient: attention keeps its inputs
        if self.wt:
            b += self.linear_inputs(1 + (self.mlp_inputs if c.shared_attention_norm else 0))  # qkv's (+ MLP's) input
        if qkv_targets:
            b += self.lora_in(d, qkv_targets, input_needs_grad=grad_in)
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
        if self.wt and not attention_output_view:
            b += s * qw * n  # the output's reshaped copy: the projection's input
        if lora("projection"):
            b += self.lora_in(qw, input_needs_grad=attn_grad)
        return b, attn_grad or lora("projection")

    def mlp(self, mlp_in_grad: bool) -> float:
        """The MLP sublayer after its norm (and its post norm)."""
        c, s, n, inter, lora = self.c, self.s, self.n, self.c.intermediate_size, self.lora
        b = self.lora_in(c.n_embd, input_needs_grad=mlp_in_grad) * (2 if self.gated else 1) if lora("mlp") else 0
        if not (mlp_in_grad or lora("mlp")):
            return b  # a frozen MLP with no gradient through its input keeps nothing
        if self.gated or c.mlp_class_name == "GptNeoxMLP":
            b += (3 if self.gated else 1) * s * inter * n  # gate, up and their product; or the GELU's input
            if self.wt:
                b += s * inter * n
            if lora("mlp"):
                b += self.lora_in(inter)
        else:
            self.notes.append(f"MLP {c.mlp_class_name}: not modelled (counted as SwiGLU)")
            b += 4 * s * inter * n
        if c.post_mlp_norm:
            b += self.norm(self.wt, residual=False)
        return b
