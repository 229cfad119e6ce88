"""FSDP1 (torch's ``FullyShardedDataParallel``, litgpt's full fine-tuning on several devices): flat parameters, the
root unit kept gathered from the forward into the backward, its backward's moments and ``cpu_offload``. See
docs/planner.md."""

from __future__ import annotations

from tunelab.plan.model.case import (
    LM_HEAD_CHUNK,
    ModelStates,
    PerDevice,
    PlanInput,
    block_params,
    dtype_bytes,
    logits_held_at_step,
    parameter_bytes,
    root_unit_params,
)
from tunelab.plan.model.strategies.base import BackwardMoment
from tunelab.plan.model.strategies.fsdp import FSDP, fsdp_shard_group


def flat_parameter_frozen_grad_elements(case: PlanInput, total: int) -> int:
    """Frozen weights FSDP1 gives a gradient under LoRA (``total``: all parameters, LoRA's excluded): a flat
    parameter (one per block, and the root unit) with any trainable weight gets a gradient for all of its weights,
    frozen ones included (torch's FSDP documents it for ``use_orig_params=True``, which Lightning's FSDPStrategy and
    tunelab's loop set; traced by the per-rank simulation); the root unit (embedding, final norm, head) only when
    one of its weights is trained or it is the whole model (:func:`frozen_units`). The memory side
    (:func:`flat_parameter_grads`) and the communication side (``tunelab.plan.model.comm``: these gradients are
    reduce-scattered whole) both count them here."""
    return total - (0 if frozen_units(case) == "all" else root_unit_params(case.config))


def frozen_units(case: PlanInput) -> str:
    """Which units' frozen weights FSDP1 gives a gradient under LoRA (:meth:`FSDP1.frozen_weights_grad`): "blocks",
    "all" where the root unit holds an adapter (the head a target) or is the whole model (no auto-wrap: one flat
    parameter), "" without LoRA."""
    if not case.lora:
        return ""
    return "all" if case.options.fsdp_wrap == "none" or "head" in set(case.lora_targets) else "blocks"


def flat_parameter_grads(case: PlanInput, st: ModelStates) -> float:
    """Gradient bytes FSDP1 allocates for a LoRA model: every weight of a flat parameter with a trainable weight
    (:func:`flat_parameter_frozen_grad_elements`) plus LoRA's own."""
    return flat_parameter_frozen_grad_elements(case, st.total) * st.s_param + st.lora_weights


def fsdp1_backward_gradients(case: PlanInput, st: ModelStates) -> float:
    """Bytes FSDP1 holds at its backward peak (full fine-tuning, each block a sharded unit) beside every activation
    and the gathered units, that the forward's end does not hold (the logits are freed by then): the block's
    unsharded flat gradient and the same gradients again as its original parameters' tensors (``use_orig_params``),
    the head's weight gradient (the root unit's, held until the root's reduce-scatter at the backward's end) and one
    activation gradient. Read from what MemTracker holds at the per-rank simulation's peak, by kind and size
    (TinyLlama, 32-true, 8 devices: 176 + 176 + 262 + 8 MB; docs/planner.md). LoRA with an adapter on the head
    (:func:`frozen_units` "all"): the head's weight gradient too, made by the chunked head's backward, which
    sums the chunks' gradients (the running sum, the chunk's and their sum: three head-sized tensors at once, beside
    two chunks' logits gradients in the compute dtype and one block gathered, the last, prefetched), then held in
    each block's backward (two blocks gathered) beside the block's flat gradient (frozen weights included) and its
    original parameters' gradients, as in full fine-tuning; the larger of the two, as bytes beyond the two gathered
    blocks the forward counts (``reports/planner-strategies/`` checks it against the per-rank simulation). At the
    head, one block of the two the forward counts is apart under FULL_SHARD and HYBRID_SHARD only: SHARD_GRAD_OP
    keeps every unit gathered into the backward and NO_SHARD gathers none, so nothing is apart there.
    FSDP1's ``cpu_offload`` changes none of it (:func:`tunelab.plan.model.strategies.fsdp.fsdp1_offloaded`). 0
    elsewhere: LoRA with the head frozen has no head gradient (:func:`fsdp1_frozen_block_backward`); one unit and
    the other strategies are not derived here."""
    c = case.config
    block = block_params(c)
    head = c.padded_vocab_size * c.n_embd
    if frozen_units(case) == "blocks":  # no head gradient: fsdp1_frozen_block_backward
        return 0
    if case.lora and case.options.fsdp_wrap != "none":
        chunk_grads = 2 * case.micro_batch_size * min(LM_HEAD_CHUNK, case.seq_len) * c.padded_vocab_size
        gathered_apart = block if case.options.sharding in ("FULL_SHARD", "HYBRID_SHARD") else 0  # see the docstring
        at_head = (3 * head - gathered_apart) * st.s_param + chunk_grads * dtype_bytes(case.precision)
        return max(at_head, (head + 2 * block) * st.s_param)
    if not _fsdp1_full_shard_full(case):
        return 0
    return (2 * block + head) * st.s_gathered + case.micro_batch_size * case.seq_len * c.n_embd * dtype_bytes(
        case.precision
    )


def fsdp1_frozen_block_backward(case: PlanInput, st: ModelStates, acts: float, inputs: float) -> list:
    """[(bytes, activations alive, gathered bytes freed)] at the moments of a block's backward under LoRA when only
    the blocks' frozen weights take a gradient (:func:`frozen_units` "blocks": the head frozen, the root unit without
    one): a block's unsharded flat gradient, built by autograd from its weights' gradients, beside every activation;
    the same with its original parameters' gradients (``use_orig_params``), two blocks' worth, once the block's own
    activations are freed (under checkpointing, every block's input left); sharded with a sync each micro batch (no
    accumulation), the second block's backward too, beside the sharded gradients of the blocks done before it (whose
    gathered parameters SHARD_GRAD_OP has freed by then). Read from MemTracker at the per-rank simulation's backward
    peak (TinyLlama's width, 4 blocks, LoRA on query and value, 2 devices: 88.2 MB flat gradient, 88.2 MB of original
    parameters' gradients, two sharded blocks of 44.1 MB). [] elsewhere."""
    if frozen_units(case) != "blocks":
        return []
    c = case.config
    block = block_params(c) * st.s_param * fsdp1_unsharded_scale(case)  # unsharded: 16-bit under FSDPPrecision
    per_block = inputs / c.n_layer if case.activation_checkpointing else acts / c.n_layer
    left = inputs if case.activation_checkpointing else acts - per_block
    moments = [(block, acts, 0.0), (2 * block, left, 0.0)]
    if case.accumulation > 1:  # no_sync(): every block's gradient is whole and held from the first micro batch
        return moments
    if case.options.sharding == "NO_SHARD":  # the backward's end: its two beside every other block's whole one
        return [*moments, ((c.n_layer + 1) * block, 0.0, 0.0)]
    done = c.n_layer - 2  # the second block: its blocks done hold sharded gradients; SHARD_GRAD_OP freed them
    freed = done * block_params(c) * st.s_gathered if case.options.sharding == "SHARD_GRAD_OP" else 0.0
    sharded = done * block_params(c) * st.s_param / fsdp_shard_group(case)
    return [*moments, (2 * block + sharded, per_block, freed)]


def fsdp1_unsharded_scale(case: PlanInput) -> float:
    """The bytes of a gathered parameter or an unsharded gradient element under FSDP1 over the sharded one's:
    litgpt's own FSDP1 (Lightning's ``FSDPStrategy``) under 16-bit mixed precision gathers and reduces in 16 bits
    (``FSDPPrecision.mixed_precision_config``: param, reduce and buffer dtype bfloat16 for bf16-mixed) over fp32
    shards, 0.5; 1 elsewhere. Seen in the per-rank simulation (TinyLlama full, bf16-mixed, 4 devices: the root and
    blocks gathered in bf16, no_sync()'s unsharded gradients 2.2 GB for 1.1B parameters)."""
    mixed16 = "mixed" in str(case.precision) and parameter_bytes(case.precision) == 4
    return 0.5 if case.loop.fabric and mixed16 else 1.0


def _fsdp1_full_shard_full(case: PlanInput) -> bool:
    """FSDP1 full fine-tuning, FULL_SHARD or HYBRID_SHARD, each block a unit (offloaded or not:
    :func:`tunelab.plan.model.strategies.fsdp.fsdp1_offloaded` takes the states off the device, the moments stay)."""
    return (
        case.method == "full"
        and case.options.sharding in ("FULL_SHARD", "HYBRID_SHARD")
        and case.options.fsdp_wrap != "none"
    )


def fsdp1_root_backward_end(case: PlanInput, st: ModelStates) -> float:
    """Bytes FSDP1 full fine-tuning (:func:`_fsdp1_full_shard_full`), or LoRA whose root unit takes a gradient
    (:func:`frozen_units` "all": the head an adapter's; its gradients :func:`flat_parameter_grads`), holds at its
    backward's end, when the root unit's gradient is made, beyond the states: the root's unsharded parameters (kept
    through backward), its new flat gradient and the same gradients as its original parameters' tensors
    (``use_orig_params``: the embedding's and the head's), and every block's gradient: sharded after a micro batch
    with sync, whole (every unsharded gradient no_sync() accumulated, the root's too, in a middle micro batch; the
    first's own, its root's new flat gradient the root's only one) in one without; every activation and gathered
    block freed. The peak once activation checkpointing has made the activations small. Read from MemTracker at the
    per-rank simulation's backward peak (TinyLlama full, 32-true, 8 devices: the root's 524.3 MB parameters and
    524.3 MB flat gradient, two of 262.1 MB, 22 block gradients of 22.0 MB; Gemma 2B full on 2, accumulating 4: the
    root's 2,097 MB parameters and new flat gradient, two of 1,048.6 MB, the accumulated 18 x 220.2 + 2,097 MB)."""
    root_trained = case.method == "full" or frozen_units(case) == "all"
    sharded = case.options.sharding in ("FULL_SHARD", "HYBRID_SHARD") and case.options.fsdp_wrap != "none"
    if not (root_trained and sharded):
        return 0.0
    scale = fsdp1_unsharded_scale(case)
    root = root_unit_params(case.config) * st.s_param * scale
    grads = flat_parameter_grads(case, st) if case.lora else st.grads
    if case.accumulation > 2:  # a middle micro batch: the root's new flat gradient beside its accumulated one
        return 3 * root + grads * scale
    if case.accumulation == 2:  # the first: its new flat gradient is the root's first
        return 2 * root + grads * scale
    shard = fsdp_shard_group(case)
    return 3 * root + max(grads - root / scale, 0.0) / shard


def fsdp1_first_block_backward(case: PlanInput, st: ModelStates, acts: float, inputs: float) -> tuple[float, float]:
    """(bytes beyond the states and the gathered units, activations alive) of FSDP1 full fine-tuning
    (:func:`_fsdp1_full_shard_full`) in the first block's backward, the last to run, after a micro batch with sync:
    the block's unsharded gradient, the head's (held until the root's reduce-scatter) and every other block's
    sharded gradient, beside that block's input and, under checkpointing, its recomputed activations. Later in the
    backward than :func:`fsdp1_backward_gradients`' moment, with fewer activations and more sharded gradients: the
    peak where a block's sharded gradient outweighs its checkpointed input (OpenLLaMA 3B full, bf16, 8 devices,
    checkpointed: 247.8 + 204.8 MB beside 24 sharded gradients of 31.0 MB and one block recomputed). (0, 0) with
    accumulation (no_sync() keeps the gradients whole: the earlier moment holds them all) and elsewhere."""
    if not _fsdp1_full_shard_full(case) or case.accumulation > 1:
        return 0.0, 0.0
    c = case.config
    block, scale = block_params(c) * st.s_param, fsdp1_unsharded_scale(case)
    shard = fsdp_shard_group(case)
    grads = (block + c.padded_vocab_size * c.n_embd * st.s_param) * scale + (c.n_layer - 1) * block / shard
    left = inputs / c.n_layer + acts - inputs if case.activation_checkpointing else acts / c.n_layer
    return grads, left


def fsdp1_one_unit_gradients(case: PlanInput, st: ModelStates) -> float:
    """Bytes FSDP1 without auto-wrap (the whole model one sharded unit) holds at its backward's end beyond the
    gathered model and the states: the unit's unsharded flat gradient and the same gradients as its original
    parameters' tensors (``use_orig_params``), every activation freed by then; under LoRA the flat parameter's
    gradient covers its frozen weights too (:func:`flat_parameter_grads`). Read from the per-rank simulation
    (TinyLlama full, 32-true, 4 devices: 8.8 GB of temporaries at the backward's peak, twice its 4.4 GB of
    gradients). 0 elsewhere."""
    if case.options.fsdp_wrap != "none" or case.options.sharding == "NO_SHARD":
        return 0.0
    if case.options.offload_params or case.options.offload_optimizer:
        return 0.0
    return 2 * (flat_parameter_grads(case, st) if case.lora else st.grads)


def fsdp1_no_shard_root_gradients(case: PlanInput, st: ModelStates) -> float:
    """Bytes FSDP1 under NO_SHARD (each block a unit) holds at its backward's end beyond every flat gradient (whole:
    nothing is sharded, each unit's is all-reduced in place and kept): the root unit's original parameters'
    gradients (``use_orig_params``: the embedding's, the head's and the final norm's, as their own tensors beside
    the root's flat gradient until its post-backward hook), when the root has a gradient (full fine-tuning, or LoRA
    on the head: :func:`flat_parameter_frozen_grad_elements`). Read from MemTracker at the per-rank simulation's
    backward peak (Phi-2 LoRA on 8 devices: 32 block flat gradients of 160.3 MB, the root's 527.8 MB and two of
    262.1 MB). 0 elsewhere."""
    if case.options.sharding != "NO_SHARD" or case.options.fsdp_wrap == "none":
        return 0.0
    if (
        case.options.offload_params
        or case.options.offload_optimizer
        or (case.lora and "head" not in set(case.lora_targets))
    ):
        return 0.0
    return root_unit_params(case.config) * st.s_param


class FSDP1(FSDP):
    """FSDP1 (``name: fsdp``; litgpt's full fine-tuning on several devices, Lightning's FSDPStrategy)."""

    files, label = ("fsdp",), "FSDP1"
    host_ops_per_unit = (33.0, 47.0)
    """Measured on a CPU in ops of the plain loop (evidence ``cpu-wrapper-host``, scripts/bench_wrapper_host.py):
    the median over its FSDP1 cases (litgpt's on 1, 2 and 4 ranks, the ``fsdp`` file on 4)."""
    host_ops_fixed = (56.0, 31.0)
    """The same cases' median beside the blocks."""

    def flat_shards(self, case: PlanInput) -> bool:
        return True  # the optimizer steps each rank's 1-D slice of the flat parameters

    def fields(self, config, world: int) -> dict:
        return {
            "strategy": self.name,
            "sharding": config.sharding_strategy,
            "fsdp_wrap": config.auto_wrap,
            "fsdp_root_kept": True,
            "fsdp2_root_kept": False,
            "offload_params": config.cpu_offload,
            "activation_checkpointing": config.activation_checkpointing,
        }

    def gathered_scale(self, case: PlanInput) -> float:
        return fsdp1_unsharded_scale(case)

    def frozen_weights_grad(self, case: PlanInput) -> str:
        """LoRA under FSDP1 (NO_SHARD too: it keeps flat parameters, all-reduced whole): flat parameters mixing
        frozen and trainable weights, which FSDP1 gives a whole gradient (:func:`flat_parameter_grads`) and whose
        frozen weights are differentiable views during the forward (their matmuls keep their inputs:
        ``activations.saved_bytes``; the backward computes their gradients: ``kernels.Step.frozen_grads``):
        :func:`frozen_units`."""
        return frozen_units(case)

    def gradients(self, case: PlanInput, st: ModelStates, notes: list) -> float:
        if not case.lora:
            return st.grads
        notes.append(
            "FSDP1 with LoRA: each block's flat parameter holds frozen and trainable weights, and FSDP1 "
            "(use_orig_params) gives the whole flat parameter a gradient, as much as full fine-tuning's; its frozen "
            "weights are differentiable in the forward, so their matmuls keep their inputs too, and the backward "
            "computes their gradients (time); FSDP2 (configs/strategies/fsdp2.yaml) does neither"
        )
        return flat_parameter_grads(case, st)

    def at_the_loss(self, case: PlanInput, st: ModelStates, dev: PerDevice, logits: float) -> tuple[float, float]:
        """FSDP1's loss runs with its root gathered and no block (MemTracker at the per-rank simulation's peaks,
        Gemma 2B full on 8 devices): the blocks' buffers count only where they outweigh the logits."""
        apart = dev.gathered - root_unit_params(case.config) * st.s_gathered if dev.gathered else 0.0
        if apart > logits:
            return 0.0, dev.in_flight
        return logits, dev.in_flight - apart

    def root_kept(self, case: PlanInput) -> bool:
        return True

    def backward_moment(
        self, case: PlanInput, st: ModelStates, dev: PerDevice, base: float, acts: float, inputs: float
    ) -> BackwardMoment:
        """FSDP1's backward peak: a block's backward beside every activation (:func:`fsdp1_backward_gradients`), the
        first block's (:func:`fsdp1_first_block_backward`) or the backward's end with none (without auto-wrap
        :func:`fsdp1_one_unit_gradients`, under NO_SHARD :func:`fsdp1_no_shard_root_gradients`, under FULL_SHARD
        :func:`fsdp1_root_backward_end`, whose root is its own gathered bytes), whichever is higher, each beside the
        logits litgpt's loop holds through backward (:func:`logits_held_at_step`); all 0 but ``acts`` elsewhere."""
        held = logits_held_at_step(case)
        backward = fsdp1_backward_gradients(case, st)
        rest = base - acts + held  # what every backward's end holds beside its own terms
        candidates = []
        if backward:
            candidates.append(
                BackwardMoment(backward, base + dev.in_flight + backward + held, acts, False, dev.in_flight)
            )
        if one_unit := fsdp1_one_unit_gradients(case, st):
            candidates.append(BackwardMoment(one_unit, rest + dev.in_flight + one_unit, 0.0, True, dev.in_flight))
        if root := fsdp1_no_shard_root_gradients(case, st):  # every flat gradient (unless accumulated: in base already)
            at_end = (0.0 if case.accumulation > 1 else dev.grads) + root
            candidates.append(BackwardMoment(at_end, rest + dev.in_flight + at_end, 0.0, True, dev.in_flight))
        if end := fsdp1_root_backward_end(case, st):
            kept = root_unit_params(case.config) * st.s_gathered
            candidates.append(BackwardMoment(end - kept, rest + end, 0.0, True, kept))
        for grads, alive, freed in fsdp1_frozen_block_backward(case, st, acts, inputs):
            gathered = dev.in_flight - freed
            candidates.append(BackwardMoment(grads, rest + alive + gathered + grads, alive, "frozen block", gathered))
        late, left = fsdp1_first_block_backward(case, st, acts, inputs)
        if late:
            candidates.append(
                BackwardMoment(late, rest + left + dev.in_flight + late, left, "first block", dev.in_flight)
            )
        # the first of the highest, as before: a block's backward, then the ends in this order
        return max(candidates, key=lambda c: c.peak, default=BackwardMoment(0.0, 0.0, acts, False, 0.0))

    def backward_note(self, case: PlanInput, at_end) -> str:
        """The plan's note when FSDP1's backward holds the peak (:meth:`backward_moment`)."""
        held = " (litgpt's loop still holds the logits)" if logits_held_at_step(case) else ""
        if at_end == "frozen block":
            return (
                "the peak is FSDP1's backward of a block under LoRA: its unsharded gradient, frozen weights included, "
                f"and its original parameters' gradients beside the activations and gradients left then{held}"
            )
        if at_end and case.options.sharding == "NO_SHARD":
            return (
                "the peak is the backward's end under FSDP1 NO_SHARD: every unit's whole flat gradient and the root "
                "unit's original parameters' gradients beside its own, every activation freed"
            )
        if at_end and case.options.fsdp_wrap == "none":
            return (
                "the peak is the backward's end under FSDP1 without auto-wrap: the whole model's unsharded gradient "
                "twice over (its flat parameter's and its original parameters'), every activation freed"
            )
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
