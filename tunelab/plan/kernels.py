"""The simulated step's kernels, timed one by one on a named GPU: the first piece of the runtime model by cause.

The step of :mod:`tunelab.plan.simulate` (litgpt's model, loss and optimizer on fake tensors, at full width) runs
under a ``TorchDispatchMode`` that records every ATen op it dispatches in the forward pass and the loss, the
backward pass and the optimizer step: its category, its FLOPs (matmuls and attention) and the bytes it reads and
writes (every tensor argument and result that is not a view). Ops that only make views launch no kernel and are
not counted. The step is traced with one and with two blocks and extrapolated by block to the model's ``n_layer``,
as the memory simulation does.

Each kernel gets a time on the GPU (``configs/hardware/gpus.yaml``):

* matmul: FLOPs / (dense peak of the compute dtype x :data:`MATMUL_EFFICIENCY` x the share of the GPU's SMs its
  output tiles keep busy over its waves (:func:`wave_efficiency`: tiles of :data:`TILE` x :data:`TILE`, one wave
  per SM count));
  fp32 matmuls as TF32 on tensor cores (litgpt's 'high') at :data:`TF32_MATMUL_SHARE` of that efficiency;
* attention (flash): FLOPs / (dense peak x :data:`ATTENTION_EFFICIENCY`), causal (half the score blocks); fp32
  attention, which flash does not take, by the memory-efficient kernel, whose fp32 products are three TF32 ones
  (:func:`fp32_attention_peak`) x :data:`FP32_ATTENTION_EFFICIENCY`;
* everything else (norms, RoPE, SwiGLU, casts, copies, the loss, the optimizer's for-each ops, LoRA's grouped
  convolution): bytes / (:func:`memory_rate`, the HBM's bandwidth or what the SMs move, x its kind's share:
  :data:`MEMORY_EFFICIENCY` contiguous, :data:`STRIDED_EFFICIENCY` over a strided view, :data:`FOREACH_EFFICIENCY`,
  :data:`CONV_EFFICIENCY` / :data:`CONV_BACKWARD_EFFICIENCY`; :attr:`Template.access`);
* every kernel at least :data:`MIN_KERNEL_S`.

The host launches the kernels one after another: :data:`HOST_S_PER_OP` per dispatched op (Python, the dispatcher,
the launch), and the for-each AdamW's Python work per tensor (:data:`ADAM_FOREACH_HOST_OPS_PER_TENSOR`). The step
takes ``max(GPU time, host time)``: a small model with many small kernels (LoRA on 1B) waits on the host, a large one
on the GPU.

Checked against our H100 profile (:data:`PROFILE`, where most constants were fitted) and the H100 and H200 grids
(:data:`GRIDS`): ``reports/planner-accuracy/kernels.md``. :mod:`tunelab.plan.runtime` puts the run around the step
(validations, saves, communication, the litgpt loop's own host time).
"""

from __future__ import annotations

import dataclasses
import math
import sys
import warnings
from dataclasses import dataclass, field

from tunelab.settings import LORA_TARGETS
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
the H100 profile's matmul time (TinyLlama full, 29.1 ms)."""
ATTENTION_EFFICIENCY = 0.19
"""Fraction of the dense peak the flash kernels reach at fine-tuning lengths (437 tokens, head size 64: short rows,
few tiles); fitted on the H100 profile's attention time (3.0 ms)."""
TF32_MATMUL_SHARE = 0.81
"""An fp32 matmul's efficiency against the TF32 peak, as a share of :data:`MATMUL_EFFICIENCY` (a bf16 matmul's
against the bf16 peak): cuBLAS's TF32 kernels reach less of their peak than its bf16 ones (their operands are twice
as wide: twice the bytes per FLOP to feed the tensor cores; a reading, not measured apart). Fitted on the H200 grid's fp32 line at micro 8
(TinyLlama full, 32-true: 72.2 ms of matmul kernels against 58.3 planned at the bf16 share); its micro-32 line is
out of sample (``reports/planner-accuracy/kernels.md``)."""
FP32_ATTENTION_EFFICIENCY = 0.15
"""Fraction of :func:`fp32_attention_peak` that fp32 attention reaches (the same causal FLOPs as flash): torch's
flash kernels take only 16-bit inputs, so fp32 SDPA runs the memory-efficient (CUTLASS) kernel. Fitted on the H200
grid's fp32 line at micro 8 (19.7 ms of attention kernels; timed as flash at the TF32 peak it was 5.1 ms); its
micro-32 line is out of sample."""
MEMORY_EFFICIENCY = 0.9
"""Fraction of :func:`memory_rate` a contiguous eager elementwise kernel reaches (a large device-to-device copy
moves about 90% of the HBM's peak on the H100 and H200 machines we borrow). Fitted with
:data:`STRIDED_EFFICIENCY` and :data:`SM_BYTES_PER_CYCLE` on the elementwise, loss and copy kernels of eight
full fine-tuning steps: the H100 profile, the H100 grid's five, two H200 lines (bounded at 0.9: the fit alone
wanted 1.0)."""
FOREACH_EFFICIENCY = 0.56
"""Fraction of :func:`memory_rate` torch's for-each optimizer kernels reach (many tensors per launch, bf16 math in
fp32); fitted on the H100 profile's optimizer phase (TinyLlama full, AdamW for-each, 16.4 ms)."""
STRIDED_EFFICIENCY = 0.44
"""Fraction of :func:`memory_rate` an elementwise kernel reaches when an operand is a strided view (RoPE on a
transposed head, its halves, their cat, copies and slice gradients): torch's unvectorized TensorIterator path.
Fitted with :data:`MEMORY_EFFICIENCY` (above); the H200 profile of OpenLLaMA 3B and 7B by op shows these ops
(cat, clone, neg, slice_backward) 2 to 3x slower than their bytes at the contiguous rate."""
CONV_EFFICIENCY = 0.13
"""Fraction of :func:`memory_rate` cuDNN's grouped 1-D convolution (litgpt's LoRA on the fused qkv: the r-wide
groups into the q, k, v widths) reaches over the bytes it reads and writes, forward, layout conversions to NHWC
and back included: measured on the H200 (OpenLLaMA 7B LoRA, micro 8 x 437: 172 us a call for an 86 MB output)."""
CONV_BACKWARD_EFFICIENCY = 0.034
"""The same for its backward (data and weight gradients: an implicit GEMM over the tokens with an r-wide reduction,
the layouts converted again): 648 us a call on that line, 27x its bytes at the contiguous rate."""
SM_BYTES_PER_CYCLE = 15.0
"""Bytes an SM moves to and from memory per clock cycle in an eager kernel (the loads it keeps in flight over the
memory's latency): with the SM count and the boost clock, a ceiling on the rate that can sit below the HBM's
(:func:`memory_rate`): 3.9 TB/s for 132 SMs at 1980 MHz, under the H200's 4.8 TB/s HBM and over the H100's 3.35.
Fitted with :data:`MEMORY_EFFICIENCY`; checked out of sample by the H200's optimizer phases (for-each kernels,
another efficiency), which the HBM's figure alone put 15-20% short."""
MIN_KERNEL_S = 3e-6
"""The shortest a kernel takes on the GPU (launch latency and a tail): seconds."""
HOST_S_PER_OP = 35e-6
"""Host time per dispatched op in eager PyTorch (Python module code, the dispatcher, autograd's bookkeeping, the
launch); fitted on the H100 profile's two steps (full 97.6 ms, GPU-bound; LoRA 160.7 ms, host-bound: its kernels
keep the GPU busy 89 ms)."""
ADAM_FOREACH_HOST_OPS_PER_TENSOR = 0.74
"""Host work per trainable tensor of torch's for-each Adam/AdamW step beyond its for-each ops, in dispatched ops
(:data:`HOST_S_PER_OP` each): without ``capturable`` it reads every tensor's step counter on the host twice
(``_get_value(step)`` for both bias corrections, torch/optim/adam.py) and builds the per-tensor step sizes in Python.
Fitted on the H100 profile's and grid's launch-bound LoRA optimizer phases (TinyLlama: 222 tensors, 5.1-6.9 ms;
OpenLLaMA 3B: 262, 6.0-7.1 ms; the median); the fused step (one kernel over the list) has none."""
TILE = 128
"""Output tile edge of a tensor-core matmul kernel (cuBLAS's common 128 x 128 / 128 x 256 tiles)."""
NOT_KERNELS = frozenset(
    "device _record_function_enter_new _record_function_exit empty empty_like empty_strided new_empty "
    "new_empty_strided _unsafe_view detach alias lift_fresh is_same_size sym_size sym_numel sym_stride stride dim "
    "is_contiguous _has_compatible_shallow_copy_type".split()
)
"""Ops that launch no GPU kernel: queries, allocations, views without alias annotations."""
DEFAULT_SMS = 108
"""Streaming multiprocessors assumed for a GPU table row without a sourced ``sms`` (an A100's)."""


@dataclass
class Kernel:
    """One dispatched op: its phase, category, FLOPs, bytes moved, and the matmul's output tiles."""

    phase: str
    op: str
    category: str
    flops: float = 0.0
    bytes: float = 0.0
    tiles: int = 0
    dtype: str = "bf16"


@dataclass
class Op:
    """One dispatched op as recorded: the shapes it saw, from which :func:`measure` gives its :class:`Kernel`."""

    phase: str
    op: str
    category: str
    dtype: str
    top: list
    """The shape of each positional argument that is a tensor (None for the others): the matmul's operands."""
    out0: tuple | None
    """The first result's shape."""
    moved: list
    """(shape, bytes per element) of every tensor read or written (inputs only for an op in place)."""
    strided: bool = False
    """Whether a tensor it reads or writes is not contiguous (a strided view: RoPE's halves, a transposed head):
    torch's elementwise kernels then take their unvectorized, strided path."""


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


def wave_efficiency(tiles: int, sms: int) -> float:
    """The share of SM slots a matmul's ``tiles`` output tiles keep busy: the last wave is partly empty."""
    if tiles <= 0:
        return 1.0
    return tiles / (math.ceil(tiles / sms) * sms)


def _category(name: str) -> str:
    if name in ("mm", "addmm", "bmm", "baddbmm", "convolution", "convolution_backward"):
        return "matmul"
    if "attention" in name:
        return "attention"
    if name.startswith("_foreach") or name.startswith("_fused_adam"):
        return "optimizer"
    if "log_softmax" in name or "nll_loss" in name:
        return "loss"
    return "elementwise"


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


def attention_head(d: int) -> int:
    """The head size an attention kernel computes for heads of ``d``: ``d`` where it is a multiple of 8 (cuDNN's
    and the memory-efficient kernels take it as it is); otherwise only torch's flash kernels run it, rounded up to
    their next head size, a multiple of 32 (OpenLLaMA 3B's 100 runs as 128: ``Flash_fwd_kernel_traits<128, ...>`` in
    our H200 profile by op)."""
    return d if d % 8 == 0 else -(-d // 32) * 32


def attention_flops(op: str, q, k) -> float:
    """Causal attention FLOPs from the query and key shapes (B, H, T, D): 4 B H T T_k D forward, halved (the blocks
    above the diagonal are skipped), 2.5x that backward; D as the kernel computes it (:func:`attention_head`)."""
    if len(q) != 4:
        return 0.0
    b, h, t, d = q
    forward = 4.0 * b * h * t * k[2] * attention_head(d) / 2
    return forward * (2.5 if "backward" in op else 1.0)


def measure(op: Op) -> Kernel:
    """An :class:`Op`'s FLOPs, bytes and tiles."""
    k = Kernel(op.phase, op.op, op.category, dtype=op.dtype)
    if op.category == "matmul":
        k.flops, k.tiles = matmul_flops_tiles(*matmul_dims(op.op, op.top, op.out0))
    elif op.category == "attention" and len(op.top) > 1 and op.top[0] and op.top[1]:
        k.flops = attention_flops(op.op, op.top[0], op.top[1])
    k.bytes = float(sum(math.prod(shape) * size for shape, size in op.moved))
    return k


def _flat(x) -> list:
    """The tensors in an op's arguments or results (nested lists and tuples included)."""
    import torch
    from torch.utils._pytree import tree_leaves

    return [t for t in tree_leaves(x) if isinstance(t, torch.Tensor)]


def _recorder(ops: list, state: dict):
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    class Recorder(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            schema = func._schema
            name = schema.name.split("::")[-1]
            views = all(r.alias_info is not None and not r.alias_info.is_write for r in schema.returns)
            if (views and schema.returns) or name in NOT_KERNELS:
                return out  # a view, a query or an allocation: no kernel
            if name == "_local_scalar_dense":  # .item(): a copy to the host, no kernel of its own
                return out
            if state["phase"] == "not recorded":
                return out
            ins, outs = _flat(args) + _flat(list((kwargs or {}).values())), _flat(out)
            in_place = bool(schema.returns) and all(r.alias_info is not None for r in schema.returns)
            moved = [(tuple(t.shape), t.element_size()) for t in (ins if in_place else ins + outs)]
            dt = next((t.dtype for t in ins + outs if t.is_floating_point()), None)
            top = [tuple(a.shape) if isinstance(a, torch.Tensor) else None for a in args]
            strided = any(t.numel() > 1 and not t.is_contiguous() for t in ins + outs) or _cast16(name, ins, outs)
            ops.append(
                Op(state["phase"], name, _category(name), str(dt).removeprefix("torch.") if dt else "bfloat16", top,
                   tuple(outs[0].shape) if outs else None, moved, strided)
            )  # fmt: skip
            return out

    return Recorder()


def _cast16(name: str, ins: list, outs: list) -> bool:
    """A copy between float16 and bfloat16 (QLoRA's backward: bitsandbytes dequantizes to float16, then ``.to()``
    the compute dtype): torch's copy kernel vectorizes casts from float32 but runs this one unrolled, with dynamic
    casting (``unrolled_elementwise_kernel<direct_copy_kernel_cuda>`` in the H200 profile, once per 4-bit matmul),
    so it is timed as a strided kernel."""
    import torch

    dtypes = {t.dtype for t in ins + outs}
    return name in ("_to_copy", "copy_") and dtypes == {torch.float16, torch.bfloat16}


TRACED_AS = {"16-mixed": "bf16-mixed"}
"""Precisions traced as another of the same sizes: float16 under autocast moves the bytes and does the FLOPs
bfloat16 does (the GPU's peak for the kind, fp16 where there is no bf16, is chosen when the kernels are timed)."""


def record_step(
    config,
    method: str,
    precision: str,
    micro: int,
    seq_len: int,
    optimizer: str = "AdamW",
    lora: tuple = (),
    evaluate: bool = True,
) -> list:
    """Every :class:`Op` of one training step of ``config`` as built, as litgpt's finetune script runs it (forward,
    loss, backward, optimizer step and zero_grad), with the optimizer's states already made: a first step on zero
    gradients makes them, unrecorded; then (``evaluate``) a validation batch and a decoded token
    (:func:`_record_eval`). ``lora``: (rank, targets), litgpt's defaults when empty."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    from tunelab.plan.measure import cuda_dropout, model_logits, training_loss
    from tunelab.plan.simulate import setup_step
    from tunelab.settings import LITGPT_LORA_R, LORA_TARGETS

    lora_r, targets = lora or (LITGPT_LORA_R, LORA_TARGETS)
    precision = TRACED_AS.get(str(precision), str(precision))

    ops: list = []
    state = {"phase": "forward"}
    with FakeTensorMode(), cuda_dropout(), warnings.catch_warnings():
        warnings.filterwarnings("ignore")
        model, opt, _ = setup_step(config, method, precision, seq_len, False, lora_r, tuple(targets), optimizer)
        trainable = [p for p in model.parameters() if p.requires_grad]
        for p in trainable:
            p.grad = torch.zeros_like(p)
        opt.step()
        opt.zero_grad()
        x = torch.zeros(micro, seq_len, dtype=torch.long)
        with _recorder(ops, state):
            logits = model_logits(model, x, method, precision)
            loss = training_loss(logits, x, method)
            state["phase"] = "backward"
            loss.backward()
            state["phase"] = "optimizer"
            opt.step()
            opt.zero_grad()
            del logits, loss
            if evaluate:
                _record_eval(model, x, precision, state)
    return ops


def _record_eval(model, x, precision: str, state: dict) -> None:
    """litgpt's ``validate`` batch (eval mode, no gradients, the whole head, the loss unchunked) as phase
    ``validation``, and one token of ``generate_example`` (a KV cache for one sample) as phase ``decode``."""
    import torch
    from litgpt.utils import chunked_cross_entropy

    from tunelab.plan.measure import forward_context

    model.eval()
    with torch.no_grad():
        state["phase"] = "validation"
        with forward_context(precision):
            logits = model(x)
        chunked_cross_entropy(logits.float()[..., :-1, :], x[..., 1:], chunk_size=0)
        del logits
        state["phase"] = "not recorded"
        model.set_kv_cache(batch_size=1)
        # the position as a constant the fake mode knows: a sliding-window cache reads it on the host (``.item()``)
        position = torch.tensor([0])
        state["phase"] = "decode"
        torch.zeros(1, dtype=torch.long)  # the one small kernel of litgpt's per-token position update (``add_``)
        with forward_context(precision):
            model(x[:1, :1], input_pos=position)
        state["phase"] = "not recorded"
    model.clear_kv_cache()
    model.train()


def trace_step(config, method: str, precision: str, micro: int, seq_len: int, optimizer: str = "AdamW") -> list:
    """Every :class:`Kernel` of one training step (:func:`record_step`)."""
    return [measure(op) for op in record_step(config, method, precision, micro, seq_len, optimizer)]


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


def _form(v1: int, v2: int, head_chunks: int = 1, single: bool = False) -> dict:
    """The polynomial {(i, j): c} in B and T whose values at the two :func:`template_shapes` are ``v1`` and ``v2``."""
    (b1, t1), (b2, t2) = template_shapes(head_chunks, single)
    if v1 == v2:
        return {(0, 0): v1} if v1 else {}
    full = CHUNK * (head_chunks - 1)
    for o in sorted({0, -1, -full, -full - 1}, reverse=True):
        for a, b in ((1, 0), (0, 1), (1, 1), (0, 2), (1, 2)):
            if b == 0 and o:
                continue
            f1, f2 = b1**a * (t1 + o) ** b, b2**a * (t2 + o) ** b
            if v1 % f1 == 0 and v2 % f2 == 0 and v1 // f1 == v2 // f2:
                terms = {(a, r): v1 // f1 * math.comb(b, r) * o ** (b - r) for r in range(b + 1)}
                return {key: c for key, c in terms.items() if c}
    raise ValueError(f"a size {v1} -> {v2} that is no c B^a (T + o)^b")


def _mul(p: dict, q: dict) -> dict:
    out: dict = {}
    for (i, j), c in p.items():
        for (k, m), d in q.items():
            out[(i + k, j + m)] = out.get((i + k, j + m), 0) + c * d
    return out


def _vec(p: dict) -> list:
    return [p.get(m, 0) for m in MONOMIALS]


@dataclass
class Template:
    """A step's kernels as polynomials in the micro batch B and the tokens T (one block count): evaluated for any
    shape without tracing again (:meth:`kernels_at`). Made by :func:`template`."""

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

    def kernels_at(self, micro: int, tokens: int):
        """(bytes, FLOPs, tiles) arrays of the kernels at ``micro`` x ``tokens``."""
        import numpy as np

        mono = np.array([float(micro) ** i * float(tokens) ** j for i, j in MONOMIALS])
        nbytes, flops = self.bytes @ mono, self.flops @ mono
        tiles = np.zeros(len(nbytes))
        if len(self.mm):
            batch, m, n, _ = np.moveaxis(self.mm_dims @ mono, 1, 0)
            conv = n == 0
            tiles[self.mm] = np.where(
                conv, np.ceil(m / TILE**2), batch * np.ceil(m / TILE) * np.ceil(np.maximum(n, 1) / TILE)
            )
        return nbytes, flops, tiles

    def counts_at(self, micro: int, tokens: int):
        """How many kernels each row stands for at ``micro`` x ``tokens`` (:attr:`count`)."""
        import numpy as np

        if self.count is None or not len(self.count):
            return np.ones(len(self.phase))
        mono = np.array([float(micro) ** i * float(tokens) ** j for i, j in MONOMIALS])
        return self.count @ mono


def _runs(ops: list) -> list:
    """``ops`` as runs of consecutive ops of one kind: [((phase, op, category, dtype), [ops]), ...]."""
    out: list = []
    for o in ops:
        key = (o.phase, o.op, o.category, o.dtype)
        if out and out[-1][0] == key:
            out[-1][1].append(o)
        else:
            out.append((key, [o]))
    return out


def _aligned(ops1: list, ops2: list, head_chunks: int, single: bool) -> tuple:
    """The ops of two traces at the two template shapes paired one for one, and how many kernels each pair stands
    for (a polynomial in B and T). A run of one op whose length grows with the shape (litgpt's sliding-window
    attention fills its mask row by row in a Python loop: one ``fill_`` per token and layer) becomes one row counted
    by that polynomial and sized as the run's last (largest) kernel; such kernels are launch-bound
    (:data:`MIN_KERNEL_S` each on the GPU, one dispatched op each on the host)."""
    one = {(0, 0): 1}
    if [o.op for o in ops1] == [o.op for o in ops2]:
        return ops1, ops2, [one] * len(ops1)
    runs1, runs2 = _runs(ops1), _runs(ops2)
    if [key for key, _ in runs1] != [key for key, _ in runs2]:
        raise ValueError("the step dispatches different ops at the two template shapes")
    out1, out2, counts = [], [], []
    for (_, run1), (_, run2) in zip(runs1, runs2):
        if len(run1) == len(run2):
            out1 += run1
            out2 += run2
            counts += [one] * len(run1)
        else:
            out1.append(run1[-1])
            out2.append(run2[-1])
            counts.append(_form(len(run1), len(run2), head_chunks, single))
    return out1, out2, counts


def _ops_template(ops1: list, ops2: list, head_chunks: int, single: bool) -> tuple:
    """The polynomial bytes, FLOPs and matmul dims of each op of two traces of the same step at the two shapes
    (paired by :func:`_aligned`)."""
    rows_b, rows_f, mm, mm_dims = [], [], [], []
    for idx, (o1, o2) in enumerate(zip(ops1, ops2)):
        nbytes: dict = {}
        for (s1, size), (s2, _) in zip(o1.moved, o2.moved):
            p = {(0, 0): size}
            for d1, d2 in zip(s1, s2):
                p = _mul(p, _form(d1, d2, head_chunks, single))
            for key, c in p.items():
                nbytes[key] = nbytes.get(key, 0) + c
        flops: dict = {}
        if o1.category == "matmul":
            dims = matmul_dims(o1.op, o1.top, o1.out0), matmul_dims(o2.op, o2.top, o2.out0)
            dims = [_form(a, b, head_chunks, single) for a, b in zip(*dims)]
            mm.append(idx)
            mm_dims.append([_vec(d) for d in dims])
            batch, m, n, k = dims
            flops = _mul(_mul(_mul(batch, m), n if n else {(0, 0): 1}), k)
            flops = {key: 2 * c for key, c in flops.items()}
        elif o1.category == "attention" and len(o1.top) > 1 and o1.top[0] and len(o1.top[0]) == 4:
            q = [_form(a, b, head_chunks, single) for a, b in zip(o1.top[0], o2.top[0])]
            kt = _form(o1.top[1][2], o2.top[1][2], head_chunks, single)
            flops = _mul(_mul(_mul(_mul(q[0], q[1]), q[2]), q[3]), kt)
            scale = 2.0 * (2.5 if "backward" in o1.op else 1.0)  # 4 B H T Tk D / 2, backward 2.5x
            scale *= attention_head(o1.top[0][3]) / o1.top[0][3]  # the head size the kernel computes
            flops = {key: scale * c for key, c in flops.items()}
        rows_b.append(_vec(nbytes))
        rows_f.append(_vec(flops))
    return rows_b, rows_f, mm, mm_dims


def template(
    config,
    method: str,
    precision: str,
    optimizer: str = "AdamW",
    head_chunks: int = 1,
    single: bool = False,
    lora: tuple = (),
) -> Template:
    """The step of ``config`` as built (its ``n_layer``) as a :class:`Template`: traced at the two
    :func:`template_shapes` (LoRA: for a head in ``head_chunks`` chunks, whose chunks, strided views, take other
    kernels than one whole head), and for full fine-tuning at :data:`CHUNK_SHAPE` for the ops of a loss chunk."""
    import numpy as np

    (b1, t1), (b2, t2) = template_shapes(head_chunks, single)
    ops1 = record_step(config, method, precision, b1, t1, optimizer, lora)
    ops2 = record_step(config, method, precision, b2, t2, optimizer, lora)
    ops1, ops2, counts = _aligned(ops1, ops2, head_chunks, single)
    rows_b, rows_f, mm, mm_dims = _ops_template(ops1, ops2, head_chunks, single)
    count = np.array([_vec(c) for c in counts], dtype=float).reshape(len(ops1), len(MONOMIALS))
    chunk_ops = {"forward": 0.0, "backward": 0.0, "optimizer": 0.0}
    if method not in LORA_LIKE:
        b3, t3 = (1, 2 * CHUNK + 2) if single else CHUNK_SHAPE
        more = record_step(config, method, precision, b3, t3, optimizer, lora, evaluate=False)  # training ops only
        extra = loss_chunks(method, b3, t3) - loss_chunks(method, b1, t1)
        at3 = count @ np.array([float(b3) ** i * float(t3) ** j for i, j in MONOMIALS])
        for phase in chunk_ops:
            traced = sum(n for o, n in zip(ops1, at3) if o.phase == phase)  # what the template has at (b3, t3)
            chunk_ops[phase] = (sum(o.phase == phase for o in more) - round(traced)) / extra
    vocab = config.padded_vocab_size
    return Template(
        [o.phase for o in ops1],
        [o.category for o in ops1],
        [o.dtype == "float32" for o in ops1],
        np.array(rows_b, dtype=float).reshape(len(ops1), len(MONOMIALS)),
        np.array(rows_f, dtype=float).reshape(len(ops1), len(MONOMIALS)),
        np.array(mm, dtype=int),
        np.array(mm_dims, dtype=float).reshape(len(mm), 4, len(MONOMIALS)),
        chunk_ops,
        [
            o.category == "loss" or (o.category != "matmul" and any(sh and sh[-1] == vocab for sh, _ in o.moved))
            for o in ops1
        ],
        [access_of(o1, o2) for o1, o2 in zip(ops1, ops2)],
        count,
    )


def access_of(o1: Op, o2: Op) -> str:
    """How a kernel traced at the two template shapes reaches memory (:attr:`Template.access`): litgpt's LoRA
    convolution forward or backward; an elementwise kernel with a strided operand at either shape; else ""."""
    if o1.op in ("convolution", "convolution_backward"):
        return "conv" if o1.op == "convolution" else "conv_backward"
    return "strided" if o1.category == "elementwise" and (o1.strided or o2.strided) else ""


TEMPLATE_VERSION = 7
"""Bumped when what a template holds changes: the cached ones are made again."""


def _config_key(config) -> str:
    import json

    return json.dumps(dataclasses.asdict(config), sort_keys=True, default=str)


_TEMPLATES: dict = {}
_TRACED: list = []
"""Templates traced in this process (the first one says where they are kept)."""


def cached_template(
    config, method: str, precision: str, optimizer: str, head_chunks: int, single: bool, lora: tuple = ()
) -> Template:
    """:func:`template` (``single``: traced at one sample per micro batch, whose step skips some copies), kept in
    the process and under the cache directory (``kernel-templates/``, JSON: nothing there is executed); a cached
    file for another torch, litgpt or template version, or one that does not read, is made again
    (:func:`tunelab.plan.trace_cache.cached_json`). Precisions traced as another (:data:`TRACED_AS`) share its
    template."""
    import json

    import numpy as np

    from tunelab import paths
    from tunelab.plan.trace_cache import cached_json

    precision = TRACED_AS.get(str(precision), str(precision))  # one template for precisions traced alike
    key = [TEMPLATE_VERSION, _config_key(config), method, precision, optimizer, head_chunks, single,
           [lora[0], sorted(lora[1])] if lora else []]  # fmt: skip
    memo = json.dumps(key)
    if memo in _TEMPLATES:
        return _TEMPLATES[memo]

    def make() -> dict:
        import time

        if not _TRACED:
            print(f"tunelab: tracing litgpt's step for the time model (once per model and shape; kept in "
                  f"{paths.cache_dir() / 'kernel-templates'})", file=sys.stderr, flush=True)  # fmt: skip
        t0 = time.monotonic()
        tp = template(config, method, precision, optimizer, head_chunks, single, lora)
        _TRACED.append(1)
        blocks = f"{config.n_layer} block{'s' if config.n_layer != 1 else ''}"
        if getattr(config, "sliding_window_size", None):  # which blocks attend in a window (Gemma 2: alternating)
            blocks += ": " + ", ".join("local" if kind[0] else "global" for kind in block_kinds(config))
        print(
            f"tunelab:   traced {config.name} {method} {precision} ({blocks}) in {time.monotonic() - t0:.1f} s",
            file=sys.stderr,
            flush=True,
        )
        data = {f.name: getattr(tp, f.name) for f in dataclasses.fields(tp)}
        return {k: v.tolist() if isinstance(v, np.ndarray) else v for k, v in data.items()}

    raw = cached_json("kernel-templates", key, make, "kernel template", valid=_template_whole)
    arrays = {k: np.array(raw[k], dtype=float) for k in ("bytes", "flops", "mm_dims", "count")}
    tp = Template(raw["phase"], raw["category"], raw["fp32"], arrays["bytes"], arrays["flops"],
                  np.array(raw["mm"], dtype=int), arrays["mm_dims"], raw["chunk_ops"], raw["logits"],
                  raw["access"], arrays["count"].reshape(len(raw["phase"]), len(MONOMIALS)))  # fmt: skip
    _TEMPLATES[memo] = tp
    return tp


def _template_whole(raw) -> bool:
    """Whether a cached template's JSON has every field, one entry per kernel and arrays of the shapes
    :class:`Template` reads (a file edited by hand or by another version is traced again, not trusted)."""
    import numpy as np

    n, m = len(raw["phase"]), len(MONOMIALS)
    phases = (*TRAINING_PHASES, "validation", "decode")
    if any(len(raw[k]) != n for k in ("category", "fp32", "logits", "access")):
        return False
    if not all(p in phases for p in raw["phase"]):
        return False
    for k, shape in (("bytes", (n, m)), ("flops", (n, m)), ("count", (n, m)), ("mm_dims", (len(raw["mm"]), 4, m))):
        if np.array(raw[k], dtype=float).reshape(shape).shape != shape:
            return False
    return all(isinstance(i, int) and 0 <= i < n for i in raw["mm"]) and isinstance(raw["chunk_ops"], dict)


def template_seconds(
    tp: Template, micro: int, tokens: float, gpu, sms: int, method: str, drop_logits: bool = False
) -> tuple:
    """(ops, GPU seconds by category, GPU seconds by phase, ops by phase) of ``tp`` at ``micro`` x ``tokens`` on
    ``gpu``: each kernel by its category (the module docstring), the ops of litgpt's loss chunks beyond the one the
    template holds added at :data:`MIN_KERNEL_S` each. ``drop_logits``: without the loss's own kernels on the logits
    (:attr:`Template.logits`; Liger's fused loss replaces them)."""
    import numpy as np

    nbytes, flops, tiles = tp.kernels_at(micro, tokens)
    counts = tp.counts_at(micro, tokens)
    if drop_logits:
        keep = ~np.array(tp.logits, dtype=bool)
        tp = dataclasses.replace(
            tp, phase=[p for p, k in zip(tp.phase, keep) if k], category=[c for c, k in zip(tp.category, keep) if k],
            fp32=[f for f, k in zip(tp.fp32, keep) if k], chunk_ops=dict.fromkeys(tp.chunk_ops, 0.0),
            access=[a for a, k in zip(tp.access, keep) if k],
        )  # fmt: skip
        nbytes, flops, tiles, counts = nbytes[keep], flops[keep], tiles[keep], counts[keep]
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
        [FOREACH_EFFICIENCY, STRIDED_EFFICIENCY, CONV_EFFICIENCY, CONV_BACKWARD_EFFICIENCY],
        MEMORY_EFFICIENCY,
    )
    bandwidth = memory_rate(gpu) * share
    waves = np.ceil(np.maximum(tiles, 1) / sms) * sms
    eff = np.where(cat == "matmul", matmul_eff * np.where(tiles > 0, tiles / waves, 1.0), attention_eff)
    compute = np.where(np.isin(cat, ("matmul", "attention")) & (flops > 0), flops / (peak * eff), 0.0)
    t = np.maximum(np.maximum(nbytes / bandwidth, compute), MIN_KERNEL_S) * counts
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
    return sum(ops_by_phase.get(p, 0.0) for p in TRAINING_PHASES), by_cat, by_phase, ops_by_phase


def fp32_attention_peak(peaks: dict) -> float:
    """TFLOP/s the memory-efficient attention kernel has for fp32 inputs: from compute capability 8.0 its CUTLASS
    GEMMs multiply fp32 as three TF32 products (``OpMultiplyAddFastF32``, 3xTF32: big x big + big x small + small x
    big), a third of the TF32 peak; before it (no TF32: V100, T4) on the CUDA cores, the plain FP32 peak."""
    return peaks["tf32"] / 3 if peaks.get("tf32") else peaks["fp32"]


def step_time(
    config,
    method: str,
    precision: str,
    micro: int,
    seq_len: float,
    gpu_name: str,
    optimizer: str = "AdamW",
    lora: tuple = (),
) -> StepTime:
    """A step's time by cause on ``gpu_name``: the templates of one and two blocks at ``micro`` x ``seq_len``
    (padded tokens per sample; a mean may be fractional), extrapolated by block. ``lora``: (rank, targets)."""
    from tunelab import hardware

    gpu = hardware.lookup(gpu_name)
    sms = gpu.sms or DEFAULT_SMS
    chunks = loss_chunks("lora", micro, math.ceil(seq_len)) if method in LORA_LIKE else 1
    kinds = block_kinds(config)

    def seconds(layers: list) -> tuple:
        tp = cached_template(with_blocks(config, layers), method, precision, optimizer, chunks, micro == 1, lora)
        return template_seconds(tp, micro, seq_len, gpu, sms, method)

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
    if optimizer == "AdamW":  # torch's for-each step reads each tensor's step counter on the host (no kernel)
        extra = trainable_tensors(config, method, lora) * ADAM_FOREACH_HOST_OPS_PER_TENSOR
        host_ops["optimizer"] = host_ops.get("optimizer", 0) + round(extra)
    ops += _add_bitsandbytes(config, method, seq_len, gpu, optimizer, lora, by_cat, both, kernel_ops, host_ops)
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


def _add_bitsandbytes(config, method, tokens, gpu, optimizer, lora, by_cat, both, kernel_ops, host_ops) -> int:
    """Add what the trace does not see of bitsandbytes (:mod:`tunelab.plan.bnb_kernels`) to a step's dicts: QLoRA's
    dequantization kernels (category ``dequantization``) and its Python per 4-bit matmul; a paged AdamW's kernel and
    Python per tensor. Returns the training phases' kernels added."""
    from tunelab.models import lora_tensor_numels, param_tensor_numels
    from tunelab.plan import bnb_kernels
    from tunelab.settings import LITGPT_LORA_R, LORA_TARGETS

    work = bnb_kernels.qlora_work(config, tokens, gpu) if method == "qlora" else {}
    if optimizer.startswith("Paged"):
        r, targets = lora or (LITGPT_LORA_R, LORA_TARGETS)
        numels = param_tensor_numels(config) if method == "full" else lora_tensor_numels(config, r, targets)
        sec, n, host = bnb_kernels.paged_adamw(numels, gpu)
        work["optimizer"] = (sec, n, host)
    added = 0
    for phase, (sec, n, host) in work.items():
        cat = "optimizer" if phase == "optimizer" else "dequantization"
        both[phase] = both.get(phase, 0.0) + sec
        both[f"{phase}/{cat}"] = both.get(f"{phase}/{cat}", 0.0) + sec
        kernel_ops[phase] = kernel_ops.get(phase, 0) + n
        host_ops[phase] = host_ops.get(phase, 0) + n + round(host)
        if phase in TRAINING_PHASES:
            by_cat[cat] = by_cat.get(cat, 0.0) + sec
            added += n
    return added


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
    parameters (a rank's share under a sharded optimizer: :attr:`tunelab.plan.runtime.KernelWork.optimizer_shards`): their time divided,
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


def trainable_tensors(config, method: str, lora: tuple = ()) -> int:
    """Trainable parameter tensors of litgpt's model for ``config``: every tensor (full fine-tuning) or LoRA's A and
    B of each adapted layer (``lora``: (rank, targets), litgpt's defaults when empty)."""
    from tunelab.models import lora_tensor_numels, param_tensor_numels
    from tunelab.settings import LITGPT_LORA_R, LORA_TARGETS

    if method == "full":
        return len(param_tensor_numels(config))
    r, targets = lora or (LITGPT_LORA_R, LORA_TARGETS)
    return len(lora_tensor_numels(config, r, targets))


def for_plan(x, gpu) -> StepTime | str:
    """The step by kernel of a planned configuration (:class:`tunelab.plan.memory.PlanInput`) on ``gpu``, or why it
    is not modelled (a sentence): litgpt's own script on one device, full fine-tuning, LoRA or QLoRA."""
    from tunelab.plan.simulate import optimizer_of
    from tunelab.settings import lora_of

    if x.world > 1 or not x.fabric:
        return "not modelled yet for several devices or tunelab's loop (a strategies file)"
    return step_time(x.config, x.method, str(x.precision), x.micro_batch_size, x.seq_len, gpu.name, optimizer_of(x),
                     lora_of(x))  # fmt: skip


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
        f"\nstep by kernel on {st.gpu} (tunelab/plan/kernels.py; constants fitted on H100 and H200 profiles): "
        f"{st.step_s:.4f} s for one micro batch and an optimizer step, bound by {bound}\n"
        f"  GPU {st.gpu_s:.4f} s: {cats}\n"
        f"  host {st.host_s:.4f} s: {st.host_s / HOST_S_PER_OP:,.0f} ops x {HOST_S_PER_OP * 1e6:.0f} us"
    )


PROFILE = "reports/2026-11-23-lab-part1-h100/profile.md"
"""Our H100 profile (TinyLlama 1.1B, bf16-true, micro 8 x 437 tokens; full and LoRA): phase times by CUDA events
and kernel self times by category, one profiled step. The constants above are fitted on it."""
PROFILE_SHAPE = ("tiny-llama-1.1b", "bf16-true", 8, 437, "H100-SXM")
"""(model, precision, micro batch, tokens, GPU) of :data:`PROFILE`."""
PROFILED_LORA = (32, LORA_TARGETS)
"""(rank, targets) of the LoRA the GPU profiles built (:data:`PROFILE`, :data:`GRID`; ``scripts/gpu/profile_steps.py``):
the recipes' r 32 on every target, not litgpt's default rank."""


PROFILE_ELEMENTWISE = ("norm/rope/elementwise", "cross-entropy/softmax", "other (copies, casts, ...)")
"""The profile's kernel categories (scripts/gpu/profile_steps.py) the model's elementwise and loss kernels answer."""


def read_profile(path) -> dict:
    """{method: {"step": s, "forward": s, "loss": s, "backward": s, "optimizer": s, "kernel:<category>": s}} from
    :data:`PROFILE`'s two tables (seconds)."""
    import re

    from tunelab import files

    text = files.read_text(path, 1 << 20, "profile")
    out: dict = {"full": {}, "lora": {}}
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if cells[0] in out and len(cells) == 9:  # method | step s | tok/s | TFLOP/s | MFU | four phases
            out[cells[0]]["step"] = float(cells[1])
            for phase, cell in zip(("forward", "loss", "backward", "optimizer"), cells[5:]):
                out[cells[0]][phase] = float(cell.split()[0])
        elif len(cells) == 3 and cells[1].endswith("%)") and "ms" in cells[1]:
            for method, cell in zip(("full", "lora"), cells[1:]):
                out[method]["kernel:" + cells[0]] = float(re.match(r"([\d.]+) ms", cell).group(1)) / 1e3
    return out


def lora_profiled(method: str) -> tuple:
    """:data:`PROFILED_LORA` for LoRA and QLoRA, () for full fine-tuning."""
    return PROFILED_LORA if method in LORA_LIKE else ()


def profile_rows(root) -> list[dict]:
    """The model against :data:`PROFILE`: per method, the step, the phases and the kernel categories, predicted and
    measured (seconds), with the relative error."""
    from litgpt import Config

    name, precision, micro, tokens, gpu = PROFILE_SHAPE
    measured = read_profile(root / PROFILE)
    rows = []
    for method in ("full", "lora"):
        st = step_time(Config.from_name(name), method, precision, micro, tokens, gpu, lora=lora_profiled(method))
        m, cat = measured[method], st.gpu_by_category
        pairs = [
            ("step (max of GPU and host)", st.step_s, m["step"]),
            ("phase: forward + loss", st.phase_s("forward"), m["forward"] + m["loss"]),
            ("phase: backward", st.phase_s("backward"), m["backward"]),
            ("phase: optimizer", st.phase_s("optimizer"), m["optimizer"]),
            ("kernels: matmul", cat.get("matmul", 0.0), m["kernel:matmul"]),
            ("kernels: attention", cat.get("attention", 0.0), m["kernel:attention"]),
            (
                "kernels: elementwise, loss, copies",
                cat.get("elementwise", 0.0) + cat.get("loss", 0.0),
                sum(m["kernel:" + c] for c in PROFILE_ELEMENTWISE),
            ),
            ("kernels: optimizer", cat.get("optimizer", 0.0), m["kernel:optimizer"]),
            ("kernels: all (GPU busy)", st.gpu_s, sum(v for k, v in m.items() if k.startswith("kernel:"))),
        ]
        for what, predicted, value in pairs:
            rows.append(
                {"method": method, "what": what, "predicted_s": predicted, "measured_s": value,
                 "rel_error": predicted / value - 1 if value else None, "ops": st.ops, "host_s": st.host_s}
            )  # fmt: skip
    return rows


GRID = "reports/2026-11-25-profile-grid-h100/profile-grid.jsonl"
"""The same profile over other shapes (TinyLlama at micro 1, 4, 16, OpenLLaMA 3B at 1 and 4; full and LoRA; one JSON
line each, ``scripts/gpu/runbook.sh grid``): its full lines' elementwise kernels are in the memory constants' fit
(:data:`MEMORY_EFFICIENCY`), its steps, phases and LoRA lines out of sample."""
GRID_H200 = "reports/2026-11-26-profile-grid-h200/profile-grid.jsonl"
"""The grid again on an H200 machine, over six models (TinyLlama, OpenLLaMA 3B and 7B, Llama 3.2 1B, Phi-2, Gemma
2B) at micro 1 to 16, each line with the host's own clock per phase (``host_phases``): out of sample too."""
GRID_BY_OP = "reports/2026-11-26-profile-grid-h200/by-op.jsonl"
"""Three more H200 lines, each op's GPU time beside its calls (``cpu_ops``: OpenLLaMA 7B LoRA at micro 8, OpenLLaMA
3B full at 8, TinyLlama full at 16; a later call that session, another H200 machine): what :data:`STRIDED_EFFICIENCY`,
:data:`CONV_EFFICIENCY` and :data:`CONV_BACKWARD_EFFICIENCY` were read from, and with :data:`MEMORY_EFFICIENCY` and
:data:`SM_BYTES_PER_CYCLE` fitted on."""
GRID_H200_AGAIN = "reports/2026-11-27-profile-grid-h200/profile-grid.jsonl"
"""TinyLlama at micro 1, 4, 8 (LoRA), 16 and OpenLLaMA 3B at 4 on a third H200 machine, the day its litgpt Part 1
rows were timed (``reports/2026-11-27-lab-part1-h200/``); each line with its host clock per phase and the probes
taken before it (``host``): out of sample."""
GRID_FP32 = "reports/2026-11-27-profile-grid-h200/profile-grid-32-true.jsonl"
"""TinyLlama full at 32-true (fp32 weights, TF32 matmuls) at micro 8 and 32 on the same machine, a later call: the
micro-8 line holds :data:`TF32_MATMUL_SHARE` and :data:`FP32_ATTENTION_EFFICIENCY`, the micro-32 line checks them."""
GRID_QLORA = "reports/2026-11-27-profile-grid-qlora-h200/profile-grid.jsonl"
"""QLoRA beside LoRA on one H200 machine (TinyLlama at micro 1, 4, 16, OpenLLaMA 7B at 4; OpenLLaMA 7B QLoRA at 8
too): litgpt's bnb.nf4 as its script builds it (``profile_steps.py --methods lora,qlora``), PagedAdamW and the
StableEmbedding swap included. OpenLLaMA 7B's QLoRA line at micro 4 holds
:data:`tunelab.plan.bnb_kernels.DEQUANT_EFFICIENCY`, TinyLlama's at micro 4 the host's work per 4-bit matmul and per
PagedAdamW tensor; every other cell is out of sample."""
GRIDS = (
    (GRID, "H100-SXM", "2026-11-25"),
    (GRID_H200, "H200", "2026-11-26"),
    (GRID_H200_AGAIN, "H200", "2026-11-27"),
    (GRID_FP32, "H200", "2026-11-27, 32-true"),
    (GRID_QLORA, "H200", "2026-11-27, QLoRA"),
)
"""(measured lines, the GPU table's row they ran on, the day) of every grid :func:`tunelab.report.runtime_accuracy.write_kernels_md` checks."""
FITTED_SHAPES = {
    "H100-SXM": {(m, "full", b) for m, b in (("tiny-llama-1.1b", 1), ("tiny-llama-1.1b", 4), ("tiny-llama-1.1b", 16),
                                             ("open_llama_3b", 1), ("open_llama_3b", 4))},
    "H200": {("open_llama_3b", "full", 8), ("tiny-llama-1.1b", "full", 16), ("open_llama_7b", "lora", 8),
             ("tiny-llama-1.1b", "full", 8), ("open_llama_7b", "qlora", 4), ("tiny-llama-1.1b", "qlora", 4)},
}  # fmt: skip
"""(model, method, micro) whose elementwise kernels (H100: these very lines) or whose shape (H200: the lines of
:data:`GRID_BY_OP`, measured again) the memory constants were fitted on, or (H200, TinyLlama full at micro 8: only
:data:`GRID_FP32` has it) the fp32 matmul and attention constants, or (H200, QLoRA at micro 4: only
:data:`GRID_QLORA` has them) bitsandbytes' constants: marked in the report."""


GRID_KEYS = ("model", "method", "dtype", "micro", "seq", "step_s", "phases", "kernels", "launches")
"""What each measured line of :data:`GRID` holds (``scripts/gpu/profile_steps.py --json``)."""


def read_grid(path) -> list[dict]:
    """:data:`GRID`'s measured lines (a line with an ``error``, e.g. out of memory, left out)."""
    import json

    from tunelab import files

    out = []
    for n, line in enumerate(files.read_text(path, 1 << 20, "profile grid").splitlines(), 1):
        if line.strip():
            try:
                row = json.loads(line)
            except ValueError:
                raise files.FileRefused(f"{path}: line {n} is not JSON; fix: regenerate it with the runbook") from None
            missing = [] if not isinstance(row, dict) else [k for k in GRID_KEYS if k not in row]
            if not isinstance(row, dict) or ("error" not in row and missing):
                raise files.FileRefused(
                    f"{path}: line {n} lacks {', '.join(missing) or 'a JSON object'}; fix: regenerate it with the runbook"
                )
            if "error" not in row:
                out.append(row)
    return out


def grid_rows(root, grid: str = GRID, gpu: str = "H100-SXM") -> list[dict]:
    """The model against a grid's lines (:data:`GRIDS`) on ``gpu``, out of sample: per line the step and phases (CUDA
    events), the kernel categories (profiler self time) and the ops against the kernels launched; where the line
    has the host's own clock per phase, the model's host time (every op at :data:`HOST_S_PER_OP`) against that
    clock summed over the step. The optimizer is compared with its phase, not with the profiler's kernel time: in
    every line that is twice the phase's wall time (on one stream the kernels cannot outlast the interval that holds
    them, so the profiler counts them twice)."""
    from litgpt import Config

    from tunelab.plan import bnb_kernels

    rows = []
    for m in read_grid(root / grid):
        optimizer = bnb_kernels.litgpt_optimizer(m["method"])
        st = step_time(Config.from_name(m["model"]), m["method"], m["dtype"], m["micro"], m["seq"], gpu, optimizer,
                       lora_profiled(m["method"]))  # fmt: skip
        k, ph, cat = m["kernels"], m["phases"], st.gpu_by_category
        pairs = {
            "step": (st.step_s, m["step_s"]),
            "forward + loss": (st.phase_s("forward"), ph["forward"] + ph["loss"]),
            "backward": (st.phase_s("backward"), ph["backward"]),
            "optimizer (phase)": (st.phase_s("optimizer"), ph["optimizer"]),
            "matmul": (cat.get("matmul", 0.0), k.get("matmul", 0.0)),
            "attention": (cat.get("attention", 0.0), k.get("attention", 0.0)),
            "elementwise, loss, copies": (
                cat.get("elementwise", 0.0) + cat.get("loss", 0.0),
                sum(k.get(c, 0.0) for c in PROFILE_ELEMENTWISE),
            ),
        }
        if "dequantization" in k:
            pairs["dequantization"] = (cat.get("dequantization", 0.0), k["dequantization"])
        if isinstance(m.get("host_phases"), dict):
            pairs["host (own clock)"] = (st.host_s, sum(m["host_phases"].values()))
        rows.append(
            {"model": m["model"], "micro": m["micro"], "method": m["method"], "ops": st.ops,
             "launches": sum(m["launches"].values()), "bound": "host" if st.host_s > st.gpu_s else "GPU",
             "pairs": {w: (p, v, p / v - 1 if v else None) for w, (p, v) in pairs.items()}}
        )  # fmt: skip
    return rows


GRID_NOTES = {
    GRID: "What misses, read from the table: the host (the LoRA steps and OpenLLaMA 3B full at micro 1 run longer "
    "than their kernels: one host figure per op is too few for LoRA's Python modules; the model counts fewer ops "
    "than the kernels launched), attention at micro 1 and with OpenLLaMA 3B's head size 100 (counted as the 128-wide "
    "head torch's flash kernels run, still short: one efficiency for all attention is too few), and OpenLLaMA 3B's "
    "small matmuls at micro 1.",
    GRID_H200: "What the host columns say: a launch-bound line is the host's own clock (the two agree), and that "
    "clock varies from process to process on one machine (TinyLlama LoRA's backward took 59.5 to 109.6 ms of host "
    "time at micro 1, 2, 4 and 8: the same ops); the host constants, fitted on the H100 machine, put that machine's "
    "launch-bound lines from -23% to +41%. The GPU-bound lines hold within 13% on six models (three of the eight "
    "are shapes the memory constants were fitted on, measured again), the optimizer phases of full fine-tuning "
    "within 10%, out of sample (the SMs' ceiling on the memory rate, `kernels.memory_rate`; the "
    "HBM's figure alone put them 14-23% short). Where the optimizer phase of a GPU-bound LoRA line reads +600% "
    "and more, the host's work on the step counters ran while the backward's kernels were still queued: the phase "
    "by CUDA events holds only what was left. What still misses: attention (OpenLLaMA 3B's, counted at the 128-wide "
    "head the flash kernel runs, still 39-66% short), Gemma's elementwise kernels (+17% to +35%: head size 256, one "
    "KV group).",
    GRID_H200_AGAIN: "What the host columns say, on a third machine: the launch-bound lines' host clock per op "
    "(over the model's ops) ran from 26 to 48 us against the constant's 35, and from process to process on one "
    "machine (TinyLlama LoRA: 28.6 us at micro 1 and 8, 38.8 at micro 4: the same ops). The probes each process took "
    "first (`host`: `host_op_us` 4.0-7.7 us, `device_op_us` 8.8-14.3 us) do not order them: TinyLlama full at micro "
    "1 had the second-highest `host_op_us` and the lowest clock per op. The GPU-bound lines hold within 12%.",
    GRID_FP32: "At 32-true the matmuls run as TF32 at 81% of a bf16 matmul's efficiency (fitted on micro 8) and "
    "the attention is not flash: the memory-efficient kernel's three TF32 products per fp32 one, at 15% of that "
    "third of the TF32 peak (fitted on micro 8); timed as "
    "bf16 kernels at the TF32 peak, the step was 15-16% short, the matmuls 19-21%, the attention 72-74%. Micro 32 "
    "is out of sample. Still over: fp32 elementwise kernels (+13% to +22%) and the for-each AdamW over fp32 state "
    "(+30%: its efficiency was fitted on bf16 state). The host clock at micro 32 "
    "includes waits on the GPU (its queue fills): not a host-bound line.",
    GRID_QLORA: "QLoRA against LoRA on one machine: bitsandbytes' dequantization kernels (one per 4-bit matmul "
    "forward, a float16 one and its cast to bfloat16 backward) take 3.0-3.1 ms a step for TinyLlama and 15.6 ms for "
    "OpenLLaMA 7B whatever the micro batch, the casts as much again (counted with the elementwise kernels: an "
    "unvectorized copy); the host's Python per 4-bit matmul and bitsandbytes' PagedAdamW, driven tensor by tensor "
    "(20.6 ms of host time for TinyLlama's 222 LoRA tensors against 4.3 ms for torch's for-each AdamW), are what "
    "makes TinyLlama's QLoRA step 40-45% longer than its LoRA step where the host bounds both. OpenLLaMA 7B at micro "
    "4 kept its GPU nearly busy: the model's host side is 21% long there (its forward 39%), and one line cannot tell "
    "the host's work per 4-bit matmul (fitted on TinyLlama) from that process's speed per op (it varies by as "
    "much); at micro 8 the model calls it GPU-bound and is 13% short.",
}
"""What each grid's table shows, in words (read from its lines; the numbers in the tables are recomputed)."""
