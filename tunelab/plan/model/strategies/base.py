"""The one interface every strategy of the planner implements (:class:`Strategy`), with one device's answers as its
defaults, and the symbols the communication model hands it (:class:`Sizes`). See docs/contributing.md."""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from tunelab.plan.model.case import (
    Division,
    ModelStates,
    PerDevice,
    PlanInput,
    block_params,
    logits_held_at_step,
    parameter_bytes,
)


class BackwardMoment(NamedTuple):
    """A strategy's peak inside its backward (FSDP1's: :meth:`Strategy.backward_moment`), bytes per device."""

    gradients: float
    """The backward's own bytes (the ``fsdp1_backward_gradients`` term)."""
    peak: float
    """Everything on the device then."""
    activations: float
    """The activations still alive."""
    moment: bool | str
    """True: the backward's end; "first block": the first block's backward, the last to run; "frozen block": a
    block's under LoRA, only the blocks' frozen weights taking gradients; False: a block's."""
    gathered: float
    """The sharding buffers then."""


class ForwardMoment(NamedTuple):
    """The peak outside the optimizer step and the backward (:meth:`Strategy.forward_moment`), bytes per device."""

    activations: float
    logits: float
    gathered: float
    """Gathered parameters and their buffers, with the unsharded gradients of micro batches without sync."""
    autocast_cache: float
    note: str | None

    @property
    def total(self) -> float:
        return self.activations + self.logits + self.gathered + self.autocast_cache


@dataclass
class Sizes:
    """The symbols of the communication formulas (``tunelab.plan.model.comm.per_step``) for one case."""

    n: int
    """Devices in all."""
    g: int
    """Devices per node."""
    m: int
    """Nodes."""
    a: int
    """Micro batches per optimizer step."""
    s_p: float
    """Bytes per gathered parameter and gradient."""
    P: float  # noqa: N815 - the formulas' symbols
    """Parameter bytes."""
    G: float  # noqa: N815
    """Gradient bytes reduced (FSDP1 under LoRA: its flat parameters' whole gradients, frozen weights too)."""
    R: float  # noqa: N815
    """Bytes of FSDP1's root unit, gathered once per micro batch (the whole model without auto-wrap; 0 for FSDP2)."""
    trainable: int
    """Trainable parameters."""
    units: int
    """FSDP units (each block and the root; 1 without auto-wrap or for a model given by its size)."""

    @property
    def ring(self) -> float:
        """A ring's share of the volume each device sends, (n-1)/n."""
        return (self.n - 1) / self.n

    def call(self, kind: str, calls: float) -> tuple:
        """One row of ``Comm.calls``: (kind, calls, ring steps per call, of them across nodes)."""
        if kind == "all-reduce":
            return kind, calls, 2 * (self.n - 1), 2 * self.m if self.m > 1 else 0
        return kind, calls, self.n - 1, self.m - 1


class Strategy:
    """How one strategy divides a case's model states among devices, the moments its peak can fall on, and what it
    communicates per optimizer step. These defaults are one device's: nothing divided, nothing sent. A strategy
    module subclasses it and overrides what its strategy changes; ``strategies.REGISTRY`` names it."""

    name = "single"
    """Its name in :attr:`PlanInput.strategy` (FSDP1 and FSDP2 share ``fsdp``; the registry tells them apart)."""
    files: tuple[str, ...] = ()
    """The strategy files' ``name`` values it plans (``configs/strategies/*.yaml``)."""
    label = "one device"
    """Its name for a reader (a plan's first line names litgpt's own choice by it)."""
    divides = False
    """Whether the model states are divided among devices (the one-device simulation refuses it)."""
    sharded = False
    """Whether each rank holds only its shard of the states (tunelab's loop then saves the model alone)."""
    advised_with_checkpointing = False
    """Whether ``tunelab advise`` tries its files with activation checkpointing on as well as off (where the
    memory it frees buys a larger micro batch: the sharded strategies)."""

    def fields(self, config, world: int) -> dict:
        """:class:`PlanInput` fields for a strategy file of this strategy (``config``: its ``StrategyConfig``)."""
        return {"strategy": self.name}

    # the model states before division
    def param_bytes(self, case: PlanInput) -> int:
        """Bytes per parameter element held on the device."""
        return parameter_bytes(case.precision)

    def gathered_scale(self, case: PlanInput) -> float:
        """A gathered parameter's or an unsharded gradient's bytes over a sharded one's."""
        return 1.0

    def autocast_over_fp32(self, case: PlanInput) -> bool:
        """Mixed precision as autocast over fp32 weights (activations per tensor dtype, autocast's weight copies)."""
        return "mixed" in str(case.precision)

    def optimizer_states(self, case: PlanInput, trainable: int, s_param: int, notes: list) -> tuple | None:
        """(optimizer states, master weights) when the strategy keeps its own (DeepSpeed's fp32); None: the
        optimizer's."""
        return None

    def flat_shards(self, case: PlanInput) -> bool:
        """Whether the optimizer steps flattened 1-D shards (FSDP1's flat parameters, ZeRO's fp32 partitions), not
        the parameters' shapes: a factored optimizer (Adafactor) then keeps a full state."""
        return False

    def foreach_temporary(self, case: PlanInput) -> bool:
        """Whether the optimizer's step is torch's own (foreach AdamW: one parameter-sized temporary)."""
        return True

    def frozen_weights_grad(self, case: PlanInput) -> str:
        """Which frozen weights get gradients and stay differentiable in the forward (FSDP1's LoRA): "blocks" (every
        block's), "all" (the root unit's too: embedding, final norm, head), or "" (none)."""
        return ""

    # the division
    def gradients(self, case: PlanInput, st: ModelStates, notes: list) -> float:
        """Gradient bytes before division."""
        return st.grads

    def division(self, case: PlanInput, st: ModelStates, grads: float, notes: list) -> Division:
        """The devices each state is sharded over, and the strategy's buffers."""
        return Division()

    def step_bytes(self, case: PlanInput, st: ModelStates, grads: float, step_temp: float) -> tuple[float, float]:
        """(gradients, temporary) the optimizer step sees on the device, before division."""
        return grads, step_temp

    def offloaded(self, case: PlanInput, st: ModelStates, dev: PerDevice, notes: list) -> PerDevice:
        """``dev`` with what offload moves to host RAM: the optimizer's states, master weights and float32 gradients
        (``offload_optimizer``: the gradients stream out per bucket, no step on the device), the weights
        (``offload_params``: ZeRO-3 gathers them to the device)."""
        two_blocks = block_params(case.config) * st.s_param * 2
        if case.options.offload_optimizer:
            dev.host += st.optimizer + st.master + st.trainable * 4
            dev.optimizer = dev.step_temp = 0
            dev.grads = min(dev.grads, two_blocks)
            notes.append("optimizer offload: states, master weights and their gradients in host RAM")
        if case.options.offload_params:
            dev.host += st.weights
            dev.weights = 0  # ZeRO-3's gathered parameters are in_flight
            notes.append("parameter offload: weights in host RAM, gathered to the device as ZeRO-3 gathers them")
        return dev

    def optimizer_shards(self, case: PlanInput, st: ModelStates) -> int:
        """Devices the optimizer's states are sharded over: each rank's step updates 1/this of them."""
        return self.division(case, st, st.grads, []).shard_o

    # the moments of the peak
    def accumulated_gradients(self, case: PlanInput, st: ModelStates, dev: PerDevice) -> float:
        """Gradients alive beside the activations: with accumulation they persist from the first micro batch."""
        return dev.grads if case.accumulation > 1 else 0

    def at_the_loss(self, case: PlanInput, st: ModelStates, dev: PerDevice, logits: float) -> tuple[float, float]:
        """(logits, gathered buffers) at the forward's end."""
        return logits, dev.in_flight

    def forward_moment(
        self, case: PlanInput, st: ModelStates, dev: PerDevice, acts: float, logits: float, inputs: float
    ) -> ForwardMoment:
        """The activations, logits, buffers, autocast's copies and note at the peak outside the step and the
        backward: the loss, beside every activation (under checkpointing the blocks' ``inputs`` alone: a block is
        recomputed only in backward), or, under checkpointing, a block recomputed in backward (``acts``: the inputs
        and one block's own) beside the logits the loop holds (:func:`logits_held_at_step`)."""
        logits, in_flight = self.at_the_loss(case, st, dev, logits)
        checkpointed = case.activation_checkpointing
        loss = ForwardMoment(inputs if checkpointed else acts, logits, in_flight, st.autocast_cache, None)
        # beside the gradients backward has made so far, unless sharded (FSDP's backward moments hold its own)
        made = 0.0 if self.sharded else dev.grads - self.accumulated_gradients(case, st, dev)
        recompute = ForwardMoment(acts, logits_held_at_step(case), in_flight + made, st.autocast_cache, None)
        return max((loss, recompute), key=lambda m: m.total) if checkpointed else loss

    def backward_moment(
        self, case: PlanInput, st: ModelStates, dev: PerDevice, base: float, acts: float, inputs: float
    ) -> BackwardMoment:
        """A peak inside the backward that the forward's end does not hold (none by default)."""
        return BackwardMoment(0.0, 0.0, acts, False, 0.0)

    def backward_note(self, case: PlanInput, at_end) -> str:
        """The plan's note when :meth:`backward_moment` holds the peak."""
        return ""

    def checkpoint_bytes(self, case: PlanInput, st: ModelStates) -> float | None:
        """Bytes each rank writes per checkpoint when the strategy writes its own (DeepSpeed's); None: litgpt's."""
        return None

    def holds_shard(self, case: PlanInput) -> bool:
        """Whether each rank holds only its shard of the weights, so that a forward is a collective (tunelab's loop
        then takes no sample on rank 0 alone: ``tunelab.strategies.Kind.holds_shard``)."""
        return self.sharded

    # communication per optimizer step
    def root_kept(self, case: PlanInput) -> bool:
        """Whether the root unit stays gathered from the forward into the backward (gathered once per micro batch)."""
        return False

    def volumes(self, c, case: PlanInput, z: Sizes, params) -> None:
        """Fill ``c`` (a ``comm.Comm``) with the bytes per device per step over the GPU links, its formula and its
        calls, on ``z.n`` > 1 devices (``params``: a model given by its size only); one device's: none."""

    def forward_gathers(self, case: PlanInput, z: Sizes, params) -> tuple[float, list]:
        """(bytes per device, calls) that one forward without gradients gathers on ``z.n`` > 1 devices (a
        validation batch, a generated token; ``params`` as in :meth:`volumes`). What stays gathered between two
        such forwards (a root unit kept, everything under SHARD_GRAD_OP) is not gathered again; one device's:
        none."""
        return 0.0, []

    def host_bytes(self, case: PlanInput, z: Sizes) -> float:
        """Bytes per device per step between the GPU and host RAM (offload)."""
        return 0.0

    # the host's work
    def wrapper_host_ops(self, case: PlanInput) -> tuple[float, float]:
        """(forward, backward) host work the strategy's wrapper adds to each micro batch (its hooks, views,
        unshards, collective launches), in ops of the model's own loop: charged at that loop's time per op. One
        device's: none."""
        return 0.0, 0.0

    def node_rings(self, case: PlanInput, z: Sizes) -> int:
        """Rings sharing each node's network (HYBRID_SHARD: one per local rank)."""
        return 1

    def hierarchical(self, case: PlanInput) -> bool:
        """Whether its rings stay inside each node and only a reduction crosses the network (HYBRID_SHARD); else
        on several nodes one flat ring runs at the network's speed."""
        return False

    def one_unit(self, case: PlanInput) -> bool:
        """Whether the whole model is one unit, gathered whole (FSDP without auto-wrap)."""
        return False

    def off_device(self, case: PlanInput) -> bool:
        """Whether offload puts the optimizer's step or the weights in host RAM (the step then runs on the CPU)."""
        return case.options.offload_optimizer or case.options.offload_params

    def unhideable(self, case: PlanInput) -> bool:
        """Whether no compute hides the traffic (one unit; ZeRO-1/2's reductions on the compute stream)."""
        return False
