"""The memory plan: a case (:class:`tunelab.plan.model.case.PlanInput`) -> :class:`Plan`, a breakdown per device that
sums to the predicted peak of ``torch.cuda.max_memory_allocated``, the verdict for a GPU and the largest micro
batch.

:func:`predict` takes the model states (:func:`model_states`), the activations and the loss (:func:`_activations`,
from :mod:`tunelab.plan.model.activations`), the strategy's division (:func:`_divide`, asking
:func:`tunelab.plan.model.strategies.of`), then the largest of the forward's end, the strategy's backward moment and
the optimizer step. :func:`verdict` adds the allocator's slack and the CUDA context. The terms, the equations and
where it is weak: docs/planner.md, "Memory"."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import asdict, dataclass, field

from tunelab import hardware, models
from tunelab.gpt import fused_loss_chunk_rows
from tunelab.models import count_params, lora_param_count, lora_tensor_numels
from tunelab.plan.model import activations, optimizers, strategies
from tunelab.plan.model.case import (
    LM_HEAD_CHUNK,
    ModelStates,
    PerDevice,
    PlanInput,
    dtype_bytes,
    last_chunk_tokens,
    logits_bytes,
    logits_held_at_step,
)
from tunelab.plan.model.tables import compiled_supported, tables_of
from tunelab.units import GB, GIB, to_gb

CUDA_CONTEXT_BYTES = int(0.5 * GIB)
"""The CUDA context a process holds outside torch's allocator (outside "allocated" and "reserved")."""
ALLOCATOR_SLACK = 1.05
"""Reserved / allocated at the peak: the caching allocator keeps some blocks it cannot reuse (5-15% typically)."""
EDGE_FRACTION = 0.02
"""A verdict whose margin is within 2% of the GPU's memory is 'at the edge': the caching allocator's fragmentation
decides it, and the planner cannot (measured on an H100, evidence ``h100-part1``: reserved over allocated at the
peak of runs that fit ranged far above :data:`ALLOCATOR_SLACK`, and s1 ran out of memory with GiBs reserved but
unallocated)."""
ALLOCATOR_HEADROOM = 0.10
"""Fraction of the GPU's memory a configuration chosen for speed leaves above its predicted peak allocated. Past
it the caching allocator retries (frees its cache, calls cudaMalloc again) and throughput drops although the run
fits: measured on the H100's micro-batch curve (evidence ``h100-part3``), where retries began at 88-92% of the
GPU's memory allocated and the largest micro batch that fit lost a fifth of the best throughput to them.
``tunelab advise`` ranks only configurations within it (``--headroom``)."""
SHARDING = ("FULL_SHARD", "SHARD_GRAD_OP", "HYBRID_SHARD", "NO_SHARD")
"""FSDP sharding strategies."""


def four_bit_bytes_per_param(quantize: str) -> float:
    """Bytes per quantized weight of bnb.nf4 / bnb.fp4: 4 bits plus one fp32 absmax per 64-weight block; with
    double quantization (``-dq``) the absmax is 8-bit with an fp32 scale per 256 blocks."""
    return 0.5 + (1 / 64 + 4 / (64 * 256) if quantize.endswith("-dq") else 4 / 64)


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


def _optimizer_states(case: PlanInput, opt: str, trainable: int, s_param: int, notes: list) -> tuple[float, float]:
    """(optimizer states, master weights) in bytes before any division: DeepSpeed's float32 moments and master
    weights, a paged optimizer's device-resident states, else the optimizer's own states."""
    if (own := strategies.of(case).optimizer_states(case, trainable, s_param, notes)) is not None:
        return own
    if "Paged" in opt:
        notes.append(
            f"{opt}: states of tensors from {PAGED_MIN_NUMEL:,} elements in CUDA unified memory, outside torch's "
            "allocator (not in 'allocated'); smaller tensors' states are ordinary device memory"
        )
        return paged_optimizer_device_states(case), 0
    bnb = optimizers.bnb_states(case.optimizer)
    if not optimizers.known(case.optimizer) and not bnb and "8bit" not in opt:
        notes.append(f"optimizer {opt}: its states not known here, assumed 2 per parameter (as Adam's)")
    elif bnb and not bnb[1]:
        notes.append(f"optimizer {opt}: bitsandbytes keeps its {bnb[0]} state(s) in float32")
    elif opt in optimizers.FACTORED:
        notes.append(f"optimizer {opt}: factored states (each matrix's row and column means)")
    return optimizer_state_bytes(case, trainable, s_param), 0


def _step_temporaries(case: PlanInput) -> float:
    """Parameter-sized temporaries of the optimizer's step on top of weights, gradients and states: a torch.optim
    class's for-each step (the default on CUDA; foreach AdamW: the square root of its second moment) as
    :data:`tunelab.plan.model.optimizers.STEP_TEMPORARIES` counts it, none for a fused step; another Adam one."""
    opt = optimizers.class_name(case.optimizer)
    if case.loop.fused_optimizer and (optimizers.takes_fused(case.optimizer) or opt.startswith("Adam")):
        return 0
    if optimizers.known(case.optimizer):
        return optimizers.step_temporaries(case.optimizer)
    return 1 if opt.startswith("Adam") and "8bit" not in opt and "Paged" not in opt else 0


def model_states(case: PlanInput, notes: list) -> ModelStates:
    """Step 1: weights (quantized or not), gradients, optimizer states, master weights, step temporaries."""
    c = case.config
    total, emb = count_params(c)
    strategy = strategies.of(case)
    s_param = strategy.param_bytes(case)
    trainable = lora_param_count(c, case.lora_r, case.lora_targets) if case.lora else total
    quantize = case.quantize or ""
    if bnb_4bit(case):
        linear = total - emb
        per = four_bit_bytes_per_param(quantize)
        weights = linear * per + emb * s_param
        notes.append(f"{quantize}: linear weights {per:.4f} bytes/param (4-bit + block absmax)")
    elif quantize == "bnb.int8-training":
        weights = (total - emb) * 1.0 + emb * s_param
    else:
        weights = total * s_param  # the base model (LoRA adapters are counted apart)
    lora_weights = trainable * s_param if case.lora else 0
    grads = trainable * s_param
    opt = optimizers.class_name(case.optimizer)
    opt_bytes, master = _optimizer_states(case, opt, trainable, s_param, notes)
    step_temp = trainable * s_param * _step_temporaries(case) if strategy.foreach_temporary(case) else 0
    if case.loop.fused_optimizer and opt.startswith("Adam"):
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
        autocast_cache=autocast_weight_copies(case) if autocast_over_fp32_weights(case) else 0,
        s_param=s_param,
        s_gathered=s_param * strategy.gathered_scale(case),
    )


EIGHT_BIT_BLOCK = 256
"""Elements per block of bitsandbytes' 8-bit optimizer states: each block of each state keeps a float32 absmax."""
EIGHT_BIT_MIN = 4096
"""bitsandbytes' ``min_8bit_size``: a tensor under this many elements keeps float32 states."""


def eight_bit_state_bytes(elements: float, states: int = 2) -> float:
    """Bytes of bitsandbytes' 8-bit states over ``elements`` of tensors from :data:`EIGHT_BIT_MIN` elements (Adam's
    two, Lion's one): each a uint8 state and its float32 absmax per :data:`EIGHT_BIT_BLOCK` (the 256-entry quantile
    maps are shared by every tensor: 1 KB each, not counted)."""
    return elements * states * (1 + 4 / EIGHT_BIT_BLOCK)


def optimizer_state_bytes(case: PlanInput, trainable: int, s_param: int) -> float:
    """Bytes of the case's optimizer states over ``trainable`` parameters, wherever they live: bitsandbytes' 8-bit
    optimizers :func:`eight_bit_state_bytes`; a torch.optim class its parameter-sized states in the parameter dtype
    (``s_param`` bytes each; :mod:`tunelab.plan.model.optimizers`), a factored one (Adafactor) its row and column
    means of each trainable tensor (one state where the strategy flattens them: ``Strategy.flat_shards``); any other
    optimizer is taken as Adam-like (two states)."""
    if bnb := optimizers.bnb_states(case.optimizer):
        states, eight_bit = bnb
        return eight_bit_state_bytes(trainable, states) if eight_bit else trainable * states * 4
    if "8bit" in case.optimizer:
        return eight_bit_state_bytes(trainable)
    shaped = optimizers.class_name(case.optimizer) in optimizers.FACTORED and not strategies.of(case).flat_shards(case)
    shapes = trainable_shapes(case) if shaped else None
    return (
        trainable
        * optimizers.states_per_parameter(case.optimizer, dict(case.optimizer_init), trainable, shapes)
        * s_param
    )


def trainable_shapes(case: PlanInput) -> list[tuple[int, ...]]:
    """Shapes of the tensors the optimizer steps: LoRA's adapters, or every parameter of the model."""
    return models.trainable_shapes(case.config, (case.lora_r, case.lora_targets) if case.lora else None)


def autocast_over_fp32_weights(case: PlanInput) -> bool:
    """Mixed precision as autocast over fp32 weights (one device, DDP): activations in per-tensor dtypes and
    autocast's weight copies; the strategy says (:meth:`tunelab.plan.model.strategies.base.Strategy.autocast_over_fp32`)."""
    return strategies.of(case).autocast_over_fp32(case)


PAGED_MIN_NUMEL = 100_000
"""bitsandbytes pages an optimizer state only for a tensor of at least this many elements
(``Optimizer8bit.get_state_buffer``: ``p.numel() < 1e5`` gets ``torch.zeros_like``, ordinary device memory)."""


def paged_optimizer_device_states(case: PlanInput) -> float:
    """Bytes of a paged optimizer's states that are ordinary device memory: the states of trainable tensors under
    :data:`PAGED_MIN_NUMEL` elements. PagedAdamW keeps two fp32 states (8 bytes per element), PagedLion one; the
    8-bit ones :func:`eight_bit_state_bytes` for tensors from :data:`EIGHT_BIT_MIN` elements, fp32 below. Under LoRA
    nearly every adapter tensor is small (r x width), so nearly all LoRA states stay on the device; full
    fine-tuning's small tensors are the norm weights and biases (not counted: kilobytes per block)."""
    if not case.lora:
        return 0
    small = [n for n in lora_tensor_numels(case.config, case.lora_r, case.lora_targets) if n < PAGED_MIN_NUMEL]
    states = (optimizers.bnb_class_states(optimizers.class_name(case.optimizer)) or (2, False))[0]
    if "8bit" in str(case.optimizer):
        return sum(4 * states * n if n < EIGHT_BIT_MIN else eight_bit_state_bytes(n, states) for n in small)
    return 4 * states * sum(small)


def autocast_weight_copies(case: PlanInput) -> float:
    """Bytes of the 16-bit weight copies autocast makes under mixed precision, alive from the forward until backward
    has used them. Autocast casts each matmul's fp32 weight to 16 bits; it caches the copy of a weight that requires
    grad (one per forward) but casts a frozen one at every call, and the graph keeps each copy for the input's
    gradient. So full fine-tuning keeps one copy of every linear weight (lm_head included, the embedding not: it is
    a lookup; under activation checkpointing lm_head's alone), and LoRA one copy of each frozen block weight, one of
    lm_head per 128-token chunk litgpt's loop calls it for, and one of the adapters. Seen in the simulated step
    (tunelab/plan/trace/simulate.py): the difference between bf16-mixed and bf16-true LoRA is 2 x the block weights
    + one lm_head copy per chunk, to 0.2%. With a fused loss (Liger's) LoRA's head weight (frozen, or ``[W, B]``
    made by concatenation: no leaf) is cast again for every chunk and not kept (:func:`liger_loss_bytes` counts the
    one alive); full fine-tuning's trainable head weight is cached as before."""
    c = case.config
    total, emb = count_params(c)
    head = c.padded_vocab_size * c.n_embd
    checkpointed = case.activation_checkpointing
    # under activation checkpointing a block's forward keeps no copy (its recompute casts the block again in
    # backward): only the head's copies stay (the simulated step: full fine-tuning at bf16-mixed; the per-rank
    # simulation: litgpt's LoRA at bf16-mixed on several devices)
    if not case.lora:
        return 2 * head if checkpointed else 2 * (total - emb)
    blocks = 0 if checkpointed else total - emb - head + lora_param_count(c, case.lora_r, case.lora_targets)
    chunks = 0 if case.loop.fused_loss else math.ceil(case.seq_len / LM_HEAD_CHUNK)
    return 2 * blocks + 2 * head * chunks


def _activations(case: PlanInput, notes: list) -> tuple[float, float]:
    """Step 2: (activations, logits and loss) per device at the end of the forward pass."""
    c = case.config
    s_act = dtype_bytes(case.precision)  # the compute dtype (16-bit under mixed precision)
    mixed = autocast_over_fp32_weights(case)
    s_logits = logits_bytes(case)
    n_tok = case.micro_batch_size * case.seq_len
    # what autograd keeps, derived from the Config (tunelab/plan/model/activations.py; measured per family on CPU)
    kind = "lora" if case.lora else "full"
    efficient = attention_output_is_a_view(case)
    forward = activations.Forward(
        c,
        kind,
        s_act,
        case.micro_batch_size,
        case.seq_len,
        tuple(case.lora_targets),
        case.lora_r,
        mixed=mixed,
        logits_bytes=s_logits,
        attention_output_view=efficient,
        flash_pad=not (efficient or case.attention_math) and c.head_size % 8 != 0,
        frozen_weights_grad=strategies.of(case).frozen_weights_grad(case),
    )
    saved = activations.saved_bytes(forward)
    notes.extend(saved.notes)
    traced = (
        case.loop.compiled
        and compiled_supported(case.precision)
        and not (case.activation_checkpointing or bnb_quantized(case) or case.attention_math)
    )
    if case.activation_checkpointing:  # block inputs only, plus one block recomputed at a time in backward
        acts = checkpointed_inputs(case) + saved.per_layer
    elif traced:  # what torch.compile's partitioner keeps per block (traced once, bytes per token)
        args = (c, kind, str(case.precision), case.lora_r, tuple(case.lora_targets) if case.lora else ())
        first = tables_of(case).compiled_saved_bytes(*args, input_grad=not case.lora) * n_tok
        acts = first + tables_of(case).compiled_saved_bytes(*args) * n_tok * (c.n_layer - 1)
        notes.append(
            "compiled blocks: each block keeps what torch.compile's partitioner saves (tunelab/plan/trace/compiled.py, "
            f"traced: {acts / c.n_layer / GB:.2f} GB per block where eager keeps {saved.per_layer / GB:.2f})"
        )
    else:
        acts = saved.first_layer + saved.per_layer * (c.n_layer - 1)
    if case.loop.compiled and not traced:
        notes.append("compiled blocks: activations planned as eager here (an upper bound: inductor saves less)")
    if bnb_quantized(case) and case.loop.qlora_stable_embedding:  # QLoRA's trainable StableEmbedding: its norm
        # keeps its input (and mean and rstd), and the first block's input carries a gradient, so it keeps what the
        # others keep (stable_embedding_states)
        acts += (s_act * c.n_embd + 8) * n_tok + (
            0 if case.activation_checkpointing else saved.per_layer - saved.first_layer
        )
    acts += bnb_inputs_at_peak(case)
    if case.loop.fused_loss:
        logits = saved.head_norm + liger_loss_bytes(case)
        notes.append("Liger's fused linear cross-entropy: the logits are never materialised (liger_loss_bytes)")
    else:
        logits = _logits_and_loss(case, saved.head, s_logits, n_tok)
    if case.attention_math and not case.activation_checkpointing:  # softmax(QK^T) kept for backward
        acts += c.n_layer * n_tok * c.n_head * case.seq_len * s_act
    return acts, logits


def checkpointed_inputs(case: PlanInput) -> float:
    """Bytes activation checkpointing keeps per block, for every block: its input (fp32 under autocast over fp32
    weights, else the compute dtype), micro batch x sequence x embedding; a block recomputed in backward adds its
    own activations for a while."""
    s = 4 if autocast_over_fp32_weights(case) else dtype_bytes(case.precision)
    return s * case.config.n_embd * case.micro_batch_size * case.seq_len * case.config.n_layer


def _logits_and_loss(case: PlanInput, head: float, s_logits: int, n_tok: int) -> float:
    """The head and loss at their peak without a fused loss: what the loss saved (``head``) and what is alive beside
    it (as the simulated step shows, :mod:`tunelab.plan.trace.simulate`):

    * full fine-tuning: the logits and one more logits-sized tensor: in litgpt's loop, which holds the logits, their
      gradient (the chunked loss's backward concatenates the chunks' gradients into one); in tunelab's loop, whose
      loss function drops them on return, the copy ``reshape`` makes of their shifted slice, inside the loss;
    * LoRA, litgpt's loop: the list of 128-token chunks it holds, and the loss backward's temporaries beside them
      (:func:`lora_loss_backward_temporaries`);
    * LoRA, tunelab's loop: the larger of the chunks with the copy ``reshape`` makes of the last one's shifted slice
      (the end of the loss's forward) and the backward's temporaries (the chunks gone by then)."""
    c = case.config
    logits = n_tok * c.padded_vocab_size * s_logits
    if not case.lora:
        return head + 2 * logits
    temporaries = lora_loss_backward_temporaries(case, s_logits)
    if case.loop.fabric:
        return head + logits + temporaries
    last = last_chunk_tokens(case.seq_len)
    return head + max(logits + (last - 1) * case.micro_batch_size * c.padded_vocab_size * s_logits, temporaries)


def liger_loss_bytes(case: PlanInput) -> float:
    """Bytes the fused head and loss (Liger's kernels) hold at their peak, the last chunk of its forward (beside the
    final norm's saved tensors), as the loop's code allocates (:func:`tunelab.gpt.fused_head_loss`): the final norm's
    output ``h`` (positions x hidden, the residual stream's dtype), the loss's input (a copy of ``h`` without the
    last position; with a LoRA head, ``[h, adapter]`` made by concatenation, hidden + r columns), the gradient of
    that input, the gradient of the head weight when it trains (full fine-tuning; a LoRA head: the concatenated
    ``[W, B]`` too), one chunk's logits (:func:`tunelab.gpt.fused_loss_chunk_rows` x vocabulary, the compute
    dtype) and its product with the weight; under bf16-mixed, autocast's 16-bit copy of the transposed head weight that chunk's first
    matmul made (a view is never cached; the second matmul's copy of a trainable leaf weight is, and is counted
    with the autocast cache). The micro batch's logits (fp32 for the loss, and their gradient) never exist."""
    c = case.config
    s_act = dtype_bytes(case.precision)
    s_h = 4 if autocast_over_fp32_weights(case) else s_act  # bf16-mixed: the residual stream and ln_f are fp32
    s_w = 4 if "mixed" in str(case.precision) or str(case.precision).startswith("32") else 2  # the weights' dtype
    n, positions, v = (
        case.micro_batch_size * case.seq_len,
        case.micro_batch_size * (case.seq_len - 1),
        c.padded_vocab_size,
    )
    lora_head = case.lora and "head" in set(case.lora_targets)
    width = c.n_embd + (case.lora_r if lora_head else 0)
    chunk = fused_loss_chunk_rows(positions, v, width)
    total = s_h * c.n_embd * n + 2 * s_h * width * positions  # h, the input copy, its gradient
    if lora_head:
        total += 2 * s_w * v * width  # [W, B] and its gradient
    elif not case.lora:
        total += s_w * v * c.n_embd  # the head weight's gradient
    if autocast_over_fp32_weights(case):
        total += s_act * v * width
    return total + chunk * v * s_act + chunk * width * s_h


def optimizer_shards(case: PlanInput) -> int:
    """Devices the optimizer's states are sharded over (:class:`Division`'s ``shard_o``): each rank's optimizer
    step updates 1/this of the trainable parameters. FSDP's FULL_SHARD and SHARD_GRAD_OP over the world,
    HYBRID_SHARD over its node, ZeRO from stage 1; DDP, FSDP's NO_SHARD and one device update every parameter on
    every rank."""
    return strategies.of(case).optimizer_shards(case, model_states(case, []))


def _divide(case: PlanInput, st: ModelStates, notes: list) -> PerDevice:
    """Step 3: the strategy's division of the model states among devices (and into host RAM for offload)."""
    strategy = strategies.of(case)
    grads = strategy.gradients(case, st, notes)
    d = strategy.division(case, st, grads, notes)
    grads, step_temp = strategy.step_bytes(case, st, grads, st.step_temp)
    dev = PerDevice(
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
    return strategy.offloaded(case, st, dev, notes)


def lora_loss_backward_temporaries(case: PlanInput, s_act: float) -> float:
    """Bytes the chunked loss's backward adds under LoRA at its peak, beside everything the forward kept: three
    vocabulary-sized tensors of one 128-token chunk (the gradients of cross-entropy's nll_loss and log_softmax, and
    the last chunk's slice ``logits[-1][..., :-1, :]`` padded back), less the last chunk's log-softmax, which
    autograd has freed by then (its node has run), as the simulated step shows (tunelab/plan/trace/simulate.py).
    ``s_act``: the logits' bytes per element. Full fine-tuning's loss gradient is counted whole in the logits term."""
    chunk = min(LM_HEAD_CHUNK, case.seq_len)
    last = last_chunk_tokens(case.seq_len)
    v = case.config.padded_vocab_size
    return (3 * chunk - (last - 1)) * case.micro_batch_size * v * s_act


def dequantized_weight_temporary(case: PlanInput) -> float:
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
    if not bnb_4bit(case):
        return 0
    c, s = case.config, dtype_bytes(case.precision)
    fp16_copy = 0 if str(case.precision).startswith("16") else 2  # under fp16 compute, .to() returns the fp16 copy
    v, positions = c.padded_vocab_size, case.micro_batch_size * (case.seq_len - 1)
    freed = positions * v * logits_bytes(case) + lora_loss_backward_temporaries(case, logits_bytes(case))  # the loss's
    head = v * c.n_embd * (s + fp16_copy) + case.micro_batch_size * case.seq_len * v * s  # + every chunk's gradient
    if c.final_logit_softcapping is not None:
        last = last_chunk_tokens(case.seq_len)
        head -= case.micro_batch_size * last * v * s
    mlp = max(c.intermediate_size, c.n_embd) * c.n_embd * (s + fp16_copy)  # a block's, the head's gradients gone
    return max(0, head - freed, mlp - freed)


def bnb_quantized(case: PlanInput) -> bool:
    """litgpt runs the model under Lightning's BitsandbytesPrecision (any ``bnb.*`` quantization)."""
    return str(case.quantize or "").startswith("bnb.")


def attention_output_is_a_view(case: PlanInput) -> bool:
    """fp32 attention runs CUDA's memory-efficient kernel (not flash), whose output the projection reads as a view
    of what the kernel saved."""
    return dtype_bytes(case.precision) == 4 and not case.attention_math


def bnb_4bit(case: PlanInput) -> bool:
    """The linears are bitsandbytes' 4-bit ones (``bnb.nf4``, ``bnb.fp4`` and their ``-dq``), run by ``MatMul4Bit``."""
    return str(case.quantize or "").startswith(("bnb.nf4", "bnb.fp4"))


def bnb_matmul_inputs(case: PlanInput) -> float:
    """Bytes the 4-bit layers' inputs hold from forward to backward where bitsandbytes keeps them
    (:attr:`~tunelab.plan.model.case.LoopFeatures.bnb_keeps_matmul_inputs`: before 0.43.2, ``ctx.tensors = (A,
    B)`` whenever A needs a gradient, an attribute no checkpoint's saved-tensor hook sees). Per token and block, in
    the compute dtype: the attention's input (the first norm's output), the MLP's (the second norm's; one tensor
    with the first under a shared norm), the projection's (the heads reshaped into a copy; a view of what the
    attention saved under CUDA's fp32 kernel) and the MLP projection's (the activated intermediate); in the first
    block the norms reading the block's input (the first; the second too under a parallel residual) give outputs
    that need no gradient where the embedding is frozen; lm_head keeps the final norm's
    output. None of these is what autograd keeps otherwise: LoRA's adapters keep their dropout's output. Being no
    saved tensor, each stays as long as its graph: the loop holds the last micro batch's loss (litgpt's and tunelab's)
    until the next loss is bound, through the optimizer step (:func:`bnb_inputs_at_peak`). One micro batch's."""
    if not (bnb_4bit(case) and case.loop.bnb_keeps_matmul_inputs):
        return 0
    c = case.config
    shared = c.parallel_residual and c.shared_attention_norm
    attention = 0 if attention_output_is_a_view(case) else c.n_head * c.head_size
    block = c.n_embd * (1 if shared else 2) + attention + c.intermediate_size
    from_input = 2 if c.parallel_residual and not shared else 1  # norms reading the block's own input
    first = block - (0 if case.loop.qlora_stable_embedding else from_input * c.n_embd)
    per_token = first + block * (c.n_layer - 1) + c.n_embd
    return dtype_bytes(case.precision) * per_token * case.micro_batch_size * case.seq_len


def bnb_inputs_at_peak(case: PlanInput) -> float:
    """Bytes of kept 4-bit inputs (:func:`bnb_matmul_inputs`) at the plan's forward peak: two micro batches'. The
    versions that keep them dequantize through fp16 in forward as in backward (two head-sized temporaries), so the
    peak is lm_head's forward, where the last micro batch's graph is still alive (the loop holds its logits until
    the model returns, its loss until the next is bound); one where the longest sample runs first
    (:attr:`~tunelab.plan.model.case.LoopFeatures.longest_first`). The simulated step at that moment holds the last
    logits where the plan's holds the chunks' gradients: the plan over it by a vocabulary's share, 0.1-1.1%
    (:mod:`tunelab.plan.trace.simulate`)."""
    return (1 if case.loop.longest_first else 2) * bnb_matmul_inputs(case)


def stable_embedding_states(case: PlanInput) -> float:
    """Bytes of litgpt's QLoRA embedding swap (``finetune/lora.py`` main, 0.5.13; any bitsandbytes quantization):
    after the optimizer is built, ``model.transformer.wte`` is replaced by bitsandbytes' ``StableEmbedding`` (an
    embedding and a LayerNorm, moved to the weights' dtype). ``main`` keeps the old embedding referenced for the
    whole run, and the new weight trains (made after ``mark_only_lora_as_trainable``) without being in the
    optimizer, so ``zero_grad`` never frees its vocabulary-sized gradient: two vocabulary x embedding tensors, plus
    the norm's weight, bias and their gradients. Its activations (the norm's input; the first block's input now
    carries a gradient) are in the activation term. Seen in the simulated step (tunelab/plan/trace/simulate.py)."""
    if not (bnb_quantized(case) and case.loop.qlora_stable_embedding):
        return 0
    c = case.config
    s = 4 if "mixed" in str(case.precision) or str(case.precision).startswith("32") else 2  # the weights' dtype
    return 2 * c.padded_vocab_size * c.n_embd * s + 4 * c.n_embd * s


def predict(case: PlanInput) -> Plan:
    """The predicted peak allocated memory per device, as a breakdown that sums to it: model states (step 1),
    divided by the strategy (step 3), plus the largest of the candidate peaks: the end of the forward pass
    (activations and logits alive, step 2; autocast's 16-bit weight copies too, alive until backward used them),
    FSDP1's backward, or the optimizer step (gradients and the step's temporary)."""
    notes: list = []
    st = model_states(case, notes)
    acts, logits = _activations(case, notes)
    dev = _divide(case, st, notes)
    state_bytes = {
        "weights": dev.weights,
        "lora_weights": dev.lora_weights,
        "optimizer_states": dev.optimizer,
        "autocast_weight_cache": 0,
        "dequantized_weight_temporary": 0,
        "sharding_buffers": dev.extra,
        "qlora_stable_embedding": stable_embedding_states(case),
    }
    strategy = strategies.of(case)
    accumulated = strategy.accumulated_gradients(case, st, dev)
    inputs = checkpointed_inputs(case)
    f_acts, logits, in_flight, f_cache, f_note = strategy.forward_moment(case, st, dev, acts, logits, inputs)
    base = acts + accumulated + st.autocast_cache + dequantized_weight_temporary(case)
    forward_peak = base - acts - st.autocast_cache + f_acts + f_cache + logits + in_flight
    # litgpt's loop still holds the logits (full: one tensor; LoRA: the list of chunks) when it steps the optimizer:
    # a vocabulary-sized term the simulated step shows (tunelab/plan/trace/simulate.py), largest for 128k-256k vocabularies
    held = logits_held_at_step(case)
    step_peak = dev.grads + dev.step_temp + held + bnb_matmul_inputs(case)  # the last graph's kept inputs too
    backward, backward_peak, acts_at_backward, at_end, gathered = strategy.backward_moment(
        case, st, dev, base, acts, inputs
    )
    in_backward = backward_peak > max(forward_peak, step_peak)  # FSDP1's backward: the logits freed, its gradients
    if in_backward or forward_peak >= step_peak:
        state_bytes["sharding_buffers"] += gathered if in_backward else in_flight
        state_bytes["autocast_weight_cache"] = st.autocast_cache if in_backward else f_cache
        state_bytes["dequantized_weight_temporary"] = dequantized_weight_temporary(case)
        parts = {
            "gradients": accumulated,
            "activations": acts_at_backward if in_backward else f_acts,
            "logits_and_loss": held if in_backward else logits,
            **({"fsdp1_backward_gradients": backward} if in_backward else {}),
            "optimizer_step_temporary": 0,
        }
        if in_backward:
            notes.append(strategy.backward_note(case, at_end))
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
    return _plan(case, st, dev, {**state_bytes, **parts}, notes)


def _plan(case: PlanInput, st: ModelStates, dev: PerDevice, parts: dict, notes: list) -> Plan:
    """The :class:`Plan` of ``case`` whose breakdown is ``parts`` (bytes by term, rounded down)."""
    breakdown = {k: int(v) for k, v in parts.items()}
    peak = sum(breakdown.values())
    return Plan(
        model=case.config.name,
        method=case.method,
        precision=case.precision,
        strategy=case.strategy,
        devices=case.world,
        micro_batch_size=case.micro_batch_size,
        seq_len=case.seq_len,
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


def max_micro_batch(case: PlanInput, gpu: hardware.GPU, limit: int = 4096, headroom: float = 0.0) -> int:
    """The largest micro batch whose predicted reserved memory + context fits (0 if even 1 does not); with
    ``headroom`` > 0 also leaving that fraction of the GPU's memory above the predicted peak allocated (see
    :func:`tight`)."""

    def fits(m):
        plan = verdict(predict(dataclasses.replace(case, micro_batch_size=m)), gpu)
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
