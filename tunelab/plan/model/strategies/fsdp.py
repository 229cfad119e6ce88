"""FSDP's sharding variants, shared by FSDP1 and FSDP2: what FULL_SHARD, SHARD_GRAD_OP, HYBRID_SHARD and NO_SHARD
shard and hold gathered. See docs/planner.md."""

from __future__ import annotations

from tunelab.plan.model.case import Division, ModelStates, PerDevice, PlanInput, block_params, root_unit_params
from tunelab.plan.model.strategies.base import Sizes, Strategy
from tunelab.plan.model.strategies.ddp import all_reduce


def fsdp_shard_group(case: PlanInput) -> int:
    """Devices FSDP shards over: the world, or under HYBRID_SHARD one node's devices."""
    return case.world if case.options.sharding != "HYBRID_SHARD" else max(1, case.devices)


def unsharded_while_accumulating(case: PlanInput) -> bool:
    """Sharded FSDP accumulating: the micro batches without gradient sync keep whole, unsharded gradients (counted
    in the sharding buffers); the sharded ones do not exist then (``zero_grad`` freed them)."""
    return case.options.sharding != "NO_SHARD" and case.accumulation > 1


def sgo_gathered(case: PlanInput, st: ModelStates) -> float:
    """Bytes SHARD_GRAD_OP (FSDP1's, or FSDP2's ``reshard_after_forward: false``) holds gathered beside the
    activations: it does not reshard a unit after its forward, so at the forward's end every parameter is unsharded
    (beside its shard), and the backward frees a unit only after its own backward. Seen in the per-rank simulation
    (TinyLlama full, 32-true, 4 devices: 4.4 GB gathered beside the 1.1 GB shard)."""
    return st.weights + st.lora_weights


class FSDP(Strategy):
    """What FSDP1 and FSDP2 share: the sharding variants, the group sharded over, the unsharded gradients of micro
    batches under ``no_sync()``, ``cpu_offload`` and the collectives per unit."""

    name = "fsdp"
    divides = sharded = advised_with_checkpointing = True
    host_ops_per_unit: tuple[float, float] = (0.0, 0.0)
    """(forward, backward) host work per block unit and micro batch, in ops of the plain loop (measured: the
    subclass names where)."""
    host_ops_fixed: tuple[float, float] = (0.0, 0.0)
    """(forward, backward) host work per micro batch beside the blocks' (the root unit, the wrapper's own)."""

    def wrapper_host_ops(self, case: PlanInput) -> tuple[float, float]:
        """:attr:`host_ops_per_unit` for each block unit (one unit without auto-wrap) plus :attr:`host_ops_fixed`."""
        units = 1 if self.one_unit(case) else case.config.n_layer
        return tuple(units * unit + fixed for unit, fixed in zip(self.host_ops_per_unit, self.host_ops_fixed))

    def autocast_over_fp32(self, case: PlanInput) -> bool:
        """FSDP's mixed precision (``MixedPrecision(param_dtype=bfloat16)``, Lightning's FSDPPrecision) gathers
        16-bit weights: activations as at 16-bit -true, no autocast copies. litgpt's LoRA on several devices is FSDP2
        under Fabric's ModelParallelStrategy, which takes the ordinary MixedPrecision plugin: fp32 weights gathered,
        autocast over them."""
        return bool(case.options.fsdp2_root_kept and case.loop.fabric and "mixed" in str(case.precision))

    def gathered_bytes(self, case: PlanInput, st: ModelStates) -> float:
        """Under FULL_SHARD and HYBRID_SHARD, what is gathered beside the activations: the block in use and the
        next one prefetched, plus the root unit (embedding, head, final norm), gathered at the forward's start and
        again for the whole backward (the per-rank simulation shows it)."""
        return (block_params(case.config) * 2 + root_unit_params(case.config)) * st.s_gathered

    def division(self, case: PlanInput, st: ModelStates, grads: float, notes: list) -> Division:
        """FSDP's sharding (FSDP1 or FSDP2): what each sharding strategy shards, what it holds gathered, and the
        unsharded gradients of micro batches without sync (``grads``: the gradients before division)."""
        if case.options.sharding == "NO_SHARD":
            notes.append(
                "FSDP NO_SHARD: every device holds the whole model; gradients all-reduced in place (no buckets)"
            )
            return Division()
        group = fsdp_shard_group(case)
        d = Division()
        if case.options.sharding in ("FULL_SHARD", "HYBRID_SHARD", "SHARD_GRAD_OP"):
            d.shard_w = d.shard_g = d.shard_o = group
        if case.options.sharding in ("FULL_SHARD", "HYBRID_SHARD"):
            # the block in use and the next one prefetched, plus the root unit (embedding, head, final norm),
            # gathered at the forward's start and again for the whole backward (the per-rank simulation shows it)
            d.in_flight = d.gathered = self.gathered_bytes(case, st)
            if self.one_unit(case):
                d.in_flight = d.gathered = 0
                d.extra = st.weights + st.lora_weights  # one unit: all parameters gathered through forward and backward
                notes.append("FSDP without auto-wrap: the whole model is one unit, gathered for every step")
        elif case.options.sharding == "SHARD_GRAD_OP":
            d.in_flight = sgo_gathered(case, st)
            notes.append(
                "SHARD_GRAD_OP: each unit stays gathered from its forward to its backward (the whole model at the "
                "forward's end; under no_sync() until the last micro batch's backward)"
            )
        if case.accumulation > 1:
            d.in_flight += grads * self.gathered_scale(case)  # no_sync() during accumulation keeps unsharded gradients
            notes.append("FSDP with gradient accumulation: no_sync() keeps full unsharded gradients")
        return d

    def offloaded(self, case: PlanInput, st: ModelStates, dev: PerDevice, notes: list) -> PerDevice:
        return (
            fsdp1_offloaded(case, dev, notes)
            if case.options.offload_params
            else super().offloaded(case, st, dev, notes)
        )

    def accumulated_gradients(self, case: PlanInput, st: ModelStates, dev: PerDevice) -> float:
        return 0 if unsharded_while_accumulating(case) else super().accumulated_gradients(case, st, dev)

    def volumes(self, c, case: PlanInput, z: Sizes, params) -> None:
        if case.options.sharding == "NO_SHARD":
            all_reduce(c, z, z.units)
        elif case.options.sharding == "HYBRID_SHARD":
            _hybrid(c, case, z)
        elif case.options.sharding == "SHARD_GRAD_OP":
            # FSDP1 keeps its units gathered through no_sync()'s micro batches (traced: tunelab.plan.trace.ranks);
            # FSDP2 reshards after each backward and gathers again
            gathers = 1 if case.options.fsdp_root_kept else z.a
            c.bytes_gpu = gathers * z.ring * z.P + z.ring * z.G
            c.formula = f"{'1' if gathers == 1 else 'a'} x (n-1)/n x P s_p + (n-1)/n x T s_g"
            c.calls = [z.call("all-gather", gathers * z.units), z.call("reduce-scatter", z.units)]
            c.hideable_under = "step"
        else:  # FULL_SHARD: a root unit kept (FSDP1's, FSDP2's by default) gathered once per forward
            kept = self.root_kept(case)
            c.bytes_gpu = z.a * z.ring * (2 * z.P - z.R) + z.ring * z.G
            c.formula = (
                "a x (n-1)/n x P s_p + (n-1)/n x T s_g (the whole model one unit)"
                if self.one_unit(case) and case.options.fsdp_root_kept
                else "a x (n-1)/n x (2P - R) s_p + (n-1)/n x T s_g (R: the root unit's parameters, kept into backward)"
                if kept
                else "a x 2(n-1)/n x P s_p + (n-1)/n x T s_g"
            )
            c.hideable_under = "step"
            c.calls = [
                z.call("all-gather", z.a * (2 * z.units - (1 if kept else 0))),
                z.call("reduce-scatter", z.units),
            ]

    def forward_gathers(self, case: PlanInput, z: Sizes, params) -> tuple[float, list]:
        """FULL_SHARD and HYBRID_SHARD gather every unit but the root kept (torch never reshards the root after its
        forward) within the shard group; SHARD_GRAD_OP and NO_SHARD keep their parameters whole between forwards."""
        if case.options.sharding not in ("FULL_SHARD", "HYBRID_SHARD"):
            return 0.0, []
        group = fsdp_shard_group(case)
        calls = z.units - (1 if self.root_kept(case) else 0)
        return (group - 1) / group * (z.P - z.R), [("all-gather", calls, group - 1, 0)] if calls else []

    def host_bytes(self, case: PlanInput, z: Sizes) -> float:
        return z.a * 2 * z.P / z.n + z.G / z.n if case.options.offload_params else 0.0

    def node_rings(self, case: PlanInput, z: Sizes) -> int:
        return z.g if self.hierarchical(case) else 1

    def hierarchical(self, case: PlanInput) -> bool:
        return case.options.sharding == "HYBRID_SHARD"

    def one_unit(self, case: PlanInput) -> bool:
        return case.options.fsdp_wrap == "none"

    def unhideable(self, case: PlanInput) -> bool:
        return self.one_unit(case)


def _hybrid(c, case: PlanInput, z: Sizes) -> None:
    """HYBRID_SHARD: FULL_SHARD within each node of g devices, each device's gradient shard all-reduced across the
    m nodes."""
    g, m, r = z.g, z.m, (z.g - 1) / z.g
    c.bytes_gpu = z.a * r * (2 * z.P - z.R) + r * z.G
    c.bytes_node = 2 * (m - 1) / m * z.G / g
    c.formula = "within a node: a x (g-1)/g x (2P - R) s_p + (g-1)/g x T s_g; across: 2(m-1)/m x T s_g / g"
    kept = 1 if case.options.fsdp_root_kept else 0
    c.calls = [
        ("all-gather", z.a * (2 * z.units - kept), g - 1, 0),
        ("reduce-scatter", z.units, g - 1, 0),
        ("all-reduce", z.units, 2 * (m - 1), 2 * (m - 1)),
    ]
    c.hideable_under = "step"


def fsdp1_offloaded(case: PlanInput, dev: PerDevice, notes: list) -> PerDevice:
    """``dev`` under FSDP1's ``cpu_offload`` (``CPUOffload(offload_params=True)``): every sharded flat parameter
    lives pinned in host RAM, with a pinned host copy of its sharded gradient (``_cpu_grad``), and the optimizer
    steps there, over host parameters: the shards, the optimizer's states and the step's temporaries leave the
    device. What stays is what the device computes with: the gathered units (``dev.in_flight``, as without offload),
    each beside the device copy of its shard that FSDP1 gathered from, the unsharded gradients of
    micro batches under ``no_sync()``, and each unit's sharded gradient, which FSDP1 keeps on the device
    (``_saved_grad_shard``) until the backward's end although it has copied it out (the FSDP1 backward moments
    count them). Seen in the per-rank simulation on a stand-in accelerator (:mod:`tunelab.plan.trace.fake_device`;
    TinyLlama full, 32-true, 8 devices: the activations as without offload, 109.6 MB of shards beside the gathered
    root and two blocks, nothing on the device at the optimizer step). The host's peak: the shards and the
    optimizer's states beside either the step (the host gradients and the step's temporaries) or the host gradient
    made again after a step (``zeros_like(...).pin_memory()``: the zeros and their pinned copy at once), the larger
    (TinyLlama full, 32-true, 4 devices: 5.5 GB both; LoRA, bf16, 4 devices: 1.68 GB, the second)."""
    step_or_repin = max(dev.grads + dev.step_temp, 2 * dev.grads)
    dev.host += dev.weights + dev.lora_weights + dev.optimizer + step_or_repin
    dev.weights = dev.lora_weights = dev.grads = dev.optimizer = dev.step_temp = 0.0
    copies = dev.gathered / fsdp_shard_group(case)
    dev.in_flight += copies
    dev.gathered += copies
    notes.append(
        "FSDP cpu_offload: sharded parameters, their gradients and the optimizer's states in host RAM, the "
        "optimizer step on the host; the device holds the gathered units and the backward's sharded gradients"
    )
    return dev
