"""The GPU table of ``configs/hardware/gpus.yaml``: memory, dense peak FLOP/s by precision, bf16 support, power."""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import yaml

from tunelab.paths import CONFIGS_DIR

GPU_TABLE = CONFIGS_DIR / "hardware" / "gpus.yaml"


@dataclass(frozen=True)
class GPU:
    """One row of the GPU table."""

    name: str
    """The table's key, e.g. ``A100-80GB``."""
    memory_gib: float
    """Board memory in GiB (2^30 bytes)."""
    bf16: bool
    """Whether bfloat16 is computed natively."""
    tdp_w: float
    """Board power limit in W (an upper bound of the average power)."""
    peak_tflops: dict
    """Dense peak TFLOP/s by precision key (fp32, tf32, fp16, bf16); None where there is no fast path."""
    match: tuple = ()
    """Lower-case substrings of device names that identify this board."""

    @property
    def memory_bytes(self) -> int:
        return int(self.memory_gib * 2**30)

    def peak_flops(self, precision: str) -> float | None:
        """Peak FLOP/s for a litgpt/Lightning precision string (``bf16-true``, ``32-true``, ``16-mixed``, ...).

        ``32-true`` counts as plain fp32 (litgpt sets matmul precision 'high', which allows tf32 on Ampere+;
        we use the fp32 figure so that MFU is never flattered). Mixed precision computes in its 16-bit type.
        """
        key = precision_compute_dtype(precision)
        value = self.peak_tflops.get(key)
        return None if value is None else float(value) * 1e12


def precision_compute_dtype(precision: str) -> str:
    """The dtype the matmuls run in for a precision string: 'bf16', 'fp16' or 'fp32'."""
    p = str(precision)
    if p.startswith("bf16"):
        return "bf16"
    if p.startswith("16"):
        return "fp16"
    return "fp32"


@lru_cache(maxsize=1)
def table() -> dict[str, GPU]:
    raw = yaml.safe_load(GPU_TABLE.read_text())["gpus"]
    return {name: GPU(name=name, match=tuple(row.pop("match", ())), **row) for name, row in raw.items()}


def lookup(name: str) -> GPU:
    """The GPU for a table key (case-insensitive, '-' or ' ' alike); ValueError listing the known names."""
    norm = name.lower().replace(" ", "-").replace("_", "-")
    for key, gpu in table().items():
        if key.lower() == norm:
            return gpu
    raise ValueError(f"unknown GPU {name!r}; known: {', '.join(table())}")


def identify(device_name: str) -> GPU | None:
    """The GPU for a device name as CUDA/NVML report it ('NVIDIA H100 80GB HBM3'), or None if not in the table."""
    low = " " + device_name.lower()
    for gpu in table().values():
        if any(m in low for m in gpu.match):
            return gpu
    return None
