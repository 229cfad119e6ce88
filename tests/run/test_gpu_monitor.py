"""The NVML sampler's bookkeeping, driven by a stand-in NVML (this machine has no GPU; the real library is what
runs on a GPU machine: pytest -m gpu). On a machine without a driver the monitor reports nothing."""

from __future__ import annotations

import sys
import time
import types

import pytest

from tunelab.run.gpu_monitor import GPUMonitor


def test_no_driver_means_no_samples():
    m = GPUMonitor()
    if m.available:
        pytest.skip("an NVIDIA driver is present here")
    assert m.start().stop() == [] and m.driver_version() is None


def fake_nvml(energy_supported: bool, watts=lambda h, t: 300.0 if h == 0 else 100.0):
    """A stand-in NVML whose power follows ``watts(handle, monotonic time)`` and whose energy counter integrates
    it (as the real counter does), so window figures can be checked against known values."""
    state = {"t": [0, 0], "energy_mj": [1_000_000.0, 2_000_000.0], "last": [None, None]}
    nv = types.SimpleNamespace()
    nv.nvmlInit = lambda: None
    nv.nvmlDeviceGetCount = lambda: 2
    nv.nvmlDeviceGetHandleByIndex = lambda i: i
    nv.nvmlDeviceGetName = lambda h: b"NVIDIA H100 80GB HBM3"
    nv.nvmlSystemGetDriverVersion = lambda: "580.1"

    def util(h):
        state["t"][h] += 1
        return types.SimpleNamespace(gpu=50 + 40 * (state["t"][h] % 2))  # alternates 50 / 90

    nv.nvmlDeviceGetUtilizationRates = util
    nv.nvmlDeviceGetPowerUsage = lambda h: watts(h, time.monotonic()) * 1000  # mW
    nv.nvmlDeviceGetMemoryInfo = lambda h: types.SimpleNamespace(used=(h + 1) * 10**9, total=80 * 2**30)

    def energy(h):
        if not energy_supported:
            raise RuntimeError("not supported")
        now = time.monotonic()
        if state["last"][h] is not None:
            state["energy_mj"][h] += watts(h, now) * (now - state["last"][h]) * 1000
        state["last"][h] = now
        return int(state["energy_mj"][h])

    nv.nvmlDeviceGetTotalEnergyConsumption = energy
    nv.NVML_CLOCK_SM = 1
    nv.nvmlDeviceGetClockInfo = lambda h, kind: 1755.0 if watts(h, time.monotonic()) < 350 else 1500.0
    nv.nvmlDeviceGetMaxClockInfo = lambda h, kind: 1980.0
    # above 350 W the power cap holds the clock down (bit 0x4); idle (0x1) is not a cap
    nv.nvmlDeviceGetCurrentClocksEventReasons = lambda h: 0x4 if watts(h, time.monotonic()) >= 350 else 0x1
    return nv


@pytest.mark.parametrize("energy_supported", [True, False])
def test_aggregation(monkeypatch, energy_supported):
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml(energy_supported))
    m = GPUMonitor(hz=50)
    assert m.available and m.driver_version() == "580.1" and m.names == ["NVIDIA H100 80GB HBM3"] * 2
    t0 = time.monotonic()
    m.start()
    time.sleep(0.3)
    samples = m.stop()
    elapsed = time.monotonic() - t0
    assert [s.index for s in samples] == [0, 1] and samples[0].name == "NVIDIA H100 80GB HBM3"
    assert samples[0].samples >= 5 and 50 <= samples[0].util_mean <= 90 and samples[0].util_std > 0
    assert samples[0].power_mean_w == 300.0 and samples[1].power_mean_w == 100.0
    assert samples[1].peak_used_bytes == 2 * 10**9
    # energy over the run: 300 W x the run's length, from the counter or from mean power x time
    assert 300.0 * 0.25 < samples[0].energy_j <= 300.0 * elapsed * 1.05


def test_a_board_without_clock_reads_still_samples(monkeypatch):
    """An NVML without the clock or reason calls (older bindings, some boards): samples go on, clocks absent."""
    nv = fake_nvml(True)
    del nv.nvmlDeviceGetCurrentClocksEventReasons
    nv.nvmlDeviceGetClockInfo = lambda h, kind: (_ for _ in ()).throw(RuntimeError("not supported"))
    monkeypatch.setitem(sys.modules, "pynvml", nv)
    m = GPUMonitor(hz=100).start()
    time.sleep(0.1)
    m.stop()
    win = m.window(0.0, time.monotonic())[0]
    assert win.samples >= 2 and win.power_mean_w == 300.0  # the first and the last sample at least (a busy CPU)
    assert win.sm_clock_mhz is None and win.clock_capped_share is None


def test_steady_window_is_separate_from_the_whole_run(monkeypatch):
    """Power is 100 W while 'loading', 400 W while 'training': the steady-state window reports 400 W and the
    energy of 400 W x its length; the whole run's mean is lower. Without timestamped samples both were one mean."""
    switch = {}
    watts = lambda h, t: 400.0 if t >= switch.get("t", float("inf")) else 100.0  # noqa: E731
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml(True, watts))
    m = GPUMonitor(hz=100).start()
    time.sleep(0.3)
    switch["t"] = t_train = time.monotonic()
    time.sleep(0.4)
    t_end = time.monotonic()
    time.sleep(0.2)  # 'saving' at 400 W still, outside the window
    whole = m.stop()[0]
    win = m.window(t_train + 0.02, t_end)[0]
    assert win.power_mean_w == pytest.approx(400.0)
    # the clock under the cap: 1500 MHz, every sample capped; over the whole run some samples were not
    assert win.sm_clock_mhz == pytest.approx(1500.0) and win.clock_capped_share == 1.0
    load = m.window(0.0, switch["t"] - 0.02)[0]
    assert load.sm_clock_mhz == pytest.approx(1755.0) and load.clock_capped_share == 0.0
    assert m.max_sm_clock_mhz() == 1980.0
    assert win.energy_j == pytest.approx(400.0 * (t_end - t_train - 0.02), rel=0.1)
    assert whole.power_mean_w < 350.0  # the 100 W 'loading' samples pull the whole-run mean down


def test_runner_window_lines_up_with_iteration_timestamps():
    """The steady-state window is rank 0's counted steps, on the monotonic clock the ranks stamp with."""
    from tunelab.record import steady_state

    t = 1000.0
    iters = [(t + k * 0.5, 100, 80) for k in range(41)]  # 41 iterations 0.5 s apart, accumulation 2: 20 steps
    out = steady_state([iters], accumulation=2, n_iters=41)
    assert out["warmup_steps_excluded"] == 2  # 10% of 20 optimizer steps
    assert out["window"] == (t + 4 * 0.5, t + 40 * 0.5)  # from step 3's first iteration to the last one's end
    assert out["window_tokens_real"] == 36 * 80
    assert out["tok_s_real"] == pytest.approx(160.0)


def test_the_host_probes_time_an_op_on_the_cpu_and_on_the_gpu_when_there_is_one():
    """host_op_us times a small autograd op on the CPU; device_op_us the same op on GPU 0 (dispatch and launch),
    None without CUDA: a record never carries a made-up launch cost."""
    import torch

    from tunelab.run.gpu_monitor import device_op_us, host_op_us

    assert 0 < host_op_us() < 1000
    if torch.cuda.is_available():
        assert 0 < device_op_us() < 1000
    else:
        assert device_op_us() is None


@pytest.mark.gpu
def test_an_op_on_the_gpu_costs_the_host_more_than_on_the_cpu():
    """On a GPU machine the launch adds to the dispatch (the H200 machine: 10.1 us against 3.9 us)."""
    from tunelab.run.gpu_monitor import device_op_us, host_op_us

    assert device_op_us() > host_op_us()
