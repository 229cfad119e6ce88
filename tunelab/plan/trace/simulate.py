"""A simulated training step: where the peak is and what is alive there, for any litgpt Config, on this CPU.

litgpt's own model classes at full width under ``FakeTensorMode`` (real shapes and dtypes, no memory), trained as
its finetune scripts do (full: logits then chunked cross-entropy; LoRA: 128-token head chunks; fp32 outputs as
Fabric converts them), with ``backward``, two optimizer steps beside the logits litgpt's loop still holds, a second
micro batch under accumulation, CUDA's dropout masks, and QLoRA's bitsandbytes layers stood in by their sizes.
torch's ``MemTracker`` counts every storage by kind and phase. :func:`for_plan` simulates a planned one-device case;
:func:`replay_run` replays its allocations through the caching allocator's model
(:mod:`tunelab.plan.model.allocator`). ``tunelab plan --simulate`` prints it beside the plan."""

from __future__ import annotations

import dataclasses
import sys
import time
import warnings
from dataclasses import dataclass, field, replace

from tunelab.errors import InputError
from tunelab.gpt import fused_head_loss, head_operands, hidden_states
from tunelab.plan.model import memory, optimizers, strategies
from tunelab.plan.model.allocator import replay
from tunelab.plan.model.memory import PAGED_MIN_NUMEL
from tunelab.plan.model.tables import OPTIMIZERS, optimizer_of
from tunelab.plan.trace.measure import DTYPES, build_model, cuda_dropout, default_dtype, model_logits, training_loss
from tunelab.units import GB

PHASES = ("forward", "backward", "optimizer step")
KINDS = ("Parameter", "Buffer", "Gradient", "Activation", "Temp", "Optstate", "Other")
"""MemTracker's kinds of storage (``_MemRefType``): Temp is what the backward pass creates beside the gradients."""
NF4_BLOCK = 64
"""Weights per fp32 absmax in bitsandbytes' NF4 (``blocksize=64``)."""


class PhasePeaks:
    """A simulation's ``phases`` ({phase: {kind: bytes, 'Total': bytes}}) and the largest of them."""

    phases: dict[str, dict[str, float]]

    @property
    def peak_phase(self) -> str:
        return max(self.phases, key=lambda p: self.phases[p]["Total"])

    @property
    def peak_bytes(self) -> float:
        return self.phases[self.peak_phase]["Total"]

    def peak_json(self) -> dict:
        """The dataclass's fields (seconds rounded) with the peak's phase and bytes."""
        return {
            **{k: v for k, v in dataclasses.asdict(self).items() if k != "seconds"},
            "peak_phase": self.peak_phase,
            "peak_bytes": self.peak_bytes,
            "seconds": round(self.seconds, 2),
        }


@dataclass
class Simulation(PhasePeaks):
    """The simulated step's peak per phase (bytes by kind, extrapolated to the model's blocks) and where it is."""

    model: str
    method: str
    precision: str
    micro_batch_size: int
    seq_len: int
    n_layer: int
    layers_built: tuple[int, int]
    phases: dict[str, dict[str, float]]
    """{phase: {kind: bytes, 'Total': bytes}} at each phase's peak, for ``n_layer`` blocks."""
    where: dict[str, str]
    """{phase: the innermost module running at that phase's peak (in the larger simulation)}."""
    seconds: float
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict:
        return self.peak_json()


def _phase_tracker(events: list | None = None):
    """MemTracker that also keeps the peak of each phase and the module running at it, and, given ``events``,
    appends every storage it sees made or freed (``("alloc" | "free", key, bytes)``, in order)."""
    from torch.distributed._tools.mem_tracker import MemTracker, _UpdateType

    class PhaseTracker(MemTracker):
        def _update_snap(self, u_type, winfo, old_mem_consumed=None, old_reftype=None) -> None:
            if events is not None:
                if u_type in (_UpdateType.DEL, _UpdateType.SIZE):
                    events.append(("free", id(winfo), old_mem_consumed or winfo.mem_consumed))
                if u_type in (_UpdateType.ADD, _UpdateType.SIZE):
                    events.append(("alloc", id(winfo), winfo.mem_consumed))
            super()._update_snap(u_type, winfo, old_mem_consumed, old_reftype)

        def __init__(self) -> None:
            super().__init__()
            self.phase_peaks: dict[str, dict] = {}
            self.phase_where: dict[str, str] = {}
            self.in_backward = False
            """Set around ``loss.backward()``: the loss's own backward runs before any module's backward hook."""

        def _track_module_params_and_buffers(self, module, install_grad_hooks: bool = True):
            for p in module.parameters():  # frozen weights take no gradient hook (torch refuses one)
                if not p.requires_grad and self._param_to_grad_hook_handles.get(p, None) is None:
                    self._param_to_grad_hook_handles[p] = (NoHook(), NoHook())
            return super()._track_module_params_and_buffers(module, install_grad_hooks)

        def _update_peak_stats(self, peak_state) -> None:
            update_peak(self, peak_state)
            phase = tracker_phase(self)
            if keep_phase_peak(self, phase):
                parents = [p for p in self._mod_tracker.parents if p != "Global"]
                self.phase_where[phase] = max(parents, key=len) if parents else "between modules (the loss, the step)"

    return PhaseTracker()


def tracker_phase(tracker) -> str:
    """The phase a MemTracker (or FSDPMemTracker) is in: optimizer step, backward (a module's, or the loss's while
    ``tracker.in_backward``) or forward."""
    backward = tracker.in_backward or tracker._mod_tracker.is_bw
    return "optimizer step" if tracker._in_opt else "backward" if backward else "forward"


def update_peak(tracker, peak_state) -> None:
    """torch's ``MemTracker._update_peak_stats`` without its walk over every tracked module on every op, which
    keeps a peak per module that nothing here reads. The walk costs ops x modules, most of a per-rank
    simulation's time under FSDP1. The whole step's peak (``_peak_mem``) is kept as torch keeps it; the phase peaks are
    :func:`keep_phase_peak`'s."""
    from torch.distributed._tools.mem_tracker import _TOTAL_KEY

    for dev, snap in tracker._curr_mem_snap.items():
        if tracker._peak_mem.get(dev, 0) < snap[_TOTAL_KEY]:
            tracker._peak_mem[dev] = snap[_TOTAL_KEY]
            tracker._peak_mem_snap[dev] = dict(snap)


def keep_phase_peak(tracker, phase: str) -> bool:
    """Keep the tracker's current bytes by kind as ``phase``'s peak (``tracker.phase_peaks``) when they are the
    largest so far; whether they were. A tracker with a ``device`` attribute (not None) counts that device only
    (the accelerator of an offloading simulation, :mod:`tunelab.plan.trace.fake_device`), else any device."""
    from torch.distributed._tools.mem_tracker import _TOTAL_KEY

    only = getattr(tracker, "device", None)
    for dev, snap in tracker._curr_mem_snap.items():
        if only is not None and dev != only:
            continue
        if snap[_TOTAL_KEY] > tracker.phase_peaks.get(phase, {}).get("Total", -1):  # the bytes by kind named then only
            tracker.phase_peaks[phase] = {str(k.value if hasattr(k, "value") else k): v for k, v in snap.items()}
            return True
    return False


class NoHook:
    """A hook handle for a frozen parameter: nothing to remove."""

    def remove(self) -> None:
        pass


def _matmul_4bit(kept: KeptInputs | None = None):
    """bitsandbytes' ``MatMul4Bit`` (0.50) as memory sees it, with the weights Lightning quantizes: forward, the
    dequantize-then-``F.linear`` path (CUDA takes it for large inputs, always on an H100 past 1536 rows) dequantizes
    the NF4 weight to a temporary in the input's dtype; nothing but the packed weight is kept for backward
    (``ctx.tensors = (None, B)``); backward, ``dequantize_4bit(B, state)`` returns the dtype the weight was quantized
    from, fp16 (Lightning's ``_Linear4bit.quantize`` casts to half first), and ``.to(grad.dtype)`` copies it to the
    compute dtype: two weight-sized temporaries at once under bf16. ``kept``: the versions before 0.43.2, whose
    forward dequantizes as backward does and keeps the input where it needs a gradient (``ctx.tensors = (A, B)``,
    each such context listed in ``kept``)."""
    import torch

    class MatMul4Bit(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, packed, out_features, in_features):
            if kept is not None:
                # before 0.43.2: dequantize_4bit's fp16, then .to(A.dtype): two temporaries, as backward
                w = torch.empty(out_features, in_features, dtype=torch.float16, device=x.device).to(x.dtype)
            else:
                w = torch.empty(out_features, in_features, dtype=x.dtype, device=x.device)  # dequantized
            ctx.shape = (out_features, in_features)
            if kept is not None and ctx.needs_input_grad[0]:
                ctx.tensors = (x, packed)
                kept.graphs[-1].append(ctx)
            return torch.nn.functional.linear(x, w)

        @staticmethod
        def backward(ctx, grad):
            w = torch.empty(*ctx.shape, dtype=torch.float16, device=grad.device).to(grad.dtype)
            return grad @ w, None, None, None

    return MatMul4Bit


class KeptInputs:
    """What one simulated model's 4-bit layers keep of their inputs (bitsandbytes before 0.43.2): per micro batch's
    graph, oldest first, the contexts that keep one (``graphs``); the model carries it as :data:`KEPT_ATTRIBUTE`."""

    def __init__(self) -> None:
        self.graphs: list[list] = [[]]


KEPT_ATTRIBUTE = "tunelab_kept_4bit_inputs"
"""The attribute a simulated model built with inputs-keeping 4-bit layers carries its :class:`KeptInputs` under."""


def release_older_graphs(model) -> None:
    """Drop what the 4-bit layers of ``model``'s every graph but the newest keep, where litgpt's loop drops the older
    graph (binding the next micro batch's loss replaces the last references to it), and open a list for the next
    graph; nothing for a model without such layers. A node's attribute lives as long as its graph, but under the
    tracker every graph lives on: torch's module tracker hooks each module's outputs, a cycle through the kept input
    that no collection breaks."""
    kept = getattr(model, KEPT_ATTRIBUTE, None)
    if kept is None:
        return
    for older in kept.graphs[:-1]:
        for ctx in older:
            ctx.tensors = None
    kept.graphs = [kept.graphs[-1], []]


def _quantize(model, keeps_input: bool = False) -> int:
    """Replace every Linear of the model (Lightning's BitsandbytesPrecision converts each ``torch.nn.Linear``,
    lm_head's included; the embedding is no Linear) by NF4 storage; returns the count. ``keeps_input``: bitsandbytes
    before 0.43.2 (:func:`_matmul_4bit`), their kept inputs listed on the model (:class:`KeptInputs`)."""
    import torch

    kept = KeptInputs() if keeps_input else None
    fn = _matmul_4bit(kept)

    class FakeLinear4bit(torch.nn.Module):
        def __init__(self, linear: torch.nn.Linear):
            super().__init__()
            n = linear.weight.numel()
            self.out_features, self.in_features = linear.weight.shape
            self.weight = torch.nn.Parameter(torch.empty(n // 2, dtype=torch.uint8), requires_grad=False)
            self.absmax = torch.nn.Parameter(torch.empty(-(-n // NF4_BLOCK), dtype=torch.float32), requires_grad=False)
            self.bias = linear.bias

        def forward(self, x):
            out = fn.apply(x, self.weight, self.out_features, self.in_features)
            return out if self.bias is None else out + self.bias

    count = 0
    for module in list(model.modules()):
        for child_name, child in list(module.named_children()):
            if type(child) is torch.nn.Linear:
                setattr(module, child_name, FakeLinear4bit(child))
                count += 1
    if kept is not None:
        setattr(model, KEPT_ATTRIBUTE, kept)
    return count


def _stable_embedding(model):
    """litgpt's QLoRA setup (``finetune/lora.py`` main, 0.5.13), after the optimizer is built from the parameters:
    the embedding is replaced by bitsandbytes' ``StableEmbedding`` (an embedding and a LayerNorm) in the weight's
    dtype. Made after ``mark_only_lora_as_trainable``, its weight and norm train: a vocabulary-sized gradient that
    no ``optimizer.zero_grad`` frees (they are not in the optimizer), the norm's input kept, and the first block's
    input now carrying a gradient. ``old_embedding`` stays a local of ``main`` for the whole run: returned, so the
    caller keeps it alive the same way."""
    from bitsandbytes.nn import StableEmbedding

    old = model.transformer.wte
    with default_dtype(old.weight.dtype):  # made in the weight's dtype: litgpt's .to(dtype) afterwards
        model.transformer.wte = StableEmbedding(old.num_embeddings, old.embedding_dim)
    return old


def case_model(case):
    """litgpt's model of ``case`` (a :class:`~tunelab.plan.model.case.PlanInput`: its config, method, precision and
    LoRA) on the current device, its rope cache for the case's sequence, in training mode."""
    model = build_model(case.config, case.method, str(case.precision), case.lora_r, case.lora_targets)
    model.max_seq_length = case.seq_len
    model.train()
    return model


def setup_step(case, optimizer: str):
    """(model, optimizer, what litgpt's main keeps beside them) of ``case`` as litgpt's finetune script sets them
    up, on the current (fake) device (:func:`case_model`, QLoRA's 4-bit layers, checkpointed blocks); ``optimizer``
    as traced (:data:`OPTIMIZERS`)."""

    model = case_model(case)
    if case.method == "qlora":
        _quantize(model, case.loop.bnb_keeps_matmul_inputs)
    if case.activation_checkpointing:
        checkpoint_blocks(model)
    opt = make_optimizer(optimizer, [p for p in model.parameters() if p.requires_grad])
    # litgpt's QLoRA swaps the embedding after building the optimizer; main() keeps the old one referenced
    kept = [_stable_embedding(model)] if case.method == "qlora" and case.loop.qlora_stable_embedding else []
    return model, opt, kept


def _fused_training_loss(model, idx):
    """tunelab's loop with ``liger``: the model's trunk (:func:`tunelab.gpt.hidden_states`), then the fused head
    and loss over the shifted positions (a LoRA head's adapter appended as extra columns), as the loop runs it
    (:func:`tunelab.gpt.fused_head_loss`) without its Triton kernels, which cannot run on fake tensors and write only
    in place (each chunk's losses into a preallocated row, the chunk's logits gradient over the logits)."""

    h, weight, bias = head_operands(model, hidden_states(model, idx)[:, :-1, :])
    return fused_head_loss(h.reshape(-1, h.size(-1)), weight, idx[:, 1:].reshape(-1), 1, bias)


def _one_step(case, optimizer: str):
    """({phase: {kind: bytes}}, {phase: module}) of two simulated optimizer steps of ``case`` as built. The loop's
    ``fabric``: litgpt's script (its loop holds the logits through backward and the optimizer step); else tunelab's
    loop (the loss computed in a function: nothing holds the logits once it returns, before backward), with
    ``fused_loss`` the fused head and loss (:func:`_fused_training_loss`)."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    method, precision, fabric = case.method, str(case.precision), case.loop.fabric
    with FakeTensorMode():
        model, opt, kept = setup_step(case, optimizer)
        x = torch.zeros(case.micro_batch_size, case.seq_len, dtype=torch.long)
        tracker = _phase_tracker()
        tracker.track_external(model, opt, x, *kept)
        logits = None
        with tracker, cuda_dropout(), warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="Module is None")  # ModTracker on modules already gone
            for _ in range(2):  # the second step runs with the optimizer states the first one created
                for _ in range(min(case.accumulation, 2)):  # a later micro batch runs beside the gradients
                    tracker.reset_mod_stats()  # per-module stats are per forward; the phase peaks stay
                    # litgpt's loop: the previous logits stay referenced through the next forward, until
                    # `logits = model(...)` rebinds the name; the loss is computed after that
                    if case.loop.fused_loss:  # the loop's loss runs under autocast with bf16-mixed
                        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16-mixed"):
                            loss = _fused_training_loss(model, x)
                    else:
                        logits = model_logits(model, x, method, precision, fabric)
                        loss = training_loss(logits, x, method)
                        if not fabric:  # tunelab's loop: the logits were local to its loss function (run/loop.py
                            logits = None  # _loss), gone before backward; autograd keeps what the loss saved
                    release_older_graphs(model)
                    tracker.in_backward = True
                    loss.backward()
                    tracker.in_backward = False
                opt.step()  # litgpt's loop still holds `logits` here
                opt.zero_grad()
                del loss
    return tracker.phase_peaks, tracker.phase_where


def replay_run(case, seq_lens: list[int], validation_seqs: list[int] | None = None) -> dict:
    """litgpt's finetune loop of ``case`` over a run's own padded sequence lengths (one per micro batch, in order), at full depth
    (no extrapolation), its storage allocations replayed through CUDA's caching allocator
    (:mod:`tunelab.plan.model.allocator`): {"end", "loaded", "first_step"} -> :class:`~tunelab.plan.model.allocator.Peaks`, as
    a run record's phases: "loaded" before the first training batch (the model, the optimizer, and the sanity
    validation litgpt runs on two batches of ``validation_seqs`` tokens, by default the longest twice),
    "first_step" after the first optimizer step. Minutes for a 1B model's dozen steps: a check of the allocator's
    share, not a planner."""
    import torch
    from litgpt.utils import chunked_cross_entropy
    from torch._subclasses.fake_tensor import FakeTensorMode

    events: list = []
    marks: dict[str, int] = {}
    longest = max(seq_lens)
    method, precision, micro_batch_size = case.method, str(case.precision), case.micro_batch_size
    with FakeTensorMode():
        model, opt, kept = setup_step(
            replace(case, seq_len=longest, activation_checkpointing=False), optimizer_of(case)
        )
        tracker = _phase_tracker(events)
        tracker.track_external(model, opt, *kept)
        loss = None
        with tracker, cuda_dropout(), warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="Module is None")
            model.eval()  # litgpt's sanity check: validate() on two batches, the whole head, unchunked loss
            with torch.no_grad():
                for length in validation_seqs or [longest, longest]:
                    tracker.reset_mod_stats()
                    v = torch.zeros(micro_batch_size, length, dtype=torch.long)
                    logits = model_logits(model, v, "full", precision)
                    chunked_cross_entropy(logits[..., :-1, :], v[..., 1:], chunk_size=0)
                    del v, logits
            model.train()
            marks["loaded"] = len(events)
            for i, t in enumerate(seq_lens):
                tracker.reset_mod_stats()
                x = torch.zeros(micro_batch_size, t, dtype=torch.long)
                logits = model_logits(model, x, method, precision)
                loss = training_loss(logits, x, method)
                release_older_graphs(model)
                (loss / case.accumulation).backward()
                if (i + 1) % case.accumulation == 0:
                    opt.step()
                    opt.zero_grad()
                    marks.setdefault("first_step", len(events))
        del logits, loss
    end, so_far = replay(events, marks)
    return {"end": end, **so_far}


def make_optimizer(name: str, params):
    """The simulated optimizer ``name`` (:data:`OPTIMIZERS`) over ``params``."""
    import torch

    if name == "AdamW fused":
        return torch.optim.AdamW(params, lr=1e-4, fused=True)
    if name.startswith("SGD"):
        return torch.optim.SGD(params, lr=1e-4, momentum=0.9 if "momentum" in name else 0.0, foreach=True)
    if name.startswith("Paged"):
        return _paged_adamw(params)
    if built := optimizers.traced_class(name):  # a class and the options that add states (tables.optimizer_of)
        cls, init = built
        return getattr(torch.optim, cls)(params, lr=1e-4, foreach=True, **init)
    return torch.optim.AdamW(params, lr=1e-4, foreach=True)


def _paged_adamw(params):
    """bitsandbytes' PagedAdamW (0.50) as torch's allocator sees it: two fp32 states for each tensor under
    ``memory.PAGED_MIN_NUMEL`` elements, created at the first step as ordinary device memory
    (``get_state_buffer``); larger tensors' states are paged (CUDA unified memory, not counted); the update is one
    fused kernel per tensor, no temporaries."""
    import torch

    class PagedAdamW(torch.optim.Optimizer):
        def __init__(self, params):
            super().__init__(params, {})

        @torch.no_grad()
        def step(self, closure=None):
            for group in self.param_groups:
                for p in group["params"]:
                    if p.grad is not None and not self.state[p] and p.numel() < PAGED_MIN_NUMEL:
                        self.state[p]["state1"] = torch.zeros_like(p, dtype=torch.float32)
                        self.state[p]["state2"] = torch.zeros_like(p, dtype=torch.float32)

    return PagedAdamW(params)


def checkpoint_blocks(model) -> None:
    """Activation checkpointing of every block, as litgpt's FSDP policy wraps them (non-reentrant)."""
    from torch.utils.checkpoint import checkpoint

    for block in model.transformer.h:
        forward = block.forward

        def wrapped(*args, _f=forward, **kwargs):
            return checkpoint(_f, *args, use_reentrant=False, **kwargs)

        block.forward = wrapped


def _check(case, optimizer: str) -> None:
    """ValueError for a step :func:`simulate` does not run."""
    if case.loop.fused_loss and case.loop.fabric:
        raise ValueError("fused_loss runs in tunelab's own loop: pass fabric=False")
    if str(case.precision) not in DTYPES:
        raise ValueError(f"precision {case.precision!r}: simulated are {', '.join(DTYPES)}")
    if case.method not in ("full", "lora", "qlora"):
        raise ValueError(f"method {case.method!r}: full, lora or qlora")
    if case.loop.bnb_keeps_matmul_inputs and case.activation_checkpointing:
        raise ValueError(
            "4-bit layers keeping their inputs under activation checkpointing: not simulated (the blocks recomputed in "
            "backward would keep theirs to the step's end under the tracker)"
        )
    if optimizer not in OPTIMIZERS and optimizers.traced_class(optimizer) is None:
        raise ValueError(f"optimizer {optimizer!r}: simulated are {', '.join(OPTIMIZERS)}")


def _notes(case, optimizer: str) -> list[str]:
    """What the simulated step on this CPU does differently from a GPU, and what it leaves out."""
    method, precision = case.method, str(case.precision)
    notes = [
        "attention: torch's CPU flash kernel (keeps what CUDA's flash kernel keeps, not its workspace)",
        "no caching-allocator rounding",
    ]
    if precision == "32-true" and method == "full":
        notes.append(
            "fp32 attention on CUDA runs the memory-efficient kernel, whose output the projection reads as a view: "
            "the CPU kernel's copy (one per block) is not there on a GPU, and the plan does not count it"
        )
    if case.config.head_size % 8 and precision != "32-true":
        notes.append(
            f"head size {case.config.head_size}: on CUDA torch pads q, k and v to a multiple of 8 for the flash "
            "kernel (new tensors kept instead of q, k and the fused qkv); the plan counts that, the CPU kernel does "
            "not pad"
        )
    if precision == "bf16-mixed":
        notes.append("mixed precision under CPU autocast: its fp32 op list differs from CUDA's")
    if method == "qlora":
        notes.append("NF4 weights and their dequantization as bitsandbytes' code does it")
    if case.loop.fused_loss:
        notes.append("the fused head and loss as the loop's code allocates (Liger's Triton kernels: in place)")
    if case.loop.compiled:
        eager = memory.predict(case.changed(compiled=False)).peak_allocated_bytes
        notes.append(
            f"blocks run eagerly here (compilation is not simulated): compare with the same step planned eagerly, "
            f"{eager / GB:.2f} GB; compiled blocks keep what torch's partitioner saves"
        )
    if "Paged" in optimizer:
        notes.append(
            "paged optimizer: the states of tensors from 1e5 elements live outside torch's allocator (left out); "
            "smaller tensors' states are counted"
        )
    return notes


def simulate(case, layers: int = 1) -> Simulation:
    """The simulated step of ``case`` (a :class:`~tunelab.plan.model.case.PlanInput`: its litgpt Config at full
    width, method, precision, micro batch, sequence, accumulation, checkpointing, LoRA, optimizer and loop) on one
    device, built at ``layers`` and ``layers + 1`` blocks and extrapolated: see the module docstring. The loop's
    ``fabric``: litgpt's script under Lightning Fabric (its loop holds the logits through the optimizer step);
    else tunelab's own loop (fp32 logits too, freed after backward), with ``fused_loss`` Liger's fused head and
    loss (the logits never materialised)."""
    optimizer = optimizer_of(case)
    _check(case, optimizer)
    t0 = time.perf_counter()
    config = case.config
    small = min(layers, max(1, config.n_layer - 1))
    runs = [_one_step(replace(case, config=replace(config, n_layer=n)), optimizer) for n in (small, small + 1)]
    (a, _), (b, where) = runs
    grown = config.n_layer - (small + 1)
    phases = {
        phase: {k: b[phase].get(k, 0) + grown * (b[phase].get(k, 0) - a[phase].get(k, 0)) for k in (*KINDS, "Total")}
        for phase in PHASES
        if phase in a and phase in b
    }
    return Simulation(
        model=config.name,
        method=case.method,
        precision=str(case.precision),
        micro_batch_size=case.micro_batch_size,
        seq_len=case.seq_len,
        n_layer=config.n_layer,
        layers_built=(small, small + 1),
        phases=phases,
        where=where,
        seconds=time.perf_counter() - t0,
        notes=_notes(case, optimizer),
    )


def for_plan(case) -> Simulation:
    """The simulated step of a planned configuration (:class:`tunelab.plan.model.memory.PlanInput`): one device, no
    sharding (InputError otherwise: sharding is not simulated)."""
    if case.world > 1 or strategies.of(case).divides:
        raise InputError(
            f"--simulate: {case.strategy} on {case.world} device(s) is not simulated (sharding and its buffers are not); "
            "fix: simulate the one-device case (no --strategy, --devices 1)"
        )
    print(
        f"simulating {case.config.name} ({case.method}, {case.precision}, micro {case.micro_batch_size} x "
        f"{case.seq_len} tokens, {optimizer_of(case)}) on fake tensors ...",
        file=sys.stderr,
        flush=True,
    )
    return simulate(case)
