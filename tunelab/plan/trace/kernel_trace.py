"""The kernel trace: every ATen op of litgpt's training step, validation batch and decoded token on fake tensors
(a ``TorchDispatchMode``), folded into a :class:`tunelab.plan.model.kernels.Template` (polynomials in the micro
batch and the tokens) that the kernel model times; templates are kept per model and shape under the cache
directory (:func:`cached_template`)."""

from __future__ import annotations

import dataclasses
import json
import math
import sys
import time
import warnings
from dataclasses import dataclass

from tunelab import paths
from tunelab.plan.model.case import PlanInput
from tunelab.plan.model.kernels import (
    CHUNK,
    CHUNK_SHAPE,
    LORA_LIKE,
    MONOMIALS,
    TRACED_AS,
    TRAINING_PHASES,
    Step,
    Template,
    attention_flops,
    attention_head,
    block_kinds,
    loss_chunks,
    matmul_dims,
    matmul_flops_tiles,
    template_shapes,
)
from tunelab.plan.trace.measure import cuda_dropout, forward_context, model_logits, training_loss
from tunelab.plan.trace.simulate import setup_step
from tunelab.plan.trace.trace_cache import cached_json
from tunelab.settings import LITGPT_LORA_R, LORA_TARGETS

NOT_KERNELS = frozenset(
    "device _record_function_enter_new _record_function_exit empty empty_like empty_strided new_empty "
    "new_empty_strided _unsafe_view detach alias lift_fresh is_same_size sym_size sym_numel sym_stride stride dim "
    "is_contiguous _has_compatible_shallow_copy_type".split()
)
"""Ops that launch no GPU kernel: queries, allocations, views without alias annotations."""


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


def recorder(ops: list, state: dict):
    """A dispatch mode that appends an :class:`Op` to ``ops`` for every kernel dispatched under it, in the phase
    ``state["phase"]`` names at the time (none while it is "not recorded"; views, queries and allocations never):
    the trace's count of ops, which the host's time per op multiplies."""
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
                Op(
                    state["phase"],
                    name,
                    _category(name),
                    str(dt).removeprefix("torch.") if dt else "bfloat16",
                    top,
                    tuple(outs[0].shape) if outs else None,
                    moved,
                    strided,
                )
            )
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


def record_step(
    config,
    method: str,
    precision: str,
    micro: int,
    seq_len: int,
    optimizer: str = "AdamW",
    lora: tuple = (),
    evaluate: bool = True,
    frozen_grads: str = "",
) -> list:
    """Every :class:`Op` of one training step of ``config`` as built, as litgpt's finetune script runs it (forward,
    loss, backward, optimizer step and zero_grad), with the optimizer's states already made: a first step on zero
    gradients makes them, unrecorded; then (``evaluate``) a validation batch and a decoded token
    (:func:`_record_eval`). ``lora``: (rank, targets), litgpt's defaults when empty; ``frozen_grads``: the frozen
    weights FSDP1 gives a gradient under LoRA take one (:attr:`tunelab.plan.model.kernels.Step.frozen_grads`)."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    lora_r, targets = lora or (LITGPT_LORA_R, LORA_TARGETS)
    precision = TRACED_AS.get(str(precision), str(precision))

    ops: list = []
    state = {"phase": "forward"}
    with FakeTensorMode(), cuda_dropout(), warnings.catch_warnings():
        warnings.filterwarnings("ignore")
        case = PlanInput(config, method, precision, seq_len=seq_len, lora_r=lora_r, lora_targets=tuple(targets))
        model, opt, _ = setup_step(case, optimizer)
        trainable = [p for p in model.parameters() if p.requires_grad]
        if frozen_grads:  # gradients computed, never stepped: the optimizer holds ``trainable`` alone
            for p in _flat_parameter_weights(model, root=frozen_grads == "all"):
                p.requires_grad_(True)
        for p in trainable:
            p.grad = torch.zeros_like(p)
        opt.step()
        opt.zero_grad()
        x = torch.zeros(micro, seq_len, dtype=torch.long)
        with recorder(ops, state):
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


def _flat_parameter_weights(model, root: bool) -> list:
    """The weights FSDP1 gives a gradient under LoRA: every block's, and (``root``) the root unit's (embedding, final
    norm, head)."""
    blocks = {id(p) for p in model.transformer.h.parameters()}
    return [*model.transformer.h.parameters(), *(p for p in model.parameters() if root and id(p) not in blocks)]


def _record_eval(model, x, precision: str, state: dict) -> None:
    """litgpt's ``validate`` batch (eval mode, no gradients, the whole head, the loss unchunked) as phase
    ``validation``, and one token of ``generate_example`` (a KV cache for one sample) as phase ``decode``."""
    import torch
    from litgpt.utils import chunked_cross_entropy

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


def template(step: Step) -> Template:
    """The kernels of ``step`` (its config as built: its ``n_layer``) as a :class:`Template`: traced at the two
    :func:`template_shapes` (LoRA: for its head's chunks, :meth:`Step.head_chunks`; one sample per micro batch:
    for that), and for full fine-tuning at :data:`CHUNK_SHAPE` for the ops of a loss chunk."""
    import numpy as np

    config, method, precision, optimizer, lora = step.config, step.method, step.precision, step.optimizer, step.lora
    head_chunks, single = step.head_chunks(), step.micro == 1
    (b1, t1), (b2, t2) = template_shapes(head_chunks, single)
    ops1 = record_step(config, method, precision, b1, t1, optimizer, lora, frozen_grads=step.frozen_grads)
    ops2 = record_step(config, method, precision, b2, t2, optimizer, lora, frozen_grads=step.frozen_grads)
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
    return json.dumps(dataclasses.asdict(config), sort_keys=True, default=str)


_TEMPLATES: dict = {}


_TRACED: list = []
"""Templates traced in this process (the first one says where they are kept)."""


def cached_template(step: Step) -> Template:
    """:func:`template`, kept in the process and under the cache directory (``kernel-templates/``, JSON: nothing
    there is executed); a cached file for another torch, litgpt or template version, or one that does not read, is
    made again (:func:`tunelab.plan.trace.trace_cache.cached_json`). Precisions traced as another
    (:data:`TRACED_AS`) share its template."""
    precision = TRACED_AS.get(str(step.precision), str(step.precision))  # one template for precisions traced alike
    step = dataclasses.replace(step, precision=precision)
    lora = [step.lora[0], sorted(step.lora[1])] if step.lora else []
    cache_key = [TEMPLATE_VERSION, _config_key(step.config), step.method, precision, step.optimizer]
    cache_key += [step.head_chunks(), step.micro == 1, lora] + (
        [f"frozen-grads-{step.frozen_grads}"] if step.frozen_grads else []
    )
    memo = json.dumps(cache_key)
    if memo in _TEMPLATES:
        return _TEMPLATES[memo]

    raw = cached_json(
        "kernel-templates", cache_key, lambda: _traced_json(step), "kernel template", valid=_template_whole
    )
    _TEMPLATES[memo] = _from_json(raw)
    return _TEMPLATES[memo]


def _traced_json(step: Step) -> dict:
    """:func:`template` traced, with a line of progress per template, as the JSON the cache keeps."""
    import numpy as np

    if not _TRACED:
        print(
            f"tunelab: tracing litgpt's step for the time model (once per model and shape; kept in "
            f"{paths.cache_dir() / 'kernel-templates'})",
            file=sys.stderr,
            flush=True,
        )
    t0 = time.monotonic()
    tp = template(step)
    _TRACED.append(1)
    config = step.config
    blocks = f"{config.n_layer} block{'s' if config.n_layer != 1 else ''}"
    if getattr(config, "sliding_window_size", None):  # which blocks attend in a window (Gemma 2: alternating)
        blocks += ": " + ", ".join("local" if kind[0] else "global" for kind in block_kinds(config))
    print(
        f"tunelab:   traced {config.name} {step.method} {step.precision} ({blocks}) in {time.monotonic() - t0:.1f} s",
        file=sys.stderr,
        flush=True,
    )
    data = {f.name: getattr(tp, f.name) for f in dataclasses.fields(tp)}
    return {k: v.tolist() if isinstance(v, np.ndarray) else v for k, v in data.items()}


def _from_json(raw: dict) -> Template:
    """A cached template's JSON (checked whole by :func:`_template_whole`) as a :class:`Template`."""
    import numpy as np

    arrays = {k: np.array(raw[k], dtype=float) for k in ("bytes", "flops", "mm_dims", "count")}
    return Template(
        raw["phase"],
        raw["category"],
        raw["fp32"],
        arrays["bytes"],
        arrays["flops"],
        np.array(raw["mm"], dtype=int),
        arrays["mm_dims"],
        raw["chunk_ops"],
        raw["logits"],
        raw["access"],
        arrays["count"].reshape(len(raw["phase"]), len(MONOMIALS)),
    )


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
