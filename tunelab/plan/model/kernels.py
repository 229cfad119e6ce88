"""The traced step's kernels, timed one by one on a named GPU: the runtime model's step by cause.

A step's template (:class:`Template`, from the tracer through :class:`tunelab.plan.model.tables.Tables`) lists every
ATen op of the forward and loss, backward, optimizer step, a validation batch and a generated token, with each op's
FLOPs, bytes and output tiles as polynomials in micro batch and tokens. Each kernel's time: matmuls at the dense
peak x :data:`MATMUL_EFFICIENCY` x their waves' SM share (fp32 as TF32), attention at its share of the peak, every
other kernel by its bytes over the memory rate (the HBM's or the SMs', the lower) at its category's share, at least
:data:`MIN_KERNEL_S`, each training one followed by the GPU's gap (:data:`KERNEL_GAP_S`). The host launches each
op at litgpt's time per op; a phase takes its kernels or its launches, whichever is longer (:func:`step_time`).
Constants and their fits: docs/planner.md, "Time"; checked in ``reports/planner-accuracy/kernels.md``."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

from tunelab import hardware
from tunelab.models import trainable_shapes
from tunelab.plan.model import bnb_kernels, optimizers
from tunelab.plan.model.case import block_params, parameter_bytes, root_unit_params
from tunelab.plan.model.tables import Tables, optimizer_of, tables_of
from tunelab.settings import LITGPT_LORA_R, LORA_TARGETS, lora_of
from tunelab.units import GB

CATEGORIES = ("matmul", "attention", "elementwise", "loss", "optimizer", "dequantization")
"""Kernel categories, as the H100 profile groups CUDA kernels (norm/rope/elementwise, cross-entropy/softmax, ...)."""
TRAINING_PHASES = ("forward", "backward", "optimizer")
"""The phases of a training step; a trace also records ``validation`` (one batch of litgpt's ``validate``) and
``decode`` (one generated token), which the step's totals leave out."""
LORA_LIKE = ("lora", "qlora")
"""Methods whose head runs by 128-token chunk in litgpt's script (``lm_head_chunk_size``)."""

MATMUL_EFFICIENCY = 0.85
"""Fraction of the dense peak a large, well-shaped matmul reaches (cuBLAS on H100/A100 reaches 70-90%); fitted on
the matmul kernels of the H100 profile (evidence ``h100-part1``)."""
ATTENTION_EFFICIENCY = 0.19
"""Fraction of the dense peak the flash kernels reach at fine-tuning lengths (hundreds of tokens, head size 64:
short rows, few tiles); fitted on the attention kernels of the H100 profile (evidence ``h100-part1``)."""
TF32_MATMUL_SHARE = 0.81
"""An fp32 matmul's efficiency against the TF32 peak, as a share of :data:`MATMUL_EFFICIENCY` (a bf16 matmul's
against the bf16 peak): cuBLAS's TF32 kernels reach less of their peak than its bf16 ones (their operands are twice
as wide: twice the bytes per FLOP to feed the tensor cores; a reading, not measured apart). Fitted on the 32-true
grid's line at micro 8 (evidence ``h200-grid-again``); its micro-32 line is out of sample."""
FP32_ATTENTION_EFFICIENCY = 0.15
"""Fraction of :func:`fp32_attention_peak` that fp32 attention reaches (the same causal FLOPs as flash): torch's
flash kernels take only 16-bit inputs, so fp32 SDPA runs the memory-efficient (CUTLASS) kernel. Fitted on the
32-true grid's line at micro 8 (evidence ``h200-grid-again``); its micro-32 line is out of sample."""
MEMORY_EFFICIENCY = 0.9
"""Fraction of :func:`memory_rate` a contiguous eager elementwise kernel reaches (a large device-to-device copy
moves about 90% of the HBM's peak on the H100 and H200 machines we borrow). Fitted with :data:`STRIDED_EFFICIENCY`
and :data:`SM_BYTES_PER_CYCLE` on the elementwise, loss and copy kernels of full fine-tuning steps (evidence
``h100-part1``'s profile, ``h100-grid``, ``h200-grid``'s lines by op), bounded at 0.9 (the fit alone wanted 1.0)."""
FOREACH_EFFICIENCY = 0.56
"""Fraction of :func:`memory_rate` torch's for-each optimizer kernels reach over 16-bit state (many tensors per
launch, each element widened to fp32 for the math and narrowed back); fitted on the optimizer phase of the H100
profile's full fine-tuning (evidence ``h100-part1``)."""
FOREACH_FP32_EFFICIENCY = 0.73
"""The same over fp32 state (32-true, and mixed precision's fp32 weights): no conversions, twice the bytes an element,
a larger share of the rate. Fitted on the optimizer phase of evidence ``h200-grid-again``'s 32-true line at micro 8
(:func:`tunelab.report.profiles.fit_foreach_fp32`)."""
STRIDED_EFFICIENCY = 0.44
"""Fraction of :func:`memory_rate` an elementwise kernel reaches when an operand is a strided view (RoPE on a
transposed head, its halves, their cat, copies and slice gradients): torch's unvectorized TensorIterator path.
Fitted with :data:`MEMORY_EFFICIENCY` (above), on the ops evidence ``h200-grid`` times one by one."""
CONV_EFFICIENCY = 0.13
"""Fraction of :func:`memory_rate` cuDNN's grouped 1-D convolution (litgpt's LoRA on the fused qkv: the r-wide
groups into the q, k, v widths) reaches over the bytes it reads and writes, forward, layout conversions to NHWC
and back included: measured on OpenLLaMA 7B LoRA's line by op (evidence ``h200-grid``)."""
CONV_BACKWARD_EFFICIENCY = 0.034
"""The same for its backward (data and weight gradients: an implicit GEMM over the tokens with an r-wide reduction,
the layouts converted again), on the same line."""
SM_BYTES_PER_CYCLE = 15.0
"""Bytes an SM moves to and from memory per clock cycle in an eager kernel (the loads it keeps in flight over the
memory's latency): with the SM count and the boost clock, a ceiling on the rate that can sit below the HBM's
(:func:`memory_rate`; on an H200 it does, on an H100 it does not). Fitted with :data:`MEMORY_EFFICIENCY` (evidence
``h100-grid``, ``h200-grid``); checked out of sample by the H200's optimizer phases."""
MIN_KERNEL_S = 3e-6
"""The shortest a kernel takes on the GPU (launch latency and a tail): seconds."""
KERNEL_GAP_S = 2.79e-6
"""Seconds the GPU stands idle after each kernel of an eager forward or backward even with the next one queued (its
front end taking the next launch), per op the template counts: the phases' wall time less the profiler's kernel time
over those ops, the median over the profile grids' lines whose kernels fill 85% of their forward and backward or more
(evidence ``h100-grid``, ``h200-grid``, ``h200-grid-again``, ``h200-grid-qlora``;
:func:`tunelab.report.profiles.fit_kernel_gap`). Added where it was measured, the training forward and backward
(:data:`GAP_PHASES`): not to the optimizer step, whose efficiency was fitted on its phase's wall time
(:data:`FOREACH_EFFICIENCY`), nor to validation and decode, which litgpt's loop launches slower than its GPU runs."""
GAP_PHASES = ("forward", "backward")
"""The phases :data:`KERNEL_GAP_S` is added to."""
HOST_S_PER_OP = 35e-6
"""Host time per dispatched op in eager PyTorch (Python module code, the dispatcher, autograd's bookkeeping, the
launch); fitted on the H100 profile's two steps, full (GPU-bound) and LoRA (host-bound) (evidence ``h100-part1``)."""
ADAM_FOREACH_HOST_OPS_PER_TENSOR = 0.74
"""Host work per trainable tensor of torch's for-each Adam/AdamW step beyond its for-each ops, in dispatched ops
(:data:`HOST_S_PER_OP` each): without ``capturable`` it reads every tensor's step counter on the host twice
(``_get_value(step)`` for both bias corrections, torch/optim/adam.py) and builds the per-tensor step sizes in Python.
Fitted on the launch-bound LoRA optimizer phases of the H100 profile and grid (evidence ``h100-part1``,
``h100-grid``; TinyLlama and OpenLLaMA 3B, the median); the fused step (one kernel over the list) has none. Another
class's for-each step: this in proportion to its reads of the step counters
(:data:`tunelab.plan.model.optimizers.STEP_COUNTER_READS`, counted on the CPU)."""
TILE = 128
"""Output tile edge of a tensor-core matmul kernel (cuBLAS's common 128 x 128 / 128 x 256 tiles)."""
SPLIT_K_DEPTH = 16384
"""Reduction depth (elements of k) each part of a split-K matmul keeps at least: where a matmul's output tiles fill
fewer SMs than the GPU has, cuBLAS splits its reduction over more of them; at this depth only a vocabulary-deep
reduction splits (the gradient into a 128-token chunk through LoRA's frozen head: 16 tiles over 128k-256k of k).
Chosen on the profile grids (evidence ``h100-grid``, ``h200-grid``, ``h200-grid-again``, ``h200-grid-qlora``): a
shallower depth also splits the micro-1 lines' model-width matmuls, which then run faster than measured
(``reports/planner-accuracy/kernels.md``)."""
DEFAULT_SMS = 108
"""Streaming multiprocessors assumed for a GPU table row without a sourced ``sms`` (an A100's)."""


EVAL_HOST_SHARE = {"validation": {"full": 0.765, "lora": 0.805}, "decode": {"full": 0.617, "lora": 0.489}}
"""The host's time per op of litgpt's validation batch (eval mode, no gradients) and of its decoded token (inference
mode, a KV cache, one ``.item()`` a token) as a share of its training step's, by method (QLoRA as LoRA): without
autograd's bookkeeping an op costs the host less. Measured on a CPU (evidence ``cpu-eval-host``,
scripts/bench_eval_host.py: the median over reps of each phase's time per op on the tiny model, growth from 2 to 8
blocks) and applied to the loop's constant on any host; a test recomputes them from the archive."""


def eval_host_share(phase: str, method: str) -> float:
    """:data:`EVAL_HOST_SHARE` of ``phase`` ("validation" or "decode") for ``method``."""
    return EVAL_HOST_SHARE[phase]["full" if method == "full" else "lora"]


@dataclass
class StepTime:
    """A step's time by cause on one GPU (seconds; ``gpu_by_category`` sums to ``gpu_s``)."""

    gpu: str
    ops: int
    gpu_s: float
    host_s: float
    gpu_by_category: dict = field(default_factory=dict)
    gpu_by_phase: dict = field(default_factory=dict)
    ops_by_phase: dict = field(default_factory=dict)
    """{phase: ops dispatched that launch a kernel}."""
    gpu_by_phase_category: dict = field(default_factory=dict)
    """{"phase/category": seconds}: the GPU time of each category within each phase."""
    host_ops_by_phase: dict = field(default_factory=dict)
    """{phase: the host's work in dispatched ops}: :attr:`ops_by_phase` plus what the host does without a kernel
    (the for-each AdamW's reads of its step counters, :data:`ADAM_FOREACH_HOST_OPS_PER_TENSOR`); each takes
    :data:`HOST_S_PER_OP` (litgpt's loop: ``runtime.LITGPT_HOST_S_PER_OP``)."""

    def host_ops(self, phase: str) -> float:
        """A phase's host work in dispatched ops (:attr:`host_ops_by_phase`)."""
        return self.host_ops_by_phase.get(phase, 0)

    def phase_s(self, phase: str) -> float:
        """A phase's time: its kernels or its launches, whichever is longer."""
        return max(self.gpu_by_phase.get(phase, 0.0), self.host_ops(phase) * HOST_S_PER_OP)

    @property
    def step_s(self) -> float:
        """The step: the GPU's kernels or the host's launches, whichever is longer."""
        return max(self.gpu_s, self.host_s)


def memory_rate(gpu) -> float:
    """Bytes per second an eager memory-bound kernel's traffic is measured against on ``gpu``: the HBM bandwidth or
    what its SMs move (``sms`` x ``boost_mhz`` x :data:`SM_BYTES_PER_CYCLE`), whichever is lower (a row without SMs
    or clock: the bandwidth). Each kind of kernel reaches its share of it (:data:`MEMORY_EFFICIENCY`, ...)."""
    rate = gpu.bandwidth_gbs * GB
    if gpu.sms and gpu.boost_mhz:
        rate = min(rate, gpu.sms * gpu.boost_mhz * 1e6 * SM_BYTES_PER_CYCLE)
    return rate


MATMUL_OPERANDS = {"mm": (0, 1), "addmm": (1, 2), "bmm": (0, 1), "baddbmm": (1, 2)}
"""Positions of a matmul op's two operands among its arguments."""


def matmul_dims(op: str, top: list, out0) -> tuple:
    """(batch, m, n, k) of a matmul-like op from its operand shapes (``convolution``: litgpt's LoRA, a grouped 1-D
    convolution over tokens, as output elements x the weight's fan-in; its backward twice that)."""
    if op in MATMUL_OPERANDS:
        i, j = MATMUL_OPERANDS[op]
        a, b = top[i], top[j]
        batch = a[0] if len(a) == 3 else 1
        return batch, a[-2], b[-1], a[-1]
    if op in ("convolution", "convolution_backward"):
        w = top[1] if op == "convolution" else top[2]
        return (2 if op == "convolution_backward" else 1), math.prod(out0), 0, math.prod(w[1:])
    return 0, 0, 0, 0


def matmul_flops_tiles(batch, m, n, k) -> tuple[float, float]:
    """(FLOPs, output tiles of :data:`TILE` x :data:`TILE`) of ``batch`` products of (m x k) by (k x n); ``n`` 0:
    a convolution of ``m`` output elements (``batch`` 2: its backward), tiled by element count."""
    if n == 0:
        return 2.0 * batch * m * k, math.ceil(m / TILE**2)
    return 2.0 * batch * m * n * k, batch * math.ceil(m / TILE) * math.ceil(n / TILE)


def attention_flops(op: str, q, k) -> float:
    """Causal attention FLOPs from the query and key shapes (B, H, T, D): 4 B H T T_k D forward, halved (the blocks
    above the diagonal are skipped), 2.5x that backward; D as the kernel computes it (:func:`attention_head`)."""
    if len(q) != 4:
        return 0.0
    b, h, t, d = q
    forward = 4.0 * b * h * t * k[2] * attention_head(d) / 2
    return forward * (2.5 if "backward" in op else 1.0)


def attention_head(d: int) -> int:
    """The head size an attention kernel computes for heads of ``d``: ``d`` where it is a multiple of 8 (cuDNN's
    and the memory-efficient kernels take it as it is); otherwise only torch's flash kernels run it, rounded up to
    their next head size, a multiple of 32 (OpenLLaMA 3B's 100 runs as 128: ``Flash_fwd_kernel_traits<128, ...>`` in
    our H200 profile by op)."""
    return d if d % 8 == 0 else -(-d // 32) * 32


TRACED_AS = {"16-mixed": "bf16-mixed"}
"""Precisions traced as another of the same sizes: float16 under autocast moves the bytes and does the FLOPs
bfloat16 does (the GPU's peak for the kind, fp16 where there is no bf16, is chosen when the kernels are timed)."""


TEMPLATE_SHAPES = ((2, 20), (3, 28))
"""The two (micro batch, tokens) a :class:`Template` is traced at (LoRA: the tokens plus 128 per head chunk before
the last): each size an op sees is solved as c x B^a x (T + o)^b (a in 0..1, b in 0..2, o in 0, -1, less the
tokens of the full chunks) from its two values; the ratios of B, T, T - 1, B T, B (T - 1), T^2 between these
shapes all differ, and both keep full fine-tuning's loss in one 128-row chunk."""
CHUNK = 128
"""litgpt's chunk: the loss's rows (``chunked_cross_entropy``), the LoRA head's tokens (``lm_head_chunk_size``)."""
CHUNK_SHAPE = (2, 130)
"""A shape whose full fine-tuning loss runs in three chunks of :data:`CHUNK` rows (B (T - 1) = 258): the ops each
chunk more dispatches are counted there."""
VECTORIZED_MASK_OPS = 5
"""Kernels a sliding-window layer's training mask took in litgpt before it filled the mask row by row (up to its
commit 3023ca88): ``ones_like``, ``tril``, ``bool``, ``masked_fill_`` and the ``+=`` onto the causal mask, each over
the whole T x T mask (launch-bound at these sizes: sized here as the row the template keeps)."""
MONOMIALS = [(i, j) for i in range(4) for j in range(5)]
"""The terms B^i T^j a :class:`Template`'s sizes are polynomials in."""


def loss_chunks(method: str, micro: int, tokens: int) -> int:
    """How many chunks litgpt's loss runs in: full fine-tuning's ``chunked_cross_entropy`` by :data:`CHUNK` rows of
    B (T - 1); LoRA's head (``lm_head_chunk_size``) by :data:`CHUNK` tokens, the loss by head chunk."""
    return math.ceil(tokens / CHUNK) if method in LORA_LIKE else math.ceil(micro * (tokens - 1) / CHUNK)


def template_shapes(head_chunks: int, single: bool = False) -> tuple:
    """:data:`TEMPLATE_SHAPES` with the tokens of ``head_chunks - 1`` full LoRA head chunks added (``single``: one
    sample per micro batch in both)."""
    return tuple((1 if single else b, t + CHUNK * (head_chunks - 1)) for b, t in TEMPLATE_SHAPES)


@dataclass
class Template:
    """A step's kernels as polynomials in the micro batch B and the tokens T (one block count): evaluated for any
    shape without tracing again (:meth:`shape_at`). Made by :func:`template`."""

    phase: list
    category: list
    fp32: list
    bytes: object
    """(kernels x :data:`MONOMIALS`) coefficients of the bytes each kernel moves."""
    flops: object
    mm: object
    """Indices of the matmul kernels."""
    mm_dims: object
    """(matmuls x 4 x :data:`MONOMIALS`): batch, m, n, k of each matmul."""
    chunk_ops: dict
    """{phase: ops} one more loss chunk dispatches."""
    logits: list = field(default_factory=list)
    """Whether each kernel is one of the loss's own on the logits (not a matmul; it reads or writes a tensor whose last
    dimension is the vocabulary, or it is the loss itself): what Liger's fused linear cross-entropy replaces."""
    access: list = field(default_factory=list)
    """How each kernel reaches memory (:func:`access_of`): "" contiguous, "strided" (an elementwise kernel over a
    strided view), "conv" / "conv_backward" (cuDNN's grouped convolution of litgpt's LoRA)."""
    count: object = None
    """(kernels x :data:`MONOMIALS`) coefficients of how many kernels each row stands for: 1, or for a run of one op
    that litgpt repeats once per token in a Python loop (the sliding-window mask, filled row by row), the tokens
    (:func:`_aligned`). None: one each."""

    def shape_at(self, micro: int, tokens: int):
        """(bytes, FLOPs, tiles, splits) arrays of the kernels at ``micro`` x ``tokens``: splits is how many parts
        each kernel's reduction may split into (:data:`SPLIT_K_DEPTH` of k each; 1 but for a matmul)."""
        import numpy as np

        mono = np.array([float(micro) ** i * float(tokens) ** j for i, j in MONOMIALS])
        nbytes, flops = self.bytes @ mono, self.flops @ mono
        tiles, splits = np.zeros(len(nbytes)), np.ones(len(nbytes))
        if len(self.mm):
            batch, m, n, k = np.moveaxis(self.mm_dims @ mono, 1, 0)
            conv = n == 0
            tiles[self.mm] = np.where(
                conv, np.ceil(m / TILE**2), batch * np.ceil(m / TILE) * np.ceil(np.maximum(n, 1) / TILE)
            )
            splits[self.mm] = np.where(conv, 1.0, np.maximum(np.floor(k / SPLIT_K_DEPTH), 1.0))
        return nbytes, flops, tiles, splits

    def counts_at(self, micro: int, tokens: int, mask_by_row: bool = True):
        """How many kernels each row stands for at ``micro`` x ``tokens`` (:attr:`count`); ``mask_by_row`` False:
        each run that grows with the shape (the mask's row fills) as :data:`VECTORIZED_MASK_OPS` kernels instead."""
        import numpy as np

        if self.count is None or not len(self.count):
            return np.ones(len(self.phase))
        mono = np.array([float(micro) ** i * float(tokens) ** j for i, j in MONOMIALS])
        counts = self.count @ mono
        if mask_by_row:
            return counts
        grows = np.abs(np.asarray(self.count)[:, 1:]).sum(axis=1) > 0  # MONOMIALS[0] is the constant term
        return np.where(grows, float(VECTORIZED_MASK_OPS), counts)


def kernel_times(tp: Template, nbytes, flops, tiles, gpu, sms: int, splits=None):
    """Each of ``tp``'s kernels' GPU seconds on ``gpu`` (arrays: its bytes, FLOPs and matmul tiles at one shape):
    matmuls and attention by FLOPs at their efficiency (matmuls over their waves, a matmul whose tiles leave SMs idle
    split over its reduction up to ``splits`` parts: :meth:`Template.shape_at`), the rest by bytes over its kind's
    share of :func:`memory_rate`, each at least :data:`MIN_KERNEL_S` (the module docstring)."""
    import numpy as np

    cat = np.array(tp.category)
    peaks = gpu.peak_tflops
    fp32 = np.array(tp.fp32, dtype=bool)
    low = peaks.get("tf32") or peaks["fp32"]
    high = peaks.get("bf16") or peaks.get("fp16") or peaks["fp32"]
    peak = np.where(fp32, low, high) * 1e12
    peak = np.where(fp32 & (cat == "attention"), fp32_attention_peak(peaks) * 1e12, peak)  # not flash
    attention_eff = np.where(fp32, FP32_ATTENTION_EFFICIENCY, ATTENTION_EFFICIENCY)
    matmul_eff = MATMUL_EFFICIENCY * np.where(fp32 & bool(peaks.get("tf32")), TF32_MATMUL_SHARE, 1.0)
    access = np.array(tp.access or [""] * len(cat))
    share = np.select(
        [cat == "optimizer", access == "strided", access == "conv", access == "conv_backward"],
        [
            np.where(fp32, FOREACH_FP32_EFFICIENCY, FOREACH_EFFICIENCY),
            STRIDED_EFFICIENCY,
            CONV_EFFICIENCY,
            CONV_BACKWARD_EFFICIENCY,
        ],
        MEMORY_EFFICIENCY,
    )
    bandwidth = memory_rate(gpu) * share
    if splits is not None:  # split-K: as many parts as fill the SMs the tiles leave idle, at most ``splits``
        tiles = tiles * np.where(tiles < sms, np.clip(np.floor(sms / np.maximum(tiles, 1)), 1, splits), 1)
    waves = np.ceil(np.maximum(tiles, 1) / sms) * sms
    eff = np.where(cat == "matmul", matmul_eff * np.where(tiles > 0, tiles / waves, 1.0), attention_eff)
    compute = np.where(np.isin(cat, ("matmul", "attention")) & (flops > 0), flops / (peak * eff), 0.0)
    return np.maximum(np.maximum(nbytes / bandwidth, compute), MIN_KERNEL_S)


def template_seconds(
    tp: Template,
    micro: int,
    tokens: float,
    gpu,
    sms: int,
    method: str,
    drop_logits: bool = False,
    mask_by_row: bool = True,
) -> tuple:
    """(ops, GPU seconds by category, GPU seconds by phase, ops by phase) of ``tp`` at ``micro`` x ``tokens`` on
    ``gpu``: each kernel by its category (the module docstring), the ops of litgpt's loss chunks beyond the one the
    template holds added at :data:`MIN_KERNEL_S` each. ``drop_logits``: without the loss's own kernels on the logits
    (:attr:`Template.logits`; Liger's fused loss replaces them). ``mask_by_row``: :attr:`Step.mask_by_row`."""
    import numpy as np

    nbytes, flops, tiles, splits = tp.shape_at(micro, tokens)
    counts = tp.counts_at(micro, tokens, mask_by_row)
    if drop_logits:
        keep = ~np.array(tp.logits, dtype=bool)
        tp = dataclasses.replace(
            tp,
            phase=[p for p, k in zip(tp.phase, keep) if k],
            category=[c for c, k in zip(tp.category, keep) if k],
            fp32=[f for f, k in zip(tp.fp32, keep) if k],
            chunk_ops=dict.fromkeys(tp.chunk_ops, 0.0),
            access=[a for a, k in zip(tp.access, keep) if k],
        )
        nbytes, flops, tiles, counts, splits = nbytes[keep], flops[keep], tiles[keep], counts[keep], splits[keep]
    t = kernel_times(tp, nbytes, flops, tiles, gpu, sms, splits) * counts
    cat = np.array(tp.category)
    phases = np.array(tp.phase)
    training = np.isin(phases, TRAINING_PHASES)
    by_cat = {c: float(t[(cat == c) & training].sum()) for c in sorted(set(tp.category))}
    by_phase = {p: float(t[phases == p].sum()) for p in sorted(set(tp.phase))}
    by_phase.update(
        {
            f"{p}/{c}": float(t[(phases == p) & (cat == c)].sum())
            for p in sorted(set(tp.phase))
            for c in sorted(set(tp.category))
        }
    )
    ops_by_phase = {p: float(counts[phases == p].sum()) for p in sorted(set(tp.phase))}
    more = max(loss_chunks(method, micro, math.ceil(tokens)) - 1, 0) if method not in LORA_LIKE else 0
    for p, n in tp.chunk_ops.items():
        ops_by_phase[p] = ops_by_phase.get(p, 0.0) + more * n
        by_phase[p] = by_phase.get(p, 0.0) + more * n * MIN_KERNEL_S
        by_phase[f"{p}/loss"] = by_phase.get(f"{p}/loss", 0.0) + more * n * MIN_KERNEL_S
        by_cat["loss"] = by_cat.get("loss", 0.0) + more * n * MIN_KERNEL_S
    _add_gaps(ops_by_phase, by_cat, by_phase)
    return sum(ops_by_phase.get(p, 0.0) for p in TRAINING_PHASES), by_cat, by_phase, ops_by_phase


def _add_gaps(ops_by_phase: dict, by_cat: dict, by_phase: dict) -> None:
    """Into a step's GPU seconds: :data:`KERNEL_GAP_S` after each op of the :data:`GAP_PHASES` (category ``gaps``,
    ``ops_by_phase``: the ops each phase launches)."""
    for p in GAP_PHASES:
        gaps = ops_by_phase.get(p, 0.0) * KERNEL_GAP_S
        by_phase[p] = by_phase.get(p, 0.0) + gaps
        by_phase[f"{p}/gaps"] = by_phase.get(f"{p}/gaps", 0.0) + gaps
        by_cat["gaps"] = by_cat.get("gaps", 0.0) + gaps


def fp32_attention_peak(peaks: dict) -> float:
    """TFLOP/s the memory-efficient attention kernel has for fp32 inputs: from compute capability 8.0 its CUTLASS
    GEMMs multiply fp32 as three TF32 products (``OpMultiplyAddFastF32``, 3xTF32: big x big + big x small + small x
    big), a third of the TF32 peak; before it (no TF32: V100, T4) on the CUDA cores, the plain FP32 peak."""
    return peaks["tf32"] / 3 if peaks.get("tf32") else peaks["fp32"]


@dataclass(frozen=True)
class Step:
    """One micro batch of litgpt's training step and its share of the optimizer step, as :func:`step_time` times it."""

    config: object
    """litgpt's model config."""
    method: str
    """full, lora or qlora (LoRA's step on 4-bit weights: :mod:`tunelab.plan.model.bnb_kernels`)."""
    precision: str
    """Lightning's precision name (32-true, bf16-true, bf16-mixed, ...)."""
    micro: int
    """Samples per micro batch."""
    tokens: float
    """Padded tokens per sample (a mean over micro batches may be fractional)."""
    optimizer: str = "AdamW"
    """The optimizer's class name as litgpt's YAML gives it."""
    lora: tuple = ()
    """(rank, targets) of the adapters; litgpt's defaults when empty."""
    accumulation: float = 1.0
    """Micro batches per optimizer step (a mean may be fractional): the micro batch timed is their mean, the later
    ones adding their gradients into the first's (:func:`_add_accumulation`)."""
    frozen_grads: str = ""
    """LoRA under FSDP1 (``use_orig_params``): each flat parameter holding a trainable weight gives all of its weights
    a gradient, so the backward computes the frozen weights' gradients too, as full fine-tuning does, while the
    optimizer steps LoRA's tensors alone: "blocks" (every block's), "all" (the root unit's too) or ""
    (:meth:`tunelab.plan.model.strategies.base.Strategy.frozen_weights_grad`)."""
    mask_by_row: bool = True
    """litgpt fills a sliding-window layer's training mask row by row, one kernel per token
    (:attr:`tunelab.plan.model.case.LoopFeatures.sliding_mask_by_row`); False: the older whole-mask build,
    :data:`VECTORIZED_MASK_OPS` kernels a layer."""

    def head_chunks(self) -> int:
        """The chunks LoRA's head runs in at this micro batch (:func:`loss_chunks`); 1 for full fine-tuning."""
        return loss_chunks("lora", self.micro, math.ceil(self.tokens)) if self.method in LORA_LIKE else 1

    def trainable_numels(self) -> list:
        """Elements of each tensor the optimizer steps: every parameter (full fine-tuning) or LoRA's A and B."""
        lora = (self.lora or (LITGPT_LORA_R, LORA_TARGETS)) if self.method in LORA_LIKE else None
        return [math.prod(shape) for shape in trainable_shapes(self.config, lora)]

    def gradient_numels(self) -> list:
        """Elements of each gradient a micro batch adds into the step's: the optimizer's tensors, or under
        :attr:`frozen_grads` each flat parameter whole (one a block, and the root unit's under "all"), LoRA's tensors
        shared among them."""
        if not self.frozen_grads:
            return self.trainable_numels()
        c = self.config
        units = [block_params(c)] * c.n_layer + ([root_unit_params(c)] if self.frozen_grads == "all" else [])
        adapters = sum(self.trainable_numels()) / len(units)
        return [round(n + adapters) for n in units]


@dataclass
class _Tally:
    """A step's sums as :func:`step_time` gathers them: GPU seconds by category and by phase (``both``: phases and
    "phase/category" keys), kernels and host ops by phase."""

    by_cat: dict
    both: dict
    kernel_ops: dict
    host_ops: dict

    def add(self, phase: str, category: str, seconds: float, kernels: int, host_ops: float) -> None:
        """``kernels`` more kernels of ``category`` in ``phase`` (``seconds`` on the GPU, each with its gap) and
        ``host_ops`` dispatched ops; a training phase's seconds also count in its category."""
        for key in (phase, f"{phase}/{category}"):
            self.both[key] = self.both.get(key, 0.0) + seconds
        self.kernel_ops[phase] = self.kernel_ops.get(phase, 0) + kernels
        self.host_ops[phase] = self.host_ops.get(phase, 0) + host_ops
        if phase in TRAINING_PHASES:
            self.by_cat[category] = self.by_cat.get(category, 0.0) + seconds
        _add_gaps({phase: kernels}, self.by_cat, self.both)


def step_time(step: Step, gpu_name: str, *, tables: Tables) -> StepTime:
    """``step``'s time by cause on ``gpu_name``: the templates of one and two blocks at its micro batch x padded
    tokens (``tables``: where they come from), extrapolated by block, with what the trace does not record
    (:func:`_add_untraced`)."""

    gpu = hardware.lookup(gpu_name)
    sms = gpu.sms or DEFAULT_SMS
    kinds = block_kinds(step.config)

    def seconds(layers: list) -> tuple:
        tp = tables.template(dataclasses.replace(step, config=with_blocks(step.config, layers)))
        return template_seconds(tp, step.micro, step.tokens, gpu, sms, step.method, mask_by_row=step.mask_by_row)

    # the first block alone, then each kind of block after it: a block of that kind adds what the second adds
    first = seconds(kinds[:1])
    second_kind = kinds[1] if len(kinds) > 1 else kinds[0]
    later = {kind: seconds([kinds[0], kind]) for kind in dict.fromkeys([second_kind, *kinds[1:]])}
    n_a, cat_a, ph_a, ops_a = first
    n_b = later[second_kind][0]
    grown = {kind: kinds[1:].count(kind) for kind in later}
    grown[second_kind] -= 1  # the second block is in its two-block step already

    def extra(a: dict, pick: int) -> dict:
        b = later[second_kind][pick]
        keys = sorted(set(a).union(*(later[kind][pick] for kind in later)))
        out = {key: b.get(key, 0.0) + grown[second_kind] * (b.get(key, 0.0) - a.get(key, 0.0)) for key in keys}
        for kind, times in grown.items():
            if kind != second_kind:
                more = later[kind][pick]
                out = {key: out[key] + times * (more.get(key, 0.0) - a.get(key, 0.0)) for key in keys}
        return out

    by_cat, both, ops_by_phase = extra(cat_a, 1), extra(ph_a, 2), extra(ops_a, 3)
    ops = round(n_b + grown[second_kind] * (n_b - n_a))
    ops += sum(times * (later[kind][0] - n_a) for kind, times in grown.items() if kind != second_kind)
    kernel_ops = {k: round(v) for k, v in ops_by_phase.items()}
    host_ops = dict(kernel_ops)
    ops += _add_untraced(step, gpu, _Tally(by_cat, both, kernel_ops, host_ops))
    host_s = sum(host_ops.get(p, 0) for p in TRAINING_PHASES) * HOST_S_PER_OP
    by_phase = {k: v for k, v in both.items() if "/" not in k}
    split = {k: v for k, v in both.items() if "/" in k}
    return StepTime(gpu_name, ops, sum(by_cat.values()), host_s, by_cat, by_phase, kernel_ops, split, host_ops)


LAYER_LISTS = ("sliding_window_indices", "rope_indices")
"""litgpt's per-block settings (a 0/1 per layer): blocks that differ in them dispatch other kernels."""


def block_kinds(config) -> list:
    """Each block's kind as litgpt builds it, a tuple of its :data:`LAYER_LISTS` flags (Gemma 2's alternating
    local and global attention: two kinds; most models: one)."""
    lists = [getattr(config, name, None) for name in LAYER_LISTS]
    return [tuple(flags[i] if flags else 0 for flags in lists) for i in range(config.n_layer)]


def with_blocks(config, layers: list):
    """``config`` with the blocks ``layers`` (kinds from :func:`block_kinds`): its per-block lists cut to them."""
    lists = {name: [kind[i] for kind in layers] for i, name in enumerate(LAYER_LISTS) if getattr(config, name, None)}
    return dataclasses.replace(config, n_layer=len(layers), **lists)


def _add_bitsandbytes(step: Step, gpu, tally: _Tally, numels: list) -> int:
    """Add what the trace does not see of bitsandbytes (:mod:`tunelab.plan.model.bnb_kernels`) to a step's sums:
    QLoRA's dequantization kernels (category ``dequantization``, each with its gap) and its Python per 4-bit matmul;
    a paged AdamW's kernel and Python per tensor (``numels``: :meth:`Step.trainable_numels`). Returns the training
    phases' kernels added."""

    work = {}
    if step.method == "qlora":
        share = {phase: eval_host_share(phase, step.method) for phase in bnb_kernels.EVAL_PYTHON_SHARE}
        work = bnb_kernels.qlora_work(step.config, step.tokens, memory_rate(gpu), MIN_KERNEL_S, share)
    if step.optimizer.startswith("Paged"):
        rate = memory_rate(gpu) * MEMORY_EFFICIENCY
        work["optimizer"] = bnb_kernels.paged_adamw(numels, rate, MIN_KERNEL_S)
    for phase, (sec, n, host) in work.items():
        tally.add(phase, "optimizer" if phase == "optimizer" else "dequantization", sec, n, n + round(host))
    return sum(n for phase, (_, n, _) in work.items() if phase in TRAINING_PHASES)


def _add_untraced(step: Step, gpu, tally: _Tally) -> int:
    """Add to a step's sums what the trace of one micro batch, the first of its step, does not record: a for-each
    optimizer's reads of its step counters (host work, no kernel), bitsandbytes' work (:func:`_add_bitsandbytes`),
    the later micro batches' gradient accumulation (:func:`_add_accumulation`). Returns the kernels added."""
    numels = step.trainable_numels()
    if reads := optimizers.host_reads_per_tensor(step.optimizer):  # a for-each step reads step counters (no kernel)
        per_tensor = ADAM_FOREACH_HOST_OPS_PER_TENSOR * reads / optimizers.STEP_COUNTER_READS["AdamW"]
        tally.host_ops["optimizer"] = tally.host_ops.get("optimizer", 0) + round(len(numels) * per_tensor)
    added = _add_bitsandbytes(step, gpu, tally, numels)
    work = accumulation_work(step.gradient_numels(), parameter_bytes(step.precision), step.accumulation, gpu)
    return added + _add_accumulation(work, tally)


def accumulation_work(numels: list, grad_bytes: int, accumulation: float, gpu) -> tuple[float, int]:
    """(GPU seconds, kernels) of the mean micro batch's gradient accumulation at ``accumulation`` micro batches per
    optimizer step: each after the first adds every gradient (``numels`` elements of
    ``grad_bytes``) into ``.grad``, both read and one written at the eager memory rate, at least
    :data:`MIN_KERNEL_S` a tensor; the first takes its gradients as they are."""
    share = 1 - 1 / max(1.0, accumulation)
    if share <= 0:
        return 0.0, 0
    rate = memory_rate(gpu) * MEMORY_EFFICIENCY
    return share * sum(max(3 * n * grad_bytes / rate, MIN_KERNEL_S) for n in numels), round(share * len(numels))


def _add_accumulation(work: tuple, tally: _Tally) -> int:
    """Add gradient accumulation (``work``: :func:`accumulation_work`) to a micro batch's backward: autograd's
    AccumulateGrad, ``grad += new``, one kernel and one op a tensor in each micro batch after the step's first (the
    trace records a first). Returns the kernels added."""
    seconds, kernels = work
    if kernels:
        tally.add("backward", "elementwise", seconds, kernels, kernels)
    return kernels


def board_scaled(st, gpu_scale: float):
    """:class:`StepTime` ``st`` with every kernel's time times ``gpu_scale`` (a board that runs them slower or faster
    than the model's constants); the host's launches unchanged."""
    if gpu_scale == 1.0:
        return st
    return dataclasses.replace(
        st,
        gpu_s=st.gpu_s * gpu_scale,
        gpu_by_category={key: v * gpu_scale for key, v in st.gpu_by_category.items()},
        gpu_by_phase={key: v * gpu_scale for key, v in st.gpu_by_phase.items()},
        gpu_by_phase_category={key: v * gpu_scale for key, v in st.gpu_by_phase_category.items()},
    )


def sharded_optimizer(st, shards: int):
    """:class:`StepTime` ``st`` with its optimizer step's kernels over 1/``shards`` of the
    parameters (a rank's share under a sharded optimizer: :attr:`tunelab.plan.model.runtime.KernelWork.optimizer_shards`): their time divided,
    each still at least :data:`MIN_KERNEL_S`; the host's launches unchanged."""
    if shards <= 1:
        return st
    floor = st.ops_by_phase.get("optimizer", 0) * MIN_KERNEL_S
    whole = st.gpu_by_phase.get("optimizer", 0.0)
    share = max(whole / shards, floor) / whole if whole else 1.0
    by_cat = {k: v * share if k == "optimizer" else v for k, v in st.gpu_by_category.items()}
    return dataclasses.replace(
        st,
        gpu_s=sum(by_cat.values()),
        gpu_by_category=by_cat,
        gpu_by_phase={k: v * share if k == "optimizer" else v for k, v in st.gpu_by_phase.items()},
        gpu_by_phase_category={
            k: v * share if k.startswith("optimizer/") else v for k, v in st.gpu_by_phase_category.items()
        },
    )


def for_plan(case, gpu) -> StepTime | str:
    """The step by kernel of a planned configuration (:class:`tunelab.plan.model.memory.PlanInput`) on ``gpu``, or why it
    is not modelled (a sentence): litgpt's own script on one device, full fine-tuning, LoRA or QLoRA."""
    if case.world > 1 or not case.loop.fabric:
        return "not modelled yet for several devices or tunelab's loop (a strategies file)"
    step = Step(
        case.config,
        case.method,
        str(case.precision),
        case.micro_batch_size,
        case.seq_len,
        optimizer_of(case),
        lora_of(case),
        case.accumulation,
    )
    return step_time(step, gpu.name, tables=tables_of(case))


def to_json(st) -> dict:
    """``plan --simulate --gpu --json``: the step by kernel, or ``{"not_modelled": why}``."""
    return {"not_modelled": st} if isinstance(st, str) else {**dataclasses.asdict(st), "step_s": st.step_s}


def render(st) -> str:
    """``plan --simulate --gpu``: the step by kernel, in lines."""
    if isinstance(st, str):
        return f"\nstep by kernel: {st}"
    cats = ", ".join(f"{k} {v:.4f}" for k, v in sorted(st.gpu_by_category.items(), key=lambda kv: -kv[1]))
    bound = "the host's launches" if st.host_s > st.gpu_s else "the GPU's kernels"
    return (
        f"\nstep by kernel on {st.gpu} (tunelab/plan/model/kernels.py; constants fitted on H100 and H200 profiles): "
        f"{st.step_s:.4f} s for one micro batch and an optimizer step, bound by {bound}\n"
        f"  GPU {st.gpu_s:.4f} s: {cats}\n"
        f"  host {st.host_s:.4f} s: {st.host_s / HOST_S_PER_OP:,.0f} ops x {HOST_S_PER_OP * 1e6:.0f} us"
    )
