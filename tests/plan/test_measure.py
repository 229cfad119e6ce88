"""One real forward counted (tunelab.plan.trace.measure): the measurement leaves nothing of the model alive."""

from __future__ import annotations

import gc

from tests.plan.test_ranks import small_llama
from tunelab.plan.trace import measure


def test_a_measurement_leaves_no_storage_of_its_model_alive(monkeypatch):
    """The saved-tensor hook keeps what it counts detached: an op's output packed as itself is a cycle through its
    grad_fn that Python's collector cannot see, and the graph (every weight and activation) outlived the measurement:
    full then LoRA of Gemma 7B in one process held both, 22.6 GB."""
    from torch.multiprocessing.reductions import StorageWeakRef

    storages = []
    build = measure._zero_model

    def spy(*args, **kwargs):
        model = build(*args, **kwargs)
        storages.extend(StorageWeakRef(p.untyped_storage()) for p in model.parameters())
        return model

    monkeypatch.setattr(measure, "_zero_model", spy)
    for precision in ("bf16-true", "bf16-mixed"):
        got = measure.measure(small_llama(), "full", precision, 1, 16)
        assert got.per_layer_bytes[0] > 0 and got.head_bytes > 0
    gc.collect()
    assert storages and all(s.expired() for s in storages), sum(not s.expired() for s in storages)
