"""``python -m tunelab.run.preflight``: what a machine has for tunelab's GPU runbook, one line each, before any run.

Prints the versions (Python, torch + CUDA, lightning, litgpt, jsonargparse, bitsandbytes, deepspeed, pynvml), the
GPU (NVML name, memory.total, driver; CUDA's own total), then one line per problem:

* a package the runs import is missing (with the fix: carry its wheel, scripts/gpu/fetch_wheels.sh);
* torch is not the pinned version (requirements.txt): not an error, but every record carries the version, and
  the report says it;
* DeepSpeed builds its CPU Adam op at first use (ZeRO offload): it needs a C++ compiler, ninja and the Python
  headers; what is missing is named (the strategies without offload do not need it).

Exit status 1 when a package the runs need is missing, else 0.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import os
import platform
import shutil
import sys
import sysconfig
from pathlib import Path

from tunelab.paths import ROOT
from tunelab.run.gpu_monitor import GPUMonitor

REQUIRED = ("torch", "lightning", "litgpt", "jsonargparse", "yaml", "tokenizers")
"""Imported by every run."""
OPTIONAL = {
    "bitsandbytes": "QLoRA (quantize bnb.nf4)",
    "deepspeed": "the deepspeed-* strategies",
    "pynvml": "GPU utilisation, power and energy in the records",
    "matplotlib": "the report's plots",
}


def pinned(name: str) -> str | None:
    """The version requirements.txt pins for ``name`` (None if not pinned, or no checkout: a wheel install)."""
    if not (ROOT / "requirements.txt").is_file():
        return None
    for line in (ROOT / "requirements.txt").read_text().splitlines():
        line = line.split("#")[0].strip()
        if line.lower().startswith(name.lower() + "=="):
            return line.split("==", 1)[1]
    return None


def _version(module: str) -> str | None:
    try:
        mod = importlib.import_module(module)
    except Exception as e:  # noqa: BLE001 - any import failure is reported as such
        return f"IMPORT FAILED ({type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''})"
    for dist in (module, {"yaml": "PyYAML", "pynvml": "nvidia-ml-py"}.get(module, module)):
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    return getattr(mod, "__version__", "?")


def deepspeed_toolchain() -> list[str]:
    """What DeepSpeed's JIT build of its CPU Adam op would miss here (empty: nothing)."""
    missing = []
    cxx = os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++")
    if not cxx:
        missing.append("a C++ compiler (c++/g++)")
    if not shutil.which("ninja") and not (Path(sys.executable).parent / "ninja").exists():
        missing.append("ninja")
    include = sysconfig.get_paths().get("include") or ""
    if not (Path(include) / "Python.h").is_file():
        missing.append(f"the Python headers (no Python.h in {include})")
    return missing


def check() -> tuple[list[str], list[str], list[str]]:
    """(info lines, warnings, errors)."""
    info = [f"python {platform.python_version()} ({sys.executable})"]
    errors, warnings = [], []
    for mod in REQUIRED:
        v = _version(mod)
        info.append(f"{mod} {v}")
        if v is None or v.startswith("IMPORT FAILED"):
            errors.append(
                f"{mod}: cannot be imported ({v}); fix: carry its wheel (bash scripts/gpu/fetch_wheels.sh,"
                " then carry .whl) or pip install -r requirements.txt"
            )
    for mod, why in OPTIONAL.items():
        v = _version(mod)
        info.append(f"{mod} {v}")
        if v is None or v.startswith("IMPORT FAILED"):
            warnings.append(f"{mod}: cannot be imported ({v}): {why} will not work")
    try:
        import torch

        want = pinned("torch")
        have = torch.__version__.split("+")[0]
        info.append(f"torch CUDA build {torch.version.cuda}; cuda available: {torch.cuda.is_available()}")
        if want and have != want:
            warnings.append(
                f"torch {torch.__version__} here, {want} pinned in requirements.txt: the records carry "
                "the version; compare timings only across the same one"
            )
    except Exception:  # noqa: BLE001 - reported above
        pass
    mon = GPUMonitor()
    if mon.available:
        for name, total in zip(mon.names, mon.memory_total_bytes()):
            info.append(f"GPU {name}: NVML memory.total {total / 2**20:,.0f} MiB, driver {mon.driver_version()}")
    else:
        info.append("GPU: none (NVML did not initialise)")
    missing = deepspeed_toolchain()
    if missing:
        warnings.append("DeepSpeed CPU Adam (ZeRO offload) cannot be built here: missing " + ", ".join(missing))
    return info, warnings, errors


def main() -> int:
    """Print what this machine has and what is missing; exit 1 when a package the runs need is missing."""
    info, warnings, errors = check()
    for line in info:
        print(line)
    for line in warnings:
        print(f"warning: {line}")
    for line in errors:
        print(f"error: {line}")
    print("preflight: " + ("FAILED" if errors else "ok") + f" ({len(errors)} error(s), {len(warnings)} warning(s))")
    return 1 if errors else 0


if __name__ == "__main__":
    raise SystemExit(main())
