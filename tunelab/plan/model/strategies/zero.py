"""DeepSpeed ZeRO stages 1-3 with offload: fp32 master weights and states, its buffers, what ZeRO-3 keeps gathered.
See docs/planner.md."""

from __future__ import annotations

import math
from dataclasses import dataclass

from tunelab.models import lora_tensor_numels, param_tensor_numels
from tunelab.plan.model import optimizers
from tunelab.plan.model.case import Division, ModelStates, PerDevice, PlanInput, parameter_bytes
from tunelab.plan.model.strategies.base import Sizes, Strategy
from tunelab.plan.model.strategies.ddp import all_reduce
from tunelab.units import GB


def zero3_tensors(case: PlanInput) -> tuple[int, int]:
    """(persistent, partitioned) parameter elements of ``case``'s model under ZeRO-3, tensor by tensor against
    :attr:`PlanInput.zero3_param_persistence_threshold` (LoRA's matrices included)."""
    numels = param_tensor_numels(case.config) + (
        lora_tensor_numels(case.config, case.lora_r, case.lora_targets) if case.lora else []
    )
    persistent = sum(n for n in numels if n < case.options.zero3_param_persistence_threshold)
    return persistent, sum(numels) - persistent


def zero3_gathered(case: PlanInput) -> float:
    """Bytes of parameters ZeRO-3 holds gathered at the forward's end (in the 16-bit dtype DeepSpeed casts the model
    to): the larger of ``stage3_max_live_parameters`` and half of ``stage3_max_reuse_distance`` elements, or the
    whole partitioned model where it is smaller. Once DeepSpeed's parameter coordinator has traced a step it
    releases no parameter used again within the reuse distance (a block near the loss is used again in the
    backward after the blocks behind it and the head, twice over: half the distance is kept), nor one its
    prefetch has scanned past, and it prefetches up to the live limit. Measured with DeepSpeed's own coordinator
    on CPU over gloo (tests/e2e/test_deepspeed_memory.py), a 32-block model with limits in proportion: live 2e6 and
    reuse 1e6 or 3.9e6 held 2.09e6 elements, reuse 8e6 4.03e6, 2e7 1.0e7 (the rule, and part of one more weight);
    reuse 1e9 the whole model. DeepSpeed's defaults (1e9, 1e9) hold 1e9 elements, 2 GB in bf16: all of a 1B
    model, five blocks and the head of a 7B one. Gone after the backward."""
    return zero3_kept(case) * zero_param_bytes(case)


def zero3_kept(case: PlanInput) -> float:
    """Parameters (elements) ZeRO-3 holds gathered at the forward's end: :func:`zero3_gathered`'s rule."""
    return min(
        zero3_tensors(case)[1], max(case.options.zero3_max_live_parameters, case.options.zero3_max_reuse_distance / 2)
    )


def zero_param_bytes(case: PlanInput) -> int:
    """Bytes per 16-bit parameter or gradient element DeepSpeed holds: bf16 wherever the precision is bf16 (tunelab's
    DeepSpeed config turns ``bf16`` on and DeepSpeed casts the model), else the precision's."""
    return 2 if str(case.precision).startswith("bf16") else parameter_bytes(case.precision)


def zero2_backward_partition(case: PlanInput, st: ModelStates) -> float:
    """ZeRO-2's 16-bit gradient partition (``grads_in_partition``, the trainable parameters / devices), allocated when
    the first reduce bucket fills: inside the backward, beside its activations, where the trainable parameters
    outnumber ``reduce_bucket_size``; otherwise only at the backward's end, after the activations are gone. Freed
    at the step (which sees the float32 copy: :func:`zero_step_bytes`)."""
    if st.trainable <= case.options.reduce_bucket_size:
        return 0.0
    return st.trainable * zero_param_bytes(case) / case.world


def zero_step_bytes(case: PlanInput, st: ModelStates) -> tuple[float, float]:
    """(gradients, temporary) of DeepSpeed's optimizer step on the device, before division by the devices: the
    float32 gradient partition the step reads (ZeRO-2 converts the 16-bit partition into it; ZeRO-3 holds its
    16-bit partitions as well: :func:`zero3_gradient_partitions`) and torch's foreach AdamW's one float32
    temporary over the master partition. Measured with DeepSpeed's own step on CPU (foreach AdamW, as on CUDA):
    8 bytes per trainable parameter / devices above the states at rest, ZeRO-2 and ZeRO-3 alike."""
    if case.options.offload_optimizer:
        return st.grads, 0.0
    grads = st.trainable * 4 + (st.grads if case.options.zero_stage >= 3 else 0.0)
    return grads, st.trainable * 4


def zero3_gradient_partitions(case: PlanInput) -> bool:
    """ZeRO-3 without optimizer offload allocates its gradient partitions (``grad_partitions_flat_buffer``, the
    model's dtype) at its start and holds them through the run: beside the activations, not only at the step."""
    return case.options.zero_stage >= 3 and not case.options.offload_optimizer


def zero_reduce_buffer(case: PlanInput) -> float:
    """Bytes of DeepSpeed's gradient reduce buffer (``contiguous_gradients``, as tunelab's loop configures it, with
    ``overlap_comm`` off: one buffer; on, two): ``reduce_bucket_size`` elements in the gradients' dtype
    (:func:`zero_param_bytes`),
    allocated whole whatever the model's size. ZeRO-2 (``stage_1_and_2.setup_buckets``) allocates it at each
    backward's start and frees it at its end; ZeRO-3 (``stage3``'s optimizer init) holds it for the whole run.
    Measured on CPU with DeepSpeed's own code over gloo (tests/e2e/test_deepspeed_memory.py): 400 MB at the default 2e8
    elements, most of a small model's peak."""
    if case.options.zero_stage < 2:
        return 0.0
    return case.options.reduce_bucket_size * zero_param_bytes(case)


class ZeRO(Strategy):
    """DeepSpeed ZeRO (``name: deepspeed``): stage 1 shards the optimizer's states, 2 the gradients too, 3 the weights
    too; fp32 master weights and fp32 Adam states whatever the training precision; offload to host RAM."""

    name, files, label = "deepspeed", ("deepspeed",), "DeepSpeed ZeRO"
    divides = sharded = True

    def holds_shard(self, case: PlanInput) -> bool:
        return case.options.zero_stage >= 3

    def fields(self, config, world: int) -> dict:
        return {
            "strategy": self.name,
            "zero_stage": config.zero_stage,
            "offload_optimizer": config.offload_optimizer,
            "offload_params": config.offload_params,
            "reduce_bucket_size": config.reduce_bucket_size,
            "allgather_bucket_size": config.allgather_bucket_size,
            "zero3_max_live_parameters": config.max_live_parameters,
            "zero3_max_reuse_distance": config.max_reuse_distance,
        }

    def param_bytes(self, case: PlanInput) -> int:
        return zero_param_bytes(case)

    def autocast_over_fp32(self, case: PlanInput) -> bool:
        return False  # ``bf16.enabled``: the forward sees 16-bit weights

    def optimizer_states(self, case: PlanInput, trainable: int, s_param: int, notes: list) -> tuple:
        """The optimizer's states over DeepSpeed's fp32 partitions (flat: a factored optimizer keeps a full state),
        and fp32 master weights under 16-bit weights."""
        notes.append("DeepSpeed keeps fp32 master weights and fp32 optimizer states")
        states = optimizers.states_per_parameter(case.optimizer, dict(case.optimizer_init), trainable)
        return trainable * 4 * states, (trainable * 4 if s_param < 4 else 0)

    def flat_shards(self, case: PlanInput) -> bool:
        return True

    def foreach_temporary(self, case: PlanInput) -> bool:
        return False

    def division(self, case: PlanInput, st: ModelStates, grads: float, notes: list) -> Division:
        """DeepSpeed ZeRO's stages: states (1), gradients (2), weights (3) over the devices, and its buffers."""
        world = case.world
        d = Division(
            shard_o=world if case.options.zero_stage >= 1 else 1,
            shard_g=world if case.options.zero_stage >= 2 else 1,
            shard_w=world if case.options.zero_stage >= 3 else 1,
        )
        if case.options.zero_stage >= 3:
            persistent = zero3_tensors(case)[0] * zero_param_bytes(case)
            d.extra = zero_reduce_buffer(case) + persistent * (1 - 1 / world)  # small tensors whole on every rank
            d.in_flight = d.gathered = zero3_gathered(case)
            notes.append(
                "ZeRO-3: its gradient reduce buffer (reduce_bucket_size elements) and gradient partitions held "
                f"through the run; {zero3_kept(case) / 1e6:,.0f}M parameters gathered at the forward's end "
                "(stage3_max_live_parameters, stage3_max_reuse_distance)"
            )
        elif case.options.zero_stage == 2:
            d.in_flight = zero_reduce_buffer(case) + zero2_backward_partition(case, st)
            notes.append("ZeRO-2: its gradient reduce buffer (reduce_bucket_size elements) from backward's start")
        return d

    def step_bytes(self, case: PlanInput, st: ModelStates, grads: float, step_temp: float) -> tuple[float, float]:
        return zero_step_bytes(case, st) if case.options.zero_stage >= 2 else (grads, step_temp)

    def accumulated_gradients(self, case: PlanInput, st: ModelStates, dev: PerDevice) -> float:
        """ZeRO-2/3 hold their 16-bit partitions (``dev.grads`` is the step's float32)."""
        if case.options.zero_stage < 2:
            return super().accumulated_gradients(case, st, dev)
        held = zero3_gradient_partitions(case) or (case.accumulation > 1 and not case.options.offload_optimizer)
        return st.grads / case.world if held else 0

    def at_the_loss(self, case: PlanInput, st: ModelStates, dev: PerDevice, logits: float) -> tuple[float, float]:
        """ZeRO-2's reduce buffer and 16-bit gradient partition come in the backward, after the head's backward has
        freed the logits, beside the activations (DeepSpeed run on CPU at each family's shape / 16, 2 ranks): the
        larger of the two counts."""
        if case.options.zero_stage != 2:
            return super().at_the_loss(case, st, dev, logits)
        return (0.0, dev.in_flight) if dev.in_flight > logits else (logits, 0.0)

    def checkpoint_bytes(self, case: PlanInput, st: ModelStates) -> float:
        model = st.total * st.s_param
        weights = model / case.world if case.options.zero_stage >= 3 else model
        return weights + (st.optimizer + st.master) / case.world

    def volumes(self, c, case: PlanInput, z: Sizes, params) -> None:
        reduces = math.ceil(z.G / (case.options.reduce_bucket_size * z.s_p))  # its buckets, in its config's elements
        if case.options.zero_stage == 1:
            all_reduce(c, z, reduces)
        elif case.options.zero_stage == 2:  # reduce-scatters on the compute stream (overlap_comm off), gather after
            c.bytes_gpu = z.ring * z.P + z.ring * z.G
            c.formula = "1 x (n-1)/n x P s_p + (n-1)/n x T s_g"
            c.calls = [z.call("reduce-scatter", reduces), z.call("all-gather", 1)]
            c.hideable_under = "none"
        else:
            _zero3(c, case, z, params)

    def forward_gathers(self, case: PlanInput, z: Sizes, params) -> tuple[float, list]:
        """ZeRO-3 gathers every parameter but those it keeps gathered at the forward's end; ZeRO-1 and 2 hold them
        whole."""
        if case.options.zero_stage < 3:
            return 0.0, []
        kept = 0.0 if params is not None else zero3_kept(case) * z.s_p
        return z.ring * max(0.0, z.P - kept), [z.call("all-gather", z.units)]

    def host_bytes(self, case: PlanInput, z: Sizes) -> float:
        if not (case.options.offload_optimizer or case.options.offload_params):
            return 0.0
        return (z.G + z.trainable * z.s_p) / z.n + (z.a * 2 * z.P / z.n if case.options.offload_params else 0.0)

    def unhideable(self, case: PlanInput) -> bool:
        return case.options.zero_stage < 3


def _zero3(c, case: PlanInput, z: Sizes, params) -> None:
    """ZeRO-3: what is still gathered at the forward's end is not gathered again; its gathers prefetched beside the
    passes, its reduce-scatters on the compute stream (``overlap_comm`` off)."""
    ring, a, units = z.ring, z.a, z.units
    K = 0.0 if params is not None else zero3_kept(case) * z.s_p  # noqa: N806 - the formulas' symbols
    c.bytes_gpu = a * ring * (2 * z.P - K) + ring * z.G
    c.formula = "a x (n-1)/n x (2P - K) s_p + (n-1)/n x T s_g (K: kept gathered into the backward)"
    c.hideable_under = "step"
    c.calls = [z.call("all-gather", a * 2 * units), z.call("reduce-scatter", units)]
    c.pipelined, c.unhidden = a * 2 * units, ring * z.G / c.bytes_gpu if c.bytes_gpu else 0.0


@dataclass
class ZeroSizes:
    """DeepSpeed's buffers on one device by their sizes (``plan --simulate`` under a ZeRO strategy): each term's
    bytes per device, where its size comes from and when it is alive."""

    stage: int
    world: int
    terms: list[tuple[str, float, str]]
    """(what, bytes per device, its size's source and lifetime)."""

    def to_json(self) -> dict:
        return {
            "deepspeed_stage": self.stage,
            "world": self.world,
            "terms": [{"what": w, "bytes": b, "source": s} for w, b, s in self.terms],
        }


def zero_sizes(case: PlanInput, st: ModelStates) -> ZeroSizes:
    """DeepSpeed ZeRO-2/3's own buffers for a planned configuration (``plan --simulate`` under a ZeRO strategy file:
    its engine does not run on fake tensors), from its config keys and the rules its code follows (this module's
    terms), each with where its size comes from and when it is alive; ``st``: the case's model states."""
    n, s16 = case.world, zero_param_bytes(case)
    grads, temp = zero_step_bytes(case, st)
    at_step = (
        0.0 if case.options.offload_optimizer else grads + temp - (st.grads if case.options.zero_stage >= 3 else 0.0)
    )
    terms = [
        (
            "reduce buffer",
            zero_reduce_buffer(case),
            f"reduce_bucket_size {case.options.reduce_bucket_size:,} x {s16} B; "
            + ("held through the run" if case.options.zero_stage >= 3 else "from each backward's start to its end"),
        ),
        (
            "16-bit parameters",
            0.0 if case.options.offload_params else st.weights / n if case.options.zero_stage >= 3 else st.weights,
            "in host RAM (offload_param)"
            if case.options.offload_params
            else "parameters / devices"
            if case.options.zero_stage >= 3
            else "every parameter on every device (ZeRO-2)",
        ),
        (
            "float32 master and Adam moments",
            0.0 if case.options.offload_optimizer else (st.optimizer + st.master) / n,
            "in host RAM (offload_optimizer)" if case.options.offload_optimizer else "12 B x trainable / devices",
        ),
        ("step: float32 gradient partition and AdamW's temporary", at_step / n, "at the optimizer step"),
    ]
    terms += _zero3_terms(case, st, s16) if case.options.zero_stage >= 3 else _zero2_terms(case, st)
    return ZeroSizes(case.options.zero_stage, n, terms)


def _zero3_terms(case, st, s16: int) -> list:
    """ZeRO-3's own buffers (:func:`zero_sizes`): what stays gathered, its gradient partitions, small tensors."""
    persistent, partitioned = zero3_tensors(case)
    kept = zero3_gathered(case)
    n = case.world
    return [
        (
            "gathered at the forward's end",
            kept,
            f"{zero3_kept(case):,.0f} of {partitioned:,} elements: max("
            f"stage3_max_live_parameters {case.options.zero3_max_live_parameters:,}, stage3_max_reuse_distance / 2)",
        ),
        (
            "16-bit gradient partitions",
            st.grads / n if zero3_gradient_partitions(case) else 0.0,
            "held through the run (grad_partitions_flat_buffer; in host RAM under offload_optimizer)",
        ),
        (
            "small tensors whole",
            persistent * s16,
            f"{persistent:,} elements under stage3_param_persistence_threshold "
            f"{case.options.zero3_param_persistence_threshold:,}",
        ),
    ]


def _zero2_terms(case, st) -> list:
    """ZeRO-2's own buffer beyond the common ones (:func:`zero_sizes`): its gradient partition in the backward."""
    return [
        (
            "16-bit gradient partition in the backward",
            zero2_backward_partition(case, st),
            "trainable / devices, once the first bucket fills (none where the model fits one bucket)",
        )
    ]


def render_zero_sizes(z: ZeroSizes, plan) -> str:
    """``plan --simulate`` under DeepSpeed: its buffers by their sizes, beside the plan's peak."""
    lines = [
        f"\nDeepSpeed ZeRO-{z.stage} on {z.world} devices, by its own sizes (not simulated: its engine does not "
        "run on fake tensors; checked against DeepSpeed run on CPU, offload not), per device, GB = 1e9 bytes:"
    ]
    lines += [f"  {what:<56}{b / GB:9.3f}  [{source}]" for what, b, source in z.terms]
    lines.append(f"  the plan's peak: {plan.peak_allocated_bytes / GB:.2f} GB (its breakdown above)")
    return "\n".join(lines)
