"""The plan's tracer: litgpt's model run on fake tensors (the simulated step, per-rank simulation, kernel and
compiled-block traces, the stand-in device, the trace cache), producing the tables :mod:`tunelab.plan.model` reads."""
