"""DDP: every rank holds the whole model; its gradient buckets hold a second copy of the gradients, all-reduced
beside the last micro batch's backward."""

from __future__ import annotations

from tunelab.plan.model.case import Division, ModelStates, PlanInput
from tunelab.plan.model.kernels import TRACED_AS
from tunelab.plan.model.strategies.base import Sizes, Strategy
from tunelab.plan.model.tables import tables_of

_BUCKETS: dict = {}


def ddp_bucket_count(case: PlanInput) -> int:
    """DDP's gradient buckets for ``case``: DDP's own assignment of the trainable gradients (a first bucket of 1 MiB,
    then ``bucket_cap_mb``; a bucket closes once it exceeds the cap, so it holds whole tensors:
    :func:`tunelab.plan.trace.ranks.ddp_buckets`), counted once per model, method, precision and cap."""
    lora = (case.lora_r, tuple(case.lora_targets)) if case.lora else ()
    precision = TRACED_AS.get(str(case.precision), str(case.precision))  # float16's gradients: bfloat16's bytes
    key = (repr(case.config), case.method, precision, case.options.ddp_bucket_mb, lora)
    if key not in _BUCKETS:
        method = "lora" if case.lora else "full"
        _BUCKETS[key] = len(
            tables_of(case).ddp_buckets(case.config, method, precision, case.options.ddp_bucket_mb, *lora)
        )
    return _BUCKETS[key]


def all_reduce(c, z: Sizes, calls: float) -> None:
    """The gradients all-reduced whole in ``calls`` calls (DDP, FSDP's NO_SHARD, ZeRO-1)."""
    c.bytes_gpu, c.formula = 2 * z.ring * z.G, "gradient all-reduce 2(n-1)/n x T s_g"
    c.calls = [z.call("all-reduce", calls)]


class DDP(Strategy):
    """torch's DistributedDataParallel (``name: ddp``)."""

    name, files, divides, label = "ddp", ("ddp",), True, "DDP"

    def fields(self, config, world: int) -> dict:
        if world == 1:  # one rank: nothing to synchronise
            return {"strategy": "single"}
        return {"strategy": self.name, "ddp_bucket_mb": config.bucket_cap_mb}

    def division(self, case: PlanInput, st: ModelStates, grads: float, notes: list) -> Division:
        notes.append("DDP: gradient buckets hold a second copy of the gradients")
        return Division(extra=st.grads)

    host_ops_per_unit = {"sync": (1.0, 5.0), "no_sync": (0.0, 1.0)}
    """DDP's reducer per block, (forward, backward) in ops of the plain loop, for a micro batch that all-reduces
    (``sync``) and one inside ``no_sync()`` that accumulates: measured on a CPU (evidence ``cpu-ddp-host``,
    scripts/bench_wrapper_host.py, cases ``ddp`` and ``ddp-no-sync`` on one gloo rank), each the median over the
    reps, rounded, none below 0."""
    host_ops_fixed = {"sync": (39.0, 16.0), "no_sync": (7.0, 0.0)}
    """The same beside the blocks (DDP's forward pre-hook, the reducer's preparation and its all-reduce launch)."""

    def wrapper_host_ops(self, case: PlanInput) -> tuple[float, float]:
        """DDP's reducer (its hooks, the bucket copies, the all-reduce's launch) per micro batch, the mean over the
        optimizer step's micro batches: the last all-reduces, the others accumulate under ``no_sync()``. The tiny
        model the constants were measured on fills one bucket: a model of hundreds of buckets launches as many
        all-reduces, not counted here."""
        acc = max(1, case.accumulation)
        blocks = case.config.n_layer

        def ops(kind: str) -> tuple:
            return tuple(blocks * u + f for u, f in zip(self.host_ops_per_unit[kind], self.host_ops_fixed[kind]))

        sync, quiet = ops("sync"), ops("no_sync")
        return tuple((s + (acc - 1) * q) / acc for s, q in zip(sync, quiet))

    def volumes(self, c, case: PlanInput, z: Sizes, params) -> None:
        all_reduce(c, z, ddp_bucket_count(case) if params is None else z.units)
