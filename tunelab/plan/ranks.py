"""Several devices, simulated per rank in one CPU process: the memory of rank 0 and the collectives it issues.

No GPU we can borrow has more than one device, so the multi-device step runs here, on fake tensors, as rank 0 of a
world of N joined by torch's fake process group (``backend="fake"``: every collective returns at once and moves
nothing, but is dispatched with its real shapes):

* **FSDP2** (``fully_shard``): litgpt's model at full width is built under ``FakeTensorMode`` and sharded by
  :func:`tunelab.parallel.wrap`, the function the run itself uses (each block, then the root). torch's
  ``FSDPMemTracker`` counts every storage by kind (sharded and unsharded parameters and gradients, all-gather and
  reduce-scatter buffers, activations, temporaries, optimizer states) and keeps the peak per phase. One correction
  to the tracker: under an outer fake mode DTensor's sharding propagation runs its shape inference in that same
  mode, so the tracker counted those global-shape temporaries as memory (1.4 GB for TinyLlama's optimizer step on 4
  ranks); they are skipped (:func:`_propagation_skipped`).
* **DDP**: the one-device simulated step (:mod:`tunelab.plan.simulate`) plus DDP's gradient buckets, assigned by
  DDP's own function (``torch.distributed._compute_bucket_assignment_by_size``, gradient-ready order, the first
  bucket 1 MiB, then ``bucket_cap_mb``): a flat copy of the trainable gradients unless ``gradient_as_bucket_view``.
  DDP's reducer does not run on fake tensors (its C++ checks read tensor data), so its buckets are computed, not
  traced, and said so.

Collectives are recorded as dispatched (``c10d`` ops: kind, the whole tensor's bytes, the phase) for one optimizer
step at the model's depth; the time model turns them into seconds (:func:`collective_seconds`).

Depth: FSDP2 runs every block of the model (fake tensors make that seconds: TinyLlama's 22 blocks in about 6 s).
Extrapolating from two small depths, as the one-device simulation does, is wrong here: where the backward peak
falls (before or after a block's reduce-scatter buffer is alive) moves between 2 and 3 blocks, so a per-kind
difference is not one block's bytes. DDP's one-device step is extrapolated as :mod:`tunelab.plan.simulate` does.
"""

from __future__ import annotations

import contextlib
import time
import warnings
from collections import Counter
from dataclasses import dataclass, field

from tunelab.errors import InputError
from tunelab.plan.simulate import PhasePeaks, keep_phase_peak, tracker_phase
from tunelab.settings import LITGPT_LORA_R, LORA_TARGETS

SIMULATED = ("fsdp2", "ddp")
"""Strategies simulated per rank (FSDP1 and DeepSpeed are planned by arithmetic; see docs/planner.md)."""
COLLECTIVES = {
    "_allgather_base_": "all-gather",
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

    def bytes_moved(self, world: int) -> float:
        """Bytes each device sends (and receives) in a ring: all-reduce 2(n-1)/n x B, the others (n-1)/n x B."""
        ring = (world - 1) / world
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

    def bytes_moved(self, kind: str | None = None) -> float:
        """Bytes rank 0 sends per optimizer step (ring collectives), of one kind or all."""
        return sum(c.bytes_moved(self.world) for c in self.collectives if kind in (None, c.kind))

    def to_json(self) -> dict:
        return {**self.peak_json(), "bytes_moved_per_step": self.bytes_moved()}


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


def _fsdp_tracker(model, opt):
    """FSDPMemTracker keeping each phase's peak (by kind) and every collective dispatched (kind, phase, bytes)."""
    import torch
    from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker

    class Tracker(FSDPMemTracker):
        def __init__(self):
            super().__init__(model, opt)
            self.propagating = 0
            self.phase_peaks: dict[str, dict] = {}
            self.collectives: list[tuple[str, str, int]] = []
            self.in_backward = False

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if self.propagating:
                return func(*args, **(kwargs or {}))
            kind = COLLECTIVES.get(func._opname) if func.namespace == "c10d" else None
            if kind is not None:
                tensors = [t for t in torch.utils._pytree.tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
                size = max(t.numel() * t.element_size() for t in tensors)
                self.collectives.append((kind, tracker_phase(self), size))
            return super().__torch_dispatch__(func, types, args, kwargs)

        def _update_peak_stats(self, peak_state) -> None:
            super()._update_peak_stats(peak_state)
            keep_phase_peak(self, tracker_phase(self))

    return Tracker()


def _fsdp2_step(config, method, precision, micro, seq_len, world, strategy, accumulation, lora_r, targets, optimizer):
    """({phase: {kind: bytes}}, [(kind, phase, bytes)] of the second optimizer step) of ``config``, rank 0
    of ``world`` under FSDP2 (:func:`tunelab.parallel.wrap`), tunelab's loop (the logits freed after backward;
    gradient sync only on the last micro batch). Two micro batches run (more add no memory); the collectives of
    the one without sync count ``accumulation - 1`` times."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed.device_mesh import init_device_mesh

    from tunelab.parallel import wrap
    from tunelab.plan.measure import build_model, cuda_dropout, model_logits, training_loss
    from tunelab.plan.simulate import make_optimizer

    mesh = init_device_mesh("cpu", (world,))  # outside fake mode: a mesh reads its ranks
    with FakeTensorMode():
        model = build_model(config, method, precision, lora_r, targets)
        model.max_seq_length = seq_len
        model.train()
        model = wrap(model, strategy, torch.device("cpu"), world, mesh=mesh)
        opt = make_optimizer(optimizer, [p for p in model.parameters() if p.requires_grad])
        x = torch.zeros(micro, seq_len, dtype=torch.long)
        tracker = _fsdp_tracker(model, opt)
        tracker.track_inputs((x,))
        with tracker, _propagation_skipped(tracker), cuda_dropout(), warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="Module is None")
            runs = min(accumulation, 2)  # a later micro batch runs beside the gradients; more add no memory
            marks: list[int] = []
            for step in range(2):  # the second step runs beside the optimizer states the first one made
                if step == 1:
                    tracker.collectives.clear()  # one step's collectives: the second's
                for i in range(runs):
                    marks.append(len(tracker.collectives))
                    tracker.reset_mod_stats()
                    model.set_requires_gradient_sync(i == runs - 1)
                    loss = training_loss(model_logits(model, x, method, precision, fabric=False), x, method)
                    tracker.in_backward = True
                    (loss / accumulation).backward()
                    tracker.in_backward = False
                    del loss
                opt.step()
                opt.zero_grad()
        raw = list(tracker.collectives)
        if runs == 2:  # the micro batch without gradient sync, once for each of the accumulation's first a - 1
            first, last = marks[-2], marks[-1]
            raw = raw[first:last] * (accumulation - 1) + raw[last:]
        return tracker.phase_peaks, raw


def _per_step(raw: list) -> list[Collective]:
    """The recorded collectives, counted: one entry per (kind, phase, size)."""
    return [Collective(kind, phase, size, calls) for (kind, phase, size), calls in sorted(Counter(raw).items())]


def ddp_buckets(config, method: str, precision: str, bucket_cap_mb: int, lora_r=LITGPT_LORA_R, targets=LORA_TARGETS):
    """Bytes of each DDP gradient bucket after DDP's rebuild: the trainable parameters in gradient-ready order
    (the reverse of their order in the model), assigned by DDP's own function with a first bucket of 1 MiB and then
    ``bucket_cap_mb``."""
    import torch
    import torch.distributed as dist

    from tunelab.plan.measure import build_model

    with torch.device("meta"):
        model = build_model(config, method, precision, lora_r, targets)
    grads = [p for p in model.parameters() if p.requires_grad][::-1]
    limits = [DDP_FIRST_BUCKET_BYTES, bucket_cap_mb * 1024 * 1024]
    buckets, _ = dist._compute_bucket_assignment_by_size(grads, limits, [False] * len(grads))
    return [sum(grads[i].numel() * grads[i].element_size() for i in b) for b in buckets]


def _ddp(config, method, precision, micro, seq_len, strategy, accumulation, lora_r, targets, optimizer):
    """(phases, collectives, notes) of DDP: the one-device simulated step (tunelab's loop) plus the buckets."""
    from tunelab.plan.simulate import simulate

    one = simulate(
        config, method, precision, micro, seq_len, strategy.activation_checkpointing, accumulation, optimizer,
        layers=2, lora_r=lora_r, lora_targets=targets, fabric=False,
    )  # fmt: skip
    buckets = ddp_buckets(config, method, precision, strategy.bucket_cap_mb, lora_r, targets)
    copy = 0 if strategy.gradient_as_bucket_view else sum(buckets)
    phases = {p: {**kinds, "Buckets": copy, "Total": kinds["Total"] + copy} for p, kinds in one.phases.items()}
    collectives = [Collective("all-reduce", "backward", size, 1) for size in buckets]
    notes = [
        "DDP's reducer does not run on fake tensors: its buckets are DDP's own assignment of the trainable gradients "
        f"({len(buckets)} bucket(s), {'views of the gradients' if copy == 0 else 'a flat copy of the gradients'})",
        *one.notes,
    ]
    return phases, collectives, notes, one.layers_built


def simulate_ranks(
    config,
    strategy,
    world: int,
    method: str = "full",
    precision: str = "bf16-true",
    micro_batch_size: int = 1,
    seq_len: int = 512,
    accumulation: int = 1,
    optimizer: str = "AdamW",
    lora_r: int = LITGPT_LORA_R,
    lora_targets=LORA_TARGETS,
) -> RankSimulation:
    """Rank 0's step of ``config`` (a litgpt Config) under ``strategy`` (a :class:`tunelab.strategies.
    StrategyConfig` named in :data:`SIMULATED`) on ``world`` devices: see the module docstring."""
    if strategy.name not in SIMULATED:
        raise InputError(
            f"--simulate: strategy {strategy.name} is not simulated per rank (simulated: {', '.join(SIMULATED)}); "
            "fix: plan it without --simulate"
        )
    if not 2 <= world <= 1024:
        raise InputError(f"--simulate: {world} devices; the per-rank simulation takes 2 to 1024")
    if method == "qlora":
        raise InputError("--simulate: QLoRA on several devices is not simulated; fix: plan it without --simulate")
    t0 = time.perf_counter()
    accumulation = max(accumulation, 1)
    if strategy.name == "ddp":
        phases, collectives, notes, built = _ddp(
            config, method, precision, micro_batch_size, seq_len, strategy, accumulation, lora_r,
            lora_targets, optimizer,
        )  # fmt: skip
    else:
        with fake_world(world):
            phases, raw = _fsdp2_step(
                config, method, precision, micro_batch_size, seq_len, world, strategy, accumulation, lora_r,
                lora_targets, optimizer,
            )  # fmt: skip
        collectives = _per_step(raw)
        built = (config.n_layer, config.n_layer)
        notes = [
            "FSDP2 as tunelab.parallel.wrap shards litgpt's model (each block, then the root), under torch's "
            "FSDPMemTracker; DTensor's shape inference left out",
            "attention: torch's CPU flash kernel (keeps what CUDA's flash kernel keeps, not its workspace)",
            "no caching-allocator rounding; NCCL's own buffers not counted",
        ]
    return RankSimulation(
        model=config.name,
        method=method,
        precision=precision,
        micro_batch_size=micro_batch_size,
        seq_len=seq_len,
        strategy=strategy.name,
        world=world,
        accumulation=accumulation,
        activation_checkpointing=strategy.activation_checkpointing,
        n_layer=config.n_layer,
        layers_built=built,
        phases=phases,
        collectives=collectives,
        seconds=time.perf_counter() - t0,
        notes=notes,
    )


def for_plan(x, strategy) -> RankSimulation:
    """Rank 0's simulated step of a planned configuration (:class:`tunelab.plan.memory.PlanInput`) under a loaded
    strategy file; InputError for what is not simulated per rank."""
    import sys

    from tunelab.plan.simulate import optimizer_of

    if strategy is None or strategy.name not in SIMULATED:
        name = "litgpt's own choice" if strategy is None else strategy.name
        raise InputError(
            f"--simulate on {x.world} devices: {name} is not simulated per rank (simulated: "
            f"{', '.join(SIMULATED)}); fix: --strategy fsdp2 or ddp, or plan without --simulate"
        )
    if x.method == "qlora":
        raise InputError("--simulate: QLoRA on several devices is not simulated; fix: plan it without --simulate")
    if x.num_nodes > 1:
        raise InputError("--simulate: one node only (the per-rank simulation has no node boundary); fix: --num_nodes 1")
    print(
        f"simulating rank 0 of {x.world} under {strategy.name} ({x.config.name}, {x.method}, {x.precision}, micro "
        f"{x.micro_batch_size} x {x.seq_len} tokens) on fake tensors ...",
        file=sys.stderr,
        flush=True,
    )
    return simulate_ranks(
        x.config, strategy, x.world, x.method, str(x.precision), x.micro_batch_size, x.seq_len, x.accumulation,
        optimizer_of(x), x.lora_r, x.lora_targets,
    )  # fmt: skip


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
        lines.append(
            f"  {phase:<15}{snap['Total'] / 1e9:8.2f}" + "".join(f"{snap.get(k, 0) / 1e9:14.3f}" for k in kinds)
        )
    planned = plan.peak_allocated_bytes
    lines.append(
        f"  peak: {sim.peak_phase}, {sim.peak_bytes / 1e9:.2f} GB simulated; planned {planned / 1e9:.2f} GB "
        f"({(planned - sim.peak_bytes) / sim.peak_bytes:+.1%})"
    )
    lines.append("  collectives per optimizer step (rank 0; bytes of the whole tensor, GB = 1e9 bytes):")
    for c in sim.collectives:
        lines.append(f"    {c.kind:<15}{c.phase:<16}{c.calls:>5} x {c.bytes / 1e9:8.4f} GB")
    lines.append(f"  sent per device per step (ring): {sim.bytes_moved() / 1e9:.2f} GB")
    lines += [f"  ({note})" for note in sim.notes]
    return "\n".join(lines)


def simulation(x, strategy_name: str):
    """``plan --simulate``: the one-device simulated step (:func:`tunelab.plan.simulate.for_plan`) on one device,
    rank 0's under the named strategy file on several (``litgpt``: litgpt's own choice, not simulated per rank)."""
    from tunelab.plan import simulate
    from tunelab.strategies import load_strategy

    if x.world == 1:
        return simulate.for_plan(x)
    return for_plan(x, load_strategy(strategy_name) if strategy_name != "litgpt" else None)


def render_simulation(sim, plan) -> str:
    """Either simulation beside the plan: rank 0's (:func:`render`) or the one-device step's."""
    from tunelab.plan.render import render_simulated

    return render(sim, plan) if isinstance(sim, RankSimulation) else render_simulated(sim, plan)
