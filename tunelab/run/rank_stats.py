"""What each training process (rank) measures about itself, written to ``$TUNELAB_STATS_DIR/rank<N>.json`` at exit.

Used by both training paths: ``tunelab.run.entry`` (litgpt's own CLI) and ``tunelab.run.loop`` (tunelab's
multi-device loop). The file's schema is :class:`tunelab.record.RankStats` plus the iteration log
(:data:`tunelab.record.RANK_FILE_LOG`); the runner reads it back with :func:`tunelab.record.read_rank_file`.

* allocator peaks (``torch.cuda.max_memory_allocated/reserved``, ``num_alloc_retries``, ``num_ooms``) and the
  peak at each phase (``loaded``, ``first_step``, ``end``: :func:`note_phase`);
* one entry per micro-batch iteration: its start on ``time.monotonic()`` (CLOCK_MONOTONIC, shared by every process
  of the machine, so the parent lines NVML samples up with it), padded and real tokens (:func:`record_iteration`);
* the float32 matmul precision in force, the device's CUDA total, peak RSS, the exception that ended the process.
"""

from __future__ import annotations

import ctypes
import logging
import os
import resource
import signal
import sys

from tunelab.files import write_json_atomic

_ITERS: list[tuple[float, int, int]] = []
_PAUSES: list[tuple] = []
_DRIVER: list[list[int]] = []
_STATE: dict = {"exception": None}
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
    """Remember the allocator peak so far under ``name`` (the first call per name wins; no CUDA: nothing)."""
    if name not in _PHASES:
        peak = _cuda_peak()
        if peak is not None:
            _PHASES[name] = peak


def note_first_iteration(seconds: float) -> None:
    """The first training iteration's wall time (model compilation, when on, happens in it): a cost of its own,
    kept apart from the steady-state figures."""
    _STATE["first_iteration_s"] = seconds


def note_compile(seconds: float, cache_hits: int, cache_misses: int) -> None:
    """Time spent compiling the training shapes ahead of the first iteration, and the graphs that took read from
    inductor's cache and compiled anew."""
    _STATE.update(compile_s=seconds, compile_cache_hits=cache_hits, compile_cache_misses=cache_misses)


def note_graphs_compiled_in_loop(count: int) -> None:
    """Graphs torch.compile built after the first iteration (recompilations inside the loop)."""
    _STATE["graphs_compiled_in_loop"] = count


def count_recompile_limit_hits() -> None:
    """Count torch.compile's recompile-limit hits in this process (dynamo logs each as a warning, then runs the frame
    eagerly for that graph variant): a handler on its logger, installed once."""

    class _Hits(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if str(record.msg).startswith("torch._dynamo hit config."):
                _STATE["recompile_limit_hits"] = _STATE.get("recompile_limit_hits", 0) + 1

    log = logging.getLogger("torch._dynamo.convert_frame")
    if not any(type(h).__name__ == "_Hits" for h in log.handlers):
        log.addHandler(_Hits(logging.WARNING))
    _STATE.setdefault("recompile_limit_hits", 0)


def note_fused_kernels(text: str) -> None:
    """The strategy's ``liger`` switch as it runs here: the kernels in use, or why it is off (added to what was
    noted before, ``; ``-separated)."""
    _STATE["fused_kernels"] = "; ".join(x for x in (_STATE.get("fused_kernels"), text) if x)


def note_fused_loss_reads(count: int) -> None:
    """Values the fused loss reads back from the GPU per micro batch (each a synchronisation)."""
    _STATE["fused_loss_reads"] = count


def note_report(**figures) -> None:
    """Figures tunelab's loop reports as litgpt's scripts print them (``report_training_time_s``, ``report_tok_s``,
    ``report_memory_gb``, ``report_val_loss``, ``trainable_params``, ``frozen_params``): the rank file carries them,
    so the record never reads them back from printed text."""
    _STATE.update(figures)


def note_pause(start: float, end: float) -> None:
    """The current iteration paused from ``start`` to ``end`` (monotonic seconds) for validation, generation or a
    save: left out of its time, and of the NVML figures of the steady window."""
    if _ITERS:
        _PAUSES.append((len(_ITERS) - 1, end - start, start))
    _STATE["paused_s"] = _STATE.get("paused_s", 0.0) + end - start


def mark_trained(t_monotonic: float) -> None:
    """The last training iteration's work is done on the device at ``t_monotonic`` (taken after a synchronisation):
    where the steady-state window ends (:attr:`tunelab.record.RankStats.trained_until`)."""
    _STATE["trained_until"] = t_monotonic


def iterations_begun() -> bool:
    """Whether a micro-batch iteration has been recorded (a pause before the first is none of the loop's)."""
    return bool(_ITERS)


def paused_seconds() -> float:
    """The time noted as pauses so far."""
    return _STATE.get("paused_s", 0.0)


def record_iteration(t_monotonic: float, padded_tokens: int, real_tokens: int) -> None:
    """One micro-batch iteration began at ``t_monotonic`` with this many padded and real tokens (-1: unknown)."""
    _ITERS.append((t_monotonic, padded_tokens, real_tokens))
    note_driver_calls(len(_ITERS) - 1)


def driver_counts() -> tuple[int, int] | None:
    """(cudaMalloc, cudaFree) calls this process's caching allocator has made on the current device; None without
    an initialised CUDA (torch is not imported for it)."""
    torch = sys.modules.get("torch")
    try:
        if torch is None or not torch.cuda.is_initialized():
            return None
        stats = torch.cuda.memory_stats_as_nested_dict()
        return int(stats.get("num_device_alloc", 0)), int(stats.get("num_device_free", 0))
    except Exception:  # noqa: BLE001 - best effort: a count is not worth a failed run
        return None


def note_driver_calls(index: int) -> None:
    """Remember the driver calls so far at iteration ``index`` when they changed since the last note (the first
    note always): :attr:`tunelab.record.RankStats.driver_allocs`."""
    counts = driver_counts()
    if counts is not None and (not _DRIVER or tuple(_DRIVER[-1][1:]) != counts):
        _DRIVER.append([index, *counts])


def install_step_hook() -> None:
    """Note the ``first_step`` phase after the first optimizer step of any torch optimizer."""
    from torch.optim.optimizer import register_optimizer_step_post_hook

    def after_step(optimizer, args, kwargs):
        note_phase("first_step")

    register_optimizer_step_post_hook(after_step)


def record_exception(exc: BaseException) -> None:
    """The exception that ends this process, as 'Type: first line of the message'."""
    text = str(exc).strip()
    _STATE["exception"] = f"{type(exc).__name__}: {text.splitlines()[0] if text else ''}"


def excepthook(exc_type, exc, tb) -> None:
    """A ``sys.excepthook`` that records the exception, then prints it as Python would."""
    record_exception(exc)
    sys.__excepthook__(exc_type, exc, tb)


def global_rank() -> int:
    """This process's global rank (torch.distributed when initialised, else the launcher's environment)."""
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


REPORTED = (
    "report_training_time_s",
    "report_tok_s",
    "report_memory_gb",
    "report_val_loss",
    "trainable_params",
    "frozen_params",
)
"""The figures :func:`note_report` takes (each a field of :class:`tunelab.record.RankStats`)."""


def write() -> None:
    """Write ``rank<N>.json`` into ``$TUNELAB_STATS_DIR`` (atomically; nothing when the variable is unset)."""
    out_dir = os.environ.get("TUNELAB_STATS_DIR")
    if not out_dir:
        return
    stats = {
        "rank": global_rank(),
        "device": "cpu",
        "exception": _STATE["exception"],
        "first_iteration_s": _STATE.get("first_iteration_s"),
        "compile_s": _STATE.get("compile_s"),
        "compile_cache_hits": _STATE.get("compile_cache_hits"),
        "compile_cache_misses": _STATE.get("compile_cache_misses"),
        "graphs_compiled_in_loop": _STATE.get("graphs_compiled_in_loop"),
        "recompile_limit_hits": _STATE.get("recompile_limit_hits"),
        "paused_s": _STATE.get("paused_s"),
        "trained_until": _STATE.get("trained_until"),
        "fused_kernels": _STATE.get("fused_kernels"),
        "fused_loss_reads": _STATE.get("fused_loss_reads"),
        **{k: _STATE.get(k) for k in REPORTED},
        "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
    }
    try:
        import torch

        stats["float32_matmul_precision"] = torch.get_float32_matmul_precision()
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            note_phase("end")
            stats["phase_peak_allocated"] = dict(_PHASES)
            stats["cuda_total_bytes"] = int(torch.cuda.mem_get_info()[1])
            dev = torch.cuda.current_device()
            ms = torch.cuda.memory_stats(dev)
            stats.update(
                device=f"cuda:{dev}",
                peak_allocated_bytes=int(torch.cuda.max_memory_allocated(dev)),
                peak_reserved_bytes=int(torch.cuda.max_memory_reserved(dev)),
                num_alloc_retries=int(ms.get("num_alloc_retries", 0)),
                num_ooms=int(ms.get("num_ooms", 0)),
            )
    except Exception as e:  # noqa: BLE001 - a broken CUDA context must not lose the rest
        stats["cuda_error"] = repr(e)
    if _ITERS:
        counts = driver_counts()
        if counts is not None:  # the exit's counts close the last iteration
            _DRIVER.append([len(_ITERS), *counts])
    stats["driver_allocs"] = _DRIVER
    stats["iters"] = _ITERS
    stats["pauses"] = _PAUSES
    write_json_atomic(os.path.join(out_dir, f"rank{stats['rank']}.json"), stats, indent=None)


def die_with_parent() -> None:
    """Ask Linux to SIGKILL this process when its parent dies, so that ranks spawned by a launcher (Lightning's,
    torchrun's) do not outlive a killed run and hang in a collective. The request covers a parent alive when it is
    made; a rank torchrun started (torchrun puts each in a session of its own, out of reach of the run's process
    group) whose torchrun died during the rank's imports is already an orphan: it says so and exits at once."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
    if os.environ.get("TORCHELASTIC_RUN_ID") and not parent_is_torchrun():
        sys.stderr.write(f"tunelab: rank {global_rank()}: torchrun, which started it, is gone; exiting\n")
        sys.stderr.flush()
        os._exit(1)


TORCHRUN_NAMES = (b"torch.distributed.run", b"torchrun", b"torch.distributed.launch")
"""What a torchrun process's command line holds (``python -m torch.distributed.run``, the ``torchrun`` script)."""


def parent_is_torchrun() -> bool:
    """Whether this process's parent is torchrun (read from /proc, bounded); True where it cannot be told."""
    try:
        with open(f"/proc/{os.getppid()}/cmdline", "rb") as f:
            cmd = f.read(1 << 16)
    except OSError:
        return True
    return any(name in cmd for name in TORCHRUN_NAMES)
