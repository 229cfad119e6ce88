"""The tracer's answers to the model's questions (:class:`tunelab.plan.model.tables.Tables`), each traced once per
model and shape and kept under the cache directory."""

from __future__ import annotations

from tunelab.plan.trace import compiled, kernel_trace, ranks


class TracedTables:
    """:class:`tunelab.plan.model.tables.Tables` from traces of litgpt's model on fake tensors."""

    def template(self, step):
        """:func:`tunelab.plan.trace.kernel_trace.cached_template`."""
        return kernel_trace.cached_template(step)

    def compiled_saved_bytes(self, config, kind, precision, lora_r, targets, input_grad=True):
        """:func:`tunelab.plan.trace.compiled.saved_bytes_per_token`."""
        return compiled.saved_bytes_per_token(config, kind, precision, lora_r, targets, input_grad=input_grad)

    def compiled_block(self, config, method, precision, lora_r, targets):
        """:func:`tunelab.plan.trace.compiled.block_kernels`."""
        return compiled.block_kernels(config, method, precision, lora_r, targets)

    def ddp_buckets(self, config, method, precision, bucket_cap_mb, *lora):
        """:func:`tunelab.plan.trace.ranks.ddp_buckets`."""
        return ranks.ddp_buckets(config, method, precision, bucket_cap_mb, *lora)


TRACED = TracedTables()
"""The tables the planner hands the model."""
