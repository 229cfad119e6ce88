"""The run's time as litgpt's "Training Time" counts it, by cause, and the band around it.

:class:`Terms` holds a case's step by kernel (:mod:`tunelab.plan.model.kernels`, or the fast path's
:mod:`tunelab.plan.model.fast_step`) with everything around it litgpt runs inside its loop: the optimizer steps of
the run's padded tokens, the initial, periodic and final validation, the generated samples, the checkpoint saves
(and apart, outside Training Time, the save and merge after the loop). :meth:`Terms.by_cause` sums to the point
estimate; :func:`litgpt_band` is the band the plan prints (the runtime model's error, widened for host-bound runs
to the hosts we measured). Where the kernel model does not apply, the fitted curve (:func:`seconds`: FLOPs at
:data:`ETA`, bytes at :data:`MU`, :data:`OVERHEAD_S` per iteration) answers and says so. docs/planner.md, "Time"."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from tunelab import settings
from tunelab.errors import InputError
from tunelab.models import count_params, lora_param_count
from tunelab.plan.model import kernels, strategies
from tunelab.plan.model.case import parameter_bytes
from tunelab.plan.model.comm import BACKWARD_SHARE
from tunelab.plan.model.fast_step import FAST_MODEL_ERROR, fast_step
from tunelab.plan.model.flops import flops_per_token
from tunelab.plan.model.memory import (
    bnb_4bit,
    four_bit_bytes_per_param,
    model_states,
    optimizer_shards,
    optimizer_state_bytes,
)
from tunelab.plan.model.tables import optimizer_of
from tunelab.units import GB

ETA = 0.6127
"""Fraction of the dense peak FLOP/s the matmul work reaches (fitted on the lab's Part 1 times,
configs/sweeps/lab-part1.yaml: see the module docstring)."""
MU = 0.2671
"""Fraction of the peak memory bandwidth the memory-bound work reaches (fitted with :data:`ETA` on the same rows,
configs/sweeps/lab-part1.yaml)."""
OVERHEAD_S = 0.0715
"""Seconds of host work per micro-batch iteration (fitted with :data:`ETA` on the same rows,
configs/sweeps/lab-part1.yaml)."""
LOO_MEAN_ABS_ERROR = 0.107
"""Mean absolute leave-one-out error of the estimate over the lab's rows (tunelab plan-accuracy recomputes it)."""
LOO_WORST_ERROR = -0.314
"""The worst leave-one-out error (s13, the one QLoRA row: without it the memory-bound constant is poorly held)."""
LOO_BAND = (-0.204, 0.458)
"""The fitted curve's band, as measured over estimated less 1 at its extremes over the lab's rows
(configs/sweeps/lab-part1.yaml) left out one by one, rounded outwards: the estimate x (1 + each) holds every such row
(tunelab plan-accuracy recomputes them; a test holds these to them)."""
LITGPT_HOST_S_PER_OP = 50.2e-6
"""Host seconds per dispatched op in litgpt's finetune loop (Python module code, Fabric's wrappers, the
dispatcher, autograd's bookkeeping, the launch; its data loader's workers beside it on the same CPU): the loop is
launch-bound wherever its kernels take less. A property of the host CPU and software, not of the GPU, and a machine
to be rented is not known: the median machine of every host-bound litgpt run we hold (each machine's median, ours
and the lab's published; ``tunelab plan-accuracy`` recomputes it in ``reports/planner-accuracy/runtime.md``, a test
holds this to it); :data:`LITGPT_HOST_S_PER_OP_RANGE` spans the machines."""
LITGPT_HOST_S_PER_OP_RANGE = (28.9e-6, 73.4e-6)
"""The host seconds per op litgpt's loop took over every host-bound run we hold, rounded outward: our records (GPU
busy under 60% of the steady window, seven reports, each its own lent machine) and the lab's published rows the
kernel model says waited on their host (the lab's A100 machine, the fastest). ``tunelab plan-accuracy`` recomputes
it in ``reports/planner-accuracy/runtime.md`` and a test holds this to it. A property of the machine no GPU table or
probe before launch tells; ``plan`` widens a launch-bound estimate's band to it."""
KERNEL_MODEL_ERROR = 0.168
"""The widest miss of the kernel-level model (:meth:`Terms.by_cause`), as measured over predicted (a band of the
estimate x (1 -/+ it) holds the run), where the GPU bounds a run we calibrate on (our timed litgpt runs whose GPU
was busy 60% or more, at the planner's host constant; the lab's A100 Part 1 rows, configs/sweeps/lab-part1.yaml, it
does not call host-bound, out of sample: a host-bound run is its host's, which :data:`LITGPT_HOST_S_PER_OP_RANGE`
carries), rounded up: the band either side of its point estimate, a bound that holds every such run rather than a
typical miss (``reports/planner-accuracy/runtime.md``; ``tunelab plan-accuracy`` recomputes it, a test holds this to
it)."""


def fast_band(bound: str) -> float:
    """The fraction either side of a fast-path time that the plan's band spans, by what bounds it: its widest miss
    over our benches (:data:`~tunelab.plan.model.fast_step.FAST_MODEL_ERROR`), but where the GPU bounds it never
    narrower than the kernel model's (:data:`KERNEL_MODEL_ERROR`): its matmuls and attention are that model's, and
    its own GPU-bound runs (two models, two GPUs) also hold its fitted compiled memory efficiency."""
    own = FAST_MODEL_ERROR[bound]
    return max(own, KERNEL_MODEL_ERROR) if bound == "GPU" else own


def litgpt_band(point: float, seconds_at) -> tuple[float, float]:
    """The plan's band around a time of litgpt's loop (``point``, at :data:`LITGPT_HOST_S_PER_OP`):
    :data:`KERNEL_MODEL_ERROR` either side, widened to the time at either end of :data:`LITGPT_HOST_S_PER_OP_RANGE`
    with the GPU's kernels at that error too (``seconds_at(h, gpu_scale)``: the same time with the host at ``h``
    seconds an op and the kernels ``gpu_scale`` times as long): the two are apart, so a run the fastest host leaves
    bound by its GPU keeps the kernel model's miss at that end, and a run the slowest host bounds keeps it wherever
    the GPU still bounds a phase."""
    fast, slow = LITGPT_HOST_S_PER_OP_RANGE
    low = min(point * (1 - KERNEL_MODEL_ERROR), seconds_at(fast, 1 - KERNEL_MODEL_ERROR))
    return low, max(point * (1 + KERNEL_MODEL_ERROR), seconds_at(slow, 1 + KERNEL_MODEL_ERROR))


EDGE_STRETCH = 1.961
"""How much longer a step may take when its plan is at the edge of memory (:data:`memory.EDGE_FRACTION`), where the
caching allocator frees its cache and retries (each retry synchronising the device): the largest slowdown per
sample measured against the same setting's largest micro batch without retries, in the FSDP study's published
tables (``configs/sweeps/lab-part3.yaml``) and our H100 Part 3 rows (evidence ``h100-part3``), rounded up
(``tunelab plan-accuracy`` recomputes it in runtime.md; a test holds this to it)."""


def edge_band(band: tuple[float, float]) -> tuple[float, float]:
    """The band of a plan at the edge of memory: its high end stretched by :data:`EDGE_STRETCH` (retries may
    come or not: the low end stays)."""
    return band[0], band[1] * EDGE_STRETCH


LAB_EVAL = {"eval.interval": 25, "eval.max_iters": 100, "eval.max_new_tokens": 100, "eval.initial_validation": False}
"""The lab's eval settings (its YAMLs): what its "Training Time" figures contain."""


CHECKPOINT_WRITE_BYTES_PER_S = 0.7e9
"""Bytes per second a checkpoint save writes (``torch.save`` of the state, on the saving rank): under a third of a
local NVMe's 2 GiB/s, as measured for ``torch.save`` and ``safetensors`` on an H100 machine (ServiceNow/Fast-LLM
issue #26, 2024: serialization, not the disk, bounds it); a network volume writes slower still (an AWS gp3
volume: 125 MiB/s unless provisioned up to 1,000). Not measured by us: a stated figure, not a fit."""


def checkpoint_bytes(case) -> tuple[float, float]:
    """(bytes the slowest rank writes at each in-loop save, bytes written after litgpt's loop) for PlanInput ``case``:

    * in the loop (every ``train.save_interval`` optimizer steps; inside litgpt's Training Time): full fine-tuning
      saves ``{model, optimizer, scheduler, counters}``: the weights and the optimizer's states; LoRA and QLoRA save
      the adapters only (``save_lora_checkpoint``); FSDP gathers the full state dict to rank 0, which writes all of
      it; DeepSpeed writes each rank's partition of the states (and of the weights at ZeRO-3) in parallel;
      tunelab's loop (``case.loop.fabric`` False) saves as litgpt does, but a sharded run's model alone;
    * after the loop (outside Training Time, inside the wall time): full fine-tuning saves the model; LoRA and
      QLoRA save the adapters, then litgpt's ``merge_lora`` writes the merged model in the run's precision (QLoRA:
      16-bit; the pretrained weights it reads are not counted: mmapped, just read by the run)."""

    st = model_states(case, [])
    if case.lora:
        merged = st.total * (2 if case.method == "qlora" else st.s_param)
        return st.lora_weights, st.lora_weights + merged
    model = st.total * st.s_param
    strategy = strategies.of(case)
    if not case.loop.fabric and strategy.sharded:  # tunelab's loop saves a sharded run's model alone
        return model, model
    if (each := strategy.checkpoint_bytes(case, st)) is not None:
        return each, each
    states = optimizer_state_bytes(case, st.trainable, st.s_param)
    return model + states, model


@dataclass
class KernelWork:
    """What the kernel model (:mod:`tunelab.plan.model.kernels`) times: one device's training step."""

    step: kernels.Step
    """The micro batch and its optimizer step (accumulation: :meth:`Terms.step_time` sets the run's own)."""
    recompute: bool
    """Activation checkpointing: each block's forward runs again in the backward pass."""
    optimizer_shards: int = 1
    """Devices the optimizer's states are sharded over (:func:`tunelab.plan.model.memory.optimizer_shards`): each rank's
    optimizer step runs its kernels over 1/this of the parameters (its launches stay: torch's optimizer is handed
    every original parameter, a rank's share of some of them empty)."""
    tables: object = None
    """Where the step's kernel templates come from (:class:`tunelab.plan.model.tables.Tables`)."""
    wrapper_ops: tuple = (0.0, 0.0)
    """(forward, backward) host work the strategy's wrapper adds per micro batch, in ops of the loop
    (:meth:`tunelab.plan.model.strategies.base.Strategy.wrapper_host_ops`); not repeated by recompute."""
    fast: object = None
    """tunelab's loop with a speed switch on (compiled blocks, Liger's loss, the fused optimizer, the loss read less
    often than every iteration): the PlanInput, whose step :func:`tunelab.plan.model.fast_step.fast_step` times."""


def kernel_work(case, tokens_per_sample: float) -> KernelWork | str:
    """The step the kernel model times for PlanInput ``case``, or why it does not (a sentence): offloaded optimizer
    steps (they run on the CPU) and optimizers it does not trace. QLoRA is traced as LoRA on 4-bit weights, with
    what bitsandbytes adds beside the trace (:mod:`tunelab.plan.model.bnb_kernels`)."""
    if strategies.of(case).off_device(case):
        return "an offloaded optimizer step (on the CPU) is not in the kernel model"
    if getattr(case.config, "n_expert", 0):
        return (
            f"mixture-of-experts routing ({case.config.mlp_class_name}: which tokens reach which expert depends on "
            "the data, so its step cannot be traced ahead) is not in the kernel model; the MFU range stands"
        )
    try:
        optimizer = optimizer_of(case)
    except InputError:
        return f"the optimizer {case.optimizer} is not in the kernel model"
    step = kernels.Step(
        case.config,
        case.method,
        str(case.precision),
        case.micro_batch_size,
        float(tokens_per_sample),
        optimizer,
        settings.lora_of(case),
        frozen_grads=strategies.of(case).frozen_weights_grad(case),
        mask_by_row=case.loop.sliding_mask_by_row,
    )
    return KernelWork(
        step,
        bool(case.activation_checkpointing),
        optimizer_shards(case),
        case.tables,
        strategies.of(case).wrapper_host_ops(case),
        case if case.loop.fast and case.method != "qlora" else None,
    )


@dataclass(frozen=True)
class MicroBatch:
    """One training micro batch of litgpt's loop on a GPU by the kernel model (:meth:`Terms._micro_batch`)."""

    step: object
    """The step's kernels (:class:`tunelab.plan.model.kernels.StepTime`), this rank's share of the optimizer's."""
    host_s_per_op: float
    """Host seconds per dispatched op (:data:`LITGPT_HOST_S_PER_OP` times the host's factor)."""
    gpu_s: float
    """The micro batch's forward (twice under activation checkpointing) and backward: GPU seconds."""
    host_s: float
    """The same: the host's seconds to launch them."""
    backward_s: float
    """Its backward alone: kernels or launches, whichever is longer (what DDP's buckets hide behind)."""


CAUSES = (
    "matmul",
    "attention",
    "elementwise",
    "dequantization",
    "optimizer",
    "kernel gaps",
    "host launches",
    "validation",
    "generation",
    "checkpoint saves",
    "communication",
)
"""The causes :meth:`Terms.by_cause` splits a run's seconds into."""


@dataclass
class Terms:
    """A run's work: FLOPs at the compute rate, bytes at the memory rate, iterations at the host overhead."""

    compute_flops: float
    memory_bytes: float
    iterations: float
    detail: dict
    comm: object = None
    """The communication of one optimizer step (:class:`tunelab.plan.model.comm.Comm`), None on one device."""
    kernels: KernelWork | str = ""
    """The step the kernel model times (:func:`kernel_work`), or why it does not."""
    save_bytes_per_s: float = CHECKPOINT_WRITE_BYTES_PER_S
    """Bytes per second a checkpoint save writes (``tunelab plan --save-gbs``): :data:`CHECKPOINT_WRITE_BYTES_PER_S`
    unless the user's disk is known."""
    host_s_per_op: float | None = None
    """Seconds per dispatched op of litgpt's loop on the launching host when the user knows it (``tunelab plan
    --host-us-per-op``); None: :data:`LITGPT_HOST_S_PER_OP`, the median machine we measured."""
    host_from: str | None = None
    """Where :attr:`host_s_per_op` came from when it was measured here (``--host auto``), as the plan says it; None:
    given by the user."""

    def by_cause(self, gpu, host_scale: float = 1.0, gpu_scale: float = 1.0, step=None) -> dict:
        """The run's seconds on ``gpu`` by cause (:data:`CAUSES`; they sum to the run), from the kernel model:

        * training: each micro batch's forward and backward (forward again under activation checkpointing) and
          each optimizer step take their kernels' GPU time or the host's launches (ops x
          :data:`LITGPT_HOST_S_PER_OP`), whichever is longer; the kernels by category, the GPU's gaps between them
          as "kernel gaps" (:data:`tunelab.plan.model.kernels.KERNEL_GAP_S`), the host's excess as "host launches";
        * validation: each batch litgpt's ``validate`` forward (eval mode, no gradients, the loss unchunked), its
          kernels or its launches (at :data:`~tunelab.plan.model.kernels.EVAL_HOST_SHARE` of a training op's host
          time);
        * generation: after each in-loop validation, and in LoRA's loop when the epochs end it (not max_steps),
          ``max_new_tokens`` decode steps of one token over a KV cache (a sample stopped early by its end token is
          not modelled: an upper bound), kernels or launches (likewise);
        * QLoRA: bitsandbytes' dequantization kernels in each forward, backward and validation batch as
          "dequantization", its Python per 4-bit matmul (a generated token's too) and per optimizer tensor with
          the launches (:mod:`tunelab.plan.model.bnb_kernels`);
        * checkpoint saves: every ``train.save_interval`` optimizer steps (:meth:`save_seconds`);
        * communication: what compute does not hide (:mod:`tunelab.plan.model.comm`).

        ``host_scale`` and ``gpu_scale`` (litgpt's loop): the launching host's time per op and the board's time per
        kernel relative to the constants' (the planner's host; the table's board at its fitted efficiencies),
        as a machine that differs from them would run; 1 is the planner's. ``step``: :meth:`step_time` on ``gpu``
        when already computed (a fit over many scales computes it once)."""

        k = self.kernels
        if k.fast is not None:
            return self._fast_by_cause(gpu)
        mb = self._micro_batch(gpu, host_scale, gpu_scale, step)
        st, h = mb.step, mb.host_s_per_op
        it_gpu, it_host = mb.gpu_s, mb.host_s
        d = self.detail
        train, steps = d["train_iterations"], d["optimizer_steps"]
        forwards = 2 if k.recompute else 1
        out = dict.fromkeys(CAUSES, 0.0)
        repeats = {"forward": train * forwards, "backward": train, "optimizer": steps}
        for key, sec in st.gpu_by_phase_category.items():
            phase, cat = key.split("/")
            times = repeats.get(phase, 0.0)
            cause = {"loss": "elementwise", "gaps": "kernel gaps"}.get(cat, cat)
            out[cause] += sec * times
        g, ops = st.gpu_by_phase, st.host_ops_by_phase
        opt_host = h * ops.get("optimizer", 0)
        out["host launches"] = train * max(0.0, it_host - it_gpu) + steps * max(0.0, opt_host - g.get("optimizer", 0.0))
        gathers = self._evaluations(out, g, ops, h)
        out["checkpoint saves"] = self.save_seconds()
        passes = train / steps * max(it_gpu, it_host) if steps else 0.0
        out["communication"] = self.comm_seconds(mb.backward_s, passes) + gathers
        return out

    def _evaluations(self, out: dict, g: dict, ops: dict, h: float) -> float:
        """Into ``out``: the validation batches and generated tokens, each its kernels (``g``) or its launches
        (``ops`` at ``h`` seconds a training op times the phase's
        :data:`~tunelab.plan.model.kernels.EVAL_HOST_SHARE`); returns the seconds their gathers add
        (:meth:`gather_seconds`)."""
        d, method = self.detail, self.kernels.step.method
        batch = max(
            g.get("validation", 0.0), h * kernels.eval_host_share("validation", method) * ops.get("validation", 0)
        )
        decode = max(g.get("decode", 0.0), h * kernels.eval_host_share("decode", method) * ops.get("decode", 0))
        out["validation"] = d["eval_iterations"] * batch
        out["generation"] = d["samples_generated"] * d["new_tokens"] * decode
        return self.gather_seconds(batch, decode)

    def step_time(self, gpu):
        """The mean micro batch of litgpt's loop on ``gpu`` by the kernel model (:func:`kernels.step_time`: the run's
        micro batches per optimizer step), before any board scale or optimizer sharding."""

        k, d = self.kernels, self.detail
        steps = d.get("optimizer_steps")
        accumulation = d["train_iterations"] / steps if steps else 1.0
        return kernels.step_time(dataclasses.replace(k.step, accumulation=accumulation), gpu.name, tables=k.tables)

    def _micro_batch(self, gpu, host_scale: float = 1.0, gpu_scale: float = 1.0, step=None) -> MicroBatch:
        """litgpt's micro batch on ``gpu`` from the kernel model (:meth:`by_cause`'s factors and ``step``)."""

        k = self.kernels
        st = kernels.board_scaled(step if step is not None else self.step_time(gpu), gpu_scale)
        st = kernels.sharded_optimizer(st, k.optimizer_shards)
        h = (self.host_s_per_op or LITGPT_HOST_S_PER_OP) * host_scale
        forwards = 2 if k.recompute else 1
        g, ops = st.gpu_by_phase, st.host_ops_by_phase
        wrapper_forward, wrapper_backward = k.wrapper_ops
        it_gpu = forwards * g.get("forward", 0.0) + g.get("backward", 0.0)
        it_host = h * (forwards * ops.get("forward", 0) + ops.get("backward", 0) + wrapper_forward + wrapper_backward)
        backward = max(g.get("backward", 0.0), h * (ops.get("backward", 0) + wrapper_backward))
        return MicroBatch(st, h, it_gpu, it_host, backward)

    def windows(self, gpu) -> dict:
        """One optimizer step of litgpt's loop on ``gpu`` by the kernel model, in seconds: ``passes`` (the forward
        and backward passes of its micro batches), ``backward`` (one micro batch's backward), ``optimizer`` (the
        optimizer step: this rank's share of its kernels, or its launches): what communication is scheduled
        beside (:meth:`tunelab.plan.model.comm.Comm.exposed`)."""
        mb = self._micro_batch(gpu)
        st, d = mb.step, self.detail
        micro_batches = d["train_iterations"] / d["optimizer_steps"] if d.get("optimizer_steps") else 0.0
        optimizer = max(
            st.gpu_by_phase.get("optimizer", 0.0), mb.host_s_per_op * st.host_ops_by_phase.get("optimizer", 0)
        )
        return {"passes": micro_batches * max(mb.gpu_s, mb.host_s), "backward": mb.backward_s, "optimizer": optimizer}

    def _fast_by_cause(self, gpu) -> dict:
        """:meth:`by_cause` for tunelab's loop with its speed switches (:mod:`tunelab.plan.model.fast_step`): each micro
        batch takes its kernels or its launches over the stretches the host queues ahead in, the optimizer step
        likewise; validation and generation as in litgpt's step (tunelab's loop runs them eagerly)."""

        k, d = self.kernels, self.detail
        fs = fast_step(k.fast, gpu, k.step.tokens)
        train, steps, ev = d["train_iterations"], d["optimizer_steps"], d["eval_iterations"]
        out = dict.fromkeys(CAUSES, 0.0)
        for phase, cats in fs.gpu.items():
            times = steps if phase == "optimizer" else train
            for cat, sec in cats.items():
                out["kernel gaps" if cat == "gaps" else cat] += sec * times
        busy = sum(fs.gpu_s(p) for p in ("forward", "loss", "backward"))
        out["host launches"] = train * max(0.0, fs.iteration_s() - busy) + steps * max(
            0.0, fs.optimizer_s() - fs.gpu_s("optimizer")
        )
        gathers = 0.0
        if ev or d["samples_generated"]:
            st = self.step_time(gpu)
            gathers = self._evaluations(out, st.gpu_by_phase, st.ops_by_phase, kernels.HOST_S_PER_OP)
        out["checkpoint saves"] = self.save_seconds()
        passes = train / steps * fs.iteration_s() if steps else 0.0
        out["communication"] = self.comm_seconds(fs.gpu_s("backward"), passes) + gathers
        return out

    def save_seconds(self, after_loop: bool = False) -> float:
        """Seconds of checkpoint saves at :attr:`save_bytes_per_s`: the in-loop saves (``after_loop``:
        what the run writes after its loop instead; :func:`checkpoint_bytes`). The gather of a sharded state to
        the saving rank is not timed."""
        d = self.detail
        written = d.get("final_save_bytes", 0.0) if after_loop else d.get("saves", 0) * d.get("save_bytes", 0.0)
        return written / self.save_bytes_per_s

    def seconds_on(self, gpu, peak_flops: float) -> float:
        """The run's seconds on ``gpu``: the kernel model's causes summed where it applies, else :meth:`seconds`
        (the fitted curve) at ``peak_flops``."""
        if isinstance(self.kernels, KernelWork):
            return sum(self.by_cause(gpu).values())
        return self.seconds(peak_flops, gpu.bandwidth_gbs * GB)

    def seconds(
        self,
        peak_flops: float,
        bandwidth_bytes_s: float,
        eta: float = ETA,
        mu: float = MU,
        overhead_s: float = OVERHEAD_S,
    ) -> float:
        """The run's seconds: compute, memory-bound work, host overhead, and the communication compute does not
        hide (:meth:`comm_seconds`)."""
        compute = self.compute_flops / (peak_flops * eta)
        return (
            compute
            + self.memory_bytes / (bandwidth_bytes_s * mu)
            + self.iterations * overhead_s
            + self.save_seconds()
            + self.comm_beside(compute)
        )

    def comm_beside(self, compute_s: float) -> float:
        """:meth:`comm_seconds` for a run whose compute takes ``compute_s`` in all, known only as a total (the
        fitted curve, an MFU range): per optimizer step its share, the backward of one micro batch
        :data:`tunelab.plan.model.comm.BACKWARD_SHARE` of a micro batch's share."""
        steps = self.detail.get("optimizer_steps") or 0
        if not steps:
            return 0.0
        per_step = compute_s / steps
        micro_batches = max(self.detail.get("train_iterations", 0) / steps, 1.0)
        return self.comm_seconds(per_step * BACKWARD_SHARE / micro_batches, per_step)

    def gather_seconds(self, batch_s: float, token_s: float) -> float:
        """Seconds over the run that the parameter gathers of forwards without gradients add beyond them: under a
        sharded strategy each validation batch (``batch_s`` of kernels or launches) and each generated token
        (``token_s``) gathers what the training step resharded (:attr:`tunelab.plan.model.comm.Comm.forward_s`),
        each unit's gather beside the previous unit's compute, so what the compute does not cover is exposed."""
        if self.comm is None or not self.comm.forward_s:
            return 0.0
        d, gather = self.detail, self.comm.forward_s
        tokens = d["samples_generated"] * d["new_tokens"]
        return d["eval_iterations"] * max(0.0, gather - batch_s) + tokens * max(0.0, gather - token_s)

    def comm_seconds(self, backward_s: float, passes_s: float) -> float:
        """Seconds of communication over the run left exposed: each optimizer step adds what its traffic takes
        beyond the compute its schedule runs it beside (:meth:`tunelab.plan.model.comm.Comm.exposed`): ``backward_s``,
        one micro batch's backward; ``passes_s``, the step's forward and backward passes."""
        steps = self.detail.get("optimizer_steps") or 0
        if self.comm is None or not steps:
            return 0.0
        return steps * self.comm.exposed(backward_s, passes_s)


def _schedule(train: dict, micro: int, world: int, train_samples: int) -> settings.Schedule:
    """litgpt's fit loop over the training samples (:func:`tunelab.settings.litgpt_schedule`); InputError where an
    epoch holds no optimizer step (litgpt sizes its schedule by them, and fails)."""
    gbs = train.get("global_batch_size") or micro
    if empty := settings.empty_epoch(train_samples, world, micro, gbs):
        what, fix = empty
        raise InputError(f"train.global_batch_size {what}; fix: {fix}")
    return settings.litgpt_schedule(train_samples, world, micro, gbs, train.get("epochs") or 1, train.get("max_steps"))


def _dequantized_bytes(
    c, total: int, emb: int, tokens_per_sample: float, train_iters: float, eval_iters: float
) -> float:
    """Bytes QLoRA's dequantization moves over the run, as the fitted curve counts them (6.5 bytes per 4-bit weight
    per dequantization): every linear weight in each forward and backward, the head once per 128-token chunk in
    training; once per validation forward."""
    head = c.padded_vocab_size * c.n_embd
    chunks = math.ceil(tokens_per_sample / 128)
    per_train_iter = 2 * ((total - emb - head) + head * chunks) * 6.5
    per_eval_iter = ((total - emb - head) + head) * 6.5
    return train_iters * per_train_iter + eval_iters * per_eval_iter


def _validations(ev: dict, train: dict, steps: int, val_samples: int, case) -> tuple[int, int, int, int]:
    """(in-loop validations, batches each, each rank's validation batches in all, samples generated) of litgpt's fit
    loop: a validation and a sample every ``eval.interval`` steps; every rank validates its DistributedSampler share
    at once, ``eval.max_iters`` batches at most, the initial validation (``eval.initial_validation``) over all of it,
    else a 2-batch sanity check; LoRA's loop samples once more when the epochs end it (not ``max_steps``); tunelab's
    loop takes no sample of a sharded model (its forward is a collective: rank 0 alone would wait)."""
    n_evals = steps // (ev.get("interval") or 10**9)
    per_rank = math.ceil(math.ceil(val_samples / case.world) / case.micro_batch_size)
    val_batches = min(ev.get("max_iters") or 100, per_rank)
    first = per_rank if ev.get("initial_validation") else min(2, per_rank)
    ended_by_epochs = not train.get("max_steps") or steps < train["max_steps"]
    samples = n_evals + (1 if case.lora and ended_by_epochs else 0)
    skipped = not case.loop.fabric and strategies.of(case).holds_shard(case)
    return n_evals, val_batches, first + n_evals * val_batches, 0 if skipped else samples


def terms(case, args: dict, train_samples: int, val_samples: int, tokens_per_sample: float) -> Terms:
    """The run's work (see the module docstring) for a PlanInput ``case`` and litgpt's resolved ``args``."""
    c = case.config
    train, ev = args["train"], args.get("eval") or {}
    world = case.world
    micro = case.micro_batch_size
    run = _schedule(train, micro, world, train_samples)
    samples, steps = run.samples, run.steps
    lora = case.lora
    n_lora = lora_param_count(c, case.lora_r, case.lora_targets) if lora else 0
    fpt = flops_per_token(c, tokens_per_sample, "lora" if lora else "full", n_lora).total
    fpt_fwd = flops_per_token(c, tokens_per_sample, "full").total / 3
    n_evals, val_batches, eval_iters, samples_generated = _validations(ev, train, steps, val_samples, case)
    train_flops = samples * tokens_per_sample * fpt
    eval_flops = eval_iters * world * micro * tokens_per_sample * fpt_fwd
    recompute_flops = samples * tokens_per_sample * fpt_fwd if case.activation_checkpointing else 0.0
    total, emb = count_params(c)
    s_param = parameter_bytes(case.precision)
    trainable = n_lora if lora else total
    # each step reads the weights, gradients and states, and writes the weights and states back
    opt_bytes = steps * (3 * trainable * s_param + 2 * optimizer_state_bytes(case, trainable, s_param))
    quant = bnb_4bit(case)
    weight_bytes = (total - emb) * (four_bit_bytes_per_param(case.quantize) if quant else s_param) + emb * s_param
    gen_bytes = samples_generated * (ev.get("max_new_tokens") or 0) * weight_bytes
    train_iters = run.micro_batches * world
    dequant = _dequantized_bytes(c, total, emb, tokens_per_sample, train_iters, eval_iters) if quant else 0.0
    memory = (opt_bytes + gen_bytes + dequant) / world
    save_bytes, final_save_bytes = checkpoint_bytes(case)
    save_interval = train.get("save_interval")
    return Terms(
        compute_flops=(train_flops + recompute_flops + eval_flops) / world,
        memory_bytes=memory,
        iterations=train_iters / world + eval_iters,
        kernels=kernel_work(case, tokens_per_sample),
        detail={
            "world": world,
            "train_iterations": train_iters / world,
            "eval_iterations": eval_iters,
            "new_tokens": ev.get("max_new_tokens") or 0,
            "weight_bytes": weight_bytes,
            "optimizer_steps": steps,
            "evaluations": n_evals,
            "samples_generated": samples_generated,
            "eval_batches_each": val_batches,
            "train_flops": train_flops,
            "eval_flops": eval_flops,
            "recompute_flops": recompute_flops,
            "optimizer_bytes": opt_bytes,
            "generation_bytes": gen_bytes,
            "dequantization_bytes": dequant,
            "saves": steps // save_interval if save_interval else 0,
            "save_bytes": save_bytes,
            "final_save_bytes": final_save_bytes,
        },
    )


def fit(rows: list[tuple[Terms, float, float, float]]) -> tuple[float, float, float]:
    """(ETA, MU, OVERHEAD_S) by least squares on relative error over (terms, peak FLOP/s, bandwidth B/s, seconds)."""
    import numpy as np  # here, not at the top: `tunelab plan` never fits

    a = np.array([[t.compute_flops / p, t.memory_bytes / b, t.iterations] for t, p, b, _ in rows])
    y = np.array([s for *_, s in rows])
    w = 1.0 / y
    coef, *_ = np.linalg.lstsq(a * w[:, None], y * w, rcond=None)
    inv_eta, inv_mu, over = coef
    return 1.0 / inv_eta, 1.0 / inv_mu, float(over)
