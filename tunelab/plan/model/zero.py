"""DeepSpeed ZeRO-2/3's buffers on one device by their own sizes (``plan --simulate`` under a ZeRO strategy file):
its engine does not run on fake tensors, so its terms come from its config keys and the rules its code follows
(:mod:`tunelab.plan.model.memory`'s DeepSpeed terms), each with where its size comes from and when it is alive."""

from __future__ import annotations

from dataclasses import dataclass

from tunelab.plan.model import memory
from tunelab.units import GB


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


def zero_sizes(x) -> ZeroSizes:
    """DeepSpeed ZeRO-2/3's own buffers for a planned configuration, from its config keys and the rules its code
    follows (:mod:`tunelab.plan.model.memory`'s DeepSpeed terms)."""

    st = memory.model_states(x, [])
    n, s16 = x.world, memory.zero_param_bytes(x)
    grads, temp = memory.zero_step_bytes(x, st)
    at_step = 0.0 if x.offload_optimizer else grads + temp - (st.grads if x.zero_stage >= 3 else 0.0)
    terms = [
        (
            "reduce buffer",
            memory.zero_reduce_buffer(x),
            f"reduce_bucket_size {x.reduce_bucket_size:,} x {s16} B; "
            + ("held through the run" if x.zero_stage >= 3 else "from each backward's start to its end"),
        ),
        (
            "16-bit parameters",
            0.0 if x.offload_params else st.weights / n if x.zero_stage >= 3 else st.weights,
            "in host RAM (offload_param)"
            if x.offload_params
            else "parameters / devices"
            if x.zero_stage >= 3
            else "every parameter on every device (ZeRO-2)",
        ),
        (
            "float32 master and Adam moments",
            0.0 if x.offload_optimizer else (st.optimizer + st.master) / n,
            "in host RAM (offload_optimizer)" if x.offload_optimizer else "12 B x trainable / devices",
        ),
        ("step: float32 gradient partition and AdamW's temporary", at_step / n, "at the optimizer step"),
    ]
    terms += _zero3_terms(x, st, s16) if x.zero_stage >= 3 else _zero2_terms(x, st)
    return ZeroSizes(x.zero_stage, n, terms)


def _zero3_terms(x, st, s16: int) -> list:
    """ZeRO-3's own buffers (:func:`zero_sizes`): what stays gathered, its gradient partitions, small tensors."""
    persistent, partitioned = memory.zero3_tensors(x)
    kept = memory.zero3_gathered(x)
    n = x.world
    return [
        (
            "gathered at the forward's end",
            kept,
            f"{memory.zero3_kept(x):,.0f} of {partitioned:,} elements: max("
            f"stage3_max_live_parameters {x.zero3_max_live_parameters:,}, stage3_max_reuse_distance / 2)",
        ),
        (
            "16-bit gradient partitions",
            st.grads / n if memory.zero3_gradient_partitions(x) else 0.0,
            "held through the run (grad_partitions_flat_buffer; in host RAM under offload_optimizer)",
        ),
        (
            "small tensors whole",
            persistent * s16,
            f"{persistent:,} elements under stage3_param_persistence_threshold {x.zero3_param_persistence_threshold:,}",
        ),
    ]


def _zero2_terms(x, st) -> list:
    """ZeRO-2's own buffer beyond the common ones (:func:`zero_sizes`): its gradient partition in the backward."""
    return [
        (
            "16-bit gradient partition in the backward",
            memory.zero2_backward_partition(x, st),
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
