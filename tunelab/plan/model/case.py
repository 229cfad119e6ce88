"""The case being planned (:class:`PlanInput`), the sizes every strategy reads from it, and the model states a
strategy divides (:class:`ModelStates`, :class:`Division`, :class:`PerDevice`). See docs/planner.md."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from dataclasses import fields as dataclass_fields

from tunelab.models import count_params
from tunelab.plan.model import optimizers
from tunelab.settings import LITGPT_LORA_R, LORA_TARGETS, world_size


@dataclass(frozen=True)
class StrategyOptions:
    """The keys a strategy file sets for its own strategy, with the defaults of the library that runs it; each is
    read by the one strategy module it belongs to (:mod:`tunelab.plan.model.strategies`)."""

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
    fsdp_root_kept: bool = False
    """FSDP1 (``name: fsdp``): the root unit (everything outside the blocks) is not freed after forward, so it is
    gathered once per micro batch, not again for backward (traced: :mod:`tunelab.plan.trace.ranks`); FSDP2: the next
    field."""
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


@dataclass(frozen=True)
class LoopFeatures:
    """The loop that runs the case: litgpt's own script under Fabric, or tunelab's loop with a strategy file's
    speed switches."""

    fabric: bool = True
    """The run is litgpt's own script under Lightning Fabric, whose precision plugins convert the model's outputs
    (the logits) to fp32 under every precision, and whose loop holds the logits through the optimizer step; False:
    tunelab's loop (a strategies file), whose loss casts the logits to fp32 itself and drops them after backward."""
    fused_optimizer: bool = False
    """torch's fused Adam/AdamW kernel updates in place: no parameter-sized temporary during the step."""
    fused_loss: bool = False
    """tunelab's loop with Liger's fused linear cross-entropy (a strategy's ``liger``): the head's logits are never
    materialised; the fused loss keeps the gradients of its input and of the head weight from forward to backward
    (:func:`liger_loss_bytes`)."""
    fused_loss_reads: int = 0
    """Values the fused loss reads back from the GPU per micro batch, each draining the queue the host keeps ahead
    of it: 0 in tunelab's loop (the count of targets comes from the host); a run recorded with Liger's own wrapper
    read 2 (:data:`tunelab.plan.model.fast_step.LIGER_WRAPPER_READS`)."""
    loss_read_interval: int = 1
    """Iterations between reads of the loss to the host (a strategy's ``log_interval``; litgpt reads it every
    iteration): between reads the host queues kernels ahead of the GPU (:mod:`tunelab.plan.model.fast_step`)."""
    compiled: bool = False
    """Transformer blocks compiled (torch.compile, a strategy's ``compile: blocks``): what each block keeps is what
    torch's partitioner saves (:mod:`tunelab.plan.trace.compiled`, traced), not eager autograd's; planned as eager (an
    upper bound) under mixed precision, activation checkpointing, QLoRA and math attention."""
    qlora_stable_embedding: bool = True
    """litgpt's QLoRA swaps the embedding for bitsandbytes' trainable ``StableEmbedding`` after building the
    optimizer (since litgpt #1770; :func:`tunelab.plan.model.memory.stable_embedding_states`); False: the embedding
    stays frozen, as in litgpt's QLoRA before that change."""
    bnb_keeps_matmul_inputs: bool = False
    """bitsandbytes' 4-bit matmul keeps its input for backward whenever that input needs a gradient
    (``ctx.tensors = (A, B)``: bitsandbytes before 0.43.2, changed by its #1270;
    :func:`tunelab.plan.model.memory.bnb_matmul_inputs`); False: the versions since, which keep only the weight."""
    longest_first: bool = False
    """The loop runs the longest sample as its first micro batch (lit-gpt's finetune scripts before its data modules:
    ``get_batch(..., longest_seq_ix if iter_num == 1 else None)``), so the peak batch has no earlier micro batch's
    graph alive beside it; False: litgpt's data loaders since, where a micro batch as long as the peak can follow
    another while the loop still holds the last one's loss."""
    sliding_mask_by_row: bool = True
    """litgpt builds a sliding-window layer's training mask row by row in a Python loop, one fill per token (since its
    commit 3023ca88; :attr:`tunelab.plan.model.kernels.Step.mask_by_row`); False: with a few whole-mask ops, as
    litgpt did before."""

    @property
    def fast(self) -> bool:
        """tunelab's loop with a speed switch on (compiled blocks, a fused loss or optimizer, the loss read less often
        than every iteration): its step is timed by :mod:`tunelab.plan.model.fast_step`, with its own launch model;
        without one tunelab's loop launches as litgpt's does."""
        switched = self.compiled or self.fused_loss or self.fused_optimizer or self.loss_read_interval > 1
        return not self.fabric and switched


_GROUP_OF = {
    **{f.name: "options" for f in dataclass_fields(StrategyOptions)},
    **{f.name: "loop" for f in dataclass_fields(LoopFeatures)},
}
"""The group each :class:`StrategyOptions` and :class:`LoopFeatures` field belongs to."""


def _grouped(fields: dict, options: StrategyOptions, loop: LoopFeatures) -> dict:
    """``fields`` with the :class:`StrategyOptions` and :class:`LoopFeatures` keys moved into ``options`` and
    ``loop`` (copies)."""
    fields = dict(fields)
    groups = {"options": fields.pop("options", options), "loop": fields.pop("loop", loop)}
    out = {}
    for key, value in fields.items():
        group = _GROUP_OF.get(key)
        if group is None:
            out[key] = value
        else:
            groups[group] = replace(groups[group], **{key: value})
    return {**groups, **out}


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
    optimizer_init: tuple = ()
    """The optimizer's init arguments as (name, value) pairs: those that add states (SGD's ``momentum``, Adam's
    ``amsgrad``: :data:`tunelab.plan.model.optimizers.OPTION_STATES`) are counted."""
    lora_r: int = LITGPT_LORA_R
    """LoRA rank (litgpt's default 8)."""
    lora_targets: tuple = LORA_TARGETS
    """Names of the LoRA targets that are on (tunelab.settings.LORA_TARGETS)."""
    strategy: str = "single"
    """The planner's name for the strategy (:data:`tunelab.plan.model.strategies.NAMES`)."""
    devices: int = 1
    """Devices per node."""
    num_nodes: int = 1
    """Nodes."""
    activation_checkpointing: bool = False
    """Keep only each block's input; recompute one block at a time in backward."""
    attention_math: bool = False
    """SDPA falls back to the math kernel (scores materialised): bf16 on a GPU without bf16 (V100, T4)."""
    options: StrategyOptions = field(default_factory=StrategyOptions)
    """What the strategy's file sets for its own strategy (read by the strategy's module alone)."""
    loop: LoopFeatures = field(default_factory=LoopFeatures)
    """The training loop that runs the case: litgpt's script, or tunelab's with its speed switches."""
    tables: object = None
    """The traced tables the model reads (:class:`tunelab.plan.model.tables.Tables`; the planner passes
    :data:`tunelab.plan.trace.tables.TRACED`): kernel templates, compiled blocks, DDP's buckets. None: a case the
    model can plan without them (memory of eager blocks, any strategy but DDP)."""

    @classmethod
    def of(cls, **fields) -> PlanInput:
        """A case from flat fields, each :class:`StrategyOptions` and :class:`LoopFeatures` field into its group."""
        return cls(**_grouped(fields, StrategyOptions(), LoopFeatures()))

    def changed(self, **fields) -> PlanInput:
        """This case with ``fields`` replaced, each :class:`StrategyOptions` and :class:`LoopFeatures` field in its
        group (``dataclasses.replace`` that knows the groups)."""
        return replace(self, **_grouped(fields, self.options, self.loop))

    @property
    def world(self) -> int:
        return world_size(self.devices, self.num_nodes)

    @property
    def lora(self) -> bool:
        return self.method != "full"

    @property
    def has_momentum(self) -> bool:
        """Whether the optimizer's ``momentum`` is on (:func:`tunelab.plan.model.optimizers.is_set`, as its states
        are counted): SGD with momentum keeps one state (traced as such)."""
        return optimizers.is_set(dict(self.optimizer_init).get("momentum"))


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


def root_unit_params(config) -> int:
    """Parameters outside litgpt's blocks: the token embedding, the head (and its bias) and the final norm. Under
    FSDP with each block a unit they form the root unit, unsharded from the forward's start to its end and again
    through the whole backward."""
    c = config
    head = c.padded_vocab_size * c.n_embd + (c.padded_vocab_size if getattr(c, "lm_head_bias", False) else 0)
    return c.padded_vocab_size * c.n_embd + head + c.n_embd * (2 if c.norm_class_name == "LayerNorm" else 1)


LM_HEAD_CHUNK = 128
"""Tokens per lm_head chunk in litgpt's LoRA finetune loop (``model(x, lm_head_chunk_size=128)``)."""


def last_chunk_tokens(seq_len: int) -> int:
    """Positions in the last of litgpt's 128-token head chunks (:data:`LM_HEAD_CHUNK`) of a ``seq_len`` sequence."""
    return seq_len - (math.ceil(seq_len / LM_HEAD_CHUNK) - 1) * LM_HEAD_CHUNK


def logits_bytes(case: PlanInput) -> int:
    """Bytes per element of the logits the loss sees: 4 under every precision. Lightning Fabric (litgpt's scripts)
    converts the model's outputs to fp32 (its precision plugins' ``convert_output``), bf16-true included; tunelab's
    loop casts them to fp32 itself, as litgpt's numerics require."""
    return 4


def logits_held_at_step(case: PlanInput) -> float:
    """Bytes of the logits alive during the optimizer step: micro batch x sequence x padded vocabulary in the
    logits' dtype (:func:`logits_bytes`). litgpt's fit loop keeps ``logits`` referenced until the next iteration, so
    they sit beside the gradients and optimizer states; tunelab's loop computes them inside its loss function, so
    nothing holds them after backward (0), and its fused loss never makes them."""
    if not case.loop.fabric or case.loop.fused_loss:
        return 0
    return case.micro_batch_size * case.seq_len * case.config.padded_vocab_size * logits_bytes(case)


@dataclass
class Division:
    """How a strategy divides the model states: the devices each state is sharded over, and its buffers."""

    shard_w: int = 1
    """Devices the weights are sharded over."""
    shard_g: int = 1
    """Devices the gradients are sharded over."""
    shard_o: int = 1
    """Devices the optimizer's states (and master weights) are sharded over."""
    extra: float = 0.0
    """Buffers held through the whole step (:attr:`PerDevice.extra`)."""
    in_flight: float = 0.0
    """Buffers of the forward and backward only (:attr:`PerDevice.in_flight`)."""
    gathered: float = 0.0
    """Of ``in_flight``, the gathered parameters (:attr:`PerDevice.gathered`)."""


@dataclass
class PerDevice:
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
