"""The NVML sampler's bookkeeping, driven by a stand-in NVML (this machine has no GPU; the real library is what
runs on a GPU machine: pytest -m gpu). On a machine without a driver the monitor reports nothing."""

from __future__ import annotations

import sys
import time
import types

import pytest

from tunelab.gpu_monitor import GPUMonitor


def test_no_driver_means_no_samples():
    m = GPUMonitor()
    if m.available:
        pytest.skip("an NVIDIA driver is present here")
    assert m.start().stop() == [] and m.driver_version() is None


def fake_nvml(energy_supported: bool):
    state = {"energy_mj": [1_000_000, 2_000_000], "t": [0, 0]}
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
    nv.nvmlDeviceGetPowerUsage = lambda h: 300_000 if h == 0 else 100_000  # mW
    nv.nvmlDeviceGetMemoryInfo = lambda h: types.SimpleNamespace(used=(h + 1) * 10**9)

    def energy(h):
        if not energy_supported:
            raise RuntimeError("not supported")
        state["energy_mj"][h] += 500_000  # +500 J per read
        return state["energy_mj"][h]
    nv.nvmlDeviceGetTotalEnergyConsumption = energy
    return nv


@pytest.mark.parametrize("energy_supported", [True, False])
def test_aggregation(monkeypatch, energy_supported):
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml(energy_supported))
    m = GPUMonitor(hz=50)
    assert m.available and m.driver_version() == "580.1"
    m.start()
    time.sleep(0.3)
    samples = m.stop()
    assert [s.index for s in samples] == [0, 1] and samples[0].name == "NVIDIA H100 80GB HBM3"
    assert samples[0].samples >= 5 and 50 <= samples[0].util_mean <= 90 and samples[0].util_std > 0
    assert samples[0].power_mean_w == 300.0 and samples[1].power_mean_w == 100.0
    assert samples[1].peak_used_bytes == 2 * 10**9
    if energy_supported:
        assert samples[0].energy_j == pytest.approx(500.0)  # counter difference, mJ -> J
    else:
        assert 300.0 * 0.25 < samples[0].energy_j < 300.0 * 1.0  # mean power x elapsed time
