"""tunelab.run.deepspeed_probe.profiled_peak: the bytes alive read from torch's profiler, without DeepSpeed (which
runs in tests/e2e/test_deepspeed_memory.py)."""

import json

import torch

from tunelab.run import deepspeed_probe


def _profiler():
    return torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True)


def test_the_peak_over_the_steps_counts_what_the_case_allocated_and_still_holds():
    """An earlier case left 2 MB alive in the allocator's running total; this case keeps 4 MB, makes and frees 16
    MB in its set-up and 8 MB inside its steps: the peak over the steps is 12 MB (not the set-up's 20, nor counted
    from the earlier case's total), 4 MB at the end."""
    with _profiler():
        earlier = torch.ones(1 << 19)  # 2 MB, alive through the next case: in the running total it starts from
    prof = _profiler()
    with prof:
        kept = torch.ones(1 << 20)  # 4 MB, alive to the end
        setup = torch.ones(4 << 20)  # 16 MB, gone before the steps
        del setup
        with torch.profiler.record_function(deepspeed_probe.STEPS_MARK):
            tmp = torch.ones(2 << 20)  # 8 MB, freed inside the steps
            del tmp
    peak, end = deepspeed_probe.profiled_peak(prof)
    assert abs(peak - 12 * 2**20) < 2**16 and abs(end - 4 * 2**20) < 2**16, (peak, end)
    del kept, earlier


def _event(ts: float, addr: int, size: int) -> dict:
    return {"name": "[memory]", "ts": ts, "args": {"Addr": addr, "Bytes": size, "Total Allocated": -1}}


def test_a_block_whose_free_was_not_seen_ends_when_its_address_is_allocated_again():
    """A block freed on a thread the profiler does not cover has no free event; the next allocation at its address
    ends it (the running total would keep it: 30 at the peak). Events are taken in time order, not file order."""
    events = [
        {"name": deepspeed_probe.STEPS_MARK, "ph": "X", "ts": 0.0},
        _event(3.0, 0xA, 10),  # the same address again: the first block (1.0) was freed unseen
        _event(1.0, 0xA, 10),
        _event(5.0, 0xB, -10),  # written before its allocation
        _event(2.0, 0xB, 10),
        _event(4.0, 0xC, 5),
        _event(6.0, 0xD, -7),  # a free of a block allocated before profiling: not counted
    ]
    assert deepspeed_probe.alive_bytes(events) == (25, 15)


def test_the_profiler_misses_a_free_made_on_another_thread(tmp_path):
    """Why the walk above: torch's profiler reports a free only on a thread it covers; a tensor made here and
    released on a Python thread leaves its bytes in the profiler's running total and sends no free event."""
    import threading

    prof = _profiler()
    with prof:
        box = [torch.ones(1 << 14)]  # 64 KiB
        thread = threading.Thread(target=box.clear)
        thread.start()
        thread.join()
        with torch.profiler.record_function(deepspeed_probe.STEPS_MARK):
            after = torch.ones(1 << 14)
    prof.export_chrome_trace(str(tmp_path / "trace.json"))
    events = json.loads((tmp_path / "trace.json").read_text())["traceEvents"]
    memory = [e["args"]["Bytes"] for e in events if e.get("name") == "[memory]"]
    assert memory == [1 << 16, 1 << 16], "a free event was reported after all"
    del after
