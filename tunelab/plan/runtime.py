"""Runtime of a litgpt fine-tuning run as a point estimate: what litgpt's "Training Time" contains, term by term.

    seconds = compute FLOPs / (peak FLOP/s x ETA) + memory-bound bytes / (bandwidth x MU) + iterations x OVERHEAD_S

* compute FLOPs: training (the model's matmul FLOPs per padded token, ``tunelab.plan.flops.flops_per_token``, times the
  epoch's padded tokens) and every validation litgpt runs inside its fit loop: the 2-batch sanity check at the
  start, then ``eval.max_iters`` batches (at most the validation set) every ``eval.interval`` optimizer steps, at a
  third of the training FLOPs per token (forward only); with activation checkpointing each training token's
  forward runs again in the backward pass (a third more);
* memory-bound bytes: the optimizer step over the trainable parameters every optimizer step (AdamW reads weights,
  gradients and both moments and writes three of them: 7 x the parameter dtype's bytes; SGD 3 x, with momentum 5 x),
  the sample litgpt generates after each in-loop validation (``eval.max_new_tokens`` decode steps, each reading
  every weight), and for QLoRA the dequantization of every 4-bit weight in each forward and backward matmul
  (0.5 byte read, a 16-bit write, a 16-bit read and the cast's 16-bit write: 6.5 bytes per weight; the lm_head
  once per 128-token chunk of litgpt's chunked head);
* iterations: micro-batch iterations of training and validation (host work per iteration: Python, data loading,
  kernel launches).

ETA, MU and OVERHEAD_S are fitted once, by least squares on relative error, to the lab's own A100 times (rows
s2-s7 and s10-s14 of configs/sweeps/lab-part1.yaml under the lab's eval settings, :data:`LAB_EVAL`);
``tunelab plan-accuracy`` refits them leaving each row out in turn and reports that error. Other GPUs get the same
constants through their own peak FLOP/s and bandwidth (configs/hardware/gpus.yaml): a transfer, not a measurement.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from tunelab.models import count_params, lora_param_count
from tunelab.plan.flops import flops_per_token
from tunelab.plan.memory import dtype_bytes, four_bit_bytes_per_param

ETA = 0.6040
"""Fraction of the dense peak FLOP/s the matmul work reaches (fitted: see the module docstring)."""
MU = 0.2774
"""Fraction of the peak memory bandwidth the memory-bound work reaches (fitted)."""
OVERHEAD_S = 0.0716
"""Seconds of host work per micro-batch iteration (fitted)."""
LOO_MEAN_ABS_ERROR = 0.114
"""Mean absolute leave-one-out error of the estimate over the lab's rows (tunelab plan-accuracy recomputes it)."""
LOO_WORST_ERROR = -0.383
"""The worst leave-one-out error (s13, the one QLoRA row: without it the memory-bound constant is poorly held)."""
LAB_EVAL = {"eval.interval": 25, "eval.max_iters": 100, "eval.max_new_tokens": 100, "eval.initial_validation": False}
"""The lab's eval settings (its YAMLs): what its "Training Time" figures contain."""


@dataclass
class Terms:
    """A run's work: FLOPs at the compute rate, bytes at the memory rate, iterations at the host overhead."""

    compute_flops: float
    memory_bytes: float
    iterations: float
    detail: dict
    comm: object = None
    """The communication of one optimizer step (:class:`tunelab.plan.comm.Comm`), None on one device."""

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
            + self.comm_seconds(compute)
        )

    def comm_seconds(self, compute_s: float) -> float:
        """Seconds of communication over the run left exposed, given the run's ``compute_s``: each optimizer step
        adds what its traffic takes beyond the compute it overlaps (tunelab.plan.comm)."""
        steps = self.detail.get("optimizer_steps") or 0
        if self.comm is None or not steps:
            return 0.0
        return steps * self.comm.exposed(compute_s / steps)


def terms(x, args: dict, train_samples: int, val_samples: int, tokens_per_sample: float) -> Terms:
    """The run's work (see the module docstring) for a PlanInput ``x`` and litgpt's resolved ``args``."""
    c = x.config
    train, ev = args["train"], args.get("eval") or {}
    world = x.world
    micro, gbs = x.micro_batch_size, train.get("global_batch_size") or x.micro_batch_size
    epochs = train.get("epochs") or 1
    samples = train_samples * epochs
    steps = samples // gbs
    if train.get("max_steps"):
        steps = min(steps, train["max_steps"])
        samples = min(samples, steps * gbs)
    lora = x.lora
    n_lora = lora_param_count(c, x.lora_r, x.lora_targets) if lora else 0
    fpt = flops_per_token(c, tokens_per_sample, "lora" if lora else "full", n_lora).total
    fpt_fwd = flops_per_token(c, tokens_per_sample, "full").total / 3
    interval = ev.get("interval") or 10**9
    n_evals = steps // interval
    val_batches = min(ev.get("max_iters") or 100, math.ceil(val_samples / micro))
    eval_iters = 2 + n_evals * val_batches  # the sanity check, then each in-loop validation
    train_flops = samples * tokens_per_sample * fpt
    eval_flops = eval_iters * micro * tokens_per_sample * fpt_fwd
    recompute_flops = samples * tokens_per_sample * fpt_fwd if x.activation_checkpointing else 0.0
    total, emb = count_params(c)
    s_param = 4 if "mixed" in str(x.precision) else dtype_bytes(x.precision)
    trainable = n_lora if lora else total
    opt = x.optimizer.split(".")[-1]
    per_param = 7 if opt.startswith("Adam") else (5 if x.momentum else 3)
    opt_bytes = steps * trainable * per_param * s_param
    quant = str(x.quantize or "").startswith(("bnb.nf4", "bnb.fp4"))
    weight_bytes = (total - emb) * (four_bit_bytes_per_param(x.quantize) if quant else s_param) + emb * s_param
    gen_bytes = n_evals * (ev.get("max_new_tokens") or 0) * weight_bytes
    dequant = 0.0
    train_iters = samples / micro
    if quant:
        head = c.padded_vocab_size * c.n_embd
        chunks = math.ceil(tokens_per_sample / 128)
        per_train_iter = 2 * ((total - emb - head) + head * chunks) * 6.5
        per_eval_iter = ((total - emb - head) + head) * 6.5
        dequant = train_iters * per_train_iter + eval_iters * per_eval_iter
    memory = (opt_bytes + gen_bytes + dequant) / world
    return Terms(
        compute_flops=(train_flops + recompute_flops + eval_flops) / world,
        memory_bytes=memory,
        iterations=(train_iters + eval_iters) / world,
        detail={
            "optimizer_steps": steps,
            "evaluations": n_evals,
            "eval_batches_each": val_batches,
            "train_flops": train_flops,
            "eval_flops": eval_flops,
            "recompute_flops": recompute_flops,
            "optimizer_bytes": opt_bytes,
            "generation_bytes": gen_bytes,
            "dequantization_bytes": dequant,
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
