"""Count what autograd really keeps for backward in one training forward of litgpt's own model, on this CPU.

The check of the planner's activation term for any model litgpt knows (``tunelab plan --measure``, ``tunelab
measure-activations``, the per-family report): litgpt's own ``GPT`` or ``lora.GPT`` from the ``Config`` at full
width with a few blocks (what one block keeps does not depend on those after it), weights zeroed, one training
forward and loss under ``saved_tensors_hooks`` that count every saved storage once, by block and for the head.
Also the helpers the simulations share: the model's logits and loss as litgpt's loops compute them, the dtypes
of each precision, CUDA's dropout."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import subprocess
import sys
import time
from dataclasses import dataclass, field

from tunelab.errors import InputError
from tunelab.plan.model.activations import Forward, saved_bytes
from tunelab.plan.model.memory import dtype_bytes
from tunelab.settings import LITGPT_LORA_R, LORA_TARGETS

DTYPES = {"bf16-true": "bfloat16", "16-true": "float16", "32-true": "float32", "bf16-mixed": "float32"}
"""The parameter dtype of each precision measured: the -true ones run weights and activations in that dtype;
bf16-mixed keeps fp32 weights and runs the model's forward under autocast, as Lightning Fabric does
(:func:`training_forward`). CPU autocast's op lists differ from CUDA's only in ops these models call on fp32
inputs (layer_norm, softmax with an explicit dtype, rsqrt) or outside autocast (the loss), so what is saved is the
same; autocast's 16-bit weight copies are the planner's own term (``autocast_weight_copies``), not counted here."""


def build_model(config, method: str, precision: str, lora_r: int = LITGPT_LORA_R, targets=LORA_TARGETS):
    """litgpt's model for ``method`` (full: ``litgpt.GPT``, every parameter trainable; lora / qlora:
    ``litgpt.lora.GPT`` with only the adapters trainable), its parameters created in ``precision``'s parameter
    dtype on the current device (``meta``, or fake under ``FakeTensorMode``). Adapter alpha and dropout rate do not
    change memory (a dropout mask is kept whenever the rate is above 0): litgpt's defaults, 16 and 0.05."""
    import torch

    if method in ("lora", "qlora"):
        from litgpt.lora import GPT, mark_only_lora_as_trainable

        config = lora_config(config, lora_r, 16, 0.05, targets)
    else:
        from litgpt import GPT
    with default_dtype(getattr(torch, DTYPES[precision])):  # no fp32 copy first
        model = GPT(config)
    if method == "full":
        model.requires_grad_(True)
    else:
        mark_only_lora_as_trainable(model)
    return model


def model_logits(model, idx, method: str, precision: str, fabric: bool = True):
    """The logits of litgpt's finetune step: full -> ``model(x)``; LoRA -> ``model(x, lm_head_chunk_size=128)`` (a
    list of chunks). Under bf16-mixed the model's forward runs under autocast. ``fabric``: as litgpt's scripts run
    it, under Lightning Fabric, whose precision plugins (``HalfPrecision``, ``MixedPrecision``, bitsandbytes,
    FSDP, DeepSpeed) all convert the model's outputs to the default dtype, fp32 (``convert_output``): bf16-true
    logits reach the loss as fp32. Without Fabric (tunelab's own loop) the loss casts them to fp32 itself."""
    with forward_context(precision, fabric):
        logits = model(idx) if method == "full" else model(idx, lm_head_chunk_size=128)
    return [t.float() for t in logits] if isinstance(logits, list) else logits.float()


def forward_context(precision: str, fabric: bool = True):
    """The context litgpt's forward runs in: autocast under bf16-mixed; under Fabric's other 16-bit plugins the
    default dtype is the weights' meanwhile (``forward_context``)."""

    import torch

    if precision == "bf16-mixed":
        return torch.autocast("cpu", dtype=torch.bfloat16)
    if fabric and precision != "32-true":
        return default_dtype(getattr(torch, DTYPES[precision]))
    return contextlib.nullcontext()


@contextlib.contextmanager
def default_dtype(dtype):
    """torch's default dtype set to ``dtype`` meanwhile (as Fabric's ``init_module`` and ``forward_context`` do)."""
    import torch

    default = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(default)


def training_loss(logits, idx, method: str):
    """litgpt's loss on :func:`model_logits` (outside autocast): full -> ``chunked_cross_entropy(logits[..., :-1,
    :], ...)``; LoRA -> the last chunk sliced in place, then the loss over the chunk list."""
    from litgpt.utils import chunked_cross_entropy

    if method == "full":
        return chunked_cross_entropy(logits[..., :-1, :], idx[..., 1:])
    logits[-1] = logits[-1][..., :-1, :]
    return chunked_cross_entropy(logits, idx[..., 1:])


def training_forward(model, idx, method: str, precision: str) -> tuple:
    """(logits, loss): :func:`model_logits` then :func:`training_loss`."""
    logits = model_logits(model, idx, method, precision)
    return logits, training_loss(logits, idx, method)


def _fused_dropout(input, p: float = 0.5, training: bool = True, inplace: bool = False):
    import torch

    if not training or p == 0:
        return input
    return torch.native_dropout(input, p, True)[0]


@contextlib.contextmanager
def cuda_dropout():
    """Dropout as CUDA runs it (``native_dropout``: a 1-byte mask kept for backward) instead of CPU's (a mask in the
    input's dtype), for litgpt's ``nn.Dropout`` modules while the block runs."""
    import torch

    original = torch.nn.functional.dropout
    torch.nn.functional.dropout = _fused_dropout
    try:
        yield
    finally:
        torch.nn.functional.dropout = original


def _weight_copy_tracker(params: set, skip: set):
    """A dispatch mode adding to ``skip`` the storage of every cast of a parameter, for mixed precision: autocast's
    16-bit weight copies, which the planner counts as their own term (fp32 weights make no other cast)."""
    import torch
    from torch.multiprocessing.reductions import StorageWeakRef
    from torch.utils._python_dispatch import TorchDispatchMode

    class WeightCopies(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if func is torch.ops.aten._to_copy.default and StorageWeakRef(args[0].untyped_storage()) in params:
                skip.add(StorageWeakRef(out.untyped_storage()))
            return out

    return WeightCopies()


@dataclass
class Measurement:
    """What one real forward kept for backward, per built block and for the head and loss (bytes)."""

    model: str
    method: str
    precision: str
    micro_batch_size: int
    seq_len: int
    layers_built: int
    per_layer_bytes: list[int]
    """Bytes first saved inside each built block (block input included: the previous block's output)."""
    head_bytes: int
    """Bytes saved outside the blocks: final norm, lm_head (chunked for LoRA), cross-entropy."""
    tensors: int
    seconds: float
    notes: list[str] = field(default_factory=list)

    @property
    def per_layer_mean(self) -> float:
        return sum(self.per_layer_bytes) / len(self.per_layer_bytes)

    def to_json(self) -> dict:
        return {
            "model": self.model,
            "method": self.method,
            "precision": self.precision,
            "micro_batch_size": self.micro_batch_size,
            "seq_len": self.seq_len,
            "layers_built": self.layers_built,
            "per_layer_bytes": self.per_layer_bytes,
            "per_layer_mean_bytes": self.per_layer_mean,
            "head_bytes": self.head_bytes,
            "tensors": self.tensors,
            "seconds": round(self.seconds, 2),
            "notes": self.notes,
        }


def lora_config(config, r: int, alpha: int, dropout: float, targets=LORA_TARGETS):
    """litgpt.lora.Config of ``config`` with the adapters on ``targets`` (names of tunelab.settings.LORA_TARGETS); a
    ``config`` that is already a LoRA Config keeps its model, not its own adapter settings."""
    from litgpt.lora import Config as LoRAConfig

    base = {
        f.name: getattr(config, f.name) for f in dataclasses.fields(config) if f.init and not f.name.startswith("lora_")
    }
    return LoRAConfig(
        **base,
        lora_r=r,
        lora_alpha=alpha,
        lora_dropout=dropout,
        **{f"lora_{k}": k in set(targets) for k in LORA_TARGETS},
    )


def measure(
    config,
    method: str = "full",
    precision: str = "bf16-true",
    micro_batch_size: int = 1,
    seq_len: int = 128,
    layers: int = 2,
    lora_r: int = LITGPT_LORA_R,
    targets=LORA_TARGETS,
) -> Measurement:
    """One real training forward of ``config`` (a litgpt Config) with ``layers`` blocks; see the module doc."""
    import torch

    if precision not in DTYPES:
        raise ValueError(f"precision {precision!r}: measured are {', '.join(DTYPES)}")
    t0 = time.perf_counter()
    small = dataclasses.replace(config, n_layer=min(layers, config.n_layer))
    model = _zero_model(small, method, precision, lora_r, targets, seq_len)
    params = _resident_storages(model)
    skip = set(params)  # + autocast's weight copies, as they are made
    where = ["head"]
    counts: dict[str, int] = {}
    n_tensors = [0]
    pack = _packer(skip, where, counts, n_tensors)
    hooks = _track_blocks(model, where)
    idx = torch.zeros(micro_batch_size, seq_len, dtype=torch.long)
    kept = []
    try:
        with (
            torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t),
            _weight_copy_tracker(params, skip) if precision == "bf16-mixed" else contextlib.nullcontext(),
            cuda_dropout(),
        ):
            kept.append(training_forward(model, idx, method, precision))  # the graph stays alive until counted
    finally:
        for h in hooks:
            h.remove()
    notes = []
    if config.attention_logit_softcapping is not None:
        notes.append("attention softcapping: scores kept (T x T per head), on every device")
    per_layer = [counts.get(f"block{i}", 0) for i in range(small.n_layer)]
    return Measurement(
        model=config.name,
        method=method,
        precision=precision,
        micro_batch_size=micro_batch_size,
        seq_len=seq_len,
        layers_built=small.n_layer,
        per_layer_bytes=per_layer,
        head_bytes=counts.get("head", 0),
        tensors=n_tensors[0],
        seconds=time.perf_counter() - t0,
        notes=notes,
    )


def _packer(skip: set, where: list, counts: dict, n_tensors: list):
    """The saved-tensor hook that counts each storage autograd keeps once, by the part of the model running
    (``where[0]``) into ``counts``, and their number into ``n_tensors[0]``; storages in ``skip`` (the model's own)
    are not counted."""
    import torch
    from torch.multiprocessing.reductions import StorageWeakRef

    seen: set = set()

    def pack(t):
        if isinstance(t, torch.Tensor) and t.device.type != "meta":
            ref = StorageWeakRef(t.untyped_storage())
            if ref not in skip and ref not in seen:
                seen.add(ref)
                counts[where[0]] = counts.get(where[0], 0) + t.untyped_storage().nbytes()
                n_tensors[0] += 1
        # kept detached: an op's own output packed as itself is a cycle through its grad_fn that no collector sees,
        # and the whole graph (weights, activations) outlived the measurement (Gemma 7B bf16-mixed: full then LoRA
        # in one process peaked at 22.6 GB, 11.6 GB for either alone)
        return t.detach() if isinstance(t, torch.Tensor) else t

    return pack


def _track_blocks(model, where: list) -> list:
    """Forward hooks that keep ``where[0]`` naming the part of ``model`` running: ``block<i>`` inside each block,
    ``head`` outside them (the embedding, the final norm, the head and the loss); the hooks, to remove."""
    hooks = []
    for i, block in enumerate(model.transformer.h):
        hooks.append(block.register_forward_pre_hook(lambda m, a, i=i: where.__setitem__(0, f"block{i}")))
        hooks.append(block.register_forward_hook(lambda m, a, o: where.__setitem__(0, "head")))
    return hooks


def _zero_model(config, method: str, precision: str, lora_r: int, targets, seq_len: int):
    """litgpt's model for ``config`` on the CPU, every weight zero (built on the meta device, then given memory),
    its rope cache made for ``seq_len``, in training mode."""
    import torch

    with torch.device("meta"):
        model = build_model(config, method, precision, lora_r, targets)
    model = model.to_empty(device="cpu")
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
    model.max_seq_length = seq_len  # computes the rope cache for this length
    model.train()
    return model


def _resident_storages(model) -> set:
    """The storages the model holds before any forward (its parameters, buffers and rope cache): what a saved
    tensor that shares one does not add."""
    import torch
    from torch.multiprocessing.reductions import StorageWeakRef

    params = {StorageWeakRef(t.untyped_storage()) for t in [*model.parameters(), *model.buffers()]}
    for t in (getattr(model, "cos", None), getattr(model, "sin", None)):
        if isinstance(t, torch.Tensor):
            params.add(StorageWeakRef(t.untyped_storage()))
    return params


FAMILIES = (
    "tiny-llama-1.1b",
    "open_llama_7b",
    "Llama-2-7b-hf",
    "Llama-3-8B",
    "Llama-3.2-1B",
    "Mistral-7B-v0.1",
    "gemma-2b",
    "gemma-7b",
    "gemma-2-2b",
    "phi-2",
    "Phi-3-mini-4k-instruct",
    "falcon-7b",
    "stablelm-3b-4e1t",
    "pythia-1b",
)
"""One litgpt config per model family the planner is checked on (LLaMA 1/2/3/3.2, Mistral, Gemma 1 and 2, Phi-2
and Phi-3, Falcon, StableLM, GPT-NeoX)."""


def compare(
    config,
    method: str,
    precision: str = "bf16-true",
    micro_batch_size: int = 1,
    seq_len: int = 128,
    lora_r: int = LITGPT_LORA_R,
    targets=LORA_TARGETS,
) -> dict:
    """The planner's saved-activation bytes (tunelab.plan.model.activations, as CUDA keeps them: the measurement runs
    CUDA's 1-byte dropout mask) beside the measurement, per block and for the head; errors relative to the
    measurement."""
    s = dtype_bytes(precision)
    m = measure(config, method, precision, micro_batch_size, seq_len, layers=2, lora_r=lora_r, targets=targets)
    kind = "full" if method == "full" else "lora"
    p = saved_bytes(
        Forward(config, kind, s, micro_batch_size, seq_len, tuple(targets), lora_r, precision == "bf16-mixed")
    )
    total_m = m.per_layer_bytes[0] + m.per_layer_bytes[1] * (config.n_layer - 1) + m.head_bytes
    total_p = p.total(config.n_layer)
    err = lambda a, b: (a - b) / b if b else None  # noqa: E731
    return {
        "model": config.name,
        "method": method,
        "precision": precision,
        "micro_batch_size": micro_batch_size,
        "seq_len": seq_len,
        "n_layer": config.n_layer,
        "measured_first_block": m.per_layer_bytes[0],
        "planned_first_block": p.first_layer,
        "measured_block": m.per_layer_bytes[1],
        "planned_block": p.per_layer,
        "measured_head": m.head_bytes,
        "planned_head": p.head,
        "measured_total": total_m,
        "planned_total": total_p,
        "error_block": err(p.per_layer, m.per_layer_bytes[1]),
        "error_head": err(p.head, m.head_bytes),
        "error_total": err(total_p, total_m),
        "seconds": round(m.seconds, 1),
        "notes": "; ".join(dict.fromkeys([*m.notes, *p.notes])),
    }


def compare_methods_in_child(
    name: str,
    methods: list[str],
    precisions: list[str] = ("bf16-true",),
    micro_batch_size: int = 1,
    seq_len: int = 128,
    timeout_s: float = 900,
) -> list[dict]:
    """:func:`compare` for each of ``methods`` (full, lora) x ``precisions`` of one family (precision outer), in one
    fresh process: one import of torch and litgpt, and the process's memory goes back to the system when it ends
    (one long process measuring 14 families grows until the kernel kills it on a 24 GiB machine)."""
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "tunelab.plan.trace.measure",
            name,
            ",".join(methods),
            ",".join(precisions),
            str(micro_batch_size),
            str(seq_len),
        ],
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )
    if p.returncode != 0:
        tail = (p.stderr.strip().splitlines() or [f"exit {p.returncode}"])[-1]
        raise RuntimeError(f"measuring {name} {','.join(methods)} failed: {tail}")
    n = len(methods) * len(precisions)
    return [json.loads(line) for line in p.stdout.strip().splitlines()[-n:]]


def for_plan(case) -> dict:
    """``plan --measure``: :func:`compare` for a planned configuration (one sequence of its length); InputError for
    a precision that is not measured (:data:`DTYPES`)."""

    if str(case.precision) not in DTYPES:
        raise InputError(
            f"--measure: precision {case.precision} is not measured ({', '.join(DTYPES)}); fix: measure with one of "
            "them, or use --simulate"
        )
    print(
        f"measuring {case.config.name} ({case.method}, {case.precision}, one sequence of {case.seq_len} tokens, 2 blocks at full "
        "width) on this CPU ...",
        file=sys.stderr,
        flush=True,
    )
    return compare(case.config, case.method, str(case.precision), 1, case.seq_len, case.lora_r, case.lora_targets)


if (
    __name__ == "__main__"
):  # python -m tunelab.plan.trace.measure NAME METHOD[,..] PRECISION[,..] MICRO SEQ -> JSON lines
    from litgpt import Config

    name, methods, precisions, micro, seq = sys.argv[1:6]
    for precision in precisions.split(","):
        for method in methods.split(","):
            print(json.dumps(compare(Config.from_name(name), method, precision, int(micro), int(seq))), flush=True)
