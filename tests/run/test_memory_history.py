"""The allocator-history summary (tunelab/run/memory_history.py) on CPU: a history in torch's snapshot format
replayed into each phase's peak and what is alive there, and the opt-in switch without a GPU. The real history
of a run is checked on a GPU (tests/e2e/test_gpu.py, pytest -m gpu)."""

from __future__ import annotations

from tunelab.run import memory_history


def _frames(*where):
    return [{"filename": f, "line": n, "name": fn} for f, n, fn in where]


TORCH = ("/x/site-packages/torch/nn/modules/linear.py", 125, "forward")
MODEL = ("/x/site-packages/litgpt/model.py", 90, "forward")
LOSS = ("/x/site-packages/litgpt/utils.py", 300, "chunked_cross_entropy")


def test_a_history_is_replayed_into_each_phases_peak_and_its_callers():
    trace = [
        {"action": "segment_alloc", "addr": 0, "size": 2 << 20, "frames": []},
        {"action": "alloc", "addr": 1, "size": 1000, "frames": _frames(TORCH, MODEL)},
        {"action": "alloc", "addr": 2, "size": 500, "frames": _frames(LOSS)},
        {"action": "free_requested", "addr": 2, "size": 500, "frames": []},  # the allocated count drops here
        {"action": "alloc", "addr": 3, "size": 200, "frames": _frames(TORCH)},  # torch's own frames only
        {"action": "free_completed", "addr": 2, "size": 500, "frames": []},  # not a second free
        {"action": "snapshot", "addr": 0, "size": 0, "frames": []},  # the first training batch
        {"action": "alloc", "addr": 4, "size": 300, "frames": _frames(LOSS)},
        {"action": "free_requested", "addr": 3, "size": 200, "frames": []},
        {"action": "free_completed", "addr": 3, "size": 200, "frames": []},
        {"action": "alloc", "addr": 5, "size": 50, "frames": _frames(TORCH, MODEL)},
    ]
    s = memory_history.summarise({"device_traces": [[], trace]}, max_entries=100)
    loaded, training = s["phases"]["loaded"], s["phases"]["training"]
    assert loaded["peak_bytes"] == 1500 and training["peak_bytes"] == 1500
    assert dict(loaded["alive_by_caller"]) == {
        "litgpt/model.py:90 forward": 1000,
        "litgpt/utils.py:300 chunked_cross_entropy": 500,
    }
    assert dict(training["alive_by_caller"]) == {
        "litgpt/model.py:90 forward": 1000,
        "litgpt/utils.py:300 chunked_cross_entropy": 300,
        "torch/nn/modules/linear.py:125 forward": 200,
    }
    assert s["events"] == len(trace) and not s["truncated"]
    # the phase boundary given as the history's length at the first batch: the same split
    assert memory_history.summarise({"device_traces": [trace]}, mark=6)["phases"] == s["phases"]
    assert memory_history.summarise({"device_traces": [trace]}, max_entries=len(trace))["truncated"]


def test_without_cuda_the_switch_is_one_line_and_writes_nothing(tmp_path, monkeypatch, capsys):
    import pytest
    import torch

    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present: tests/e2e/test_gpu.py checks the recording")
    monkeypatch.setenv(memory_history.ENV, "1")
    memory_history.start()
    memory_history.mark_first_batch()
    memory_history.write(str(tmp_path), 0)
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"tunelab: {memory_history.ENV}=1 ignored: no CUDA device"]
    assert not list(tmp_path.iterdir())
