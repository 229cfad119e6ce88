"""The step of tunelab's own loop under a strategy file (the fast path), kernel by kernel: what its switches remove.

Under a strategy file the time follows four changes, each modelled from what runs, not from a speed-up factor:
compiled blocks (the kernels inductor's graphs launch, :func:`tunelab.plan.trace.compiled.block_kernels`, fused
regions reading and writing HBM once, each launched at :data:`COMPILED_HOST_S_PER_KERNEL`), Liger's fused linear
cross-entropy (its chunks instead of the logits), the fused optimizer (one kernel over all parameters), and the
loss read every ``log_interval`` iterations (the host queues ahead of the GPU between reads). Its padding is the
loop's own grouping. :data:`FAST_START_EXTRA_S` is the fast path's longer start, from our benches: docs/planner.md,
"The fast path"."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

from tunelab.gpt import fused_loss_chunk_rows
from tunelab.plan.model import kernels, strategies
from tunelab.plan.model.case import parameter_bytes
from tunelab.plan.model.memory import dtype_bytes, optimizer_shards, trainable_shapes
from tunelab.plan.model.tables import TRACE_TOKENS, compiled_supported, optimizer_of, tables_of

COMPILED_MEMORY_EFFICIENCY = 0.41
"""Fraction of :func:`tunelab.plan.model.kernels.memory_rate` a compiled (Triton) or Liger kernel reaches over the bytes
the traced graphs say it reads and writes once: an effective figure (what inductor's kernels read again, or
recompute in the backward, falls into it too), fitted on the fast path's GPU-bound probes (TinyLlama full at micro
58-97 on an H100, evidence ``h100-bench-tiny-full``: :func:`tunelab.report.runtime_accuracy.fit_compiled_memory`)
and checked out of sample on OpenLLaMA 7B LoRA's compiled fast run on an H200, GPU-bound
(``reports/planner-accuracy/runtime.md``; a test holds this to the refit)."""
COMPILED_HOST_S_PER_KERNEL = 68e-6
"""Host seconds per kernel of a compiled block's forward or backward (inductor's generated Python wrapper launching
each Triton or cuBLAS kernel, the compiled autograd function around the graph and its guards, amortised per kernel).
Fitted on our H100 bench of the fast path (evidence ``h100-bench-tiny-full``: TinyLlama full, bf16-true, micro 8,
three runs, host-bound: the mean optimizer step over the steady window does not follow its padded tokens there; the
later micro batches' gradient accumulation is eager work beside it); one configuration, one host: the weakest
constant of the model."""
FAST_MODEL_ERROR = {"GPU": 0.026, "host": 0.365}
"""The widest miss of :func:`fast_step` over our benches' fast-path runs that ran compiled throughout, by what the
model says bounds the run (:meth:`FastStep.bound`), rounded up. GPU-bound: TinyLlama full's largest-micro-batch
probes (evidence ``h100-bench-tiny-full``, each window to the loop's synchronised end;
:data:`COMPILED_MEMORY_EFFICIENCY` is fitted on them) and OpenLLaMA 7B LoRA at micro 8
(``h200-bench-7b-lora-compiled``, out of sample); the plan's band there is never narrower than the kernel model's
(:func:`tunelab.plan.model.runtime.fast_band`). Host-bound: TinyLlama full at micro 8 (``h100-bench-tiny-full``) and
TinyLlama LoRA (``h200-bench-tiny-lora-compiled``) on an H200 machine whose host ran TinyLlama's launches far faster
than the H100 machine's: a host-bound step follows the host CPU, which no GPU table describes. ``tunelab
plan-accuracy`` recomputes both (``reports/planner-accuracy/runtime.md``); a test holds this to it."""
FAST_START_EXTRA_S = (26.1, 74.8)
"""Seconds the fast path's run takes to start beyond litgpt's (loading, tokenising once, compiling every shape ahead,
the final save: wall time less the printed Training Time), with inductor's cache warm and cold: the medians over
our benches' reports (evidence ``bench`` entries; ``reports/planner-accuracy/runtime.md`` recomputes them)."""
LIGER_OPS_PER_CHUNK = 5
"""Ops the fused head and loss dispatches per chunk (:func:`tunelab.gpt.fused_head_loss`, as Liger's own wrapper:
the logits matmul, Liger's cross-entropy kernel, the input-gradient matmul and its copy into place, the weight
gradient's addmm)."""
LIGER_OPS_FIXED = 6
"""Ops the fused head and loss dispatches once per call (three zeroed buffers, the loss's sum, backward's in-place
scalings of the two gradients)."""
LIGER_WRAPPER_READS = 2
"""Values Liger's own wrapper reads back per micro batch (the count of targets, and whether the upstream gradient
is 1); each read costs one more op (the mask and count before it are counted with it): the runs recorded before
the record said (``fused_loss_reads`` None) ran it."""


@dataclass
class FastStep:
    """One micro batch and one optimizer step of the fast path on a GPU, by phase: GPU seconds by category and host
    seconds. ``forward`` and ``backward`` exclude the loss, which is its own phase ``loss``."""

    gpu: dict = field(default_factory=dict)
    """{phase: {category: seconds}} (phases forward, loss, backward, optimizer)."""
    host: dict = field(default_factory=dict)
    """{phase: host seconds to dispatch it}."""
    kernels: dict = field(default_factory=dict)
    """{phase: kernels launched}."""
    waits_for_loss: bool = False
    """Whether the loss reads a value back to the host (Liger's own wrapper: its count of targets): the GPU drains
    before it."""

    def gpu_s(self, phase: str) -> float:
        return sum(self.gpu.get(phase, {}).values())

    def iteration_s(self) -> float:
        """One micro batch (forward, loss, backward): the host queues ahead of the GPU except where the loss waits."""
        fb_gpu = self.gpu_s("forward") + self.gpu_s("backward")
        fb_host = self.host.get("forward", 0.0) + self.host.get("backward", 0.0)
        if self.waits_for_loss:
            return max(fb_gpu, fb_host) + max(self.gpu_s("loss"), self.host.get("loss", 0.0))
        return max(fb_gpu + self.gpu_s("loss"), fb_host + self.host.get("loss", 0.0))

    def optimizer_s(self) -> float:
        return max(self.gpu_s("optimizer"), self.host.get("optimizer", 0.0))

    def bound(self) -> str:
        """What bounds a micro batch's forward and backward: "GPU" when their kernels take at least as long as
        the host's launches of them, else "host" (the loss and the optimizer step left out)."""
        busy = self.gpu_s("forward") + self.gpu_s("backward")
        return "GPU" if busy >= self.host.get("forward", 0.0) + self.host.get("backward", 0.0) else "host"


def liger_chunks(tokens: int, n_embd: int, vocab: int) -> int:
    """The chunks the fused head and loss splits ``tokens`` rows into (:func:`tunelab.gpt.fused_loss_chunk_rows`)."""
    return math.ceil(tokens / max(fused_loss_chunk_rows(tokens, vocab, n_embd), 1))


def _add(into: dict, phase: str, category: str, seconds: float) -> None:
    into.setdefault(phase, {})
    into[phase][category] = into[phase].get(category, 0.0) + seconds


def kernel_seconds(
    category: str, flops: float, nbytes: float, tiles: float, fp32: bool, gpu, sms: int, memory_efficiency: float
) -> float:
    """One kernel's GPU seconds, by the rules of :mod:`tunelab.plan.model.kernels` (matmuls and attention by FLOPs at their
    efficiency and wave quantization, everything else by bytes over the memory rate at ``memory_efficiency``
    (:data:`COMPILED_MEMORY_EFFICIENCY`; the for-each optimizer at its own), at least MIN_KERNEL_S)."""
    peaks = gpu.peak_tflops
    peak = (peaks.get("tf32") or peaks["fp32"]) if fp32 else (peaks.get("bf16") or peaks.get("fp16") or peaks["fp32"])
    peak *= 1e12
    rate = kernels.memory_rate(gpu)
    compute = 0.0
    if category == "matmul" and flops:
        waves = math.ceil(max(tiles, 1) / sms) * sms
        compute = flops / (peak * kernels.MATMUL_EFFICIENCY * (tiles / waves if tiles else 1.0))
    elif category == "attention" and flops:
        compute = flops / (peak * kernels.ATTENTION_EFFICIENCY)
    memory = nbytes / (rate * (kernels.FOREACH_EFFICIENCY if category == "optimizer" else memory_efficiency))
    return max(compute, memory, kernels.MIN_KERNEL_S)


def compiled_block_seconds(
    block: dict, micro: int, tokens: float, gpu, sms: int, memory_efficiency: float = COMPILED_MEMORY_EFFICIENCY
) -> tuple[dict, dict]:
    """({phase: {category: GPU seconds}}, {phase: kernels}) of one compiled block (:func:`tunelab.plan.trace.compiled
    .block_kernels`) at ``micro`` x ``tokens``: what the traces at one sample of 64 and 128 tokens give, scaled by
    the tokens of the micro batch (fused bytes and matmul rows are affine in them; attention by sample and length);
    its kernels move bytes at ``memory_efficiency`` of the GPU's memory rate."""
    n = micro * tokens
    grow = (n - TRACE_TOKENS) / TRACE_TOKENS
    seconds: dict = {}
    count: dict = {}
    for phase, pairs in block.items():
        for a, b in pairs:
            fp32 = a[1] == "float32"
            if a[0] == "fused":
                nbytes = a[2] + (b[2] - a[2]) * grow
                t = kernel_seconds("elementwise", 0.0, nbytes, 0, fp32, gpu, sms, memory_efficiency)
                t = max(t, a[3] * kernels.MIN_KERNEL_S)
                _add(seconds, phase, "elementwise", t)
                count[phase] = count.get(phase, 0) + a[3]
                continue
            if a[0] == "matmul":
                dims = [
                    [da * n / TRACE_TOKENS if da != db else da for da, db in zip(sa, sb)]
                    for sa, sb in ((a[2], b[2]), (a[3], b[3]))
                ]
                (x, w), size = dims, 4 if fp32 else 2
                batch = x[0] if len(x) == 3 else 1
                flops, tiles = kernels.matmul_flops_tiles(batch, x[-2], w[-1], x[-1])
                nbytes = size * batch * (x[-2] * x[-1] + x[-1] * w[-1] + x[-2] * w[-1])
                t = kernel_seconds("matmul", flops, nbytes, tiles, fp32, gpu, sms, memory_efficiency)
                _add(seconds, phase, "matmul", t)
            else:  # attention: (1, heads, T, head size) -> (micro, heads, tokens, head size)
                q = (micro, a[2][1], tokens, a[2][3])
                kv = (micro, a[3][1], tokens, a[3][3])
                flops = kernels.attention_flops(a[4], q, kv)
                nbytes = (4 if "backward" in a[4] else 2) * 2 * math.prod(q)  # q, k, v, out (and their gradients)
                t = kernel_seconds("attention", flops, nbytes, 0, fp32, gpu, sms, memory_efficiency)
                _add(seconds, phase, "attention", t)
            count[phase] = count.get(phase, 0) + 1
    return seconds, count


def fast_step(
    case,
    gpu,
    tokens: float,
    compiled_host_s: float = COMPILED_HOST_S_PER_KERNEL,
    memory_efficiency: float = COMPILED_MEMORY_EFFICIENCY,
) -> FastStep:
    """The fast path's micro batch and optimizer step for PlanInput ``case`` (a strategy file: ``case.loop.fabric`` False) at
    ``tokens`` padded tokens per sample on ``gpu`` (see the module docstring); ``compiled_host_s``: the host time per
    compiled kernel, ``memory_efficiency``: its compiled and Liger kernels' share of the memory rate (the accuracy
    report refits both)."""
    c, micro = case.config, case.micro_batch_size
    sms = gpu.sms or kernels.DEFAULT_SMS
    method = "full" if case.method == "full" else "lora"
    lora = (case.lora_r, tuple(case.lora_targets)) if case.lora else ()
    optimizer = optimizer_of(case)
    whole_tokens = max(1, math.ceil(tokens))
    liger = bool(case.loop.fused_loss)
    out = FastStep(waits_for_loss=liger and case.loop.fused_loss_reads > 0)

    def eager(n_layer: int):
        config = dataclasses.replace(c, n_layer=n_layer)
        tp = tables_of(case).template(kernels.Step(config, method, str(case.precision), micro, tokens, optimizer, lora))
        return kernels.template_seconds(tp, micro, tokens, gpu, sms, method, drop_logits=liger)[2:]

    one, two = eager(1), eager(2)
    _outside_blocks(out, one, two)
    if (
        compiled_supported(case.precision)
        and case.loop.compiled
        and not case.activation_checkpointing
        and case.method != "qlora"
    ):
        _compiled_blocks(out, case, gpu, sms, tokens, (compiled_host_s, memory_efficiency))
    else:
        _eager_blocks(out, one, two, c.n_layer, case.activation_checkpointing)
    for phase, ops in zip(("forward", "backward"), strategies.of(case).wrapper_host_ops(case)):
        out.host[phase] += ops * kernels.HOST_S_PER_OP  # the strategy's wrapper: hooks and views, no kernels
    numels = [math.prod(shape) for shape in trainable_shapes(case)]
    seconds, added = kernels.accumulation_work(numels, parameter_bytes(case.precision), case.accumulation, gpu)
    _add(out.gpu, "backward", "elementwise", seconds)  # the later micro batches' gradients added: eager, not compiled
    out.kernels["backward"] = out.kernels.get("backward", 0) + added
    out.host["backward"] = out.host.get("backward", 0.0) + added * kernels.HOST_S_PER_OP
    if liger:
        _liger_loss(out, case, gpu, micro * whole_tokens, memory_efficiency)
    for phase in ("forward", "loss", "backward"):  # the GPU's idle after each kernel (kernels.KERNEL_GAP_S)
        _add(out.gpu, phase, "gaps", out.kernels.get(phase, 0) * kernels.KERNEL_GAP_S)
    _optimizer_step(out, case, gpu, tokens, optimizer, method, lora)
    return out


def _outside_blocks(out: FastStep, one: tuple, two: tuple) -> None:
    """Into ``out``: what runs outside the blocks (embedding, final norm, head, and litgpt's loss unless Liger's
    replaces it), from the eager templates of one and two blocks (``(seconds by phase/category, ops by phase)``
    each): one block's template less one block, as they run in a deep model (the head's backward to its input
    included; a model of no blocks may train nothing, as a LoRA without its head)."""
    (one_s, one_ops), (two_s, two_ops) = one, two
    for key in {*one_s, *two_s}:
        phase, _, cat = key.partition("/")
        if cat and cat != "gaps" and phase in ("forward", "backward"):  # gaps: by kernel, in fast_step
            _add(out.gpu, phase, "elementwise" if cat == "loss" else cat, 2 * one_s.get(key, 0.0) - two_s.get(key, 0.0))
    for phase in ("forward", "backward"):
        ops = 2 * one_ops.get(phase, 0.0) - two_ops.get(phase, 0.0)
        out.host[phase] = ops * kernels.HOST_S_PER_OP
        out.kernels[phase] = ops


def _eager_blocks(out: FastStep, one: tuple, two: tuple, n_layer: int, recompute: bool) -> None:
    """Into ``out``: ``n_layer`` eager blocks, each the template of two blocks less the template of one (``recompute``:
    activation checkpointing runs each block's forward again in the backward pass)."""
    (one_s, one_ops), (two_s, two_ops) = one, two
    block: dict = {}
    for key, sec in two_s.items():
        if "/" in key and key.split("/")[0] in ("forward", "backward") and not key.endswith("/gaps"):
            _add(block, *key.split("/"), sec - one_s.get(key, 0.0))
    more = {p: two_ops.get(p, 0.0) - one_ops.get(p, 0.0) for p in ("forward", "backward")}
    if recompute:
        for cat, sec in block.get("forward", {}).items():
            _add(block, "backward", cat, sec)
        more["backward"] += more["forward"]
    for phase in ("forward", "backward"):
        for cat, sec in block.get(phase, {}).items():
            _add(out.gpu, phase, "elementwise" if cat == "loss" else cat, n_layer * sec)
        out.host[phase] += n_layer * more[phase] * kernels.HOST_S_PER_OP
        out.kernels[phase] += n_layer * more[phase]


def _optimizer_step(out: FastStep, case, gpu, tokens: float, optimizer: str, method: str, lora: tuple) -> None:
    """The optimizer step in ``out`` as traced (torch's fused AdamW is its own op there: ``optimizer_of``'s "AdamW
    fused"), over this rank's share of the parameters where the strategy shards the optimizer's states."""
    step = kernels.Step(case.config, method, str(case.precision), case.micro_batch_size, tokens, optimizer, lora)
    st = kernels.step_time(step, gpu.name, tables=tables_of(case))
    st = kernels.sharded_optimizer(st, optimizer_shards(case))
    _add(out.gpu, "optimizer", "optimizer", st.gpu_by_phase.get("optimizer", 0.0))
    out.host["optimizer"] = st.host_ops("optimizer") * kernels.HOST_S_PER_OP
    out.kernels["optimizer"] = st.ops_by_phase.get("optimizer", 0)


def _compiled_blocks(out: FastStep, case, gpu, sms: int, tokens: float, constants: tuple) -> None:
    """The compiled blocks in ``out``: one block's kernels from torch.compile's own graphs, times the depth;
    ``constants``: (host seconds to launch each, their share of the memory rate)."""
    compiled_host_s, memory_efficiency = constants
    c, method = case.config, "full" if case.method == "full" else "lora"
    block = tables_of(case).compiled_block(
        c, method, str(case.precision), case.lora_r if case.lora else 0, tuple(case.lora_targets) if case.lora else ()
    )
    secs, count = compiled_block_seconds(block, case.micro_batch_size, tokens, gpu, sms, memory_efficiency)
    for phase in ("forward", "backward"):
        for cat, sec in secs.get(phase, {}).items():
            _add(out.gpu, phase, cat, c.n_layer * sec)
        out.host[phase] += c.n_layer * count.get(phase, 0) * compiled_host_s
        out.kernels[phase] += c.n_layer * count.get(phase, 0)


def _liger_loss(out: FastStep, case, gpu, rows: int, memory_efficiency: float) -> None:
    """Liger's fused linear cross-entropy in ``out``: its chunks' logits read and their gradient written in place
    (bytes over ``memory_efficiency`` of the memory rate, or a minimal kernel per chunk), its ops on the host (its
    matmuls are the head's, counted with the model)."""
    c = case.config
    n = liger_chunks(rows, c.n_embd, c.padded_vocab_size)
    size = dtype_bytes(case.precision) if "mixed" not in str(case.precision) else 2
    ce = 2.0 * rows * c.padded_vocab_size * size  # each chunk's logits read, their gradient written in place
    _add(
        out.gpu,
        "loss",
        "elementwise",
        max(ce / (kernels.memory_rate(gpu) * memory_efficiency), n * kernels.MIN_KERNEL_S),
    )
    fixed = LIGER_OPS_FIXED + case.loop.fused_loss_reads
    out.host["loss"] = (n * LIGER_OPS_PER_CHUNK + fixed) * kernels.HOST_S_PER_OP
    out.kernels["loss"] = n * (LIGER_OPS_PER_CHUNK - 3) + fixed  # its matmuls are the head's, above
