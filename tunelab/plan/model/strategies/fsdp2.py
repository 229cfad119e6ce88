"""FSDP2 (``fully_shard`` per block, then the root; litgpt's LoRA on several devices): what it holds gathered at each
moment of a micro batch. See docs/planner.md."""

from __future__ import annotations

from tunelab.plan.model.case import (
    ModelStates,
    PerDevice,
    PlanInput,
    block_params,
    dtype_bytes,
    logits_held_at_step,
    parameter_bytes,
    root_unit_params,
)
from tunelab.plan.model.strategies.base import ForwardMoment
from tunelab.plan.model.strategies.fsdp import FSDP


def fsdp2_full_shard(case: PlanInput) -> bool:
    """FSDP2 resharding each block after forward (FULL_SHARD), each block a unit, then the root."""
    return case.options.sharding == "FULL_SHARD" and case.options.fsdp_wrap != "none"


def root_regathered(case: PlanInput) -> float:
    """Bytes FSDP2 holds at the start of backward that its loss never sees beside it, when each block and then the
    root unit are sharded and resharded after forward (``reshard_after_forward``, FULL_SHARD): the root is freed
    before the loss runs and gathered again for the head's backward, its all-gather buffer and its unsharded
    parameters alive together (two root units), beside the logits' gradient in the compute dtype. Read from what
    FSDPMemTracker holds at the per-rank simulation's peaks, by kind and size (TinyLlama LoRA and Gemma 2B full on 2
    devices: no gathered parameter at the loss; 2 x the root plus the logits' gradient at the backward's start).
    0 elsewhere (FSDP1 keeps the root gathered from forward to backward: it sits beside the loss)."""
    if not fsdp2_full_shard(case) or case.options.fsdp2_root_kept:
        return 0.0
    n_tok = case.micro_batch_size * case.seq_len
    return 2 * root_unit_params(case.config) * parameter_bytes(
        case.precision
    ) + n_tok * case.config.padded_vocab_size * dtype_bytes(case.precision)


def fsdp2_gathered(case: PlanInput) -> float:
    """Bytes FSDP2 (FULL_SHARD, each block a unit, then the root) holds gathered beside the activations inside its
    blocks, as FSDPMemTracker shows at the per-rank simulation's peaks (OpenLLaMA 3B, bf16-true): the larger of

    * a late block's forward: the root unit, unsharded for the whole forward (its forward holds every block's),
      the block's all-gather buffer and its unsharded parameters, and the next block's buffer, prefetched (LoRA on
      2 devices: 2 x 251.7 MB buffers, 251.7 MB unsharded, the root's 409.6 MB);
    * full fine-tuning, a block's backward: the root, the head's weight gradient (unsharded until the root's
      reduce-scatter at the end of backward), the block's unsharded parameters and gradients, the next block's
      all-gather buffer and the previous one's reduce-scatter buffer (on 8 devices: 409.6 + 204.8 + 4 x 247.8 MB)."""
    c = case.config
    root, block = root_unit_params(c), block_params(c)
    backward = root + c.padded_vocab_size * c.n_embd + 4 * block if case.method == "full" else 0
    return max(root + 3 * block, backward) * parameter_bytes(case.precision)


def fsdp2_forward_start(case: PlanInput) -> float:
    """Bytes FSDP2 (each block, then the root, resharded after forward) holds gathered at the forward's start: the
    root unit and the first block, each unsharded beside its all-gather buffer, 2 x (root + block), before any of
    this forward's activations. Read from FSDPMemTracker at the per-rank simulation's forward peak (TinyLlama LoRA on
    4 devices under litgpt's parallelize_fn: 0.355 GB unsharded beside 0.355 GB of all-gather buffers); the peak
    where activation checkpointing leaves the activations small."""
    if not fsdp2_full_shard(case):
        return 0.0
    return 2 * (root_unit_params(case.config) + block_params(case.config)) * parameter_bytes(case.precision)


def _fsdp2_moment(
    case: PlanInput, dev: PerDevice, acts: float, logits: float, cache: float, checkpointed: float
) -> ForwardMoment:
    """The activations, logits, gathered buffers, autocast's copies and note at FSDP2's peak outside the optimizer step
    (``cache``: autocast's weight copies, alive from the forward into backward), the largest of:
    the forward's start (:func:`fsdp2_forward_start`, beside the logits litgpt's loop still holds from the last
    micro batch); the loss (the root beside it where it is kept); a late block's forward or the backward's start
    (the division's gathered bytes, :func:`root_regathered` or :func:`fsdp2_gathered`, beside the blocks' saved
    activations, under checkpointing their inputs only, and the logits litgpt's loop holds); and, under
    checkpointing, a block's backward (the root, the block and the next one gathered, one block recomputed). Every
    moment holds the unsharded gradients of micro batches without sync."""
    held = logits_held_at_step(case)
    grads = dev.in_flight - dev.gathered
    inputs = checkpointed if case.activation_checkpointing else acts
    root = root_unit_params(case.config) * parameter_bytes(case.precision)
    start_note = "the peak is FSDP2's forward start: the root unit and the first block gathered, each beside its "
    start_note += "all-gather buffer" + (", the last micro batch's logits still held (litgpt's loop)" if held else "")
    late = 0.0 if case.activation_checkpointing else cache  # checkpointed: only the head's copies, made at the loss
    moments = [
        ForwardMoment(0.0, held, fsdp2_forward_start(case) + grads, 0.0, start_note),
        # the loss: under checkpointing one block beside the inputs, as rank 0's simulation holds it (unlike FSDP1's)
        ForwardMoment(acts, logits, grads + (root if case.options.fsdp2_root_kept else 0.0), cache, None),
        ForwardMoment(inputs, held, dev.in_flight, late, None),
        ForwardMoment(
            acts, held, grads + root + 2 * block_params(case.config) * parameter_bytes(case.precision), late, None
        ),
    ]
    return max(moments, key=lambda m: m.total)


class FSDP2(FSDP):
    """FSDP2 (``name: fsdp2``, and litgpt's LoRA on several devices, whose root is kept: ``fsdp2_root_kept``)."""

    files, label = ("fsdp2",), "FSDP2"
    host_ops_per_unit = (39.0, 52.0)
    """Measured on a CPU in ops of the plain loop (evidence ``cpu-wrapper-host``, scripts/bench_wrapper_host.py):
    the median over its FSDP2 cases (the ``fsdp2`` file and litgpt's LoRA sharding, on 4 ranks)."""
    host_ops_fixed = (41.0, 20.0)
    """The same cases' median beside the blocks."""

    def fields(self, config, world: int) -> dict:
        """Per-block ``fully_shard``: ``reshard_after_forward`` False keeps the parameters (ZeRO-2-like);
        tunelab.parallel.wrap passes the file's ``reshard_after_forward`` to the root too."""
        return {
            "strategy": self.name,
            "sharding": "FULL_SHARD" if config.reshard_after_forward else "SHARD_GRAD_OP",
            "fsdp_root_kept": False,
            "fsdp2_root_kept": False,
        }

    def gathered_bytes(self, case: PlanInput, st: ModelStates) -> float:
        if fsdp2_full_shard(case):  # what it gathers beside the activations, by moment
            return max(root_regathered(case), fsdp2_gathered(case))
        return super().gathered_bytes(case, st)

    def forward_moment(
        self, case: PlanInput, st: ModelStates, dev: PerDevice, acts: float, logits: float, inputs: float
    ) -> ForwardMoment:
        if not fsdp2_full_shard(case):
            return super().forward_moment(case, st, dev, acts, logits, inputs)
        return _fsdp2_moment(case, dev, acts, logits, st.autocast_cache, inputs)

    def root_kept(self, case: PlanInput) -> bool:
        return case.options.fsdp2_root_kept
