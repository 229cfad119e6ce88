"""NVML sampling (nvidia-ml-py) in a background thread of the parent: utilisation, power, used memory, energy.

On a machine without an NVIDIA driver NVML does not initialise and the monitor returns no samples: GPU figures
are then absent from the record, never made up.
"""

from __future__ import annotations

import statistics
import threading
import time

from tunelab.record import GPUSample


class GPUMonitor:
    """Samples every visible GPU at ``hz`` (default 4 Hz) between start() and stop()."""

    def __init__(self, hz: float = 4.0):
        self.hz = hz
        self.available = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._handles: list = []
        self._names: list[str] = []
        self._util: list[list[float]] = []
        self._power: list[list[float]] = []
        self._peak_used: list[int] = []
        self._energy0: list[int | None] = []
        self._t0 = self._t1 = 0.0
        try:
            import pynvml

            pynvml.nvmlInit()
            self._nvml = pynvml
            count = pynvml.nvmlDeviceGetCount()
            self._handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
            self._names = [self._name(h) for h in self._handles]
            self.available = count > 0
        except Exception:  # noqa: BLE001 - no driver, no library, no GPU: no samples
            self.available = False

    def _name(self, handle) -> str:
        name = self._nvml.nvmlDeviceGetName(handle)
        return name.decode() if isinstance(name, bytes) else str(name)

    def driver_version(self) -> str | None:
        if not self.available:
            return None
        v = self._nvml.nvmlSystemGetDriverVersion()
        return v.decode() if isinstance(v, bytes) else str(v)

    def _energy(self, h) -> int | None:
        try:
            return int(self._nvml.nvmlDeviceGetTotalEnergyConsumption(h))  # mJ since driver load
        except Exception:  # noqa: BLE001 - not supported on every board
            return None

    def start(self) -> "GPUMonitor":
        if not self.available:
            return self
        n = len(self._handles)
        self._util, self._power = [[] for _ in range(n)], [[] for _ in range(n)]
        self._peak_used = [0] * n
        self._energy0 = [self._energy(h) for h in self._handles]
        self._t0 = time.monotonic()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()
        return self

    def _loop(self) -> None:
        period = 1.0 / self.hz
        while not self._stop.is_set():
            for i, h in enumerate(self._handles):
                try:
                    self._util[i].append(float(self._nvml.nvmlDeviceGetUtilizationRates(h).gpu))
                    self._power[i].append(self._nvml.nvmlDeviceGetPowerUsage(h) / 1000.0)
                    self._peak_used[i] = max(self._peak_used[i], int(self._nvml.nvmlDeviceGetMemoryInfo(h).used))
                except Exception:  # noqa: BLE001 - a failed read is a missing sample
                    pass
            self._stop.wait(period)

    def stop(self) -> list[GPUSample]:
        if not self.available or self._thread is None:
            return []
        self._stop.set()
        self._thread.join(timeout=5)
        self._t1 = time.monotonic()
        out = []
        for i, h in enumerate(self._handles):
            util, power = self._util[i], self._power[i]
            e0, e1 = self._energy0[i], self._energy(h)
            if e0 is not None and e1 is not None:
                energy = (e1 - e0) / 1000.0
            elif power:
                energy = statistics.fmean(power) * (self._t1 - self._t0)
            else:
                energy = None
            out.append(GPUSample(
                index=i, name=self._names[i], peak_used_bytes=self._peak_used[i] or None,
                util_mean=statistics.fmean(util) if util else None,
                util_std=statistics.pstdev(util) if len(util) > 1 else None,
                power_mean_w=statistics.fmean(power) if power else None, energy_j=energy, samples=len(util)))
        return out
