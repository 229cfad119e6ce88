"""The traced tables the model reads, as an interface: the model asks, :mod:`tunelab.plan.trace` answers.

The model never imports the tracer. What it needs of a trace (a step's kernel template, what a compiled block
keeps and launches, DDP's gradient buckets) it asks of a :class:`Tables` handed to it with the case
(``PlanInput.tables``); :data:`tunelab.plan.trace.tables.TRACED` is the one the planner passes. A test or a tool
may pass its own (fixed tables, no torch)."""

from __future__ import annotations

from typing import Protocol

from tunelab.errors import InputError
from tunelab.plan.model import optimizers

COMPILED_PRECISIONS = {"bf16-true": "bfloat16", "16-true": "float16", "32-true": "float32"}
"""Precisions whose compiled blocks are traced: the weights' dtype is the compute dtype. Mixed precision (autocast
over fp32 weights) is not: CPU autocast's op lists differ from CUDA's, so a plan under it stays eager (an upper
bound) and says so."""
TRACE_TOKENS = 64
"""Tokens of the shorter of a compiled block's two one-sample traces (the longer has twice as many; a multiple of
64, as the fast path pads; any length gives the same bytes per token, tested)."""
OPTIMIZERS = ("AdamW", "AdamW fused", "SGD", "SGD momentum", "PagedAdamW", "PagedAdamW32bit")
"""Optimizers traced by these names: torch's AdamW (``foreach=True``, CUDA's default; ``fused=True``), SGD (with
momentum: one state), and bitsandbytes' paged AdamW (the states of tensors from 1e5 elements outside torch's
allocator: left out; smaller tensors' fp32 states on the device); every other torch.optim class it can trace by
:func:`tunelab.plan.model.optimizers.traced_name`."""


class Tables(Protocol):
    """What the model reads from traces of litgpt's model (each answer cached by the tracer)."""

    def template(self, step):
        """The kernels of ``step`` (a :class:`tunelab.plan.model.kernels.Step`, its config as built: its blocks) as
        a :class:`tunelab.plan.model.kernels.Template` in its micro batch and tokens (LoRA: for its head's chunks;
        one sample per micro batch: for that)."""

    def compiled_saved_bytes(
        self, config, kind: str, precision: str, lora_r: int, targets: tuple, input_grad: bool = True
    ) -> float:
        """Bytes one compiled block keeps for backward per token (``input_grad``: its input needs a gradient)."""

    def compiled_block(self, config, method: str, precision: str, lora_r: int, targets: tuple) -> dict:
        """The kernels of one compiled block's forward and backward at two lengths (``{phase: [(a, b), ...]}``)."""

    def ddp_buckets(self, config, method: str, precision: str, bucket_cap_mb: int, *lora) -> list:
        """Bytes of each DDP gradient bucket, as DDP assigns the trainable gradients (``lora``: rank, targets)."""


def tables_of(case) -> Tables:
    """The tables a case carries (``PlanInput.tables``); a case planned without any cannot be timed by kernel."""
    if case.tables is None:
        raise ValueError("this plan needs traced tables (PlanInput.tables: tunelab.plan.trace.tables.TRACED)")
    return case.tables


def compiled_supported(precision: str) -> bool:
    """Whether compiled blocks under ``precision`` are traced (else planned as eager)."""
    return str(precision) in COMPILED_PRECISIONS


def optimizer_of(case) -> str:
    """The traced optimizer for a PlanInput (:data:`OPTIMIZERS`); InputError for one that is not traced."""
    name = optimizers.class_name(case.optimizer)  # torch.optim.AdamW, bitsandbytes.optim.PagedAdamW
    if name in ("AdamW", "Adam") and not optimizers.is_set(dict(case.optimizer_init).get("amsgrad")):
        return "AdamW fused" if case.loop.fused_optimizer else "AdamW"
    if name == "SGD":
        return "SGD momentum" if case.has_momentum else "SGD"
    if name in ("PagedAdamW", "PagedAdamW32bit"):
        return name
    fused = case.loop.fused_optimizer and optimizers.takes_fused(case.optimizer)  # only AdamW's fused step is traced
    if not fused and (traced := optimizers.traced_name(case.optimizer, dict(case.optimizer_init))):
        return traced
    raise InputError(
        f"--simulate: optimizer {name}{' fused' if fused else ''} is not simulated ({', '.join(OPTIMIZERS)}, or a "
        "torch.optim class whose step reads nothing on the host, for-each); fix: plan without --simulate"
    )
