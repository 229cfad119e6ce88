"""The host's time per op, measured on the machine that will run (``tunelab plan --host auto``): litgpt's finetune
step of the planned model's architecture (every block, its attention and MLP as configured) at a toy width, under
Lightning Fabric on the GPU here, so that the GPU waits on the host; the step's wall time over the ops the planner
counts in it is the figure ``--host-us-per-op`` takes."""

from __future__ import annotations

import dataclasses
import statistics
import sys
import time
import warnings
from dataclasses import dataclass

from tunelab.plan.model.kernels import ADAM_FOREACH_HOST_OPS_PER_TENSOR
from tunelab.plan.trace.kernel_trace import recorder
from tunelab.plan.trace.measure import build_model, training_loss

TOY_WIDTH = {"n_embd": 64, "head_size": 8, "intermediate_size": 128, "vocab_size": 256, "padded_vocab_size": 256}
"""The probe's widths: kernels of a few microseconds each, so the step is the host's; the blocks, heads and layers
of the planned model kept (the ops the host dispatches)."""
TOY_BATCH = (2, 32)
"""(micro batch, tokens) of the probe's step: the host's work per op does not depend on them."""
NO_CUDA = (
    "--host auto: no CUDA device here, and a GPU host's time per op includes CUDA's launches, which this machine "
    "cannot show; fix: run it on the machine the run will use, or give --host-us-per-op (a record's implied figure)"
)


@dataclass(frozen=True)
class HostProbe:
    """What :func:`measure_host` measured."""

    us_per_op: float
    """The median step's wall time over its host ops: microseconds an op, litgpt's loop as the planner counts it."""
    low_us: float
    """The fastest step's figure."""
    high_us: float
    """The slowest step's figure."""
    ops: float
    """Host ops per step: the kernel-launching ops dispatched (the planner's count) plus the for-each AdamW's host
    work per trainable tensor (:data:`~tunelab.plan.model.kernels.ADAM_FOREACH_HOST_OPS_PER_TENSOR`)."""
    steps: int
    """Steps timed, after the warm-up steps."""
    device: str
    """Where it ran (``cuda`` on a GPU machine; ``cpu`` only in tests: without CUDA's launches)."""

    def how(self) -> str:
        """How the figure was had, in words."""
        return (
            f"measured here (--host auto: litgpt's step of this model at a toy width on {self.device}, "
            f"{self.ops:,.0f} ops a step, median of {self.steps} steps, {self.low_us:.1f}-{self.high_us:.1f})"
        )

    def source(self) -> str:
        """The figure and how it was had, for the plan's ``host_source``."""
        return f"{self.us_per_op:.1f} us an op, {self.how()}"


def toy_config(config):
    """``config`` at :data:`TOY_WIDTH` (an MoE's experts as narrow), its layers, heads and features kept."""
    narrow = dict(TOY_WIDTH)
    if getattr(config, "moe_intermediate_size", None):
        narrow["moe_intermediate_size"] = TOY_WIDTH["intermediate_size"]
    return dataclasses.replace(config, **narrow)


def measure_here(case, steps: int = 5) -> HostProbe:
    """:func:`measure_host` on this machine's GPU, saying so on stderr; ValueError in one line for the fast path
    (its launch model is its own) and without CUDA (:data:`NO_CUDA`)."""
    import torch

    if case.loop.fast:
        raise ValueError(
            "--host auto: the host figure of litgpt's loop; the fast path (a strategy file's speed switches) has its "
            "own launch model; fix: leave --host out"
        )
    if not torch.cuda.is_available():
        raise ValueError(NO_CUDA)
    print(f"--host auto: timing {steps} steps of litgpt's step of this model at a toy width on cuda", file=sys.stderr)
    return measure_host(case, "cuda", steps)


def measure_host(case, device: str, steps: int = 5, warmup: int = 2) -> HostProbe:
    """Time ``steps`` of litgpt's finetune step of ``case`` (a :class:`~tunelab.plan.model.case.PlanInput`: its
    config at :func:`toy_config`, method and precision) on ``device`` after ``warmup`` steps, each step as litgpt's
    loop runs one micro batch and an optimizer step (the batch copied in, forward, loss, Fabric's backward, the
    running loss, AdamW for-each, zero_grad), synchronised at its end; count its ops once under the planner's
    recorder. QLoRA is timed as LoRA (its 4-bit layers need bitsandbytes): an op's host cost, not their number."""
    import lightning as L
    import torch
    from torchmetrics.aggregation import RunningMean

    method = "lora" if case.method == "qlora" else case.method
    fabric = L.Fabric(accelerator=device, devices=1, precision=str(case.precision))
    with fabric.init_module(), warnings.catch_warnings():
        warnings.filterwarnings("ignore")
        model = build_model(toy_config(case.config), method, str(case.precision), case.lora_r, case.lora_targets)
    trainable = [p for p in model.parameters() if p.requires_grad]
    model, optimizer = fabric.setup(model, torch.optim.AdamW(trainable, lr=1e-4, foreach=True))
    running = RunningMean(window=1, sync_on_compute=False).to(fabric.device)
    batch = torch.randint(0, TOY_WIDTH["vocab_size"], TOY_BATCH)
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)

    def step() -> None:
        idx = batch.to(fabric.device)
        logits = model(idx) if method == "full" else model(idx, lm_head_chunk_size=128)
        loss = training_loss(logits, idx, method)
        fabric.backward(loss / 1)
        running.update(loss.detach())
        optimizer.step()
        optimizer.zero_grad()
        sync()

    for _ in range(warmup):
        step()
    ops: list = []
    with recorder(ops, {"phase": "step"}):
        step()
    host_ops = len(ops) + len(trainable) * ADAM_FOREACH_HOST_OPS_PER_TENSOR
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    per_op = [t / host_ops * 1e6 for t in times]
    return HostProbe(statistics.median(per_op), min(per_op), max(per_op), host_ops, steps, device)
