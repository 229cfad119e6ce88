"""One device: nothing divided, nothing communicated (the :class:`Strategy` defaults). tunelab's fast path is this
strategy with the loop's speed switches on."""

from __future__ import annotations

from tunelab.plan.model.strategies.base import Strategy


class Single(Strategy):
    """One device (litgpt's default on one GPU, and a DDP file on one device)."""

    files = ("single",)
