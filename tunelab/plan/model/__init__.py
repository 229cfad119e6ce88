"""The plan's model: memory, time, communication, energy and price from typed inputs (no torch, no tracing).

The traced tables it reads (kernel templates, compiled blocks, DDP buckets) come in through
:class:`tunelab.plan.model.tables.Tables`, made by :mod:`tunelab.plan.trace`; see docs/architecture.md."""
