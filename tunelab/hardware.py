"""The GPU table of ``configs/hardware/gpus.yaml``: memory, dense peak FLOP/s by precision, bf16 support, power."""

from __future__ import annotations

import re
from dataclasses import dataclass, fields, replace
from functools import lru_cache

from tunelab import yaml_input
from tunelab.errors import InputError
from tunelab.paths import CONFIGS_DIR, display_path
from tunelab.units import GIB

GPU_TABLE = CONFIGS_DIR / "hardware" / "gpus.yaml"


@dataclass(frozen=True)
class GPU:
    """One row of the GPU table."""

    name: str
    """The table's key, e.g. ``A100-80GB``."""
    memory_gib: float
    """Board memory as marketed, GiB (2^30 bytes); for display."""
    cuda_total_gib: float
    """Memory CUDA exposes to a process (torch.cuda.mem_get_info total), GiB: what fit verdicts use."""
    cuda_total_source: str
    """Where cuda_total_gib comes from (a measurement, a reported figure, or an estimate: said which)."""
    bf16: bool
    """Whether bfloat16 is computed natively."""
    tdp_w: float
    """Board power limit in W (an upper bound of the average power)."""
    peak_tflops: dict
    """Dense peak TFLOP/s by precision key (fp32, tf32, fp16, bf16); None where there is no fast path."""
    match: tuple = ()
    """Lower-case words of device names that identify this board (matched as whole words)."""
    bandwidth_gbs: float | None = None
    """Peak memory bandwidth, GB/s (datasheet): the runtime estimate's memory-bound terms divide by it."""
    link: str | None = None
    """The usual link between such GPUs in one node (a key of configs/hardware/links.yaml: nvlink4, pcie4, ...):
    the communication term's default (``plan --interconnect`` says otherwise)."""
    sms: int | None = None
    """Streaming multiprocessors (architecture whitepaper), or None where no source was found: the kernel time
    model's wave quantization."""
    sms_source: str = ""
    """Where ``sms`` comes from."""
    boost_mhz: float | None = None
    """The boost clock of the plain FP32 peak, MHz: with ``sms`` it checks the row (fp32 = SMs x FP32 lanes per SM
    x 2 FLOP x clock)."""
    clock_source: str = ""
    """Where ``boost_mhz`` comes from."""
    peak_source: str = ""
    """The datasheet or whitepaper the dense peaks come from."""
    bandwidth_source: str = ""
    """The datasheet the memory bandwidth comes from."""
    timed_by: str = ""
    """The timed runs on this GPU that the plan's time is checked against, and where they are kept; empty where
    there are none (:func:`time_checked` then says the time on it is an extrapolation)."""

    @property
    def memory_bytes(self) -> int:
        """The usable total (cuda_total_gib) in bytes; the CUDA context still comes out of it."""
        return int(self.cuda_total_gib * GIB)

    def peak_flops(self, precision: str, float32_matmul_precision: str | None = "highest") -> float | None:
        """Dense peak FLOP/s of the math a run actually does, for a litgpt/Lightning precision string
        (``bf16-true``, ``32-true``, ``16-mixed``, ...) and the float32 matmul precision in force.

        Mixed precision computes in its 16-bit type. ``32-true`` computes its matmuls as TF32 on tensor cores when
        the float32 matmul precision is 'high' or 'medium' (litgpt's CLI sets 'high') and the GPU has TF32; then
        the TF32 peak is the honest denominator (dividing by the FP32 one overstates MFU up to ~7x on Hopper).
        """
        key = precision_compute_dtype(precision, float32_matmul_precision, self)
        value = self.peak_tflops.get(key)
        return None if value is None else float(value) * 1e12

    def training_peak(self, precision: str) -> float | None:
        """The dense peak FLOP/s a planned run at ``precision`` is timed and its MFU measured against: litgpt's CLI
        and tunelab's loop set the float32 matmul precision to 'high', so ``32-true`` matmuls run as TF32. The one
        rule plan, advise and the accuracy checks share."""
        return self.peak_flops(precision, TRAINING_FLOAT32_MATMUL_PRECISION)


def precision_compute_dtype(
    precision: str, float32_matmul_precision: str | None = "highest", gpu: GPU | None = None
) -> str:
    """The dtype the matmuls run in: 'bf16', 'fp16', 'tf32' or 'fp32'."""
    p = str(precision)
    if p.startswith("bf16"):
        return "bf16"
    if p.startswith("16"):
        return "fp16"
    if float32_matmul_precision in ("high", "medium") and (gpu is None or gpu.peak_tflops.get("tf32")):
        return "tf32"
    return "fp32"


def peak_basis(precision: str, float32_matmul_precision: str | None, gpu: GPU | None = None) -> str:
    """The words for the peak MFU divides by, e.g. 'tf32 dense (float32 matmul precision high)'."""
    key = precision_compute_dtype(precision, float32_matmul_precision, gpu)
    if key in ("tf32", "fp32") and float32_matmul_precision:
        return f"{key} dense (float32 matmul precision {float32_matmul_precision})"
    return f"{key} dense"


TRAINING_FLOAT32_MATMUL_PRECISION = "high"
"""What litgpt's finetune CLI and tunelab's loop set (``torch.set_float32_matmul_precision``)."""
PEAK_KEYS = ("fp32", "tf32", "fp16", "bf16")
"""The precisions a row's ``peak_tflops`` gives (null where the GPU has no fast path)."""
_NUMBERS = {"memory_gib": 1e4, "cuda_total_gib": 1e4, "tdp_w": 1e5, "bandwidth_gbs": 1e6, "boost_mhz": 1e5}
"""Numeric keys of a row and their largest sensible value (each must be a finite number above 0)."""


TEXT_KEYS = ("cuda_total_source", "sms_source", "link", "clock_source", "peak_source", "bandwidth_source", "timed_by")
"""Keys of a row that hold text (a source, a link's name, the timed runs)."""


def _positive(value, high: float) -> bool:
    return type(value) in (int, float) and 0 < value < high  # NaN and inf fail both comparisons or the bound


def _check_row(name, row) -> None:
    """InputError naming the table, row and key for a row that is not a GPU: unknown or missing keys, a wrong type,
    a number that is not finite and positive, peaks for unknown precisions."""
    where = f"{GPU_TABLE}: gpus: {name}"
    if not isinstance(row, dict):
        raise InputError(f"{where}: a row is a mapping of keys to values; fix: see the table's header")
    known = {f.name for f in fields(GPU)} - {"name"}
    required = {"memory_gib", "cuda_total_gib", "cuda_total_source", "bf16", "tdp_w", "peak_tflops", "bandwidth_gbs"}
    if set(row) - known:
        raise InputError(f"{where}: unknown key(s) {sorted(set(row) - known)}; fix: one of {sorted(known)}")
    if required - set(row):
        raise InputError(f"{where}: missing {sorted(required - set(row))}; fix: see the table's header")
    for key, high in _NUMBERS.items():
        if (key in required or row.get(key) is not None) and not _positive(row.get(key), high):
            raise InputError(f"{where}: {key}: {row.get(key)!r} is not a positive number; fix: the datasheet's figure")
    if type(row["bf16"]) is not bool:
        raise InputError(
            f"{where}: bf16: {row['bf16']!r} is not true or false; fix: true where the GPU computes bfloat16"
        )
    peaks = row["peak_tflops"]
    if not isinstance(peaks, dict) or set(peaks) - set(PEAK_KEYS):
        raise InputError(
            f"{where}: peak_tflops: not a table of peaks; fix: map {', '.join(PEAK_KEYS)} to dense TFLOP/s or null"
        )
    for key, value in peaks.items():
        if value is not None and not _positive(value, 1e6):
            raise InputError(
                f"{where}: peak_tflops: {key}: {value!r} is not a peak; fix: positive dense TFLOP/s, or null"
            )
    needed = ["fp32", "fp16"] + (["bf16"] if row["bf16"] else [])  # what every GPU runs; bf16 where it says so
    missing = [k for k in needed if peaks.get(k) is None]
    if missing:
        raise InputError(
            f"{where}: peak_tflops: {', '.join(missing)}: no figure, but the planner times "
            f"{'bf16: true rows at it' if missing == ['bf16'] else 'every GPU at these'}; fix: the datasheet's dense "
            "TFLOP/s"
        )
    sms = row.get("sms")
    if sms is not None and (type(sms) is not int or not 0 < sms < 10_000):
        raise InputError(
            f"{where}: sms: {sms!r} is not a count of streaming multiprocessors; fix: a positive whole number from "
            "the GPU's architecture whitepaper (sms_source), or null"
        )
    match = row.get("match", [])
    if not isinstance(match, list) or not all(isinstance(m, str) and m for m in match):
        raise InputError(f"{where}: match: not a list of words; fix: lower-case words of nvidia-smi's device name")
    for key in TEXT_KEYS:
        if row.get(key) is not None and not isinstance(row[key], str):
            raise InputError(f"{where}: {key}: {str(row[key])[:40]!r} is not text; fix: quote it")


@lru_cache(maxsize=1)
def table() -> dict[str, GPU]:
    """Every row of configs/hardware/gpus.yaml by name (read once), each checked (:func:`_check_row`); a name
    given twice is refused by the reader."""
    raw = yaml_input.load_mapping(GPU_TABLE, "the GPU table").get("gpus")
    if not isinstance(raw, dict) or not raw:
        raise InputError(f"{GPU_TABLE}: gpus: a mapping of GPU names to rows; fix: see the table's header")
    for name, row in raw.items():
        _check_row(name, row)
    return {str(name): GPU(name=str(name), match=tuple(row.pop("match", ())), **row) for name, row in raw.items()}


def time_checked(gpu: GPU) -> str:
    """What checks a plan's time on ``gpu``: its row's timed runs, or that none do (the rows that have some named)."""
    if gpu.timed_by:
        return f"against {gpu.timed_by}"
    checked = ", ".join(g.name for g in table().values() if g.timed_by)
    return f"no timed run on {gpu.name} checks it: an extrapolation from runs on {checked}"


DEVICE_NAME_PREFIXES = ("nvidia ", "tesla ")
"""How the names CUDA and NVML report begin ('NVIDIA A100 80GB PCIe', 'Tesla T4'): :func:`lookup` reads such a name
as :func:`identify` does."""


def lookup(name: str) -> GPU:
    """The GPU for a table key: case, '-', '_' and spaces alike ('h200', 'RTX 4090', 'rtx4090'), or for a device name
    as nvidia-smi prints it ('NVIDIA A100 80GB PCIe': :func:`identify`); ValueError naming the keys that begin with
    what was given ('h100': H100-PCIe, H100-NVL, H100-SXM), else every known name."""

    def squeeze(text: str) -> str:
        return "".join(ch for ch in text.lower() if ch.isalnum())

    given = squeeze(name)
    for key, gpu in table().items():
        if given and squeeze(key) == given:
            return gpu
    if str(name).strip().lower().startswith(DEVICE_NAME_PREFIXES) and (gpu := identify(str(name))):
        return gpu
    near = [key for key in table() if given and squeeze(key).startswith(given)]
    if near:
        raise ValueError(f"GPU {name!r} is ambiguous: did you mean {' or '.join(near)}?")
    raise ValueError(f"unknown GPU {name!r}; fix: a row of {display_path(GPU_TABLE)}: {', '.join(table())}")


def local_gpu() -> GPU | None:
    """The GPU of this machine (device 0) with its real CUDA-visible total read from the device, or None when
    there is no GPU or it is not in the table."""
    try:
        import pynvml  # cheap check first: no NVIDIA driver, no torch import

        pynvml.nvmlInit()
        if pynvml.nvmlDeviceGetCount() < 1:
            return None
        import torch

        if not torch.cuda.is_available():
            return None
        gpu = identify(torch.cuda.get_device_name(0))
        if gpu is None:
            return None
        total = torch.cuda.mem_get_info(0)[1]
    except Exception:  # noqa: BLE001 - no usable device
        return None

    return replace(
        gpu,
        cuda_total_gib=total / GIB,
        cuda_total_source=f"read from this machine's device 0 (torch.cuda.mem_get_info: {total:,} B)",
    )


def identify(device_name: str) -> GPU | None:
    """The GPU for a device name as CUDA/NVML report it ('NVIDIA H100 80GB HBM3'), or None if not in the table. A
    match stands as whole words: 'l4' is not 'NVIDIA L40S', 'a100' not 'NVIDIA RTX A1000', 'h200' not 'GH200'."""
    low = device_name.lower()
    for gpu in table().values():
        if any(re.search(rf"(?<![a-z0-9]){re.escape(m)}(?![a-z0-9])", low) for m in gpu.match):
            return gpu
    return None
