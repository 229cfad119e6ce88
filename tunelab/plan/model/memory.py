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
  PagedAdamW) keep the states of tensors from 1e5 elements in CUDA unified memory, outside torch's allocator (not
  in "allocated"), and smaller tensors' states (most LoRA adapters) on the device.
* mixed precision: autocast's 16-bit weight copies alive from the forward until backward has used them
  (``autocast_weight_copies``: every linear weight for full fine-tuning; LoRA: every frozen block weight, one
  lm_head copy per 128-token chunk, the adapters).
* activations: what autograd keeps for backward, derived op by op from the model's litgpt Config for any family
  (RMSNorm / LayerNorm, SwiGLU / GeGLU / GELU MLPs, multi-head / grouped / multi-query attention, partial rotary,
  parallel residual, shared and post norms, attention and final-logit softcapping, LoRA's dropout and adapter
  inputs, a frozen embedding's first block): ``tunelab/plan/model/activations.py``, checked against a real forward of
  litgpt's own model per family (``tunelab plan-families``, ``tunelab plan --measure``). Activation checkpointing
  keeps each block's input (s d per token; fp32 under mixed precision) plus one block recomputed at a time. Mixed
  precision is derived the same way, per tensor dtype (fp32 residual stream and norms, 16-bit matmuls).
* logits and loss: the loss's saved tensors (litgpt's chunked cross-entropy keeps each chunk's log-softmax) plus
  what is alive beside them when backward starts: the logits litgpt's loop still holds and, for full fine-tuning,
  their gradient (3 x N_tok x V x s in all); LoRA's chunked head: 2 x N_tok x V x s plus the loss backward's
  chunk gradients. The logits are fp32 (s = 4 here) under every precision in litgpt's scripts: Lightning Fabric's
  precision plugins convert the model's outputs to fp32, bf16-true included (tunelab's own multi-device loop does
  not: the compute dtype there).
* QLoRA, from the code (Lightning's BitsandbytesPrecision and litgpt's loading, bitsandbytes 0.50): on one device
  the model is built under ``fabric.init_module`` with every ``torch.nn.Linear`` replaced by an NF4 layer that
  quantizes itself in ``__init__`` on CUDA, and ``load_checkpoint`` streams the memory-mapped weights through a
  load hook that quantizes each one (``weight.to(cuda, float16)`` then ``quantize_4bit``): the bf16 model never sits
  on the GPU, one layer's 16-bit copy at a time does (the measured peak right after loading, 1.3-1.8 GB for
  TinyLlama and 5.6-6.0 GB for OpenLLaMA 7B, is far below the training peak, so loading never sets it). In training,
  ``MatMul4Bit`` keeps only the packed weight for backward (no activation beyond LoRA's); every forward matmul
  dequantizes its weight to a 16-bit temporary and every backward one to fp16 and then a compute-dtype copy
  (``dequantized_weight_temporary``: lm_head's, 2 x 0.13 GB for TinyLlama, 2 x 0.26 GB for 7B, sets the peak);
  PagedAdamW keeps the states of tensors under 1e5 elements on the device (``paged_optimizer_device_states``);
  litgpt's script swaps the embedding for bitsandbytes' ``StableEmbedding`` after building the optimizer: the old
  one stays referenced, the new one trains outside the optimizer (``stable_embedding_states``). No measured
  constant: these causes leave the H100's QLoRA runs as close to the plan as its LoRA runs without quantization.
* CUDA context (~0.5 GiB, outside "allocated") and the caching allocator's slack (reserved / allocated, ALLOCATOR_SLACK = 1.05:
  PyTorch typically reserves 5-15% above what it allocates) decide the fit, not the allocated peak alone.

Strategies divide the model states: DDP adds gradient buckets (a second copy of the gradients); FSDP
FULL_SHARD shards weights, gradients and optimizer states (plus one unsharded block in flight), SHARD_GRAD_OP
shards gradients and states, HYBRID_SHARD shards within a node, NO_SHARD is DDP; DeepSpeed ZeRO-1/2/3 shard
states / + gradients / + weights and keep fp32 master weights and fp32 Adam states (12 bytes/param) whatever the
training precision; offload moves optimizer states (and with ZeRO-3 parameters) to host RAM.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import asdict, dataclass, field
from typing import NamedTuple

from tunelab import hardware
from tunelab.models import count_params, lora_param_count, lora_tensor_numels, param_tensor_numels
from tunelab.plan.model import activations
from tunelab.plan.model.tables import compiled_supported, tables_of
from tunelab.settings import LITGPT_LORA_R, LORA_TARGETS, world_size
from tunelab.units import GB, GIB, to_gb

CUDA_CONTEXT_BYTES = int(0.5 * GIB)
"""The CUDA context a process holds outside torch's allocator (outside "allocated" and "reserved")."""
ALLOCATOR_SLACK = 1.05
"""Reserved / allocated at the peak: the caching allocator keeps some blocks it cannot reuse (5-15% typically)."""
EDGE_FRACTION = 0.02
"""A verdict whose margin is within 2% of the GPU's memory is 'at the edge': the caching allocator's fragmentation
decides it, and the planner cannot (measured on an H100: reserved / allocated 1.05-1.40 at the peak of runs that
fit; s1 ran out of memory with 7.84 GiB reserved but unallocated)."""
ALLOCATOR_HEADROOM = 0.10
"""Fraction of the GPU's memory a configuration chosen for speed leaves above its predicted peak allocated. Past
it the caching allocator retries (frees its cache, calls cudaMalloc again) and throughput drops although the run
fits: measured on the H100 (evidence ``h100-part3``, ``reports/evidence.yaml``), retries began at 75.2 GB allocated of 85.0 GB (FSDP,
micro 42 of the 47 that fit: 88%) and at 78.5 GB (with activation checkpointing, micro 244: 92%); micro 47 ran at
82% of the best throughput with 26 retries. ``tunelab advise`` ranks only configurations within it
(``--headroom``)."""
STRATEGIES = ("single", "ddp", "fsdp", "deepspeed")
"""How the model states are divided (what :func:`predict` models)."""
SHARDING = ("FULL_SHARD", "SHARD_GRAD_OP", "HYBRID_SHARD", "NO_SHARD")
"""FSDP sharding strategies."""


def dtype_bytes(precision: str) -> int:
    """Bytes per element of a Lightning precision's training dtype (bf16 / 16: 2, 64: 8, else 4)."""
    p = str(precision)
    if p.startswith("bf16") or p.startswith("16"):
        return 2
    if p.startswith("64"):
        return 8
    return 4


def parameter_bytes(precision: str) -> int:
    """Bytes per parameter element under a Lightning precision: float32 under mixed precision (the weights stay
    float32, the compute is 16-bit), else the training dtype's (:func:`dtype_bytes`)."""
    return 4 if "mixed" in str(precision) else dtype_bytes(precision)


def block_params(config) -> float:
    """One transformer block's parameters: all of them less the root unit's (:func:`root_unit_params`), over the
    depth."""
    return (count_params(config)[0] - root_unit_params(config)) / config.n_layer


def last_chunk_tokens(seq_len: int) -> int:
    """Positions in the last of litgpt's 128-token head chunks (:data:`LM_HEAD_CHUNK`) of a ``seq_len`` sequence."""
    return seq_len - (math.ceil(seq_len / LM_HEAD_CHUNK) - 1) * LM_HEAD_CHUNK


def four_bit_bytes_per_param(quantize: str) -> float:
    """Bytes per quantized weight of bnb.nf4 / bnb.fp4: 4 bits plus one fp32 absmax per 64-weight block; with
    double quantization (``-dq``) the absmax is 8-bit with an fp32 scale per 256 blocks."""
    return 0.5 + (1 / 64 + 4 / (64 * 256) if quantize.endswith("-dq") else 4 / 64)


@dataclass
class PlanInput:
    """Everything the model needs (built from a recipe's Settings by tunelab.plan.recipe, or given directly)."""

    config: object
    """litgpt Config of the model."""
    method: str = "full"
    """full, lora or qlora."""
    precision: str = "bf16-true"
    """Lightning precision string."""
    quantize: str | None = None
    """bitsandbytes quantization (bnb.nf4, ...) or None."""
    micro_batch_size: int = 1
    """Samples per device per forward/backward."""
    seq_len: int = 512
    """Sequence length of the peak batch (the recipe's max_seq_length, or the dataset's longest sample)."""
    accumulation: int = 1
    """Micro batches per optimizer step per device."""
    optimizer: str = "AdamW"
    """Optimizer class name as built (AdamW, SGD, bnb AdamW8bit / PagedAdamW; QLoRA: PagedAdamW)."""
    momentum: float = 0.0
    """SGD momentum (an SGD with momentum keeps one state per parameter)."""
    lora_r: int = LITGPT_LORA_R
    """LoRA rank (litgpt's default 8)."""
    lora_targets: tuple = LORA_TARGETS
    """Names of the LoRA targets that are on (tunelab.settings.LORA_TARGETS)."""
    strategy: str = "single"
    """One of STRATEGIES."""
    devices: int = 1
    """Devices per node."""
    num_nodes: int = 1
    """Nodes."""
    sharding: str = "FULL_SHARD"
    """FSDP sharding strategy (SHARDING)."""
    zero_stage: int = 3
    """DeepSpeed ZeRO stage."""
    reduce_bucket_size: int = 200_000_000
    """DeepSpeed's ``reduce_bucket_size`` (elements; a strategy file's key, 2e8 as in Lightning's DeepSpeed
    strategy): ZeRO-2 and ZeRO-3 allocate a gradient reduce buffer of this many elements whatever the model's size
    (:func:`zero_reduce_buffer`)."""
    allgather_bucket_size: int = 200_000_000
    """DeepSpeed's ``allgather_bucket_size`` (elements; a strategy file's key): ZeRO-2's parameter all-gather after
    the step runs in buckets of this size (:mod:`tunelab.plan.model.comm` counts its calls)."""
    zero3_max_live_parameters: int = 1_000_000_000
    """DeepSpeed's ``stage3_max_live_parameters`` (elements; a strategy file's ``max_live_parameters``, DeepSpeed's
    default 1e9): with the reuse distance, how many parameters ZeRO-3 holds gathered when the forward turns into
    the backward (:func:`zero3_gathered`)."""
    zero3_max_reuse_distance: int = 1_000_000_000
    """DeepSpeed's ``stage3_max_reuse_distance`` (elements; a strategy file's ``max_reuse_distance``, DeepSpeed's
    default 1e9): a parameter used again within this many parameters' fetches is not released
    (:func:`zero3_gathered`)."""
    zero3_param_persistence_threshold: int = 100_000
    """DeepSpeed's ``stage3_param_persistence_threshold`` (elements; its default 1e5): ZeRO-3 keeps a parameter
    tensor smaller than this whole on every rank, never partitioned nor gathered (norms, LoRA's matrices)
    (:func:`zero3_tensors`)."""
    offload_optimizer: bool = False
    """Optimizer states (and master weights) in host RAM."""
    offload_params: bool = False
    """Parameters in host RAM."""
    activation_checkpointing: bool = False
    """Keep only each block's input; recompute one block at a time in backward."""
    fsdp_root_kept: bool = False
    """FSDP1 (``name: fsdp``): the root unit (everything outside the blocks) is not freed after forward, so it is
    gathered once per micro batch, not again for backward (traced: :mod:`tunelab.plan.trace.ranks`); FSDP2: the next field."""
    fsdp2_root_kept: bool = False
    """FSDP2 whose root was sharded with torch's default ``reshard_after_forward=None`` (litgpt's LoRA
    ``parallelize_fn``): since torch 2.8 the root stays unsharded from its forward to the end of backward, gathered
    once per micro batch like FSDP1's (traced: :mod:`tunelab.plan.trace.ranks`); False: resharded after forward and
    gathered again for backward (a strategy file's ``reshard_after_forward: true``)."""
    ddp_bucket_mb: int = 25
    """DDP's ``bucket_cap_mb`` (a strategy file's key; torch's default 25): how many all-reduce calls a step makes."""
    fsdp_wrap: str = "block"
    """FSDP units: 'block' (each transformer block, litgpt's policy) or 'none' (the whole model one unit, Lightning's
    default when no auto_wrap_policy is given: every parameter is gathered for the whole forward and backward)."""
    attention_math: bool = False
    """SDPA falls back to the math kernel (scores materialised): bf16 on a GPU without bf16 (V100, T4)."""
    fused_optimizer: bool = False
    """torch's fused Adam/AdamW kernel updates in place: no parameter-sized temporary during the step."""
    fabric: bool = True
    """The run is litgpt's own script under Lightning Fabric, whose precision plugins convert the model's outputs
    (the logits) to fp32 under every precision, and whose loop holds the logits through the optimizer step; False:
    tunelab's loop (a strategies file), whose loss casts the logits to fp32 itself and drops them after backward."""
    fused_loss: bool = False
    """tunelab's loop with Liger's fused linear cross-entropy (a strategy's ``liger``): the head's logits are never
    materialised; the fused loss keeps the gradients of its input and of the head weight from forward to backward
    (:func:`liger_loss_bytes`)."""
    loss_read_interval: int = 1
    """Iterations between reads of the loss to the host (a strategy's ``log_interval``; litgpt reads it every
    iteration): between reads the host queues kernels ahead of the GPU (:mod:`tunelab.plan.model.fast_step`)."""
    compiled: bool = False
    """Transformer blocks compiled (torch.compile, a strategy's ``compile: blocks``): what each block keeps is what
    torch's partitioner saves (:mod:`tunelab.plan.trace.compiled`, traced), not eager autograd's; planned as eager (an
    upper bound) under mixed precision, activation checkpointing, QLoRA and math attention."""
    tables: object = None
    """The traced tables the model reads (:class:`tunelab.plan.model.tables.Tables`; the planner passes
    :data:`tunelab.plan.trace.tables.TRACED`): kernel templates, compiled blocks, DDP's buckets. None: a case the
    model can plan without them (memory of eager blocks, any strategy but DDP)."""

    @property
    def world(self) -> int:
        return world_size(self.devices, self.num_nodes)

    @property
    def lora(self) -> bool:
        return self.method != "full"


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
    """Host RAM for offloaded states per device (rank), at its peak (0 without offload)."""
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
        return self.peak_allocated_bytes / GB

    def to_json(self) -> dict:
        d = asdict(self)
        d["peak_memory_gb"] = round(self.peak_memory_gb, 3)
        d["breakdown_gb"] = {k: to_gb(v, 3) for k, v in self.breakdown_bytes.items()}
        d["margin_gb"] = to_gb(self.margin_bytes, 3)
        d["host_ram_gb"] = to_gb(self.host_ram_bytes, 3)
        return d


@dataclass
class ModelStates:
    """The model states of one configuration before they are divided among devices (bytes, all devices)."""

    total: int
    """All parameters."""
    emb: int
    """Token-embedding parameters."""
    trainable: int
    weights: float
    lora_weights: float
    grads: float
    optimizer: float
    """Optimizer states (AdamW moments, ...)."""
    master: float
    """fp32 master weights (DeepSpeed)."""
    step_temp: float
    """The optimizer step's temporary (torch's foreach AdamW: one parameter-sized buffer)."""
    autocast_cache: float
    """Mixed precision: autocast's 16-bit copies of the matmul weights (:func:`autocast_weight_copies`)."""
    s_param: int
    """Bytes per parameter element."""
    s_gathered: float
    """Bytes per element of a gathered parameter or an unsharded gradient on the device: ``s_param``, or under
    litgpt's own FSDP1 at 16-bit mixed precision half of it (:func:`fsdp1_unsharded_scale`)."""


def _optimizer_states(x: PlanInput, opt: str, trainable: int, s_param: int, notes: list) -> tuple[float, float]:
    """(optimizer states, master weights) in bytes before any division: DeepSpeed's float32 moments and master
    weights, a paged optimizer's device-resident states, else the optimizer's own states."""
    if x.strategy == "deepspeed":
        notes.append("DeepSpeed keeps fp32 master weights and fp32 optimizer states")
        return trainable * 8, (trainable * 4 if s_param < 4 else 0)  # fp32 Adam moments; fp32 master weights
    if "Paged" in opt:
        notes.append(
            f"{opt}: states of tensors from {PAGED_MIN_NUMEL:,} elements in CUDA unified memory, outside torch's "
            "allocator (not in 'allocated'); smaller tensors' states are ordinary device memory"
        )
        return paged_optimizer_device_states(x), 0
    if not opt.startswith("Adam") and opt != "SGD" and "8bit" not in opt:
        notes.append(f"optimizer {opt}: assumed 2 states per parameter")
    return optimizer_state_bytes(opt, trainable, s_param, x.momentum), 0


def model_states(x: PlanInput, notes: list) -> ModelStates:
    """Step 1: weights (quantized or not), gradients, optimizer states, master weights, step temporaries."""
    c = x.config
    total, emb = count_params(c)
    s_param = zero_param_bytes(x) if x.strategy == "deepspeed" else parameter_bytes(x.precision)
    trainable = lora_param_count(c, x.lora_r, x.lora_targets) if x.lora else total
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
    lora_weights = trainable * s_param if x.lora else 0
    grads = trainable * s_param
    opt = x.optimizer.split(".")[-1]
    opt_bytes, master = _optimizer_states(x, opt, trainable, s_param, notes)
    # torch's foreach AdamW (the default on CUDA) allocates one parameter-sized temporary (sqrt of exp_avg_sq)
    # during the step, on top of weights, gradients and states
    step_temp = (
        trainable * s_param
        if (
            opt.startswith("Adam")
            and "8bit" not in opt
            and "Paged" not in opt
            and x.strategy != "deepspeed"
            and not x.fused_optimizer
        )
        else 0
    )
    if x.fused_optimizer and opt.startswith("Adam"):
        notes.append("fused AdamW: the update runs in place, no parameter-sized temporary")
    return ModelStates(
        total=total,
        emb=emb,
        trainable=trainable,
        weights=weights,
        lora_weights=lora_weights,
        grads=grads,
        optimizer=opt_bytes,
        master=master,
        step_temp=step_temp,
        autocast_cache=autocast_weight_copies(x) if autocast_over_fp32_weights(x) else 0,
        s_param=s_param,
        s_gathered=s_param * fsdp1_unsharded_scale(x),
    )


def optimizer_state_bytes(opt: str, trainable: int, s_param: int, momentum: float = 0.0) -> float:
    """Bytes of an optimizer's states over ``trainable`` parameters, wherever they live: bitsandbytes' 8-bit
    optimizers 2 (two 1-byte states), Adam/AdamW two states in the parameter dtype (``s_param`` bytes each), SGD one
    with momentum and none without; any other optimizer is taken as Adam-like (two states)."""
    if "8bit" in opt:
        return trainable * 2
    if opt == "SGD":
        return trainable * s_param if momentum else 0
    return trainable * 2 * s_param


def autocast_over_fp32_weights(x: PlanInput) -> bool:
    """Mixed precision as autocast over fp32 weights (one device, DDP): activations in per-tensor dtypes and
    autocast's weight copies. Under FSDP (``MixedPrecision(param_dtype=bfloat16)``, Lightning's FSDPPrecision) and
    DeepSpeed (``bf16.enabled``) the weights the forward sees are already 16-bit: activations as at 16-bit -true,
    no autocast copies; the outputs are still converted to fp32. litgpt's LoRA on several devices is FSDP2 under
    Fabric's ModelParallelStrategy, which takes the ordinary MixedPrecision plugin (no FSDP mixed-precision policy):
    fp32 weights gathered, autocast over them."""
    if x.strategy == "fsdp" and x.fsdp2_root_kept and x.fabric:
        return "mixed" in str(x.precision)
    return "mixed" in str(x.precision) and x.strategy not in ("fsdp", "deepspeed")


PAGED_MIN_NUMEL = 100_000
"""bitsandbytes pages an optimizer state only for a tensor of at least this many elements
(``Optimizer8bit.get_state_buffer``: ``p.numel() < 1e5`` gets ``torch.zeros_like``, ordinary device memory)."""


def paged_optimizer_device_states(x: PlanInput) -> float:
    """Bytes of a paged optimizer's states that are ordinary device memory: the states of trainable tensors under
    :data:`PAGED_MIN_NUMEL` elements. PagedAdamW keeps two fp32 states (8 bytes per element); the 8-bit one keeps two
    uint8 states (2 bytes) for tensors from 4096 elements (``min_8bit_size``), fp32 below. Under LoRA nearly every
    adapter tensor is small (r x width), so nearly all LoRA states stay on the device; full fine-tuning's small
    tensors are the norm weights and biases (not counted: kilobytes per block)."""
    if not x.lora:
        return 0
    small = [n for n in lora_tensor_numels(x.config, x.lora_r, x.lora_targets) if n < PAGED_MIN_NUMEL]
    if "8bit" in str(x.optimizer):
        return sum(8 * n if n < 4096 else 2 * n for n in small)
    return 8 * sum(small)


def autocast_weight_copies(x: PlanInput) -> float:
    """Bytes of the 16-bit weight copies autocast makes under mixed precision, alive from the forward until backward
    has used them. Autocast casts each matmul's fp32 weight to 16 bits; it caches the copy of a weight that requires
    grad (one per forward) but casts a frozen one at every call, and the graph keeps each copy for the input's
    gradient. So full fine-tuning keeps one copy of every linear weight (lm_head included, the embedding not: it is
    a lookup), and LoRA one copy of each frozen block weight, one of lm_head per 128-token chunk litgpt's loop
    calls it for, and one of the adapters. Seen in the simulated step (tunelab/plan/trace/simulate.py): the difference
    between bf16-mixed and bf16-true LoRA is 2 x the block weights + one lm_head copy per chunk, to 0.2%. With a
    fused loss (Liger's) LoRA's head weight (frozen, or ``[W, B]`` made by concatenation: no leaf) is cast again
    for every chunk and not kept (:func:`liger_loss_bytes` counts the one alive); full fine-tuning's trainable head
    weight is cached as before."""
    c = x.config
    total, emb = count_params(c)
    head = c.padded_vocab_size * c.n_embd
    if not x.lora:
        return 2 * (total - emb)
    # LoRA under activation checkpointing: a block's forward keeps nothing (its recompute casts one block again in
    # backward), so only the head's copies stay (per-rank simulation, litgpt's LoRA at bf16-mixed on several
    # devices). Full fine-tuning's copies sit in autocast's cache until the forward ends, checkpointed or not.
    checkpointed = x.activation_checkpointing
    blocks = 0 if checkpointed else total - emb - head + lora_param_count(c, x.lora_r, x.lora_targets)
    chunks = 0 if x.fused_loss else math.ceil(x.seq_len / LM_HEAD_CHUNK)
    return 2 * blocks + 2 * head * chunks


def _activations(x: PlanInput, notes: list) -> tuple[float, float]:
    """Step 2: (activations, logits and loss) per device at the end of the forward pass."""
    c = x.config
    s_act = dtype_bytes(x.precision)  # the compute dtype (16-bit under mixed precision)
    mixed = autocast_over_fp32_weights(x)
    s_logits = logits_bytes(x)
    n_tok = x.micro_batch_size * x.seq_len
    # what autograd keeps, derived from the Config (tunelab/plan/model/activations.py; measured per family on CPU)
    kind = "lora" if x.lora else "full"
    efficient = s_act == 4 and not x.attention_math  # fp32 attention: CUDA's memory-efficient kernel, not flash
    saved = activations.saved_bytes(
        c,
        kind,
        s_act,
        x.micro_batch_size,
        x.seq_len,
        x.lora_targets,
        x.lora_r,
        mixed=mixed,
        logits_bytes=s_logits,
        attention_output_view=efficient,
        flash_pad=not (efficient or x.attention_math) and c.head_size % 8 != 0,
        frozen_weights_grad=fsdp1_lora(x),
    )
    notes.extend(saved.notes)
    traced = (
        x.compiled
        and compiled_supported(x.precision)
        and not (x.activation_checkpointing or bnb_quantized(x) or x.attention_math)
    )
    if x.activation_checkpointing:  # block inputs only, plus one block recomputed at a time in backward
        acts = checkpointed_inputs(x) + saved.per_layer
    elif traced:  # what torch.compile's partitioner keeps per block (traced once, bytes per token)
        args = (c, kind, str(x.precision), x.lora_r, tuple(x.lora_targets) if x.lora else ())
        first = tables_of(x).compiled_saved_bytes(*args, input_grad=not x.lora) * n_tok
        acts = first + tables_of(x).compiled_saved_bytes(*args) * n_tok * (c.n_layer - 1)
        notes.append(
            "compiled blocks: each block keeps what torch.compile's partitioner saves (tunelab/plan/trace/compiled.py, "
            f"traced: {acts / c.n_layer / GB:.2f} GB per block where eager keeps {saved.per_layer / GB:.2f})"
        )
    else:
        acts = saved.first_layer + saved.per_layer * (c.n_layer - 1)
    if x.compiled and not traced:
        notes.append("compiled blocks: activations planned as eager here (an upper bound: inductor saves less)")
    if bnb_quantized(x):  # QLoRA's trainable StableEmbedding: its norm keeps its input (and mean and rstd), and the
        # first block's input carries a gradient, so it keeps what the others keep (stable_embedding_states)
        acts += (s_act * c.n_embd + 8) * n_tok + (
            0 if x.activation_checkpointing else saved.per_layer - saved.first_layer
        )
    if x.fused_loss:
        logits = saved.head_norm + liger_loss_bytes(x)
        notes.append("Liger's fused linear cross-entropy: the logits are never materialised (liger_loss_bytes)")
    else:
        logits = _logits_and_loss(x, saved.head, s_logits, n_tok)
    if x.attention_math and not x.activation_checkpointing:  # softmax(QK^T) kept for backward
        acts += c.n_layer * n_tok * c.n_head * x.seq_len * s_act
    return acts, logits


def checkpointed_inputs(x: PlanInput) -> float:
    """Bytes activation checkpointing keeps per block, for every block: its input (fp32 under autocast over fp32
    weights, else the compute dtype), micro batch x sequence x embedding; a block recomputed in backward adds its
    own activations for a while."""
    s = 4 if autocast_over_fp32_weights(x) else dtype_bytes(x.precision)
    return s * x.config.n_embd * x.micro_batch_size * x.seq_len * x.config.n_layer


def _logits_and_loss(x: PlanInput, head: float, s_logits: int, n_tok: int) -> float:
    """The head and loss at their peak without a fused loss: what the loss saved (``head``) and what is alive beside
    it (as the simulated step shows, :mod:`tunelab.plan.trace.simulate`):

    * full fine-tuning: the logits and one more logits-sized tensor: in litgpt's loop, which holds the logits, their
      gradient (the chunked loss's backward concatenates the chunks' gradients into one); in tunelab's loop, whose
      loss function drops them on return, the copy ``reshape`` makes of their shifted slice, inside the loss;
    * LoRA, litgpt's loop: the list of 128-token chunks it holds, and the loss backward's temporaries beside them
      (:func:`lora_loss_backward_temporaries`);
    * LoRA, tunelab's loop: the larger of the chunks with the copy ``reshape`` makes of the last one's shifted slice
      (the end of the loss's forward) and the backward's temporaries (the chunks gone by then)."""
    c = x.config
    logits = n_tok * c.padded_vocab_size * s_logits
    if not x.lora:
        return head + 2 * logits
    temporaries = lora_loss_backward_temporaries(x, s_logits)
    if x.fabric:
        return head + logits + temporaries
    last = last_chunk_tokens(x.seq_len)
    return head + max(logits + (last - 1) * x.micro_batch_size * c.padded_vocab_size * s_logits, temporaries)


def liger_loss_bytes(x: PlanInput) -> float:
    """Bytes Liger's fused linear cross-entropy holds at its peak, the last chunk of its forward (beside the final
    norm's saved tensors), as its code allocates (``tunelab.plan.trace.simulate._liger_loss_standin``): the final norm's
    output ``h`` (positions x hidden, the residual stream's dtype), the loss's input (a copy of ``h`` without the
    last position; with a LoRA head, ``[h, adapter]`` made by concatenation, hidden + r columns), the gradient of
    that input, the gradient of the head weight when it trains (full fine-tuning; a LoRA head: the concatenated
    ``[W, B]`` too), one chunk's logits (:func:`liger_chunk_rows` x vocabulary, the compute dtype) and its product
    with the weight; under bf16-mixed, autocast's 16-bit copy of the transposed head weight that chunk's first
    matmul made (a view is never cached; the second matmul's copy of a trainable leaf weight is, and is counted
    with the autocast cache). The micro batch's logits (fp32 for the loss, and their gradient) never exist."""
    c = x.config
    s_act = dtype_bytes(x.precision)
    s_h = 4 if autocast_over_fp32_weights(x) else s_act  # bf16-mixed: the residual stream and ln_f are fp32
    s_w = 4 if "mixed" in str(x.precision) or str(x.precision).startswith("32") else 2  # the weights' dtype
    n, positions, v = x.micro_batch_size * x.seq_len, x.micro_batch_size * (x.seq_len - 1), c.padded_vocab_size
    lora_head = x.lora and "head" in set(x.lora_targets)
    width = c.n_embd + (x.lora_r if lora_head else 0)
    chunk = liger_chunk_rows(positions, v, width)
    total = s_h * c.n_embd * n + 2 * s_h * width * positions  # h, the input copy, its gradient
    if lora_head:
        total += 2 * s_w * v * width  # [W, B] and its gradient
    elif not x.lora:
        total += s_w * v * c.n_embd  # the head weight's gradient
    if autocast_over_fp32_weights(x):
        total += s_act * v * width
    return total + chunk * v * s_act + chunk * width * s_h


@dataclass
class _PerDevice:
    """Step 3's result: the model states one device holds under the strategy, and what lives on the host."""

    weights: float
    lora_weights: float
    grads: float
    optimizer: float
    step_temp: float
    extra: float
    """Strategy buffers held through the whole step: DDP's gradient buckets, ZeRO-3's gathered blocks, FSDP's whole
    model gathered when it is one unit."""
    host: float
    in_flight: float = 0.0
    """FSDP's buffers of the forward and backward only (gone at the optimizer step, as the per-rank simulation
    shows): the root unit and two blocks gathered (SHARD_GRAD_OP: every unit), and the unsharded gradients of micro
    batches without sync; ZeRO-2/3's buffers of the backward."""
    gathered: float = 0.0
    """Of ``in_flight``, the gathered parameters that need not meet the logits (the root unit and two blocks;
    0 under SHARD_GRAD_OP, whose units are all gathered at the loss)."""


def root_unit_params(config) -> int:
    """Parameters outside litgpt's blocks: the token embedding, the head (and its bias) and the final norm. Under
    FSDP with each block a unit they form the root unit, unsharded from the forward's start to its end and again
    through the whole backward."""
    c = config
    head = c.padded_vocab_size * c.n_embd + (c.padded_vocab_size if getattr(c, "lm_head_bias", False) else 0)
    return c.padded_vocab_size * c.n_embd + head + c.n_embd * (2 if c.norm_class_name == "LayerNorm" else 1)


def fsdp1_lora(x: PlanInput) -> bool:
    """LoRA under FSDP1 (a ``name: fsdp`` strategy file, NO_SHARD too: it keeps flat parameters, all-reduced whole):
    flat parameters mixing frozen and trainable weights, which FSDP1 gives a whole gradient (:func:`flat_parameter_grads`) and whose frozen weights are
    differentiable views during the forward (their matmuls keep their inputs: ``activations.saved_bytes``)."""
    return x.strategy == "fsdp" and x.fsdp_root_kept and x.lora


def flat_parameter_frozen_grad_elements(x: PlanInput, total: int) -> int:
    """Frozen weights FSDP1 gives a gradient under LoRA (``total``: all parameters, LoRA's excluded): a flat
    parameter (one per block, and the root unit) with any trainable weight gets a gradient for all of its weights,
    frozen ones included (torch's FSDP documents it for ``use_orig_params=True``, which Lightning's FSDPStrategy and
    tunelab's loop set; traced by the per-rank simulation); the root unit (embedding, final norm, head) only when
    one of its weights is trained. The memory side (:func:`flat_parameter_grads`) and the communication side
    (``tunelab.plan.model.comm``: these gradients are reduce-scattered whole) both count them here."""
    root = root_unit_params(x.config)
    return total - root + (root if "head" in set(x.lora_targets) else 0)


def flat_parameter_grads(x: PlanInput, st: ModelStates) -> float:
    """Gradient bytes FSDP1 allocates for a LoRA model: every weight of a flat parameter with a trainable weight
    (:func:`flat_parameter_frozen_grad_elements`) plus LoRA's own."""
    return flat_parameter_frozen_grad_elements(x, st.total) * st.s_param + st.lora_weights


def fsdp1_backward_gradients(x: PlanInput, st: ModelStates) -> float:
    """Bytes FSDP1 holds at its backward peak (full fine-tuning, each block a sharded unit) beside every activation
    and the gathered units, that the forward's end does not hold (the logits are freed by then): the block's
    unsharded flat gradient and the same gradients again as its original parameters' tensors (``use_orig_params``),
    the head's weight gradient (the root unit's, held until the root's reduce-scatter at the backward's end) and one
    activation gradient. Read from what MemTracker holds at the per-rank simulation's peak, by kind and size
    (TinyLlama, 32-true, 8 devices: 176 + 176 + 262 + 8 MB; docs/planner.md). LoRA (:func:`fsdp1_lora`): the head's
    weight gradient too, made by the chunked head's backward, which sums the chunks' gradients (the running sum,
    the chunk's and their sum: three head-sized tensors at once, beside two chunks' logits gradients in the compute
    dtype and one block gathered, the last, prefetched),
    then held in each block's backward (two blocks gathered) beside the block's flat gradient (frozen weights
    included) and its original parameters' gradients, as in full fine-tuning; the larger of the two, as bytes
    beyond the two gathered blocks the forward counts (OpenLLaMA 3B on 8 devices: 251.7 + 227.3 + 204.8 MB in a
    block's backward; Gemma 2B: 3 x 1,048.6 + 2 x 131.1 MB at the head). At the head, one block of the two the
    forward counts is apart under FULL_SHARD and HYBRID_SHARD only: SHARD_GRAD_OP keeps every unit gathered into the
    backward and NO_SHARD gathers none, so nothing is apart there (Phi-2 LoRA on 2 and 8 devices: -1.0% and -1.9%
    while a block was taken off). FSDP1's ``cpu_offload`` changes none of it (:func:`fsdp1_offloaded`). 0 elsewhere
    (one unit and the other strategies are not derived here)."""
    c = x.config
    block = block_params(c)
    head = c.padded_vocab_size * c.n_embd
    if fsdp1_lora(x) and x.fsdp_wrap != "none":
        chunk_grads = 2 * x.micro_batch_size * min(LM_HEAD_CHUNK, x.seq_len) * c.padded_vocab_size
        gathered_apart = block if x.sharding in ("FULL_SHARD", "HYBRID_SHARD") else 0  # see the docstring
        at_head = (3 * head - gathered_apart) * st.s_param + chunk_grads * dtype_bytes(x.precision)
        return max(at_head, (head + 2 * block) * st.s_param)
    if not _fsdp1_full_shard_full(x):
        return 0
    return (2 * block + head) * st.s_gathered + x.micro_batch_size * x.seq_len * c.n_embd * dtype_bytes(x.precision)


def fsdp2_full_shard(x: PlanInput) -> bool:
    """FSDP2 resharding each block after forward (FULL_SHARD), each block a unit, then the root."""
    return x.strategy == "fsdp" and not x.fsdp_root_kept and x.sharding == "FULL_SHARD" and x.fsdp_wrap != "none"


def root_regathered(x: PlanInput) -> float:
    """Bytes FSDP2 holds at the start of backward that its loss never sees beside it, when each block and then the
    root unit are sharded and resharded after forward (``reshard_after_forward``, FULL_SHARD): the root is freed
    before the loss runs and gathered again for the head's backward, its all-gather buffer and its unsharded
    parameters alive together (two root units), beside the logits' gradient in the compute dtype. Read from what
    FSDPMemTracker holds at the per-rank simulation's peaks, by kind and size (TinyLlama LoRA and Gemma 2B full on 2
    devices: no gathered parameter at the loss; 2 x the root plus the logits' gradient at the backward's start).
    0 elsewhere (FSDP1 keeps the root gathered from forward to backward: it sits beside the loss)."""
    if not fsdp2_full_shard(x) or x.fsdp2_root_kept:
        return 0.0
    n_tok = x.micro_batch_size * x.seq_len
    return 2 * root_unit_params(x.config) * parameter_bytes(
        x.precision
    ) + n_tok * x.config.padded_vocab_size * dtype_bytes(x.precision)


def fsdp2_gathered(x: PlanInput) -> float:
    """Bytes FSDP2 (FULL_SHARD, each block a unit, then the root) holds gathered beside the activations inside its
    blocks, as FSDPMemTracker shows at the per-rank simulation's peaks (OpenLLaMA 3B, bf16-true): the larger of

    * a late block's forward: the root unit, unsharded for the whole forward (its forward holds every block's),
      the block's all-gather buffer and its unsharded parameters, and the next block's buffer, prefetched (LoRA on
      2 devices: 2 x 251.7 MB buffers, 251.7 MB unsharded, the root's 409.6 MB);
    * full fine-tuning, a block's backward: the root, the head's weight gradient (unsharded until the root's
      reduce-scatter at the end of backward), the block's unsharded parameters and gradients, the next block's
      all-gather buffer and the previous one's reduce-scatter buffer (on 8 devices: 409.6 + 204.8 + 4 x 247.8 MB)."""
    c = x.config
    root, block = root_unit_params(c), block_params(c)
    backward = root + c.padded_vocab_size * c.n_embd + 4 * block if x.method == "full" else 0
    return max(root + 3 * block, backward) * parameter_bytes(x.precision)


def zero3_tensors(x: PlanInput) -> tuple[int, int]:
    """(persistent, partitioned) parameter elements of ``x``'s model under ZeRO-3, tensor by tensor against
    :attr:`PlanInput.zero3_param_persistence_threshold` (LoRA's matrices included)."""
    numels = param_tensor_numels(x.config) + (lora_tensor_numels(x.config, x.lora_r, x.lora_targets) if x.lora else [])
    persistent = sum(n for n in numels if n < x.zero3_param_persistence_threshold)
    return persistent, sum(numels) - persistent


def zero3_gathered(x: PlanInput) -> float:
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
    return zero3_kept(x) * zero_param_bytes(x)


def zero3_kept(x: PlanInput) -> float:
    """Parameters (elements) ZeRO-3 holds gathered at the forward's end: :func:`zero3_gathered`'s rule."""
    return min(zero3_tensors(x)[1], max(x.zero3_max_live_parameters, x.zero3_max_reuse_distance / 2))


def zero_param_bytes(x: PlanInput) -> int:
    """Bytes per 16-bit parameter or gradient element DeepSpeed holds: bf16 wherever the precision is bf16 (tunelab's
    DeepSpeed config turns ``bf16`` on and DeepSpeed casts the model), else the precision's."""
    return 2 if str(x.precision).startswith("bf16") else parameter_bytes(x.precision)


def zero2_backward_partition(x: PlanInput, st: ModelStates) -> float:
    """ZeRO-2's 16-bit gradient partition (``grads_in_partition``, the trainable parameters / devices), allocated when
    the first reduce bucket fills: inside the backward, beside its activations, where the trainable parameters
    outnumber ``reduce_bucket_size``; otherwise only at the backward's end, after the activations are gone. Freed
    at the step (which sees the float32 copy: :func:`zero_step_bytes`)."""
    if st.trainable <= x.reduce_bucket_size:
        return 0.0
    return st.trainable * zero_param_bytes(x) / x.world


def zero_step_bytes(x: PlanInput, st: ModelStates) -> tuple[float, float]:
    """(gradients, temporary) of DeepSpeed's optimizer step on the device, before division by the devices: the
    float32 gradient partition the step reads (ZeRO-2 converts the 16-bit partition into it; ZeRO-3 holds its
    16-bit partitions as well: :func:`zero3_gradient_partitions`) and torch's foreach AdamW's one float32
    temporary over the master partition. Measured with DeepSpeed's own step on CPU (foreach AdamW, as on CUDA):
    8 bytes per trainable parameter / devices above the states at rest, ZeRO-2 and ZeRO-3 alike."""
    if x.offload_optimizer:
        return st.grads, 0.0
    grads = st.trainable * 4 + (st.grads if x.zero_stage >= 3 else 0.0)
    return grads, st.trainable * 4


def zero3_gradient_partitions(x: PlanInput) -> bool:
    """ZeRO-3 without optimizer offload allocates its gradient partitions (``grad_partitions_flat_buffer``, the
    model's dtype) at its start and holds them through the run: beside the activations, not only at the step."""
    return x.strategy == "deepspeed" and x.zero_stage >= 3 and not x.offload_optimizer


def zero_reduce_buffer(x: PlanInput) -> float:
    """Bytes of DeepSpeed's gradient reduce buffer (``contiguous_gradients``, as tunelab's loop configures it, with
    ``overlap_comm`` off: one buffer; on, two): ``reduce_bucket_size`` elements in the gradients' dtype
    (:func:`zero_param_bytes`),
    allocated whole whatever the model's size. ZeRO-2 (``stage_1_and_2.setup_buckets``) allocates it at each
    backward's start and frees it at its end; ZeRO-3 (``stage3``'s optimizer init) holds it for the whole run.
    Measured on CPU with DeepSpeed's own code over gloo (tests/e2e/test_deepspeed_memory.py): 400 MB at the default 2e8
    elements, most of a small model's peak."""
    if x.strategy != "deepspeed" or x.zero_stage < 2:
        return 0.0
    return x.reduce_bucket_size * zero_param_bytes(x)


def unsharded_while_accumulating(x: PlanInput) -> bool:
    """Sharded FSDP accumulating: the micro batches without gradient sync keep whole, unsharded gradients (counted
    in the sharding buffers); the sharded ones do not exist then (``zero_grad`` freed them)."""
    return x.strategy == "fsdp" and x.sharding != "NO_SHARD" and x.accumulation > 1


def sgo_gathered(x: PlanInput, st: ModelStates) -> float:
    """Bytes SHARD_GRAD_OP (FSDP1's, or FSDP2's ``reshard_after_forward: false``) holds gathered beside the
    activations: it does not reshard a unit after its forward, so at the forward's end every parameter is unsharded
    (beside its shard), and the backward frees a unit only after its own backward. Seen in the per-rank simulation
    (TinyLlama full, 32-true, 4 devices: 4.4 GB gathered beside the 1.1 GB shard)."""
    return st.weights + st.lora_weights


@dataclass
class _Division:
    """How a strategy divides the model states: the devices each state is sharded over, and its buffers."""

    shard_w: int = 1
    """Devices the weights are sharded over."""
    shard_g: int = 1
    """Devices the gradients are sharded over."""
    shard_o: int = 1
    """Devices the optimizer's states (and master weights) are sharded over."""
    extra: float = 0.0
    """Buffers held through the whole step (:attr:`_PerDevice.extra`)."""
    in_flight: float = 0.0
    """Buffers of the forward and backward only (:attr:`_PerDevice.in_flight`)."""
    gathered: float = 0.0
    """Of ``in_flight``, the gathered parameters (:attr:`_PerDevice.gathered`)."""


def _fsdp_division(x: PlanInput, st: ModelStates, grads: float, notes: list) -> _Division:
    """FSDP's sharding (FSDP1 or FSDP2): what each sharding strategy shards, what it holds gathered, and the
    unsharded gradients of micro batches without sync (``grads``: the gradients before division)."""
    if x.sharding == "NO_SHARD":
        notes.append("FSDP NO_SHARD: every device holds the whole model; gradients all-reduced in place (no buckets)")
        return _Division()
    group = fsdp_shard_group(x)
    d = _Division()
    if x.sharding in ("FULL_SHARD", "HYBRID_SHARD", "SHARD_GRAD_OP"):
        d.shard_w = d.shard_g = d.shard_o = group
    if x.sharding in ("FULL_SHARD", "HYBRID_SHARD"):
        # the block in use and the next one prefetched, plus the root unit (embedding, head, final norm),
        # gathered at the forward's start and again for the whole backward (the per-rank simulation shows it)
        d.in_flight = d.gathered = (block_params(x.config) * 2 + root_unit_params(x.config)) * st.s_gathered
        if fsdp2_full_shard(x):  # FSDP2: what it gathers beside the activations, by moment
            d.in_flight = d.gathered = max(root_regathered(x), fsdp2_gathered(x))
        if x.fsdp_wrap == "none":
            d.in_flight = d.gathered = 0
            d.extra = st.weights + st.lora_weights  # one unit: all parameters gathered through forward and backward
            notes.append("FSDP without auto-wrap: the whole model is one unit, gathered for every step")
    elif x.sharding == "SHARD_GRAD_OP":
        d.in_flight = sgo_gathered(x, st)
        notes.append(
            "SHARD_GRAD_OP: each unit stays gathered from its forward to its backward (the whole model at the "
            "forward's end; under no_sync() until the last micro batch's backward)"
        )
    if x.accumulation > 1:
        d.in_flight += grads * fsdp1_unsharded_scale(x)  # no_sync() during accumulation keeps unsharded gradients
        notes.append("FSDP with gradient accumulation: no_sync() keeps full unsharded gradients")
    return d


def _zero_division(x: PlanInput, st: ModelStates, notes: list) -> _Division:
    """DeepSpeed ZeRO's stages: states (1), gradients (2), weights (3) over the devices, and its buffers."""
    world = x.world
    d = _Division(
        shard_o=world if x.zero_stage >= 1 else 1,
        shard_g=world if x.zero_stage >= 2 else 1,
        shard_w=world if x.zero_stage >= 3 else 1,
    )
    if x.zero_stage >= 3:
        persistent = zero3_tensors(x)[0] * zero_param_bytes(x)
        d.extra = zero_reduce_buffer(x) + persistent * (1 - 1 / world)  # small tensors whole on every rank
        d.in_flight = d.gathered = zero3_gathered(x)
        notes.append(
            "ZeRO-3: its gradient reduce buffer (reduce_bucket_size elements) and gradient partitions held "
            f"through the run; {zero3_kept(x) / 1e6:,.0f}M parameters gathered at the forward's end "
            "(stage3_max_live_parameters, stage3_max_reuse_distance)"
        )
    elif x.zero_stage == 2:
        d.in_flight = zero_reduce_buffer(x) + zero2_backward_partition(x, st)
        notes.append("ZeRO-2: its gradient reduce buffer (reduce_bucket_size elements) from backward's start")
    return d


def optimizer_shards(x: PlanInput) -> int:
    """Devices the optimizer's states are sharded over (:class:`_Division`'s ``shard_o``): each rank's optimizer
    step updates 1/this of the trainable parameters. FSDP's FULL_SHARD and SHARD_GRAD_OP over the world,
    HYBRID_SHARD over its node, ZeRO from stage 1; DDP, FSDP's NO_SHARD and one device update every parameter on
    every rank."""
    st = model_states(x, [])
    if x.strategy == "fsdp":
        return _fsdp_division(x, st, st.grads, []).shard_o
    if x.strategy == "deepspeed":
        return _zero_division(x, st, []).shard_o
    return 1


def _divide(x: PlanInput, st: ModelStates, notes: list) -> _PerDevice:
    """Step 3: the strategy's division of the model states among devices (and into host RAM for offload)."""
    grads = st.grads
    if fsdp1_lora(x):
        grads = flat_parameter_grads(x, st)
        notes.append(
            "FSDP1 with LoRA: each block's flat parameter holds frozen and trainable weights, and FSDP1 "
            "(use_orig_params) gives the whole flat parameter a gradient, as much as full fine-tuning's; its frozen "
            "weights are differentiable in the forward, so their matmuls keep their inputs too"
        )
    if x.strategy == "ddp":
        d = _Division(extra=st.grads)  # gradient buckets
        notes.append("DDP: gradient buckets hold a second copy of the gradients")
    elif x.strategy == "fsdp":
        d = _fsdp_division(x, st, grads, notes)
    elif x.strategy == "deepspeed":
        d = _zero_division(x, st, notes)
    else:
        d = _Division()
    step_temp = st.step_temp
    if x.strategy == "deepspeed" and x.zero_stage >= 2:
        grads, step_temp = zero_step_bytes(x, st)
    dev = _PerDevice(
        weights=st.weights / d.shard_w,
        lora_weights=st.lora_weights / d.shard_w,
        grads=grads / d.shard_g,
        optimizer=(st.optimizer + st.master) / d.shard_o,
        step_temp=step_temp / d.shard_o,
        extra=d.extra,
        host=0,
        in_flight=d.in_flight,
        gathered=d.gathered,
    )
    return _offloaded(x, st, dev, notes)


def _offloaded(x: PlanInput, st: ModelStates, dev: _PerDevice, notes: list) -> _PerDevice:
    """``dev`` with what offload moves to host RAM: the optimizer's states, master weights and float32 gradients
    (``offload_optimizer``: the gradients stream out per bucket, no step on the device), the weights
    (``offload_params``: ZeRO-3 gathers them to the device); FSDP1's ``cpu_offload``: :func:`fsdp1_offloaded`."""
    if x.offload_params and x.strategy == "fsdp":
        return fsdp1_offloaded(x, dev, notes)
    two_blocks = block_params(x.config) * st.s_param * 2
    if x.offload_optimizer:
        dev.host += st.optimizer + st.master + st.trainable * 4
        dev.optimizer = dev.step_temp = 0
        dev.grads = min(dev.grads, two_blocks)
        notes.append("optimizer offload: states, master weights and their gradients in host RAM")
    if x.offload_params:
        dev.host += st.weights
        dev.weights = 0  # ZeRO-3's gathered parameters are in_flight
        notes.append("parameter offload: weights in host RAM, gathered to the device as ZeRO-3 gathers them")
    return dev


def fsdp1_offloaded(x: PlanInput, dev: _PerDevice, notes: list) -> _PerDevice:
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
    copies = dev.gathered / fsdp_shard_group(x)
    dev.in_flight += copies
    dev.gathered += copies
    notes.append(
        "FSDP cpu_offload: sharded parameters, their gradients and the optimizer's states in host RAM, the "
        "optimizer step on the host; the device holds the gathered units and the backward's sharded gradients"
    )
    return dev


def liger_chunk_rows(positions: int, vocab: int, hidden: int) -> int:
    """Rows (positions) per chunk of Liger's fused linear cross-entropy (0.8.5, ``chunk_mem_const`` 1): the
    positions split into ``ceil(vocab / hidden)`` parts, rounded up to a power of two, at most all of them, so one
    chunk's logits (rows x vocabulary) are about the size of the input (positions x hidden)."""
    parts = -(-vocab // hidden)
    rows = 1 << max(0, (-(-positions // parts) - 1).bit_length())
    return min(rows, positions)


LM_HEAD_CHUNK = 128
"""Tokens per lm_head chunk in litgpt's LoRA finetune loop (``model(x, lm_head_chunk_size=128)``)."""


def lora_loss_backward_temporaries(x: PlanInput, s_act: float) -> float:
    """Bytes the chunked loss's backward adds under LoRA at its peak, beside everything the forward kept: three
    vocabulary-sized tensors of one 128-token chunk (the gradients of cross-entropy's nll_loss and log_softmax, and
    the last chunk's slice ``logits[-1][..., :-1, :]`` padded back), less the last chunk's log-softmax, which
    autograd has freed by then (its node has run), as the simulated step shows (tunelab/plan/trace/simulate.py).
    ``s_act``: the logits' bytes per element. Full fine-tuning's loss gradient is counted whole in the logits term."""
    chunk = min(LM_HEAD_CHUNK, x.seq_len)
    last = last_chunk_tokens(x.seq_len)
    v = x.config.padded_vocab_size
    return (3 * chunk - (last - 1)) * x.micro_batch_size * v * s_act


def dequantized_weight_temporary(x: PlanInput) -> float:
    """Bytes a 4-bit (QLoRA) matmul's dequantized weight adds to LoRA's peak (the start of backward). bitsandbytes'
    ``MatMul4Bit`` (0.50) dequantizes its weight to a temporary in the forward pass and again in the backward pass,
    one matmul at a time; in backward ``dequantize_4bit`` returns the dtype the weight was quantized from, fp16
    (Lightning's ``_Linear4bit`` casts to half before quantizing), and ``.to(grad.dtype)`` copies it to the compute
    dtype: under bf16 two weight-sized temporaries at once. The largest weight is lm_head's (vocabulary x
    embedding) or the MLP's. lm_head's backward runs after every chunk's loss backward (autograd runs the nodes
    made last first): the loss's saved log-softmax and its backward temporaries are freed by then, and every
    chunk's logits gradient is alive in the compute dtype (Fabric's fp32 conversion, undone by its backward); with
    final-logit softcapping (Gemma 2) the last chunk's saved tanh is freed too. Seen in the simulated step
    (tunelab/plan/trace/simulate.py)."""
    if not str(x.quantize or "").startswith(("bnb.nf4", "bnb.fp4")):
        return 0
    c, s = x.config, dtype_bytes(x.precision)
    fp16_copy = 0 if str(x.precision).startswith("16") else 2  # under fp16 compute, .to() returns the fp16 copy
    v, positions = c.padded_vocab_size, x.micro_batch_size * (x.seq_len - 1)
    freed = positions * v * logits_bytes(x) + lora_loss_backward_temporaries(x, logits_bytes(x))  # the loss's
    head = v * c.n_embd * (s + fp16_copy) + x.micro_batch_size * x.seq_len * v * s  # + every chunk's gradient
    if c.final_logit_softcapping is not None:
        last = last_chunk_tokens(x.seq_len)
        head -= x.micro_batch_size * last * v * s
    mlp = max(c.intermediate_size, c.n_embd) * c.n_embd * (s + fp16_copy)  # a block's, the head's gradients gone
    return max(0, head - freed, mlp - freed)


def logits_bytes(x: PlanInput) -> int:
    """Bytes per element of the logits the loss sees: 4 under every precision. Lightning Fabric (litgpt's scripts)
    converts the model's outputs to fp32 (its precision plugins' ``convert_output``), bf16-true included; tunelab's
    loop casts them to fp32 itself, as litgpt's numerics require."""
    return 4


def logits_held_at_step(x: PlanInput) -> float:
    """Bytes of the logits alive during the optimizer step: micro batch x sequence x padded vocabulary in the
    logits' dtype (:func:`logits_bytes`). litgpt's fit loop keeps ``logits`` referenced until the next iteration, so
    they sit beside the gradients and optimizer states; tunelab's loop computes them inside its loss function, so
    nothing holds them after backward (0), and its fused loss never makes them."""
    if not x.fabric or x.fused_loss:
        return 0
    return x.micro_batch_size * x.seq_len * x.config.padded_vocab_size * logits_bytes(x)


def bnb_quantized(x: PlanInput) -> bool:
    """litgpt runs the model under Lightning's BitsandbytesPrecision (any ``bnb.*`` quantization)."""
    return str(x.quantize or "").startswith("bnb.")


def stable_embedding_states(x: PlanInput) -> float:
    """Bytes of litgpt's QLoRA embedding swap (``finetune/lora.py`` main, 0.5.13; any bitsandbytes quantization):
    after the optimizer is built, ``model.transformer.wte`` is replaced by bitsandbytes' ``StableEmbedding`` (an
    embedding and a LayerNorm, moved to the weights' dtype). ``main`` keeps the old embedding referenced for the
    whole run, and the new weight trains (made after ``mark_only_lora_as_trainable``) without being in the
    optimizer, so ``zero_grad`` never frees its vocabulary-sized gradient: two vocabulary x embedding tensors, plus
    the norm's weight, bias and their gradients. Its activations (the norm's input; the first block's input now
    carries a gradient) are in the activation term. Seen in the simulated step (tunelab/plan/trace/simulate.py)."""
    if not bnb_quantized(x):
        return 0
    c = x.config
    s = 4 if "mixed" in str(x.precision) or str(x.precision).startswith("32") else 2  # the weights' dtype
    return 2 * c.padded_vocab_size * c.n_embd * s + 4 * c.n_embd * s


def fsdp1_one_unit_gradients(x: PlanInput, st: ModelStates) -> float:
    """Bytes FSDP1 without auto-wrap (the whole model one sharded unit) holds at its backward's end beyond the
    gathered model and the states: the unit's unsharded flat gradient and the same gradients as its original
    parameters' tensors (``use_orig_params``), every activation freed by then; under LoRA the flat parameter's
    gradient covers its frozen weights too (:func:`flat_parameter_grads`). Read from the per-rank simulation
    (TinyLlama full, 32-true, 4 devices: 8.8 GB of temporaries at the backward's peak, twice its 4.4 GB of
    gradients). 0 elsewhere."""
    if not (x.strategy == "fsdp" and x.fsdp_root_kept and x.fsdp_wrap == "none" and x.sharding != "NO_SHARD"):
        return 0.0
    if x.offload_params or x.offload_optimizer:
        return 0.0
    return 2 * (flat_parameter_grads(x, st) if fsdp1_lora(x) else st.grads)


def fsdp1_no_shard_root_gradients(x: PlanInput, st: ModelStates) -> float:
    """Bytes FSDP1 under NO_SHARD (each block a unit) holds at its backward's end beyond every flat gradient (whole:
    nothing is sharded, each unit's is all-reduced in place and kept): the root unit's original parameters'
    gradients (``use_orig_params``: the embedding's, the head's and the final norm's, as their own tensors beside
    the root's flat gradient until its post-backward hook), when the root has a gradient (full fine-tuning, or LoRA on the head:
    :func:`flat_parameter_frozen_grad_elements`). Read from MemTracker at the per-rank simulation's backward peak
    (Phi-2 LoRA on 8 devices: 32 block flat gradients of 160.3 MB, the root's 527.8 MB and two of 262.1 MB).
    0 elsewhere."""
    if not (x.strategy == "fsdp" and x.fsdp_root_kept and x.sharding == "NO_SHARD" and x.fsdp_wrap != "none"):
        return 0.0
    if x.offload_params or x.offload_optimizer or (x.lora and "head" not in set(x.lora_targets)):
        return 0.0
    return root_unit_params(x.config) * st.s_param


def _accumulated_gradients(x: PlanInput, st: ModelStates, dev: _PerDevice) -> float:
    """Gradients alive beside the activations. Without accumulation the gradients are created while the
    activations are freed, so the forward peak does not hold them; with accumulation they persist and add to both
    (FSDP's unsharded ones are in its sharding buffers). DeepSpeed ZeRO-2/3: its 16-bit partitions (``dev.grads``
    is the step's float32)."""
    accumulated = dev.grads if x.accumulation > 1 and not unsharded_while_accumulating(x) else 0
    if x.strategy == "deepspeed" and x.zero_stage >= 2:
        held = zero3_gradient_partitions(x) or (x.accumulation > 1 and not x.offload_optimizer)
        accumulated = st.grads / x.world if held else 0
    return accumulated


def _at_the_loss(x: PlanInput, st: ModelStates, dev: _PerDevice, logits: float) -> tuple[float, float]:
    """(logits, gathered buffers) at the forward's end. What is gathered only where the logits are not (MemTracker
    at the per-rank simulation's peaks): FSDP1's loss runs with its root gathered and no block (Gemma 2B full on 8
    devices); ZeRO-2's reduce buffer and 16-bit gradient partition come in the backward, after the head's backward
    has freed the logits, beside the activations (DeepSpeed run on CPU at each family's shape / 16, 2 ranks:
    TinyLlama +7.5%, Gemma 2B +6.8%, Phi-2 +5.2% when the plan summed them with the logits; 0.0%, 0.0%, -1.8% as
    the larger of the two, OpenLLaMA 7B's 0.0% the buffers'). The larger of the two counts. FSDP2's moments are
    :func:`_fsdp2_moment`'s."""
    apart = 0.0
    if x.fsdp_root_kept and dev.gathered:
        apart = dev.gathered - root_unit_params(x.config) * st.s_gathered
    elif x.strategy == "deepspeed" and x.zero_stage == 2:
        apart = dev.in_flight
    if apart > logits:
        return 0.0, dev.in_flight
    return logits, dev.in_flight - apart


class Fsdp2Moment(NamedTuple):
    """One candidate of FSDP2's peak outside the optimizer step (:func:`_fsdp2_moment`), bytes per device."""

    activations: float
    logits: float
    gathered: float
    """Gathered parameters and their buffers, with the unsharded gradients of micro batches without sync."""
    autocast_cache: float
    note: str | None

    @property
    def total(self) -> float:
        return self.activations + self.logits + self.gathered + self.autocast_cache


def fsdp2_forward_start(x: PlanInput) -> float:
    """Bytes FSDP2 (each block, then the root, resharded after forward) holds gathered at the forward's start: the
    root unit and the first block, each unsharded beside its all-gather buffer, 2 x (root + block), before any of
    this forward's activations. Read from FSDPMemTracker at the per-rank simulation's forward peak (TinyLlama LoRA on
    4 devices under litgpt's parallelize_fn: 0.355 GB unsharded beside 0.355 GB of all-gather buffers); the peak
    where activation checkpointing leaves the activations small."""
    if not fsdp2_full_shard(x):
        return 0.0
    return 2 * (root_unit_params(x.config) + block_params(x.config)) * parameter_bytes(x.precision)


def _fsdp2_moment(x: PlanInput, dev: _PerDevice, acts: float, logits: float, cache: float) -> Fsdp2Moment:
    """The activations, logits, gathered buffers, autocast's copies and note at FSDP2's peak outside the optimizer step
    (``cache``: autocast's weight copies, alive from the forward into backward), the largest of:
    the forward's start (:func:`fsdp2_forward_start`, beside the logits litgpt's loop still holds from the last
    micro batch); the loss (the root beside it where it is kept); a late block's forward or the backward's start
    (the division's gathered bytes, :func:`root_regathered` or :func:`fsdp2_gathered`, beside the blocks' saved
    activations, under checkpointing their inputs only, and the logits litgpt's loop holds); and, under
    checkpointing, a block's backward (the root, the block and the next one gathered, one block recomputed). Every
    moment holds the unsharded gradients of micro batches without sync."""
    held = logits_held_at_step(x)
    grads = dev.in_flight - dev.gathered
    inputs = checkpointed_inputs(x) if x.activation_checkpointing else acts
    root = root_unit_params(x.config) * parameter_bytes(x.precision)
    start_note = "the peak is FSDP2's forward start: the root unit and the first block gathered, each beside its "
    start_note += "all-gather buffer" + (", the last micro batch's logits still held (litgpt's loop)" if held else "")
    late = 0.0 if x.activation_checkpointing else cache  # checkpointed: only the head's copies, made at the loss
    moments = [
        Fsdp2Moment(0.0, held, fsdp2_forward_start(x) + grads, 0.0, start_note),
        Fsdp2Moment(acts, logits, grads + (root if x.fsdp2_root_kept else 0.0), cache, None),
        Fsdp2Moment(inputs, held, dev.in_flight, late, None),
        Fsdp2Moment(acts, held, grads + root + 2 * block_params(x.config) * parameter_bytes(x.precision), late, None),
    ]
    return max(moments, key=lambda m: m.total)


def fsdp1_unsharded_scale(x: PlanInput) -> float:
    """The bytes of a gathered parameter or an unsharded gradient element under FSDP1 over the sharded one's:
    litgpt's own FSDP1 (Lightning's ``FSDPStrategy``) under 16-bit mixed precision gathers and reduces in 16 bits
    (``FSDPPrecision.mixed_precision_config``: param, reduce and buffer dtype bfloat16 for bf16-mixed) over fp32
    shards, 0.5; 1 elsewhere. Seen in the per-rank simulation (TinyLlama full, bf16-mixed, 4 devices: the root and
    blocks gathered in bf16, no_sync()'s unsharded gradients 2.2 GB for 1.1B parameters)."""
    mixed16 = "mixed" in str(x.precision) and parameter_bytes(x.precision) == 4
    return 0.5 if x.strategy == "fsdp" and x.fsdp_root_kept and x.fabric and mixed16 else 1.0


def fsdp_shard_group(x: PlanInput) -> int:
    """Devices FSDP shards over: the world, or under HYBRID_SHARD one node's devices."""
    return x.world if x.sharding != "HYBRID_SHARD" else max(1, x.devices)


def _fsdp1_full_shard_full(x: PlanInput) -> bool:
    """FSDP1 full fine-tuning, FULL_SHARD or HYBRID_SHARD, each block a unit (offloaded or not:
    :func:`fsdp1_offloaded` takes the states off the device, the moments stay)."""
    return (
        x.strategy == "fsdp"
        and x.fsdp_root_kept
        and x.method == "full"
        and x.sharding in ("FULL_SHARD", "HYBRID_SHARD")
        and x.fsdp_wrap != "none"
    )


def fsdp1_root_backward_end(x: PlanInput, st: ModelStates) -> float:
    """Bytes FSDP1 full fine-tuning (:func:`_fsdp1_full_shard_full`) holds at its backward's end, when the root
    unit's gradient is made, beyond the states: the root's unsharded parameters (kept through backward), its new
    flat gradient and the same gradients as its original parameters' tensors (``use_orig_params``: the embedding's
    and the head's), and every block's gradient: sharded after a micro batch with sync, whole (every unsharded
    gradient no_sync() accumulated, the root's too, in a middle micro batch; the first's own, its root's new
    flat gradient the root's only one) in one without; every activation and gathered block freed. The
    peak once activation checkpointing has made the activations small. Read from MemTracker at the per-rank
    simulation's backward peak (TinyLlama full, 32-true, 8 devices: the root's 524.3 MB parameters and 524.3 MB
    flat gradient, two of 262.1 MB, 22 block gradients of 22.0 MB; Gemma 2B full on 2, accumulating 4: the root's
    2,097 MB parameters and new flat gradient, two of 1,048.6 MB, the accumulated 18 x 220.2 + 2,097 MB)."""
    if not _fsdp1_full_shard_full(x):
        return 0.0
    scale = fsdp1_unsharded_scale(x)
    root = root_unit_params(x.config) * st.s_param * scale
    if x.accumulation > 2:  # a middle micro batch: the root's new flat gradient beside its accumulated one
        return 3 * root + st.grads * scale
    if x.accumulation == 2:  # the first: its new flat gradient is the root's first
        return 2 * root + st.grads * scale
    shard = fsdp_shard_group(x)
    return 3 * root + max(st.grads - root / scale, 0.0) / shard


def fsdp1_first_block_backward(x: PlanInput, st: ModelStates, acts: float) -> tuple[float, float]:
    """(bytes beyond the states and the gathered units, activations alive) of FSDP1 full fine-tuning
    (:func:`_fsdp1_full_shard_full`) in the first block's backward, the last to run, after a micro batch with sync:
    the block's unsharded gradient, the head's (held until the root's reduce-scatter) and every other block's
    sharded gradient, beside that block's input and, under checkpointing, its recomputed activations. Later in the
    backward than :func:`fsdp1_backward_gradients`' moment, with fewer activations and more sharded gradients: the
    peak where a block's sharded gradient outweighs its checkpointed input (OpenLLaMA 3B full, bf16, 8 devices,
    checkpointed: 247.8 + 204.8 MB beside 24 sharded gradients of 31.0 MB and one block recomputed). (0, 0) with
    accumulation (no_sync() keeps the gradients whole: the earlier moment holds them all) and elsewhere."""
    if not _fsdp1_full_shard_full(x) or x.accumulation > 1:
        return 0.0, 0.0
    c = x.config
    block, scale = block_params(c) * st.s_param, fsdp1_unsharded_scale(x)
    shard = fsdp_shard_group(x)
    grads = (block + c.padded_vocab_size * c.n_embd * st.s_param) * scale + (c.n_layer - 1) * block / shard
    inputs = checkpointed_inputs(x)
    left = inputs / c.n_layer + acts - inputs if x.activation_checkpointing else acts / c.n_layer
    return grads, left


class BackwardMoment(NamedTuple):
    """FSDP1's peak in its backward (:func:`_backward_moment`), bytes per device."""

    gradients: float
    """FSDP1's backward bytes (the ``fsdp1_backward_gradients`` term)."""
    peak: float
    """Everything on the device then."""
    activations: float
    """The activations still alive."""
    moment: bool | str
    """True: the backward's end; "first block": the first block's backward, the last to run; False: a block's."""
    gathered: float
    """The sharding buffers then."""


def _backward_moment(x: PlanInput, st: ModelStates, dev: _PerDevice, base: float, acts: float) -> BackwardMoment:
    """FSDP1's backward peak: a block's backward beside every activation (:func:`fsdp1_backward_gradients`), the
    first block's (:func:`fsdp1_first_block_backward`) or the backward's end with none (without auto-wrap
    :func:`fsdp1_one_unit_gradients`, under NO_SHARD :func:`fsdp1_no_shard_root_gradients`, under FULL_SHARD
    :func:`fsdp1_root_backward_end`, whose root is its own gathered bytes), whichever is higher, each beside the
    logits litgpt's loop holds through backward (:func:`logits_held_at_step`); all 0 but ``acts`` elsewhere."""
    held = logits_held_at_step(x)
    backward = fsdp1_backward_gradients(x, st)
    rest = base - acts + held  # what every backward's end holds beside its own terms
    candidates = []
    if backward:
        candidates.append(BackwardMoment(backward, base + dev.in_flight + backward + held, acts, False, dev.in_flight))
    if one_unit := fsdp1_one_unit_gradients(x, st):
        candidates.append(BackwardMoment(one_unit, rest + dev.in_flight + one_unit, 0.0, True, dev.in_flight))
    if root := fsdp1_no_shard_root_gradients(x, st):  # every flat gradient (unless accumulated: in base already)
        at_end = (0.0 if x.accumulation > 1 else dev.grads) + root
        candidates.append(BackwardMoment(at_end, rest + dev.in_flight + at_end, 0.0, True, dev.in_flight))
    if end := fsdp1_root_backward_end(x, st):
        kept = root_unit_params(x.config) * st.s_gathered
        candidates.append(BackwardMoment(end - kept, rest + end, 0.0, True, kept))
    late, left = fsdp1_first_block_backward(x, st, acts)
    if late:
        candidates.append(BackwardMoment(late, rest + left + dev.in_flight + late, left, "first block", dev.in_flight))
    # the first of the highest, as before: a block's backward, then the ends in this order
    return max(candidates, key=lambda c: c.peak, default=BackwardMoment(0.0, 0.0, acts, False, 0.0))


def _backward_note(x: PlanInput, at_end) -> str:
    """The plan's note when FSDP1's backward holds the peak (:func:`_backward_moment`)."""
    if at_end and x.sharding == "NO_SHARD":
        return (
            "the peak is the backward's end under FSDP1 NO_SHARD: every unit's whole flat gradient and the root "
            "unit's original parameters' gradients beside its own, every activation freed"
        )
    if at_end and x.fsdp_wrap == "none":
        return (
            "the peak is the backward's end under FSDP1 without auto-wrap: the whole model's unsharded gradient "
            "twice over (its flat parameter's and its original parameters'), every activation freed"
        )
    held = " (litgpt's loop still holds the logits)" if logits_held_at_step(x) else ""
    if at_end == "first block":
        return (
            "the peak is FSDP1's backward of the first block, the last to run: its unsharded gradient and the "
            f"head's beside every other block's sharded gradient and that block's activations{held}"
        )
    if at_end:
        return (
            "the peak is the backward's end under FSDP1: the root unit's gradient twice over (its flat "
            "parameter's and its original parameters') beside its parameters and every block's sharded gradient, "
            f"every activation freed{held}"
        )
    return (
        "the peak is FSDP1's backward: a block's unsharded gradient twice over (its flat parameter's and its "
        f"original parameters') and the head's gradient beside every activation, the logits freed{held}"
    )


def predict(x: PlanInput) -> Plan:
    """The predicted peak allocated memory per device, as a breakdown that sums to it: model states (step 1),
    divided by the strategy (step 3), plus the largest of the candidate peaks: the end of the forward pass
    (activations and logits alive, step 2; autocast's 16-bit weight copies too, alive until backward used them),
    FSDP1's backward, or the optimizer step (gradients and the step's temporary)."""
    notes: list = []
    st = model_states(x, notes)
    acts, logits = _activations(x, notes)
    dev = _divide(x, st, notes)
    state_bytes = {
        "weights": dev.weights,
        "lora_weights": dev.lora_weights,
        "optimizer_states": dev.optimizer,
        "autocast_weight_cache": 0,
        "dequantized_weight_temporary": 0,
        "sharding_buffers": dev.extra,
        "qlora_stable_embedding": stable_embedding_states(x),
    }
    accumulated = _accumulated_gradients(x, st, dev)
    f_acts, f_cache, f_note = acts, st.autocast_cache, None
    if fsdp2_full_shard(x):
        f_acts, logits, in_flight, f_cache, f_note = _fsdp2_moment(x, dev, acts, logits, st.autocast_cache)
    else:
        logits, in_flight = _at_the_loss(x, st, dev, logits)
    base = acts + accumulated + st.autocast_cache + dequantized_weight_temporary(x)
    forward_peak = base - acts - st.autocast_cache + f_acts + f_cache + logits + in_flight
    # litgpt's loop still holds the logits (full: one tensor; LoRA: the list of chunks) when it steps the optimizer:
    # a vocabulary-sized term the simulated step shows (tunelab/plan/trace/simulate.py), largest for 128k-256k vocabularies
    held = logits_held_at_step(x)
    step_peak = dev.grads + dev.step_temp + held
    backward, backward_peak, acts_at_backward, at_end, gathered = _backward_moment(x, st, dev, base, acts)
    in_backward = backward_peak > max(forward_peak, step_peak)  # FSDP1's backward: the logits freed, its gradients
    if in_backward or forward_peak >= step_peak:
        state_bytes["sharding_buffers"] += gathered if in_backward else in_flight
        state_bytes["autocast_weight_cache"] = st.autocast_cache if in_backward else f_cache
        state_bytes["dequantized_weight_temporary"] = dequantized_weight_temporary(x)
        parts = {
            "gradients": accumulated,
            "activations": acts_at_backward if in_backward else f_acts,
            "logits_and_loss": held if in_backward else logits,
            **({"fsdp1_backward_gradients": backward} if in_backward else {}),
            "optimizer_step_temporary": 0,
        }
        if in_backward:
            notes.append(_backward_note(x, at_end))
        elif f_note:
            notes.append(f_note)
    else:
        parts = {
            "gradients": dev.grads,
            "activations": 0,
            "logits_and_loss": held,
            "optimizer_step_temporary": dev.step_temp,
        }
        notes.append(
            "the peak is the optimizer step (gradients, the step's temporary and the logits the loop still holds), "
            "not the forward pass"
        )
    return _plan(x, st, dev, {**state_bytes, **parts}, notes)


def _plan(x: PlanInput, st: ModelStates, dev: _PerDevice, parts: dict, notes: list) -> Plan:
    """The :class:`Plan` of ``x`` whose breakdown is ``parts`` (bytes by term, rounded down)."""
    breakdown = {k: int(v) for k, v in parts.items()}
    peak = sum(breakdown.values())
    return Plan(
        model=x.config.name,
        method=x.method,
        precision=x.precision,
        strategy=x.strategy,
        devices=x.world,
        micro_batch_size=x.micro_batch_size,
        seq_len=x.seq_len,
        params=st.total,
        trainable_params=st.trainable,
        breakdown_bytes=breakdown,
        peak_allocated_bytes=peak,
        predicted_reserved_bytes=int(peak * ALLOCATOR_SLACK),
        cuda_context_bytes=CUDA_CONTEXT_BYTES,
        host_ram_bytes=int(dev.host),
        notes=notes,
    )


def verdict(plan: Plan, gpu: hardware.GPU) -> Plan:
    """Fill in the plan's fit verdict for ``gpu``: reserved + CUDA context against the memory CUDA exposes."""
    plan.gpu, plan.gpu_memory_bytes = gpu.name, gpu.memory_bytes
    need = plan.predicted_reserved_bytes + plan.cuda_context_bytes
    plan.margin_bytes = gpu.memory_bytes - need
    plan.fits = plan.margin_bytes >= 0
    plan.edge = abs(plan.margin_bytes) <= EDGE_FRACTION * gpu.memory_bytes
    return plan


def tight(plan: Plan, gpu: hardware.GPU, headroom: float = ALLOCATOR_HEADROOM) -> bool:
    """The predicted peak allocated leaves less than ``headroom`` of the GPU's memory free: the caching allocator is
    likely to retry (free its cache and call cudaMalloc again), which costs throughput though the run fits."""
    return headroom > 0 and plan.peak_allocated_bytes > (1 - headroom) * gpu.memory_bytes


def max_micro_batch(x: PlanInput, gpu: hardware.GPU, limit: int = 4096, headroom: float = 0.0) -> int:
    """The largest micro batch whose predicted reserved memory + context fits (0 if even 1 does not); with
    ``headroom`` > 0 also leaving that fraction of the GPU's memory above the predicted peak allocated (see
    :func:`tight`)."""

    def fits(m):
        plan = verdict(predict(dataclasses.replace(x, micro_batch_size=m)), gpu)
        return plan.fits and not tight(plan, gpu, headroom)

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
