"""Several devices, simulated per rank in one CPU process: the memory of rank 0 and the collectives it issues.

litgpt's model at full width on fake tensors, as rank 0 of a world joined by torch's fake process group (every
collective dispatched with its real shapes, nothing moved), wrapped by :func:`tunelab.parallel.wrap` as the run
wraps it: FSDP2 under ``FSDPMemTracker`` (DTensor's shape-propagation temporaries skipped), FSDP1 and DDP under
``MemTracker``, FSDP1's ``cpu_offload`` on a stand-in device (:mod:`tunelab.plan.trace.fake_device`). The micro
batches before the last run under ``no_sync()``; the peak per phase by kind and the collectives by kind, phase and
size per optimizer step come back as :class:`RankSimulation`. DeepSpeed does not run on fake tensors:
a ZeRO-2/3 file gets its buffers by their sizes (:func:`tunelab.plan.model.strategies.zero.zero_sizes`).
``tunelab plan --simulate`` prints it; docs/planner.md, "Where the peaks come from"."""

from __future__ import annotations

import ast
import contextlib
import inspect
import sys
import time
import warnings
from collections import Counter
from dataclasses import dataclass, field, replace

from tunelab.errors import InputError
from tunelab.plan.model import memory
from tunelab.plan.model.strategies.zero import zero_sizes
from tunelab.plan.model.tables import optimizer_of
from tunelab.plan.trace.fake_device import fake_accelerator
from tunelab.plan.trace.measure import build_model, cuda_dropout, model_logits, training_loss
from tunelab.plan.trace.simulate import (
    NoHook,
    PhasePeaks,
    case_model,
    keep_phase_peak,
    make_optimizer,
    simulate,
    tracker_phase,
    update_peak,
)
from tunelab.plan.trace.simulate import for_plan as simulate_for_plan
from tunelab.settings import LITGPT_LORA_R, LORA_TARGETS
from tunelab.strategies import load_strategy
from tunelab.units import GB

SIMULATED = ("fsdp2", "fsdp", "ddp")
"""Strategy files' kinds simulated per rank (DeepSpeed is planned by arithmetic; see docs/planner.md)."""
LITGPT = "litgpt"
"""litgpt's own choice on several devices (no strategy file), simulated as litgpt's scripts wrap the model: full
fine-tuning by Lightning's ``FSDPStrategy`` (FSDP1), LoRA by litgpt's ``parallelize_fn`` (FSDP2)."""
COLLECTIVES = {
    "_allgather_base_": "all-gather",
    "allgather_": "all-gather",
    "allgather_into_tensor_coalesced_": "all-gather",
    "_reduce_scatter_base_": "reduce-scatter",
    "reduce_scatter_tensor_coalesced_": "reduce-scatter",
    "allreduce_": "all-reduce",
    "allreduce_coalesced_": "all-reduce",
    "broadcast_": "broadcast",
}
"""torch's ``c10d`` ops and the collective each is."""
DDP_FIRST_BUCKET_BYTES = 1024 * 1024
"""DDP's first bucket after its rebuild (``torch.distributed._DEFAULT_FIRST_BUCKET_BYTES``)."""


@dataclass(frozen=True)
class Collective:
    """A collective as rank 0 issues it, per optimizer step."""

    kind: str
    """all-gather, reduce-scatter, all-reduce or broadcast."""
    phase: str
    """forward, backward or optimizer step."""
    bytes: int
    """The whole tensor: an all-gather's output, a reduce-scatter's input, an all-reduce's buffer."""
    calls: int
    """Times it is issued per optimizer step (at the model's depth)."""
    group: int = 0
    """Ranks in the process group it runs over (0: the whole world; HYBRID_SHARD's replication across one node's
    copies runs over a group of 1 and moves nothing)."""

    def bytes_moved(self, world: int) -> float:
        """Bytes each device sends (and receives) in a ring over its group of n ranks (default ``world``): all-reduce
        2(n-1)/n x B, the others (n-1)/n x B."""
        n = self.group or world
        ring = (n - 1) / n
        return self.calls * self.bytes * ring * (2 if self.kind == "all-reduce" else 1)


@dataclass
class RankSimulation(PhasePeaks):
    """Rank 0's simulated step under a strategy on ``world`` devices."""

    model: str
    method: str
    precision: str
    micro_batch_size: int
    seq_len: int
    strategy: str
    world: int
    accumulation: int
    activation_checkpointing: bool
    n_layer: int
    layers_built: tuple[int, int]
    phases: dict[str, dict[str, float]]
    """{phase: {kind: bytes, 'Total': bytes}} at each phase's peak on rank 0, for ``n_layer`` blocks."""
    collectives: list[Collective]
    seconds: float
    notes: list[str] = field(default_factory=list)
    host_peak_bytes: float = 0.0
    """Peak host RAM the offloaded states took (FSDP1's ``cpu_offload``: sharded parameters, their gradients, the
    optimizer's states, pinned), simulated on the host apart from the device (:mod:`tunelab.plan.trace.fake_device`); 0
    without offload. ``phases`` and the peak are the device's."""

    def bytes_moved(self, kind: str | None = None) -> float:
        """Bytes rank 0 sends per optimizer step (ring collectives), of one kind or all."""
        return sum(c.bytes_moved(self.world) for c in self.collectives if kind in (None, c.kind))

    def to_json(self) -> dict:
        return {**self.peak_json(), "bytes_moved_per_step": self.bytes_moved(), "host_peak_bytes": self.host_peak_bytes}


@contextlib.contextmanager
def fake_world(world: int):
    """torch's fake process group as rank 0 of ``world``, torn down on exit; InputError inside a real one."""
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if dist.is_initialized():
        raise InputError("the per-rank simulation runs outside a distributed run (a process group is already up)")
    dist.init_process_group("fake", rank=0, world_size=world, store=FakeStore())
    try:
        yield
    finally:
        dist.destroy_process_group()


@contextlib.contextmanager
def _propagation_skipped(tracker):
    """Mark DTensor's sharding propagation (run under ``ShardingPropagator._fake_mode_lock``) so that ``tracker``
    leaves out the global-shape fake tensors it makes: they are shape inference, not memory."""
    from torch.distributed.tensor._sharding_prop import ShardingPropagator

    class Marker:
        def __enter__(self):
            tracker.propagating += 1

        def __exit__(self, *exc):
            tracker.propagating -= 1

    saved = ShardingPropagator._fake_mode_lock
    ShardingPropagator._fake_mode_lock = Marker()
    try:
        yield
    finally:
        ShardingPropagator._fake_mode_lock = saved


def _collective_bytes(func, args, kwargs) -> int:
    """The whole tensor of a collective: the list of outputs an ``allgather_`` fills (one shard per rank), else the
    largest tensor it is given (an all-gather's output, a reduce-scatter's input, an all-reduce's buffer)."""
    import torch
    from torch.utils._pytree import tree_leaves

    if func._opname == "allgather_":
        return sum(t.numel() * t.element_size() for t in tree_leaves(args[0]) if isinstance(t, torch.Tensor))
    tensors = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
    return max(t.numel() * t.element_size() for t in tensors)


def _group_size(args, kwargs) -> int:
    """Ranks in the process group a c10d op is dispatched with (boxed as a TorchScript object among its
    arguments)."""
    import torch.distributed as dist
    from torch.utils._pytree import tree_leaves

    for a in tree_leaves((args, kwargs)):
        if type(a).__name__ == "ScriptObject" and a._type().qualified_name().endswith(".ProcessGroup"):
            return dist.ProcessGroup.unbox(a).size()
    return 0


def _recording(base):
    """``base`` (torch's FSDPMemTracker or MemTracker) keeping each phase's peak (by kind) and every collective
    dispatched (kind, phase, bytes); parameters that are not leaves (FSDP1's views of its flat parameters) or take
    no gradient get no gradient hook (torch refuses one)."""

    class Tracker(base):
        def __init__(self, *args):
            super().__init__(*args)
            self.propagating = 0
            self.phase_peaks: dict[str, dict] = {}
            self.collectives: list[tuple[str, str, int]] = []
            self.in_backward = False

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if self.propagating:
                return func(*args, **(kwargs or {}))
            kind = COLLECTIVES.get(func._opname) if func.namespace == "c10d" else None
            if kind is not None:
                self.collectives.append(
                    (kind, tracker_phase(self), _collective_bytes(func, args, kwargs), _group_size(args, kwargs))
                )
            return super().__torch_dispatch__(func, types, args, kwargs)

        def _track_module_params_and_buffers(self, module, install_grad_hooks: bool = True):
            for p in module.parameters():
                if (not p.requires_grad or not p.is_leaf) and self._param_to_grad_hook_handles.get(p) is None:
                    self._param_to_grad_hook_handles[p] = (NoHook(), NoHook())
            return super()._track_module_params_and_buffers(module, install_grad_hooks)

        def _update_peak_stats(self, peak_state) -> None:
            update_peak(self, peak_state)
            keep_phase_peak(self, tracker_phase(self))

    return Tracker


def _fsdp_tracker(model, opt):
    """FSDP2's tracker (FSDPMemTracker) with :func:`_recording`."""
    from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker

    return _recording(FSDPMemTracker)(model, opt)


def _fsdp1_step(case, strategy, optimizer: str):
    """As :func:`_fsdp2_step`, under FSDP1 (:func:`tunelab.parallel.wrap` with a ``name: fsdp`` file, or Lightning's
    FSDPStrategy as litgpt's full fine-tuning makes it when ``strategy`` is None: :func:`lightning_fsdp`) and torch's
    MemTracker; the micro batches before the last run under ``no_sync()``."""

    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed._tools.mem_tracker import MemTracker

    from tunelab.parallel import wrap

    mesh = None
    if strategy is not None and strategy.sharding_strategy == "HYBRID_SHARD":  # one node of ``world`` devices
        from torch.distributed.device_mesh import init_device_mesh

        mesh = init_device_mesh("cpu", (1, case.world))  # outside fake mode
    offload = strategy is not None and strategy.cpu_offload
    with FakeTensorMode(allow_non_fake_inputs=True), _fake_storage_allocated(), contextlib.ExitStack() as stack:
        # offload: a stand-in accelerator, the host's memory counted apart; else all on this CPU
        device = stack.enter_context(fake_accelerator()) if offload else torch.device("cpu")
        model = case_model(case)
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore")
            if strategy is None:
                model = lightning_fsdp(model, str(case.precision))
            else:
                model = wrap(model, strategy, device, case.world, mesh=mesh)
        opt = make_optimizer(optimizer, [p for p in model.parameters() if p.requires_grad])
        x = torch.zeros(case.micro_batch_size, case.seq_len, dtype=torch.long, device=device)
        tracker = _recording(MemTracker)()
        tracker.device = device if offload else None
        tracker.track_external(model, opt, x)
        with tracker, cuda_dropout(), warnings.catch_warnings():
            warnings.filterwarnings("ignore")
            no_sync = lambda last: contextlib.nullcontext() if last else model.no_sync()  # noqa: E731
            raw = _two_steps(model, opt, tracker, x, case, no_sync, most=3, fabric=strategy is None)
        host = tracker._peak_mem.get(torch.device("cpu"), 0) if offload else 0
        return tracker.phase_peaks, raw, host


def litgpt_fsdp_keywords() -> dict:
    """The keywords litgpt's full fine-tuning (``litgpt/finetune/full.py``, the installed version) gives Lightning's
    ``FSDPStrategy`` on several devices, read from its source (parsed, not run): litgpt 0.5 passes
    ``auto_wrap_policy={Block}, activation_checkpointing_policy={Block}, state_dict_type="full",
    limit_all_gathers=True, cpu_offload=False``."""

    import litgpt.finetune.full as full

    for node in ast.walk(ast.parse(inspect.getsource(full))):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "FSDPStrategy":
            out = {}
            for k in node.keywords:
                names = k.value.elts if isinstance(k.value, ast.Set) else ()
                if names and all(isinstance(e, ast.Name) for e in names):
                    out[k.arg] = {getattr(full, e.id) for e in names}
                else:
                    out[k.arg] = ast.literal_eval(k.value)
            return out
    raise InputError("--simulate: this litgpt's finetune/full.py makes no FSDPStrategy; fix: --strategy fsdp")


def lightning_fsdp(model, precision: str):
    """``model`` wrapped by Lightning's own ``FSDPStrategy.setup_module`` with litgpt's keywords
    (:func:`litgpt_fsdp_keywords`) and the precision plugin Fabric gives it (``FSDPPrecision``: its
    ``MixedPrecision`` gathers 16-bit parameters under bf16-mixed too), on this CPU. One change: Lightning passes
    FSDP its CUDA device's index (``device_id=root_device.index``), None for a CPU device, where FSDP1 then asks for
    an accelerator; while it wraps, FSDP takes this CPU for None."""
    import torch
    import torch.distributed.fsdp as fsdp
    from lightning.fabric.plugins.precision.fsdp import FSDPPrecision
    from lightning.fabric.strategies import FSDPStrategy

    real = fsdp.FullyShardedDataParallel

    class OnThisCPU(real):
        def __init__(self, *args, device_id=None, **kwargs):
            super().__init__(*args, device_id=torch.device("cpu") if device_id is None else device_id, **kwargs)

    strategy = FSDPStrategy(
        **litgpt_fsdp_keywords(), precision=FSDPPrecision(precision), parallel_devices=[torch.device("cpu")]
    )
    fsdp.FullyShardedDataParallel = OnThisCPU
    try:
        return strategy.setup_module(model)
    finally:
        fsdp.FullyShardedDataParallel = real


def litgpt_parallelize(model, mesh):
    """``model`` sharded by litgpt's LoRA (``litgpt.finetune.lora.parallelize_fn``, what Lightning's
    ``ModelParallelStrategy`` calls with its (data_parallel, tensor_parallel) mesh): each block under
    ``checkpoint_wrapper``, ``fully_shard`` on every block, wrapper and trainable ``Linear``, then the root."""
    from litgpt.finetune.lora import parallelize_fn

    return parallelize_fn(model, mesh)


@contextlib.contextmanager
def _fake_storage_allocated():
    """FSDP1 asks whether a flat parameter's storage is allocated by its data pointer being non-zero
    (``torch.distributed.fsdp._flat_param._data_ptr_allocated``); a fake tensor's pointer is always 0, so under
    SHARD_GRAD_OP (the unsharded parameter kept from forward into backward) FSDP1 stops with "the unsharded flat
    parameter should be allocated". While the simulation runs, a fake tensor counts as allocated by its storage's
    size, which FSDP1 itself sets to 0 when it frees one (``_free_storage``); a real tensor keeps torch's check."""
    import torch.distributed.fsdp._flat_param as flat_param
    from torch._subclasses.fake_tensor import FakeTensor

    real = flat_param._data_ptr_allocated

    def allocated(tensor) -> bool:
        if isinstance(tensor, FakeTensor):
            return tensor.untyped_storage().nbytes() > 0
        return real(tensor)

    flat_param._data_ptr_allocated = allocated
    try:
        yield
    finally:
        flat_param._data_ptr_allocated = real


def _two_steps(model, opt, tracker, x, case, sync, most: int = 2, fabric=False) -> list:
    """Two optimizer steps of ``case`` in tunelab's loop (the second runs beside the optimizer states the first
    made), each of ``min(accumulation, most)`` micro batches (a later one runs beside the gradients; more add no memory), each
    micro batch under ``sync(last)`` (a context: gradient sync on the last only); the second step's collectives,
    those of the micro batches without sync counted for all of them: with three, the middle one ``accumulation -
    2`` times; with two, the first ``accumulation - 1`` times. FSDP1 runs three (``most=3``): its first and middle
    micro batches differ (SHARD_GRAD_OP gathers its units in the first and keeps them through the rest; counting
    the first's gathers for each charged it ``accumulation - 1``); FSDP2 reshards after every backward, so its
    first stands for the rest. ``fabric``: litgpt's loop (the forward under Lightning Fabric:
    :func:`tunelab.plan.trace.measure.model_logits`; its logits held to the next forward), else tunelab's loop."""

    method, precision, accumulation = case.method, str(case.precision), case.accumulation
    runs = min(accumulation, most)
    marks: list[int] = []
    logits = None
    for step in range(2):
        if step == 1:
            tracker.collectives.clear()  # one step's collectives: the second's
        for i in range(runs):
            marks.append(len(tracker.collectives))
            tracker.reset_mod_stats()
            with sync(i == runs - 1):
                # litgpt's loop holds its logits through backward, the optimizer step and the next forward, until
                # `logits = model(...)` rebinds the name; tunelab's loop computes them inside its loss function
                logits = model_logits(model, x, method, precision, fabric=fabric)
                loss = training_loss(logits, x, method)
                if not fabric:
                    logits = None
                tracker.in_backward = True
                (loss / accumulation).backward()
                tracker.in_backward = False
                del loss
        opt.step()
        opt.zero_grad()
    raw = list(tracker.collectives)
    if runs == 3:  # the middle micro batch, once for each of the accumulation's a - 2 between the first and last
        first, middle, last = marks[-3], marks[-2], marks[-1]
        raw = raw[first:middle] + raw[middle:last] * (accumulation - 2) + raw[last:]
    elif runs == 2:  # the micro batch without gradient sync, once for each of the accumulation's first a - 1
        first, last = marks[-2], marks[-1]
        raw = raw[first:last] * (accumulation - 1) + raw[last:]
    return raw


def _fsdp2_step(case, strategy, optimizer: str):
    """({phase: {kind: bytes}}, [(kind, phase, bytes)] of the second optimizer step) of ``case``, rank 0
    of its world under FSDP2 (:func:`tunelab.parallel.wrap` in tunelab's loop, or litgpt's LoRA sharding in
    litgpt's loop when ``strategy`` is None: :func:`litgpt_parallelize`), gradient sync only on the last micro
    batch (:func:`_two_steps`)."""

    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed.device_mesh import init_device_mesh

    from tunelab.parallel import wrap

    # outside fake mode: a mesh reads its ranks; litgpt's is Lightning's ModelParallelStrategy's, named
    if strategy is None:
        mesh = init_device_mesh("cpu", (case.world, 1), mesh_dim_names=("data_parallel", "tensor_parallel"))
    else:
        mesh = init_device_mesh("cpu", (case.world,))
    with FakeTensorMode():
        model = case_model(case)
        if strategy is None:
            model = litgpt_parallelize(model, mesh)
        else:
            model = wrap(model, strategy, torch.device("cpu"), case.world, mesh=mesh)
        opt = make_optimizer(optimizer, [p for p in model.parameters() if p.requires_grad])
        x = torch.zeros(case.micro_batch_size, case.seq_len, dtype=torch.long)
        tracker = _fsdp_tracker(model, opt)
        tracker.track_inputs((x,))
        with tracker, _propagation_skipped(tracker), cuda_dropout(), warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="Module is None")

            def sync(last: bool):
                model.set_requires_gradient_sync(last)
                return contextlib.nullcontext()

            raw = _two_steps(model, opt, tracker, x, case, sync, fabric=strategy is None)
        return tracker.phase_peaks, raw, 0


def _per_step(raw: list) -> list[Collective]:
    """The recorded collectives, counted: one entry per (kind, phase, size, group)."""
    return [
        Collective(kind, phase, size, calls, group)
        for (kind, phase, size, group), calls in sorted(Counter(raw).items())
    ]


def ddp_buckets(config, method: str, precision: str, bucket_cap_mb: int, lora_r=LITGPT_LORA_R, targets=LORA_TARGETS):
    """Bytes of each DDP gradient bucket after DDP's rebuild: the trainable parameters in gradient-ready order
    (the reverse of their order in the model), assigned by DDP's own function with a first bucket of 1 MiB and then
    ``bucket_cap_mb``."""
    import torch
    import torch.distributed as dist

    with torch.device("meta"):
        model = build_model(config, method, precision, lora_r, targets)
    grads = [p for p in model.parameters() if p.requires_grad][::-1]
    limits = [DDP_FIRST_BUCKET_BYTES, bucket_cap_mb * 1024 * 1024]
    buckets, _ = dist._compute_bucket_assignment_by_size(grads, limits, [False] * len(grads))
    return [sum(grads[i].numel() * grads[i].element_size() for i in b) for b in buckets]


def _ddp(case, strategy):
    """(phases, collectives, notes) of DDP: the one-device simulated step (tunelab's loop) plus the buckets."""
    one_device = case.changed(activation_checkpointing=strategy.activation_checkpointing, fabric=False)
    one = simulate(one_device.changed(fused_loss=False), layers=2)
    lora = (case.lora_r, case.lora_targets)
    buckets = ddp_buckets(case.config, case.method, str(case.precision), strategy.bucket_cap_mb, *lora)
    copy = 0 if strategy.gradient_as_bucket_view else sum(buckets)
    phases = {p: {**kinds, "Buckets": copy, "Total": kinds["Total"] + copy} for p, kinds in one.phases.items()}
    collectives = [Collective("all-reduce", "backward", size, 1) for size in buckets]
    notes = [
        "DDP's reducer does not run on fake tensors: its buckets are DDP's own assignment of the trainable gradients "
        f"({len(buckets)} bucket(s), {'views of the gradients' if copy == 0 else 'a flat copy of the gradients'})",
        *one.notes,
    ]
    return phases, collectives, notes, one.layers_built


def _fsdp_notes(name: str, method: str) -> list[str]:
    """What an FSDP1 or FSDP2 rank simulation ran, and what it leaves out."""
    how = {
        "fsdp": "FSDP1 as tunelab.parallel.wrap wraps litgpt's model (each block a unit, the file's sharding, "
        "limit_all_gathers, use_orig_params), under torch's MemTracker, no_sync() before the last micro batch",
        "fsdp2": "FSDP2 as tunelab.parallel.wrap shards litgpt's model (each block, then the root), under torch's "
        "FSDPMemTracker; DTensor's shape inference left out",
    }
    if name == LITGPT and method == "full":
        how[name] = (
            "litgpt's own choice: FSDP1 as Lightning's FSDPStrategy.setup_module wraps litgpt's model with "
            "litgpt's keywords (each Block a unit and checkpointed, limit_all_gathers, FSDPPrecision's "
            "MixedPrecision), under torch's MemTracker, no_sync() before the last micro batch, Fabric's forward"
        )
    elif name == LITGPT:
        how[name] = (
            "litgpt's own choice: FSDP2 as litgpt's LoRA parallelize_fn shards its model (checkpoint_wrapper per "
            "block, fully_shard on each block, wrapper and trainable Linear, then the root), under torch's "
            "FSDPMemTracker; Fabric's forward; DTensor's shape inference left out"
        )
    return [
        how[name],
        "attention: torch's CPU flash kernel (keeps what CUDA's flash kernel keeps, not its workspace)",
        "no caching-allocator rounding; NCCL's own buffers not counted",
    ]


def _check_simulated(strategy, world: int, method: str) -> None:
    """InputError for what the per-rank simulation does not run: another strategy, a world outside 2-1024, QLoRA."""
    if strategy is not None and strategy.name not in SIMULATED:
        raise InputError(
            f"--simulate: strategy {strategy.name} is not simulated per rank (simulated: {', '.join(SIMULATED)}); "
            "fix: plan it without --simulate"
        )
    if not 2 <= world <= 1024:
        raise InputError(f"--simulate: {world} devices is out of its range; fix: 2 to 1024 devices (--devices)")
    if method == "qlora":
        raise InputError("--simulate: QLoRA on several devices is not simulated; fix: plan it without --simulate")


def simulate_ranks(case, strategy) -> RankSimulation:
    """Rank 0's step of ``case`` (a :class:`~tunelab.plan.model.case.PlanInput`: its litgpt Config, method,
    precision, micro batch, sequence, accumulation, LoRA and optimizer, on its devices) under ``strategy`` (a
    :class:`tunelab.strategies.StrategyConfig` named in :data:`SIMULATED`, or None: litgpt's own choice,
    :data:`LITGPT`): see the module docstring."""
    world, config = case.world, case.config
    _check_simulated(strategy, world, case.method)
    t0 = time.perf_counter()
    case = replace(case, accumulation=max(case.accumulation, 1))
    name = LITGPT if strategy is None else strategy.name
    host = 0.0
    if strategy is not None and not strategy.kind.sharded:  # DDP, the one simulated strategy that shards nothing
        phases, collectives, notes, built = _ddp(case, strategy)
    else:
        # litgpt's own choice: FSDP1 (Lightning's FSDPStrategy) for full fine-tuning, FSDP2 for LoRA
        full = case.method == "full"
        step = (_fsdp1_step if full else _fsdp2_step) if strategy is None else FSDP_STEPS[strategy.name]
        with fake_world(world):
            phases, raw, host = step(case, strategy, optimizer_of(case))
        collectives = _per_step(raw)
        built = (config.n_layer, config.n_layer)
        notes = _fsdp_notes(name, case.method)
        if host:
            notes.insert(
                1,
                "cpu_offload on a stand-in accelerator (tunelab.plan.trace.fake_device: fake tensors on the meta "
                "device); the peaks are the device's, the host's counted apart",
            )
    return RankSimulation(
        model=config.name,
        method=case.method,
        precision=str(case.precision),
        micro_batch_size=case.micro_batch_size,
        seq_len=case.seq_len,
        strategy=name,
        world=world,
        accumulation=case.accumulation,
        activation_checkpointing=strategy is None or strategy.activation_checkpointing,
        n_layer=config.n_layer,
        layers_built=built,
        phases=phases,
        collectives=collectives,
        seconds=time.perf_counter() - t0,
        notes=notes,
        host_peak_bytes=host,
    )


def for_plan(case, strategy) -> RankSimulation:
    """Rank 0's simulated step of a planned configuration (:class:`tunelab.plan.model.memory.PlanInput`) under a loaded
    strategy file; InputError for what is not simulated per rank."""
    if strategy is not None and strategy.name not in SIMULATED:
        raise InputError(
            f"--simulate on {case.world} devices: {strategy.name} is not simulated per rank (simulated: "
            f"{', '.join(SIMULATED)}, litgpt's own choice; DeepSpeed ZeRO-2/3 by its sizes); fix: --strategy "
            "litgpt, fsdp, fsdp2, ddp or deepspeed-zero2/3, or plan without --simulate"
        )
    if case.num_nodes > 1:
        raise InputError("--simulate: one node only (the per-rank simulation has no node boundary); fix: --num_nodes 1")
    print(
        f"simulating rank 0 of {case.world} under {LITGPT if strategy is None else strategy.name} "
        f"({case.config.name}, {case.method}, {case.precision}, micro {case.micro_batch_size} x {case.seq_len} "
        "tokens) on fake tensors ...",
        file=sys.stderr,
        flush=True,
    )
    return simulate_ranks(case, strategy)


def render(sim: RankSimulation, plan) -> str:
    """``plan --devices N --strategy S --simulate``: rank 0's peak per phase by kind and its collectives, beside
    the plan."""
    kinds = sorted({k for snap in sim.phases.values() for k, v in snap.items() if v and k != "Total"})
    lines = [
        f"\nsimulated rank 0 of {sim.world} under {sim.strategy} (litgpt's model on fake tensors, a fake process "
        f"group; {sim.seconds:.1f} s): peak allocated per phase, GB = 1e9 bytes",
        f"  {'phase':<15}{'total':>8}" + "".join(f"{k[:13]:>14}" for k in kinds),
    ]
    for phase, snap in sim.phases.items():
        lines.append(f"  {phase:<15}{snap['Total'] / GB:8.2f}" + "".join(f"{snap.get(k, 0) / GB:14.3f}" for k in kinds))
    planned = plan.peak_allocated_bytes
    lines.append(
        f"  peak: {sim.peak_phase}, {sim.peak_bytes / GB:.2f} GB simulated; planned {planned / GB:.2f} GB "
        f"({(planned - sim.peak_bytes) / sim.peak_bytes:+.1%})"
    )
    if sim.host_peak_bytes:
        lines.append(
            f"  host RAM (offloaded parameters, gradients, optimizer states): {sim.host_peak_bytes / GB:.2f} GB "
            f"simulated; planned {plan.host_ram_bytes / GB:.2f} GB"
        )
    lines.append("  collectives per optimizer step (rank 0; bytes of the whole tensor, GB = 1e9 bytes):")
    for c in sim.collectives:
        group = f" over a group of {c.group}" if c.group and c.group != sim.world else ""
        lines.append(f"    {c.kind:<15}{c.phase:<16}{c.calls:>5} x {c.bytes / GB:8.4f} GB{group}")
    lines.append(f"  sent per device per step (ring): {sim.bytes_moved() / GB:.2f} GB")
    lines += [f"  ({note})" for note in sim.notes]
    return "\n".join(lines)


def simulation(case, strategy_name: str):
    """``plan --simulate``: the one-device simulated step (:func:`tunelab.plan.trace.simulate.for_plan`) on one device,
    rank 0's under the named strategy file on several (``litgpt``: litgpt's own choice, as its scripts wrap),
    DeepSpeed's buffers by their sizes under a ZeRO-2/3 file (:func:`tunelab.plan.model.strategies.zero.zero_sizes`)."""
    if case.world == 1:
        return simulate_for_plan(case)
    strategy = load_strategy(strategy_name) if strategy_name != "litgpt" else None
    if strategy is not None and case.activation_checkpointing and not strategy.activation_checkpointing:
        strategy = replace(strategy, activation_checkpointing=True)  # the plan's --activation-checkpointing
    if strategy is not None and strategy.kind.engine and strategy.zero_stage >= 2:
        return zero_sizes(case, memory.model_states(case, []))
    return for_plan(case, strategy)


FSDP_STEPS = {"fsdp": _fsdp1_step, "fsdp2": _fsdp2_step}
"""The per-rank step each FSDP strategy file runs under (by its ``name``): FSDP1's or FSDP2's wrapping and tracker."""
