"""NVML sampling (nvidia-ml-py) in a background thread of the parent: utilisation, power, used memory, energy, the SM
clock and why it is held down; and the host's own speed (:func:`host_op_us`, :func:`device_op_us`).

Every sample keeps its ``time.monotonic()`` stamp, the clock the ranks stamp their iterations with, so the record
gives two labelled sets of figures: the whole run, launch to exit, and the steady-state window the tokens/s use
(warm-up excluded, :meth:`GPUMonitor.window`). Energy is NVML's counter where the GPU has one, else power
integrated over the samples. docs/records.md."""

from __future__ import annotations

import functools
import platform
import statistics
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from tunelab.record import GPUSample


@dataclass
class WindowFigures:
    """NVML figures of one GPU between two instants."""

    util_mean: float | None
    util_std: float | None
    power_mean_w: float | None
    energy_j: float | None
    """From NVML's energy counter when the board has one (difference across the window, scaled to its exact
    length), else mean power x duration."""
    samples: int
    sm_clock_mhz: float | None = None
    """Mean SM clock of the samples, MHz (NVML_CLOCK_SM)."""
    clock_capped_share: float | None = None
    """Share of the samples whose clock NVML says was held down by power or heat (:data:`CAPPED_REASONS`)."""


CAPPED_REASONS = {
    0x4: "software power cap",
    0x8: "hardware slowdown",
    0x20: "software thermal slowdown",
    0x40: "hardware thermal slowdown",
    0x80: "hardware power brake",
}
"""NVML's clock event (throttle) reason bits that hold the SM clock below what the load asks for
(nvmlClocksEventReason*: idle, application clocks and sync boost are not among them)."""


class GPUMonitor:
    """Samples every visible GPU at ``hz`` (default 4 Hz) between start() and stop()."""

    def __init__(self, hz: float = 4.0):
        self.hz = hz
        self.available = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._handles: list = []
        self._names: list[str] = []
        self._samples: list[list[tuple]] = []
        """Per GPU: (t monotonic, util %, power W, used bytes, energy counter mJ or None, SM clock MHz or None, clock
        event reasons bitmask or None)."""
        self._energy_ok: list[bool] = []
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

    @property
    def names(self) -> list[str]:
        """NVML device names (read without creating a CUDA context in this process)."""
        return list(self._names)

    def memory_total_bytes(self) -> list[int]:
        """NVML total memory per GPU (what nvidia-smi prints as memory.total)."""
        if not self.available:
            return []
        return [int(self._nvml.nvmlDeviceGetMemoryInfo(h).total) for h in self._handles]

    def driver_version(self) -> str | None:
        if not self.available:
            return None
        v = self._nvml.nvmlSystemGetDriverVersion()
        return v.decode() if isinstance(v, bytes) else str(v)

    def _energy(self, i: int) -> int | None:
        if not self._energy_ok[i]:
            return None
        try:
            return int(self._nvml.nvmlDeviceGetTotalEnergyConsumption(self._handles[i]))  # mJ since driver load
        except Exception:  # noqa: BLE001 - not supported on every board
            self._energy_ok[i] = False
            return None

    def start(self) -> GPUMonitor:
        if not self.available:
            return self
        n = len(self._handles)
        self._samples = [[] for _ in range(n)]
        self._energy_ok = [True] * n
        self._t0 = time.monotonic()
        self._sample_all()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()
        return self

    def _sample_all(self) -> None:
        for i, h in enumerate(self._handles):
            try:
                t = time.monotonic()
                util = float(self._nvml.nvmlDeviceGetUtilizationRates(h).gpu)
                power = self._nvml.nvmlDeviceGetPowerUsage(h) / 1000.0
                used = int(self._nvml.nvmlDeviceGetMemoryInfo(h).used)
                self._samples[i].append((t, util, power, used, self._energy(i), *self._clock(h)))
            except Exception:  # noqa: BLE001 - a failed read is a missing sample
                pass

    def _clock(self, handle) -> tuple:
        """(SM clock MHz, clock event reasons) of one GPU, None for what this NVML or board does not report."""
        nv = self._nvml
        try:
            mhz = float(nv.nvmlDeviceGetClockInfo(handle, nv.NVML_CLOCK_SM))
        except Exception:  # noqa: BLE001 - optional: the sample stands without it
            mhz = None
        reasons = None
        for name in ("nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetCurrentClocksThrottleReasons"):
            if hasattr(nv, name):  # the first is NVML 12.2's name for the second
                try:
                    reasons = int(getattr(nv, name)(handle))
                except Exception:  # noqa: BLE001 - optional, as above
                    pass
                break
        return mhz, reasons

    def max_sm_clock_mhz(self) -> float | None:
        """GPU 0's highest SM clock (NVML's max clock info): what the clock samples are compared with."""
        if not self.available:
            return None
        try:
            return float(self._nvml.nvmlDeviceGetMaxClockInfo(self._handles[0], self._nvml.NVML_CLOCK_SM))
        except Exception:  # noqa: BLE001 - not reported by every board
            return None

    def _loop(self) -> None:
        period = 1.0 / self.hz
        while not self._stop.wait(period):
            self._sample_all()

    def stop(self) -> list[GPUSample]:
        """Stop sampling; the whole-run figures per GPU (launch to exit)."""
        if not self.available or self._thread is None:
            return []
        self._stop.set()
        self._thread.join(timeout=5)
        self._sample_all()
        self._t1 = time.monotonic()
        out = []
        for i, whole in enumerate(self.window(self._t0, self._t1)):
            used = [s[3] for s in self._samples[i]]
            out.append(
                GPUSample(
                    index=i,
                    name=self._names[i],
                    peak_used_bytes=max(used) if used else None,
                    util_mean=whole.util_mean,
                    util_std=whole.util_std,
                    power_mean_w=whole.power_mean_w,
                    energy_j=whole.energy_j,
                    samples=whole.samples,
                )
            )
        return out

    def window(self, t0: float, t1: float, skip=()) -> list[WindowFigures]:
        """Figures per GPU over [t0, t1] (monotonic seconds) less each (start, end) of ``skip`` (the loop's pauses:
        validation, generation, saves), from the samples taken there; energy over that time alone, at the counter's
        rate between samples no pause separates (else the mean power)."""

        def paused(a: float, b: float) -> bool:  # a pause lies within [a, b]
            return any(a <= end and start <= b for start, end in skip)

        span = (t1 - t0) - sum(max(0.0, min(end, t1) - max(start, t0)) for start, end in skip)
        out = []
        for samples in self._samples:
            inside = [s for s in samples if t0 <= s[0] <= t1 and not paused(s[0], s[0])]
            util = [s[1] for s in inside]
            power = [s[2] for s in inside]
            energy = None
            counted = [s for s in inside if s[4] is not None]
            pairs = [(a, b) for a, b in zip(counted, counted[1:]) if b[0] > a[0] and not paused(a[0], b[0])]
            if pairs:
                rate_w = sum(b[4] - a[4] for a, b in pairs) / 1000.0 / sum(b[0] - a[0] for a, b in pairs)
                energy = rate_w * span
            elif power:
                energy = statistics.fmean(power) * span
            clocks = [s[5] for s in inside if s[5] is not None]
            reasons = [s[6] for s in inside if s[6] is not None]
            capped = sum(1 for r in reasons if any(r & bit for bit in CAPPED_REASONS))
            out.append(
                WindowFigures(
                    util_mean=statistics.fmean(util) if util else None,
                    util_std=statistics.pstdev(util) if len(util) > 1 else None,
                    power_mean_w=statistics.fmean(power) if power else None,
                    energy_j=energy,
                    samples=len(inside),
                    sm_clock_mhz=statistics.fmean(clocks) if clocks else None,
                    clock_capped_share=capped / len(reasons) if reasons else None,
                )
            )
        return out


def cpu_name() -> str:
    """The CPU's model name (the device name of a run without a GPU)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


HOST_PROBE_OPS = 2000
"""Eager ops per repeat of :func:`host_op_us` (5 repeats, the median kept: about 30 ms on a laptop core)."""


def per_op_us(step, start, sync=None) -> float:
    """Microseconds per call of ``step``, the median of 5 repeats of :data:`HOST_PROBE_OPS` calls, each repeat from
    ``start`` and each call given the last one's result (``y = step(y)``: a chain autograd records, as in a model;
    a ``step`` that ignores its argument times independent ops); ``sync()`` after each repeat, outside its time."""
    times = []
    for _ in range(5):
        t = time.perf_counter()
        y = start
        for _ in range(HOST_PROBE_OPS):
            y = step(y)
        times.append((time.perf_counter() - t) / HOST_PROBE_OPS * 1e6)
        del y
        if sync is not None:
            sync()
    return statistics.median(times)


def host_op_us() -> float:
    """The host's eager dispatch speed: microseconds per small autograd-recording torch op (a multiply of a
    16-element tensor that requires grad), the median of 5 repeats, measured in the parent before launch. It
    describes that moment, not the loop: on one H200 machine (evidence ``h200-part1``) six runs read 4.3-7.6 us while litgpt's
    host-bound loop cost the same 54-57 us per op in each (``reports/planner-accuracy/runtime.md``), so the planner
    does not scale its host constant by it; it says which CPU a record's times came from and how busy it was."""
    import torch

    x = torch.ones(16, requires_grad=True)
    return per_op_us(lambda y: y * 1.0, x)


def device_op_us() -> float | None:
    """The same chain of ops as :func:`host_op_us` on GPU 0: dispatch and the kernel's launch, timed on the host
    without a synchronisation inside a repeat (the GPU runs such a kernel faster than the host queues it); None
    without CUDA. What a host-bound step pays per kernel before litgpt's own Python: 10.1 us on the H200 machine
    whose CPU probe read 3.9 us (evidence ``h200-grid``, independent ops there), where
    litgpt's TinyLlama loop took about 47 us per kernel-launching op (runtime.md)."""
    import torch

    if not torch.cuda.is_available():
        return None
    x = torch.ones(16, device="cuda", requires_grad=True)
    x * 1.0  # the first launch loads the kernel
    torch.cuda.synchronize()
    return per_op_us(lambda y: y * 1.0, x, torch.cuda.synchronize)


def device_name(monitor: GPUMonitor | None = None) -> str:
    """The device a run started here records as ``device_name``: NVML's name of the first GPU when torch sees CUDA
    ('cuda' without NVML), else the CPU's model name."""
    import torch

    if torch.cuda.is_available():
        names = (monitor or GPUMonitor()).names
        return names[0] if names else "cuda"
    return cpu_name()


@functools.lru_cache(maxsize=1)
def this_device() -> str:
    """:func:`device_name`, read once per process (what a reused record must have run on)."""
    return device_name()
