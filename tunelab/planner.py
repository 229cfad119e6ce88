"""Predict peak GPU memory, fit, FLOPs, runtime and energy of a recipe before launch, from arithmetic alone.

Memory model (bytes; P = parameters, s = bytes of the training dtype, N_tok = micro_batch x sequence length):

* weights: P x s (bf16-true 2, 32-true 4; mixed precision keeps fp32 weights, 4). QLoRA: the linear layers in
  NF4, 0.5 byte/param plus one fp32 absmax per 64-weight block (0.0625 byte/param; nf4-dq: 8-bit absmax + fp32
  per 256 blocks), embedding kept in the compute dtype.
* gradients of the trainable parameters: P_train x s_param. Without accumulation they are created during the
  backward pass while activations are freed, so the peak holds max(activations, gradients); with accumulation
  they persist from the first micro batch, so they add.
* optimizer states: AdamW 2 per trainable parameter in the parameter dtype (bf16-true: bf16 states), SGD with
  momentum 1, plain SGD none; bitsandbytes 8-bit Adam 2 bytes; bitsandbytes paged optimizers (litgpt's QLoRA
  PagedAdamW) live in CUDA unified memory, outside torch's allocator (not in "allocated").
* mixed precision: autocast caches a 16-bit copy of every trainable weight during forward (+2 bytes/param).
* activations: what autograd keeps for backward, derived op by op from the model's litgpt Config for any family
  (RMSNorm / LayerNorm, SwiGLU / GeGLU / GELU MLPs, multi-head / grouped / multi-query attention, partial rotary,
  parallel residual, shared and post norms, attention and final-logit softcapping, LoRA's dropout and adapter
  inputs, a frozen embedding's first block): ``tunelab/activations.py``, checked against a real forward of
  litgpt's own model per family (``tunelab plan-families``, ``tunelab plan --measure``). Activation checkpointing
  keeps each block's input (s d per token) plus one block recomputed at a time. Mixed precision (autocast) keeps
  the older LLaMA-shaped approximation (not derived: said in the plan's notes).
* logits and loss: the loss's saved tensors (litgpt's chunked cross-entropy keeps each chunk's log-softmax) plus
  what is alive beside them when backward starts: the logits litgpt's loop still holds and, for full fine-tuning,
  their gradient (3 x N_tok x V x s in all); LoRA's chunked head: 2 x N_tok x V x s.
* QLoRA, from the code (Lightning's BitsandbytesPrecision and litgpt's loading, bitsandbytes 0.50): on one device
  the model is built under ``fabric.init_module`` with every ``torch.nn.Linear`` replaced by an NF4 layer that
  quantizes itself in ``__init__`` on CUDA, and ``load_checkpoint`` streams the memory-mapped weights through a
  load hook that quantizes each one (``weight.to(cuda, float16)`` then ``quantize_4bit``): the bf16 model never sits
  on the GPU, one layer's 16-bit copy at a time does (the measured peak right after loading, 1.3-1.8 GB for
  TinyLlama and 5.6-6.0 GB for OpenLLaMA 7B, is far below the training peak, so loading never sets it). In training,
  ``MatMul4Bit`` keeps only the packed weight for backward (no activation beyond LoRA's), but every forward and
  backward matmul dequantizes its weight to a 16-bit temporary (``dequantize_4bit``, then a cast to the compute
  dtype): the largest is the lm_head (V x d: 0.13 GB for TinyLlama, 0.26 GB for 7B, once per 128-token chunk of
  litgpt's chunked head), which accounts for up to about half of the measured QLoRA extra below; the rest stays a
  measured term (QLORA_EXTRA_BYTES), not attributed to a buffer.
* CUDA context (~0.5 GiB, outside "allocated") and the caching allocator's slack (reserved / allocated, ALLOCATOR_SLACK = 1.05:
  PyTorch typically reserves 5-15% above what it allocates) decide the fit, not the allocated peak alone.

Strategies divide the model states: DDP adds gradient buckets (a second copy of the gradients); FSDP
FULL_SHARD shards weights, gradients and optimizer states (plus one unsharded block in flight), SHARD_GRAD_OP
shards gradients and states, HYBRID_SHARD shards within a node, NO_SHARD is DDP; DeepSpeed ZeRO-1/2/3 shard
states / + gradients / + weights and keep fp32 master weights and fp32 Adam states (12 bytes/param) whatever the
training precision; offload moves optimizer states (and with ZeRO-3 parameters) to host RAM.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path

from tunelab import activations, hardware
from tunelab.flops import count_params, flops_per_token, lora_param_count
from tunelab.settings import accumulation, world_size

GiB = 2**30
CUDA_CONTEXT_BYTES = int(0.5 * GiB)
QLORA_EXTRA_BYTES = int(0.812e9)
QLORA_EXTRA_PER_PARAM = 0.0822
"""QLoRA (bnb.nf4) peaks measured on an NVIDIA H100 (reports/2026-11-23-qlora-memory-h100) sit above the sum of the
other terms by 0.84-1.02 GB for TinyLlama (4 runs: micro 2 and 4, LoRA on all layers and on query/value) and
1.32-1.40 GB for OpenLLaMA 7B (2 runs); refit with `python scripts/fit_qlora_extra.py <unpacked records>` as
0.812 GB + 0.0822 bytes per quantized parameter (worst residual after the fit 0.12 GB). Part of it is not
quantization's: the same LoRA runs without quantization sit 0.32-0.66 GB above the plan too (a LoRA peak term not
yet attributed, also seen as the lab's s10 at -5%); dequantized 16-bit weight temporaries (the module docstring)
account for some of the rest. The load phase does not set the peak (peak allocated at the first training batch:
1.3-1.8 GB for TinyLlama, 5.6-6.0 GB for 7B, against peaks of 3.4-6.8 and 13.4-21.0 GB)."""
ALLOCATOR_SLACK = 1.05


def four_bit_bytes_per_param(quantize: str) -> float:
    """Bytes per quantized weight of bnb.nf4 / bnb.fp4: 4 bits plus one fp32 absmax per 64-weight block; with
    double quantization (``-dq``) the absmax is 8-bit with an fp32 scale per 256 blocks."""
    return 0.5 + (1 / 64 + 4 / (64 * 256) if quantize.endswith("-dq") else 4 / 64)
STRATEGIES = ("single", "ddp", "fsdp", "deepspeed")
SHARDING = ("FULL_SHARD", "SHARD_GRAD_OP", "HYBRID_SHARD", "NO_SHARD")
DEFAULT_MFU_RANGE = (0.25, 0.55)


@dataclass
class PlanInput:
    """Everything the model needs, resolved from a recipe and overrides (or given directly)."""

    config: object
    """litgpt Config of the model."""
    method: str = "full"
    """full, lora or qlora."""
    precision: str = "bf16-true"
    quantize: str | None = None
    micro_batch_size: int = 1
    seq_len: int = 512
    """Sequence length of the peak batch (the recipe's max_seq_length, or the dataset's longest sample)."""
    accumulation: int = 1
    optimizer: str = "AdamW"
    """Optimizer class name (AdamW, SGD, SGD+momentum, bnb AdamW8bit / PagedAdamW)."""
    momentum: float = 0.0
    lora_r: int = 0
    lora_targets: dict = field(default_factory=dict)
    strategy: str = "single"
    devices: int = 1
    num_nodes: int = 1
    sharding: str = "FULL_SHARD"
    zero_stage: int = 3
    offload_optimizer: bool = False
    offload_params: bool = False
    activation_checkpointing: bool = False
    fsdp_wrap: str = "block"
    """FSDP units: 'block' (each transformer block, litgpt's policy) or 'none' (the whole model one unit, Lightning's
    default when no auto_wrap_policy is given: every parameter is gathered for the whole forward and backward)."""
    attention_math: bool = False
    """SDPA falls back to the math kernel (scores materialised): bf16 on a GPU without bf16 (V100, T4)."""


@dataclass
class Plan:
    """The prediction: a breakdown that sums to the peak, the verdict and the throughput projection."""

    model: str
    method: str
    precision: str
    strategy: str
    devices: int
    micro_batch_size: int
    seq_len: int
    params: int
    trainable_params: int
    breakdown_bytes: dict
    """Per-device allocated bytes by component; sums to peak_allocated_bytes."""
    peak_allocated_bytes: int
    """Predicted peak of torch.cuda.max_memory_allocated per device (what litgpt prints as Memory Used)."""
    predicted_reserved_bytes: int
    """peak x allocator slack."""
    cuda_context_bytes: int
    host_ram_bytes: int
    """Host RAM for offloaded states (0 without offload)."""
    gpu: str | None = None
    gpu_memory_bytes: int | None = None
    fits: bool | None = None
    margin_bytes: int | None = None
    """GPU memory left after reserved + context (negative: short by that much)."""
    edge: bool = False
    """The margin is within EDGE_FRACTION of the GPU's memory: fits or not is decided by fragmentation."""
    max_micro_batch_size: int | None = None
    notes: list = field(default_factory=list)

    @property
    def peak_memory_gb(self) -> float:
        return self.peak_allocated_bytes / 1e9

    def to_json(self) -> dict:
        d = asdict(self)
        d["peak_memory_gb"] = round(self.peak_memory_gb, 3)
        d["breakdown_gb"] = {k: round(v / 1e9, 3) for k, v in self.breakdown_bytes.items()}
        d["margin_gb"] = None if self.margin_bytes is None else round(self.margin_bytes / 1e9, 3)
        d["host_ram_gb"] = round(self.host_ram_bytes / 1e9, 3)
        return d


def _dtype_bytes(precision: str) -> int:
    p = str(precision)
    if p.startswith("bf16") or p.startswith("16"):
        return 2
    if p.startswith("64"):
        return 8
    return 4


def _activations_per_token_layer(c, method: str, s: int, ckpt: bool, targets: dict | None = None) -> float:
    """Bytes autograd keeps per token and per transformer block (see the module docstring)."""
    d, inter = c.n_embd, c.intermediate_size
    q_width = c.n_head * c.head_size
    if ckpt:
        return s * d  # only the block input; one block is recomputed at a time (added separately)
    mha = c.n_query_groups == c.n_head
    attn = (7 if mha else 5) * s * q_width
    if method == "full":
        norms = 2 * (4 * d + 4 * d + s * d)
        mlp = 4 * s * inter
        lora = 0
    else:
        norms = 2 * (4 * d)
        mlp = 3 * s * inter
        lora = 0
        t = lambda k: bool((targets or {}).get(k, False))  # noqa: E731
        drop = s + 1  # dropout output + bool mask per element
        lora += drop * d if any(t(k) for k in ("query", "key", "value")) else 0
        lora += drop * q_width if t("projection") else 0
        lora += (2 * drop * d + drop * inter) if t("mlp") else 0
    if c.mlp_class_name not in ("LLaMAMLP", "GemmaMLP"):  # GptNeoxMLP: fc out + gelu out (+ saved input)
        mlp = 2 * s * inter
    return norms + attn + mlp + lora


def predict(x: PlanInput) -> Plan:
    c = x.config
    total, emb = count_params(c)
    s_act = _dtype_bytes(x.precision)
    mixed = "mixed" in str(x.precision)
    s_param = 4 if mixed else _dtype_bytes(x.precision)
    world = world_size(x.devices, x.num_nodes)
    notes = []

    targets: dict = {}
    if x.method in ("lora", "qlora"):
        targets = x.lora_targets or {k: True for k in ("query", "key", "value", "projection", "mlp", "head")}
        trainable = lora_param_count(c, x.lora_r or 8, targets)
    else:
        trainable = total

    # weights
    quantize = x.quantize or ""
    if quantize.startswith(("bnb.nf4", "bnb.fp4")):
        linear = total - emb
        per = four_bit_bytes_per_param(quantize)
        weights = linear * per + emb * s_param
        notes.append(f"{quantize}: linear weights {per:.4f} bytes/param (4-bit + block absmax)")
    elif quantize == "bnb.int8-training":
        weights = (total - emb) * 1.0 + emb * s_param
    else:
        weights = total * s_param  # the base model (LoRA adapters are counted apart)
    lora_weights = trainable * s_param if x.method != "full" else 0
    grads = trainable * s_param
    opt = x.optimizer.split(".")[-1]
    if x.strategy == "deepspeed":
        opt_bytes = trainable * 8  # fp32 Adam moments
        master = trainable * 4 if s_param < 4 else 0
        notes.append("DeepSpeed keeps fp32 master weights and fp32 optimizer states")
    else:
        master = 0
        if "Paged" in opt:
            opt_bytes = 0
            notes.append(f"{opt}: states in CUDA unified memory, outside torch's allocator (not in 'allocated')")
        elif "8bit" in opt:
            opt_bytes = trainable * 2
        elif opt.startswith("Adam") or opt in ("AdamW", "Adam"):
            opt_bytes = trainable * 2 * s_param
        elif opt == "SGD":
            opt_bytes = trainable * s_param if x.momentum else 0
        else:
            opt_bytes = trainable * 2 * s_param
            notes.append(f"optimizer {opt}: assumed 2 states per parameter")
    autocast_cache = trainable * 2 if mixed else 0
    # torch's foreach AdamW (the default on CUDA) allocates one parameter-sized temporary (sqrt of exp_avg_sq)
    # during the step, on top of weights, gradients and states
    step_temp = trainable * s_param if (opt.startswith("Adam") and "8bit" not in opt and "Paged" not in opt
                                        and x.strategy != "deepspeed") else 0

    # activations
    n_tok = x.micro_batch_size * x.seq_len
    kind = "full" if x.method == "full" else "lora"
    if mixed:  # autocast: not derived op by op (LLaMA-shaped approximation, checked on the lab's s5 row only)
        per_layer = _activations_per_token_layer(c, kind, s_act, x.activation_checkpointing, targets)
        acts = per_layer * c.n_layer * n_tok
        if x.activation_checkpointing:  # one block recomputed at a time
            acts += _activations_per_token_layer(c, kind, s_act, False, targets) * n_tok
        logits = n_tok * c.padded_vocab_size * (2 + 4 + 4) if x.method == "full" else \
            2 * n_tok * c.padded_vocab_size * 4
        notes.append("mixed precision: activations from a LLaMA-shaped approximation (autocast is not derived "
                     "op by op; tunelab.activations covers -true precisions)")
    else:  # what autograd keeps, derived from the Config (tunelab/activations.py; measured per family on CPU)
        saved = activations.saved_bytes(c, kind, s_act, x.micro_batch_size, x.seq_len, targets, x.lora_r or 8)
        notes.extend(saved.notes)
        if x.activation_checkpointing:  # block inputs only, plus one block recomputed at a time in backward
            acts = s_act * c.n_embd * n_tok * c.n_layer + saved.per_layer
        else:
            acts = saved.first_layer + saved.per_layer * (c.n_layer - 1)
        # the loss's saved tensors, plus what is alive beside them at the start of backward: the logits (litgpt's
        # loop holds them: full, one tensor; LoRA, the list of 128-token chunks) and, for full fine-tuning, their
        # gradient (the chunked loss's backward concatenates the chunks' gradients into one)
        logits = saved.head + n_tok * c.padded_vocab_size * s_act * (2 if x.method == "full" else 1)
    if x.attention_math and not x.activation_checkpointing:  # softmax(QK^T) kept for backward
        acts += c.n_layer * n_tok * c.n_head * x.seq_len * s_act

    # strategy division of the model states
    shard_w = shard_g = shard_o = 1
    host = 0
    extra = 0
    if x.strategy == "ddp" or (x.strategy == "fsdp" and x.sharding == "NO_SHARD"):
        extra = grads  # gradient buckets
        notes.append("DDP: gradient buckets hold a second copy of the gradients")
    elif x.strategy == "fsdp":
        group = world if x.sharding != "HYBRID_SHARD" else max(1, x.devices)
        if x.sharding in ("FULL_SHARD", "HYBRID_SHARD"):
            shard_w = shard_g = shard_o = group
            block = (total - emb) / c.n_layer
            extra = block * s_param * 2  # one unsharded block's weights + its gradient in flight
            if x.fsdp_wrap == "none":
                extra = weights + lora_weights  # one unit: all parameters gathered through forward and backward
                notes.append("FSDP without auto-wrap: the whole model is one unit, gathered for every step")
        if x.accumulation > 1 and x.sharding != "NO_SHARD":
            extra += grads  # no_sync() during accumulation keeps unsharded gradients
            notes.append("FSDP with gradient accumulation: no_sync() keeps full unsharded gradients")
        elif x.sharding == "SHARD_GRAD_OP":
            shard_g = shard_o = group
    elif x.strategy == "deepspeed":
        if x.zero_stage >= 1:
            shard_o = world
        if x.zero_stage >= 2:
            shard_g = world
        if x.zero_stage >= 3:
            shard_w = world
            block = (total - emb) / c.n_layer
            extra = block * s_param * 2
    weights_dev = weights / shard_w
    lora_w_dev = lora_weights / shard_w
    grads_dev = grads / shard_g
    opt_dev = (opt_bytes + master) / shard_o
    if x.offload_optimizer:
        host += opt_bytes + master + trainable * 4  # states, master weights and fp32 gradients live on the host
        opt_dev = 0
        grads_dev = min(grads_dev, (total - emb) / c.n_layer * s_param * 2)  # gradients stream out per bucket
        notes.append("optimizer offload: states, master weights and their gradients in host RAM")
    if x.offload_params:
        host += weights
        weights_dev = (total - emb) / c.n_layer * s_param * 2
        notes.append("parameter offload: weights in host RAM, two blocks resident at a time")

    step_temp_dev = 0 if x.offload_optimizer else step_temp / shard_o
    qlora_extra = 0
    if quantize.startswith(("bnb.nf4", "bnb.fp4")):
        qlora_extra = QLORA_EXTRA_BYTES + QLORA_EXTRA_PER_PARAM * (total - emb)
        notes.append("QLoRA: + a measured term (bitsandbytes at training time, not attributed to one buffer; fitted "
                     "to 6 QLoRA runs on an H100 by scripts/fit_qlora_extra.py, see QLORA_EXTRA_BYTES)")
    model_states = {"weights": weights_dev, "lora_weights": lora_w_dev, "optimizer_states": opt_dev,
                    "autocast_weight_cache": autocast_cache, "sharding_buffers": extra,
                    "qlora_measured_extra": qlora_extra}
    act_total = acts + logits
    # Two candidate peaks: the end of the forward pass (activations alive) and the optimizer step (gradients and
    # the step's temporary alive). Without accumulation the gradients are created while the activations are
    # freed, so the forward peak does not hold them; with accumulation they persist and add to both.
    forward_peak = act_total + (grads_dev if x.accumulation > 1 else 0)
    step_peak = grads_dev + step_temp_dev
    if forward_peak >= step_peak:
        parts = {"gradients": grads_dev if x.accumulation > 1 else 0, "activations": acts, "logits_and_loss": logits,
                 "optimizer_step_temporary": 0}
    else:
        parts = {"gradients": grads_dev, "activations": 0, "logits_and_loss": 0,
                 "optimizer_step_temporary": step_temp_dev}
        notes.append("the peak is the optimizer step (gradients + the step's temporary), not the forward pass")
    breakdown = {**model_states, **parts}
    breakdown = {k: int(v) for k, v in breakdown.items()}
    peak = sum(breakdown.values())
    return Plan(model=c.name, method=x.method, precision=x.precision, strategy=x.strategy, devices=world,
                micro_batch_size=x.micro_batch_size, seq_len=x.seq_len, params=total, trainable_params=trainable,
                breakdown_bytes=breakdown, peak_allocated_bytes=peak,
                predicted_reserved_bytes=int(peak * ALLOCATOR_SLACK), cuda_context_bytes=CUDA_CONTEXT_BYTES,
                host_ram_bytes=int(host), notes=notes)


EDGE_FRACTION = 0.02
"""A verdict whose margin is within 2% of the GPU's memory is 'at the edge': the caching allocator's fragmentation
decides it, and the planner cannot (measured on an H100: reserved / allocated 1.05-1.40 at the peak of runs that
fit; s1 ran out of memory with 7.84 GiB reserved but unallocated)."""


def verdict(plan: Plan, gpu: hardware.GPU) -> Plan:
    plan.gpu, plan.gpu_memory_bytes = gpu.name, gpu.memory_bytes
    need = plan.predicted_reserved_bytes + plan.cuda_context_bytes
    plan.margin_bytes = gpu.memory_bytes - need
    plan.fits = plan.margin_bytes >= 0
    plan.edge = abs(plan.margin_bytes) <= EDGE_FRACTION * gpu.memory_bytes
    return plan


def max_micro_batch(x: PlanInput, gpu: hardware.GPU, limit: int = 4096) -> int:
    """The largest micro batch whose predicted reserved memory + context fits (0 if even 1 does not)."""
    import dataclasses

    def fits(m):
        return verdict(predict(dataclasses.replace(x, micro_batch_size=m)), gpu).fits

    if not fits(1):
        return 0
    lo, hi = 1, 2
    while hi <= limit and fits(hi):
        lo, hi = hi, hi * 2
    if hi > limit:
        return lo
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo


# ---------------------------------------------------------------------------------------------------------------
# From a recipe


def check_ranges(args: dict) -> None:
    """ValueError naming the key when a count the plan divides or multiplies by is not a positive integer."""
    train = args.get("train") if isinstance(args.get("train"), dict) else {}
    for key, value in (("train.micro_batch_size", train.get("micro_batch_size")),
                       ("train.global_batch_size", train.get("global_batch_size")),
                       ("train.max_seq_length", train.get("max_seq_length")),
                       ("devices", args.get("devices")), ("num_nodes", args.get("num_nodes")),
                       ("lora_r", args.get("lora_r"))):
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{key}: {value!r} must be a positive integer; fix: set --{key} to 1 or more")


def strategy_fields(strategy, world: int) -> dict:
    """PlanInput fields for a configs/strategies file (a StrategyConfig; None: litgpt's own choice, which is one
    device, or FSDP when there are several)."""
    if strategy is None or strategy.name == "single" or (strategy.name == "ddp" and world == 1):
        return {"strategy": "single"}
    if strategy.name == "ddp":
        return {"strategy": "ddp"}
    if strategy.name == "fsdp":
        return {"strategy": "fsdp", "sharding": strategy.sharding_strategy, "fsdp_wrap": strategy.auto_wrap,
                "offload_params": strategy.cpu_offload, "activation_checkpointing": strategy.activation_checkpointing}
    if strategy.name == "fsdp2":  # per-block fully_shard: reshard_after_forward False keeps parameters (ZeRO-2)
        return {"strategy": "fsdp", "sharding": "FULL_SHARD" if strategy.reshard_after_forward else "SHARD_GRAD_OP"}
    if strategy.name == "deepspeed":
        return {"strategy": "deepspeed", "zero_stage": strategy.zero_stage,
                "offload_optimizer": strategy.offload_optimizer, "offload_params": strategy.offload_params}
    raise ValueError(f"strategy {strategy.name!r} has no memory model")


def plan_input_from_args(args: dict, method: str, *, strategy: str = "single", sharding: str = "FULL_SHARD",
                         zero_stage: int = 3, offload_optimizer: bool = False, offload_params: bool = False,
                         activation_checkpointing: bool = False, seq_len: int | None = None,
                         devices: int | None = None, fsdp_wrap: str = "block") -> PlanInput:
    """A PlanInput from litgpt's resolved arguments (see tunelab.validate.check)."""
    from tunelab.flops import load_config

    config = load_config(args["checkpoint_dir"])
    train = args["train"]
    dev = devices or int(args.get("devices") or 1)
    nodes = int(args.get("num_nodes") or 1)
    world = world_size(dev, nodes)
    opt = args.get("optimizer")
    momentum = 0.0
    if isinstance(opt, dict):
        momentum = float((opt.get("init_args") or {}).get("momentum") or 0.0)
        opt = opt.get("class_path", "AdamW")
    quantize = args.get("quantize")
    if quantize and "AdamW" in str(opt):
        opt = "bitsandbytes.optim.PagedAdamW"  # what litgpt builds for quantized training
    if strategy == "single" and world > 1:
        strategy = "fsdp"  # litgpt's own multi-device choice: FSDP for full, FSDP2 (same division) for LoRA
    return PlanInput(
        config=config, method=method, precision=args.get("precision") or "bf16-true", quantize=quantize,
        micro_batch_size=train["micro_batch_size"],
        seq_len=seq_len or min(train.get("max_seq_length") or config.block_size, config.block_size),
        accumulation=accumulation(train["global_batch_size"], world, train["micro_batch_size"]),
        optimizer=str(opt), momentum=momentum, lora_r=int(args.get("lora_r") or 0),
        lora_targets={k[5:]: bool(args[k]) for k in args if k.startswith("lora_") and k not in ("lora_r",
                                                                                                 "lora_alpha",
                                                                                                 "lora_dropout")},
        strategy=strategy, devices=dev, num_nodes=nodes, sharding=sharding, zero_stage=zero_stage,
        offload_optimizer=offload_optimizer, offload_params=offload_params, fsdp_wrap=fsdp_wrap,
        activation_checkpointing=activation_checkpointing or (method != "full" and world > 1))


def longest_sample_tokens(json_path: Path, checkpoint_dir: Path, prompt_style: str = "alpaca") -> int:
    """Token count of the dataset's longest sample with its prompt template (needs the checkpoint's tokenizer)."""
    from litgpt.prompts import PromptStyle
    from litgpt.tokenizer import Tokenizer

    tok = Tokenizer(checkpoint_dir)
    style = PromptStyle.from_name(prompt_style)
    records = json.loads(Path(json_path).read_text(encoding="utf-8"))
    return max(len(tok.encode(style.apply(r["instruction"], input=r.get("input", "")) + r["output"], eos=True))
               for r in records)


# ---------------------------------------------------------------------------------------------------------------
# Time and energy


@dataclass
class Projection:
    tokens: float
    """Tokens to process (padded), all devices."""
    flops_per_token: float
    flops_formula: str
    mfu_low: float
    mfu_high: float
    mfu_source: str
    """Where the MFU range comes from (a default range, or the calibration record)."""
    peak_flops_per_device: float
    seconds_low: float
    seconds_high: float
    power_w: float
    power_source: str
    energy_j_low: float
    energy_j_high: float
    energy_j_per_million_tokens_low: float
    energy_j_per_million_tokens_high: float
    seconds: float | None = None
    """Point estimate of litgpt's "Training Time" for the run (tunelab.runtime: compute + memory-bound work +
    per-iteration overhead, constants fitted on the lab's A100 times), None without the GPU's bandwidth."""
    seconds_band: tuple | None = None
    """seconds x (1 -/+ the estimate's mean absolute leave-one-out error on the lab's rows)."""
    seconds_source: str = ""


def calibration(records_dir: Path, model: str, method: str, precision: str, micro: int):
    """The measured run nearest to this configuration (same model, method and precision first, then micro batch)."""
    from tunelab import record as record_mod

    best, best_key = None, None
    for path in Path(records_dir).rglob("record.json"):
        try:
            rec = record_mod.load(path)
        except (ValueError, OSError):
            continue
        if rec.status != "ok" or rec.mfu is None:
            continue
        key = (rec.model_name != model, rec.method != method, rec.precision != precision,
               abs(math.log2(max(rec.micro_batch_size or 1, 1)) - math.log2(max(micro, 1))))
        if best_key is None or key < best_key:
            best, best_key = (rec, path), key
    return best


def project(x: PlanInput, gpu: hardware.GPU, tokens: float, calibrate_dir: Path | None = None,
            mfu_range: tuple[float, float] = DEFAULT_MFU_RANGE, work=None) -> Projection:
    """The runtime and energy range from an MFU range (or a measured run's MFU), and with ``work`` (the run's
    tunelab.runtime.Terms) the point estimate."""
    n_lora = lora_param_count(x.config, x.lora_r or 8, x.lora_targets) if x.method != "full" else 0
    fpt = flops_per_token(x.config, x.seq_len, "full" if x.method == "full" else "lora", n_lora)
    peak = gpu.peak_flops(x.precision, "high") or 0.0  # litgpt's CLI runs float32 matmuls as TF32
    lo, hi, source = mfu_range[0], mfu_range[1], f"default range {mfu_range[0]:.0%}-{mfu_range[1]:.0%}"
    power, power_source = float(gpu.tdp_w), f"{gpu.name} board power {gpu.tdp_w} W (upper bound, not measured)"
    if calibrate_dir:
        found = calibration(calibrate_dir, x.config.name, x.method, x.precision, x.micro_batch_size)
        if found:
            rec, path = found
            lo = hi = rec.mfu
            source = (f"measured MFU {rec.mfu:.1%} of run {rec.sweep or ''}/{rec.row_id} ({rec.model_name} "
                      f"{rec.method} {rec.precision} micro {rec.micro_batch_size} on {rec.device_name}; {path})")
            if rec.power_mean_w:
                power = rec.power_mean_w / max(rec.device_count, 1)
                power_source = f"measured mean {power:.0f} W per GPU in that run"
    world = world_size(x.devices, x.num_nodes)
    total_flops = fpt.total * tokens
    rate = lambda m: m * peak * world  # noqa: E731
    t_low = total_flops / rate(hi) if peak and hi else float("inf")
    t_high = total_flops / rate(lo) if peak and lo else float("inf")
    e_low, e_high = power * world * t_low, power * world * t_high
    return Projection(tokens=tokens, flops_per_token=fpt.total, flops_formula=fpt.formula, mfu_low=lo, mfu_high=hi,
                      mfu_source=source, peak_flops_per_device=peak, seconds_low=t_low, seconds_high=t_high,
                      power_w=power, power_source=power_source, energy_j_low=e_low, energy_j_high=e_high,
                      energy_j_per_million_tokens_low=e_low / tokens * 1e6 if tokens else 0.0,
                      energy_j_per_million_tokens_high=e_high / tokens * 1e6 if tokens else 0.0,
                      **_point_estimate(work, gpu, peak))


def _point_estimate(work, gpu: hardware.GPU, peak: float) -> dict:
    from tunelab import runtime

    if work is None or not gpu.bandwidth_gbs or not peak:
        return {"seconds_source": "no point estimate: the GPU table has no bandwidth or peak for this precision"
                if work is not None else ""}
    secs = work.seconds(peak, gpu.bandwidth_gbs * 1e9)
    e = runtime.LOO_MEAN_ABS_ERROR
    return {"seconds": secs, "seconds_band": (secs * (1 - e), secs * (1 + e)),
            "seconds_source": (f"tunelab.runtime fitted on the lab's A100 times (leave-one-out error mean "
                               f"{e:.0%}, worst {runtime.LOO_WORST_ERROR:+.0%}); {gpu.name}: "
                               f"{peak / 1e12:.0f} TFLOP/s, "
                               f"{gpu.bandwidth_gbs:.0f} GB/s; {work.detail['optimizer_steps']} optimizer steps, "
                               f"{work.detail['evaluations']} in-loop validations")}
