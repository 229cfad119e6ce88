"""Micro batches by length, the fast path's way, in one place for the loop that forms them
(:mod:`tunelab.run.batching`) and the planner that predicts their padding (:mod:`tunelab.plan.recipe`).

* :func:`plan_epoch`: the epoch's micro batches as sample indices: the order cut into micro batches, or
  length-grouped: the order cut into windows of ``group`` micro batches, each window sorted by length and cut into
  micro batches, the micro batches then shuffled (seeded). Every sample is in exactly one micro batch per epoch.
* :func:`bucket`: a micro batch's padded length under a strategy's ``pad_to_multiple``.
"""

from __future__ import annotations

import random


def plan_epoch(
    order: list[int],
    micro: int,
    lengths: list[int] | None = None,
    group: int | None = None,
    seed: int = 0,
    epoch: int = 0,
) -> list[list[int]]:
    """The epoch's micro batches (lists of sample indices) from an ``order``: cut in order, or, with ``group`` and the
    samples' ``lengths``, grouped by length within windows of ``group`` micro batches (see the module docstring)."""
    if not group:
        return [order[i : i + micro] for i in range(0, len(order), micro)]
    window = micro * group
    batches = []
    for start in range(0, len(order), window):
        chunk = sorted(order[start : start + window], key=lambda i: lengths[i], reverse=True)
        batches += [chunk[i : i + micro] for i in range(0, len(chunk), micro)]
    random.Random(seed * 1_000_003 + epoch).shuffle(batches)
    return batches


def bucket(length: int, multiple: int | None, cap: int) -> int:
    """The padded length of a micro batch whose longest sample has ``length`` tokens: the next multiple of
    ``multiple`` (None: ``length`` itself), never above ``cap`` (the model's ``max_seq_length``)."""
    if not multiple:
        return length
    return min(-(-length // multiple) * multiple, max(cap, length))
