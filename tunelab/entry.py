"""``python -m tunelab.entry <litgpt args>``: litgpt's own CLI, run in-process, that leaves per-rank figures at exit.

The training loop stays litgpt's: this module only observes. It wraps ``litgpt.utils.CycleIterator.__next__``
(the training batch iterator of every finetune script) to note, per micro-batch iteration, the time it started and
its padded and real token counts; at exit (normal, exception or sys.exit) it writes ``rank<N>.json`` into
``$TUNELAB_STATS_DIR`` with this rank's allocator peaks (``torch.cuda.max_memory_allocated/reserved``,
``num_alloc_retries``), the allocator peak at each phase (model loaded = first batch fetched, first optimizer step,
end), the float32 matmul precision in force (TF32 or not: it sets the MFU peak), its peak RSS and the exception
that ended it. Iteration timestamps are ``time.monotonic()`` (CLOCK_MONOTONIC, shared by every process of the
machine), so the parent can line NVML samples up with the steady-state window. Lightning's multi-device launcher re-runs
``python -m tunelab.entry ...`` for every rank, so every rank reports for itself (litgpt prints rank 0 only).
"""

from __future__ import annotations

import atexit
import importlib
import os
import resource
import sys
import time
import traceback

_ITERS: list[tuple[float, int, int]] = []
_STATE: dict = {"exception": None, "t0": time.time()}
_PHASES: dict = {}


def _cuda_peak() -> int | None:
    try:
        import torch

        if torch.cuda.is_available() and torch.cuda.is_initialized():
            return int(torch.cuda.max_memory_allocated())
    except Exception:  # noqa: BLE001 - best effort
        pass
    return None


def note_phase(name: str) -> None:
    """Remember the allocator peak so far under ``name`` (first call per name wins)."""
    if name not in _PHASES:
        peak = _cuda_peak()
        if peak is not None:
            _PHASES[name] = peak


def _install_step_hook() -> None:
    from torch.optim.optimizer import register_optimizer_step_post_hook

    def after_step(optimizer, args, kwargs):
        note_phase("first_step")
    register_optimizer_step_post_hook(after_step)


def _global_rank() -> int:
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            return dist.get_rank()
    except Exception:  # noqa: BLE001 - best effort at exit
        pass
    for key in ("RANK", "GLOBAL_RANK"):
        if key in os.environ:
            return int(os.environ[key])
    local = int(os.environ.get("LOCAL_RANK", 0))
    node = int(os.environ.get("NODE_RANK", 0))
    per_node = int(os.environ.get("LOCAL_WORLD_SIZE", 1))
    return node * per_node + local


def _install_iterator_probe() -> None:
    from litgpt import utils

    original = utils.CycleIterator.__next__

    def __next__(self):
        note_phase("loaded")  # model, optimizer (and quantization) are in place before the first batch
        t = time.monotonic()
        batch = original(self)
        try:
            padded = int(batch["input_ids"].numel())
            real = int(batch["token_counts"]["raw_plus_prompt_template"].sum())
        except (KeyError, TypeError, AttributeError):
            padded, real = -1, -1
        _ITERS.append((t, padded, real))
        return batch

    utils.CycleIterator.__next__ = __next__


def _excepthook(exc_type, exc, tb):
    _STATE["exception"] = f"{exc_type.__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"
    sys.__excepthook__(exc_type, exc, tb)


def _write_stats() -> None:
    out_dir = os.environ.get("TUNELAB_STATS_DIR")
    if not out_dir:
        return
    stats = {"rank": _global_rank(), "device": "cpu", "exception": _STATE["exception"],
             "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}
    try:
        import torch

        stats["float32_matmul_precision"] = torch.get_float32_matmul_precision()
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            note_phase("end")
            stats["phase_peak_allocated"] = dict(_PHASES)
            stats["cuda_total_bytes"] = int(torch.cuda.mem_get_info()[1])
            dev = torch.cuda.current_device()
            ms = torch.cuda.memory_stats(dev)
            stats.update(device=f"cuda:{dev}", peak_allocated_bytes=int(torch.cuda.max_memory_allocated(dev)),
                         peak_reserved_bytes=int(torch.cuda.max_memory_reserved(dev)),
                         num_alloc_retries=int(ms.get("num_alloc_retries", 0)), num_ooms=int(ms.get("num_ooms", 0)))
    except Exception as e:  # noqa: BLE001 - a broken CUDA context must not lose the rest
        stats["cuda_error"] = repr(e)
    stats["iters"] = _ITERS
    from tunelab.record import write_json_atomic

    write_json_atomic(os.path.join(out_dir, f"rank{stats['rank']}.json"), stats, indent=None)


def die_with_parent() -> None:
    """Ask Linux to SIGKILL this process when its parent dies, so that ranks spawned by a launcher (Lightning's,
    torchrun's) do not outlive a killed run and hang in a collective."""
    try:
        import ctypes
        import signal

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


SKIP_SAVE_ENV = "TUNELAB_SKIP_SAVE"
"""Set to 1 (tunelab does for random-weight runs) to skip litgpt's checkpoint saves and the LoRA merge: of random
weights they are worthless, take 2-26 GB of disk and up to a minute per run. Training is untouched; litgpt's
Training Time and Tok/sec are measured before the final save anyway."""


def _skip_saves() -> None:
    import lightning.fabric

    def no_save(self, path, state, filter=None):  # noqa: A002 - Fabric.save's signature
        print(f"tunelab: checkpoint save skipped ({SKIP_SAVE_ENV}=1): {path}", flush=True)
    lightning.fabric.Fabric.save = no_save
    for module in ("litgpt.finetune.lora", "litgpt.finetune.adapter", "litgpt.finetune.adapter_v2"):
        try:
            mod = importlib.import_module(module)
        except ImportError:
            continue
        if hasattr(mod, "merge_lora"):
            mod.merge_lora = lambda *a, **k: print("tunelab: LoRA merge skipped", flush=True)


def main() -> None:
    die_with_parent()
    os.environ.setdefault("JSONARGPARSE_DEPRECATION_WARNINGS", "off")
    sys.excepthook = _excepthook
    atexit.register(_write_stats)
    _install_iterator_probe()
    _install_step_hook()
    if os.environ.get(SKIP_SAVE_ENV) == "1":
        _skip_saves()
    from litgpt.__main__ import main as litgpt_main

    try:
        litgpt_main()  # parses sys.argv[1:], exactly as the `litgpt` command does
    except SystemExit:
        raise
    except BaseException as e:  # record, then let Python print and exit as usual
        _STATE["exception"] = f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"
        traceback.print_exc()
        sys.exit(1)


if __name__ == "__main__":
    main()
