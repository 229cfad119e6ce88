"""tunelab.run.deepspeed_probe.profiled_peak: the bytes alive read from torch's profiler, without DeepSpeed (which
runs in tests/e2e/test_deepspeed_memory.py)."""

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
