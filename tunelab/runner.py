"""Run one recipe as a child process through the real ``litgpt finetune_*`` (via ``tunelab.entry``) and collect
everything about it into one :class:`~tunelab.record.RunRecord`, written atomically next to its raw logs.

Layout of a run directory::

    <run_dir>/record.json      the record (written last, atomically)
    <run_dir>/stdout.log       the child's stdout (litgpt's own printout), stderr.log
    <run_dir>/stats/rank*.json what each rank measured about itself at exit
    <run_dir>/litgpt/          litgpt's out_dir (metrics.csv under logs/csv/, final checkpoint)
"""

from __future__ import annotations

import csv
import ctypes
import importlib.metadata
import json
import math
import os
import platform
import re
import resource
import signal
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

from tunelab import checkpoints, hardware, settings
from tunelab.errors import InputError, Interrupted
from tunelab.flops import flops_per_token, lora_param_count, mfu
from tunelab.gpu_monitor import GPUMonitor
from tunelab.paths import ROOT, output_root
from tunelab.record import RankStats, RunRecord, read_rank_file, save
from tunelab.recipes import Recipe
from tunelab.validate import check, litgpt_args, split_checkpoint_override

MODEL_CHOICES = ("auto", "checkpoint", "tiny", "random")
OOM_MARKERS = ("OutOfMemoryError", "CUDA out of memory", "MemoryError", "can't allocate memory",
               "DefaultCPUAllocator: not enough memory", "std::bad_alloc", "Cannot allocate memory")
_ITER_LINE = re.compile(r"iter (\d+) step (\d+) \| loss train: ([\d.naninf]+).*iter time: ([\d.]+) ms")


class RunError(InputError):
    """A run refused before anything starts (invalid recipe, missing checkpoint)."""


@dataclass
class Progress:
    """What the progress display gets from a running child."""

    iter: int = 0
    step: int = 0
    loss: float | None = None
    iter_ms: float | None = None
    tok_s: float | None = None
    """Real (non-padding) tokens/s of rank 0 x ranks, from litgpt's metrics.csv since the first logged iteration."""


def now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def git_sha() -> str | None:
    try:
        sha = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short=12", "HEAD"], capture_output=True,
                             text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10).stdout.strip()
        return (sha + ("+dirty" if dirty else "")) or None
    except (OSError, subprocess.SubprocessError):
        return None


def versions() -> dict:
    out = {"python": platform.python_version()}
    for pkg in ("torch", "litgpt", "lightning", "bitsandbytes", "deepspeed", "tunelab"):
        try:
            out[pkg] = importlib.metadata.version(pkg)
        except importlib.metadata.PackageNotFoundError:
            out[pkg] = None
    if out["tunelab"] is None:  # run from a checkout on PYTHONPATH (the GPU runbook), not pip-installed
        import tunelab

        out["tunelab"] = f"{getattr(tunelab, '__version__', '?')} (source checkout)"
    return out


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def choose_model(recipe: Recipe, model: str = "auto", checkpoint_dir: str | None = None) -> tuple[str, Path | None]:
    """(model_source, checkpoint_dir override or None) for ``model`` in MODEL_CHOICES.

    auto: the recipe's real checkpoint when it is there; else the tiny model when no GPU is present; else an error
    that says how to get one (download, or --weights random).
    """
    if model not in MODEL_CHOICES:
        raise RunError(f"--model must be one of {', '.join(MODEL_CHOICES)}, got {model!r}")
    ckpt = Path(checkpoint_dir or recipe.get("checkpoint_dir") or "")
    have_real = (ckpt / "lit_model.pth").is_file()
    if model == "tiny" or (model == "auto" and not have_real and not cuda_available()):
        return "tiny", checkpoints.build("tiny")
    if model == "random":
        from litgpt import Config

        try:
            name = Config.from_name(ckpt.name).name
        except ValueError:
            raise RunError(f"{recipe.key}: cannot tell the architecture of {ckpt} for --weights random") from None
        # built in a child process, on the GPU when there is one (a 13B model takes minutes on a CPU): the memory
        # it took is the child's and goes with it, so this process holds no CUDA memory while the run trains
        return "random", build_in_child(name, device="cuda" if cuda_available() else "cpu")
    if not have_real:
        raise RunError(f"{recipe.key}: no checkpoint at {ckpt}; download it ({recipe.download_command()}), or use "
                       "--model tiny (embedded tiny model) or --weights random (real architecture, random weights)")
    return "checkpoint", None


def build_in_child(name: str, device: str = "cpu", timeout_s: float = 1800) -> Path:
    """``tunelab build-model NAME`` as a child process (see choose_model); RunError with the reason if it fails
    ('disk full' when the disk ran out)."""
    cached = checkpoints.default_dir(name)
    if checkpoints.is_complete(cached):
        return cached
    proc = subprocess.run([sys.executable, "-m", "tunelab", "build-model", name, "--device", device],
                          cwd=ROOT, capture_output=True, text=True, timeout=timeout_s,
                          env=dict(os.environ, PYTHONUNBUFFERED="1"))
    if proc.returncode != 0 or not checkpoints.is_complete(cached):
        text = proc.stderr + proc.stdout
        reason = "disk full" if ("No space left on device" in text or "ENOSPC" in text) else \
            (_last_error_line(text) or f"exit code {proc.returncode}")
        raise RunError(f"building the random-weight checkpoint {name} failed: {reason}")
    return cached


def benchmark_overrides(recipe: Recipe, overrides: list[str]) -> list[str]:
    """Random weights are a benchmark: a recipe reading the project's small JSON data reads the benchmark dataset
    instead (tunelab.benchmark_data: the lab's 2,000 samples and batch shapes under the benchmark tokenizer the
    random-weight checkpoint carries). The override is added to the run's overrides, so the record says so. A row
    that sets its own data keeps it."""
    from tunelab import benchmark_data
    from tunelab.paths import DATASET

    if any(o in ("--data", "--data.json_path", "--data.class_path") or o.startswith(("--data=", "--data.json_path="))
           for o in overrides):
        return overrides
    path = recipe.get("data.json_path")
    if not path or (ROOT / path).resolve() != DATASET.resolve():
        return overrides
    data_path = benchmark_data.ensure()
    if data_path.is_relative_to(ROOT):  # the child runs in ROOT; a relative path keeps machine paths out of records
        data_path = data_path.relative_to(ROOT)
    return [*overrides, "--data.json_path", str(data_path)]


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _preexec(memory_limit_bytes: int | None):
    def fn():
        os.setsid()  # own process group: a timeout kills the whole tree (DDP ranks, loader workers)
        try:  # die with the parent (a SIGKILLed sweep leaves no orphan training)
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)
        except OSError:
            pass
        if memory_limit_bytes:
            resource.setrlimit(resource.RLIMIT_AS, (memory_limit_bytes, memory_limit_bytes))
    return fn


def _read_metrics(out_dir: Path) -> list[dict]:
    files = sorted(out_dir.glob("logs/csv/version_*/metrics.csv"))
    if not files:
        return []
    with open(files[-1], newline="") as f:
        return list(csv.DictReader(f))


def _latest_tokens(out_dir: Path) -> int | None:
    """The cumulative real-token count of the last row litgpt flushed to metrics.csv (cheap: reads the tail)."""
    files = sorted(out_dir.glob("logs/csv/version_*/metrics.csv"))
    if not files:
        return None
    try:
        with open(files[-1], "rb") as f:
            header = f.readline().decode().strip().split(",")
            f.seek(0, 2)
            f.seek(max(0, f.tell() - 4096))
            last = f.read().decode(errors="replace").strip().splitlines()[-1].split(",")
        value = dict(zip(header, last)).get("tokens")
        return int(float(value)) if value else None
    except (OSError, ValueError, IndexError):
        return None


def _parse_litgpt_report(stdout: str) -> dict:
    def grab(pattern, cast=float):
        m = re.findall(pattern, stdout)
        return cast(m[-1].replace(",", "")) if m else None

    return {
        "training_time_s": grab(r"Training Time\s*:\s*([\d.]+) s"),
        "tok_s": grab(r"Tok/sec\s*:\s*([\d.]+) tok/s"),
        "memory_gb": grab(r"Memory Used\s*:\s*([\d.]+) GB"),
        "trainable": grab(r"Number of trainable parameters: ([\d,]+)", int),
        "non_trainable": grab(r"Number of non-trainable parameters: ([\d,]+)", int),
        "val_loss": grab(r"Final evaluation \| val loss: ([\d.]+)"),
        "last_iter": grab(r"iter (\d+) step \d+ \|", int),
    }


def _classify(exit_code: int | None, killed_reason: str | None, ranks: list[RankStats], stderr_tail: str,
              stdout_tail: str) -> tuple[str, str | None]:
    if killed_reason:
        return "killed", killed_reason
    if exit_code == 0:
        return "ok", None
    text = "\n".join([*(r.exception or "" for r in ranks), stderr_tail])
    if any(m in text for m in OOM_MARKERS):
        line = next((r.exception for r in ranks if r.exception and any(m in r.exception for m in OOM_MARKERS)),
                    None) or _last_error_line(stderr_tail)
        return "oom", line
    if exit_code is not None and exit_code < 0:
        return "killed", f"killed by signal {signal.Signals(-exit_code).name}"
    line = next((r.exception for r in ranks if r.exception), None) or _last_error_line(stderr_tail) \
        or _last_error_line(stdout_tail)
    return "error", line or f"exit code {exit_code}"


def _last_error_line(text: str) -> str | None:
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    for ln in reversed(lines):
        if re.match(r"^[\w.]*(Error|Exception|Interrupt)\b", ln) or ": error:" in ln:
            return ln[:500]
    return lines[-1][:500] if lines else None


def _steady_state(ranks_iters: list[list], accumulation: int, n_iters: int) -> dict:
    """Median step/iteration times and steady-state token rates from each rank's iteration log.

    Iteration k lasts from its batch fetch to the next one; the last iteration (no successor) is dropped, and so
    is the first 10% of optimizer steps (at least 1 when there are 3 or more): warm-up.
    """
    out: dict = {}
    per_rank = []
    for iters in ranks_iters:
        iters = [it for it in iters[:n_iters] if it[1] >= 0]
        durations = [(iters[k + 1][0] - iters[k][0], iters[k][1], iters[k][2]) for k in range(len(iters) - 1)]
        n_steps_full = len(durations) // accumulation
        warm = max(1, n_steps_full // 10) if n_steps_full >= 3 else 0
        steps = [durations[s * accumulation:(s + 1) * accumulation] for s in range(warm, n_steps_full)]
        if not steps:
            continue
        per_rank.append({
            "warm": warm,
            "step_times": [sum(d for d, _, _ in st) for st in steps],
            "iter_times": [d for st in steps for d, _, _ in st],
            "time": sum(d for st in steps for d, _, _ in st),
            "padded": sum(p for st in steps for _, p, _ in st),
            "real": sum(r for st in steps for _, _, r in st),
            "samples": len(steps) * accumulation,
            "t0": iters[warm * accumulation][0],
            "t1": iters[n_steps_full * accumulation][0],  # the end of the last counted iteration
        })
    if not per_rank:
        return out
    r0 = per_rank[0]
    out["warmup_steps_excluded"] = r0["warm"]
    out["step_time_s"] = statistics.median(r0["step_times"])
    out["iter_time_s"] = statistics.median(r0["iter_times"])
    out["tok_s_padded"] = sum(r["padded"] / r["time"] for r in per_rank if r["time"] > 0)
    out["tok_s_real"] = sum(r["real"] / r["time"] for r in per_rank if r["time"] > 0)
    # the window NVML figures are averaged over: rank 0's counted steps, on the shared monotonic clock
    out["window"] = (r0["t0"], r0["t1"])
    out["window_tokens_real"] = sum(r["real"] for r in per_rank)
    return out


@dataclass
class Prepared:
    """A run checked and ready to launch: litgpt's resolved arguments, the model choice, the strategy."""

    recipe: Recipe
    overrides: list[str]
    """The row's overrides as given (plus the benchmark data path for random weights): what the record keeps."""
    full_overrides: list[str]
    """Those plus out_dir and the chosen checkpoint: what the child gets."""
    args: dict
    settings: settings.Settings
    source: str
    """Model source: checkpoint, tiny or random."""
    ckpt: Path | None
    strategy: str | None
    strat: object | None
    run_dir: Path


def prepare(recipe: Recipe, overrides: list[str], run_dir: Path | None, model: str,
            strategy: str | None) -> Prepared:
    """Step 1: choose the model, resolve and validate everything; RunError (one line) before anything starts."""
    overrides = list(overrides)
    source, ckpt = choose_model(recipe, model, split_checkpoint_override(overrides)[1])
    if source == "random":
        overrides = benchmark_overrides(recipe, overrides)
    run_dir = Path(run_dir or output_root() / "runs" / "single" / f"{recipe.model}-{recipe.method}-{int(time.time())}")
    if not run_dir.is_absolute() and Path.cwd().resolve() != ROOT.resolve():
        run_dir = run_dir.absolute()  # the child runs in ROOT: a path relative to here must not move there
    full_overrides = [*overrides, "--out_dir", str(run_dir / "litgpt")]
    if ckpt is not None:
        full_overrides += ["--checkpoint_dir", str(ckpt)]
    # the CPU rules (no bitsandbytes, no 16-bit float) apply when the child will find no GPU: one line now, not
    # Lightning's error after the model is built
    result = check(recipe, full_overrides, device="cuda" if cuda_available() else "cpu")
    problems = result.blocking(under_strategy=bool(strategy))
    if problems:
        raise RunError("; ".join(problems))
    from tunelab import data_modules

    missing = data_modules.problem(result.resolved)  # before anything starts: nothing left behind
    if missing:
        raise RunError(f"{recipe.key}: {missing}")
    strat = None
    if strategy:
        from tunelab.distributed.strategy import StrategyError, load_strategy

        try:
            strat = load_strategy(strategy)
            strat.check(recipe.method, result.resolved)
        except StrategyError as e:
            raise RunError(f"{recipe.key}: {e}") from None
    return Prepared(recipe=recipe, overrides=overrides, full_overrides=full_overrides, args=result.resolved,
                    settings=settings.from_args(recipe, result.resolved), source=source, ckpt=ckpt,
                    strategy=strategy, strat=strat, run_dir=run_dir)


def launch_command(prep: Prepared, nnodes: int = 1, node_rank: int = 0, master_addr: str = "127.0.0.1",
                   master_port: int | None = None) -> tuple[list[str], int]:
    """Step 2: the child's command line (after ``python``) and the world size: ``litgpt finetune_*`` behind
    tunelab.entry, or torchrun running tunelab's multi-device loop under a strategy file."""
    s = prep.settings
    if prep.strat is None:
        return ["-m", "tunelab.entry", *litgpt_args(prep.recipe, prep.full_overrides)], s.world_size
    port = master_port or _free_port()
    launch = ["-m", "torch.distributed.run", f"--nproc_per_node={s.devices}", f"--nnodes={nnodes}",
              f"--node_rank={node_rank}", f"--master_addr={master_addr}", f"--master_port={port}",
              "-m", "tunelab.distributed.train", "--recipe", str(prep.recipe.path), "--strategy", str(prep.strategy),
              *prep.full_overrides]
    return launch, settings.world_size(s.devices, nnodes)


def new_record(prep: Prepared, launch: list[str], world: int, sweep: str | None, row_id: str) -> RunRecord:
    """The record's identity and settings, before the run (never parsed from names: from the resolved args)."""
    s = prep.settings
    return RunRecord(sweep=sweep, row_id=row_id, recipe=prep.recipe.key, command=prep.recipe.command,
                     overrides=prep.overrides, litgpt_argv=launch,
                     strategy=prep.strat.describe() if prep.strat else "litgpt", strategy_file=prep.strategy,
                     resolved_args=json.loads(json.dumps(prep.args, default=str)), model_source=prep.source,
                     git_sha=git_sha(), versions=versions(), device_count=world, method=prep.recipe.method,
                     precision=s.precision, quantize=s.quantize, micro_batch_size=s.micro_batch_size,
                     global_batch_size=s.global_batch_size,
                     accumulation=settings.accumulation(s.global_batch_size, world, s.micro_batch_size),
                     max_seq_length=s.max_seq_length, optimizer=s.optimizer, log_dir=".")


def run(recipe: Recipe, overrides: list[str] | None = None, run_dir: Path | None = None, *, sweep: str | None = None,
        row_id: str = "run", model: str = "auto", timeout_s: float | None = None,
        memory_limit_bytes: int | None = None, on_progress: Callable[[Progress], None] | None = None,
        nvml_hz: float = 4.0, extra_env: dict | None = None, strategy: str | None = None, nnodes: int = 1,
        node_rank: int = 0, master_addr: str = "127.0.0.1", master_port: int | None = None) -> RunRecord:
    """Validate, launch, watch and record one run. Refuses (RunError) before launching if the recipe is invalid.

    Without ``strategy`` the child is ``litgpt finetune_*`` itself (behind tunelab.entry). With a
    configs/strategies file, the child is torchrun running tunelab.distributed.train with ``devices`` processes
    per node; for several nodes every node runs this with its ``node_rank`` and the same run directory (a shared
    filesystem), and node 0 writes the record once all ranks have reported.
    """
    prep = prepare(recipe, overrides or [], run_dir, model, strategy)
    run_dir = prep.run_dir
    run_dir.mkdir(parents=True, exist_ok=True)
    stats_dir = run_dir / "stats"
    if node_rank == 0:
        for old in stats_dir.glob("rank*.json"):
            old.unlink()
    launch, world = launch_command(prep, nnodes, node_rank, master_addr, master_port)
    rec = new_record(prep, launch, world, sweep, row_id)
    import torch

    # nothing here touches CUDA (no context, no memory on the GPU in this process): the device is named by NVML
    monitor = GPUMonitor(hz=nvml_hz)
    rec.device_type = "cuda" if cuda_available() else "cpu"
    rec.device_name = (monitor.names[0] if monitor.names else "cuda") if rec.device_type == "cuda" else cpu_name()
    rec.device_memory_total_bytes = (monitor.memory_total_bytes() or [None])[0]
    rec.cuda = torch.version.cuda

    env = dict(os.environ, TUNELAB_STATS_DIR=str(stats_dir), PYTHONUNBUFFERED="1",
               JSONARGPARSE_DEPRECATION_WARNINGS="off", **(extra_env or {}))
    if prep.source == "random":  # random weights: a benchmark, nothing worth saving (see tunelab.entry)
        from tunelab.entry import SKIP_SAVE_ENV

        env[SKIP_SAVE_ENV] = "1"
        rec.saves_skipped = True
    rec.driver = monitor.driver_version()
    rec.started_at = now_iso()
    t0 = time.monotonic()
    interrupted = False
    suffix = f".node{node_rank}" if node_rank else ""
    with open(run_dir / f"stdout{suffix}.log", "w") as out_f, open(run_dir / f"stderr{suffix}.log", "w") as err_f:
        monitor.start()
        proc = subprocess.Popen([sys.executable, *launch], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                                stderr=err_f, preexec_fn=_preexec(memory_limit_bytes))
        try:  # step 3: watch the child
            killed_reason = watch(proc, out_f, t0, timeout_s, run_dir / "litgpt", world, on_progress)
            proc.wait()  # exited: its stdout closed
        except KeyboardInterrupt:  # Ctrl-C, or SIGTERM (tunelab.cli turns it into this): record, then stop
            killed_reason = f"{INTERRUPTED_PREFIX} stopped by Ctrl-C or SIGTERM; the row runs again on resume"
            interrupted = True
        finally:  # whatever happened (interrupt, a full disk while logging): no training, no rank is left running
            _kill_group(proc)
            proc.wait()
            gpus = monitor.stop()
    rec.wall_s = round(time.monotonic() - t0, 3)
    rec.ended_at = now_iso()
    rec.exit_code = proc.returncode
    if node_rank:  # node 0 writes the record (its ranks finish after every rank's final barrier)
        return rec

    # step 4: collect the record
    stdout = (run_dir / "stdout.log").read_text(errors="replace")
    stderr = (run_dir / "stderr.log").read_text(errors="replace")
    collect(rec, prep.args, stats_dir, run_dir / "litgpt", stdout, stderr, killed_reason, gpus,
            nvml_hz if gpus else None, prep.ckpt or Path(prep.args["checkpoint_dir"]), monitor)
    if prep.source == "random":
        rec.pruned = prune_weights(run_dir)
    save(rec, run_dir / "record.json")
    if interrupted:
        raise Interrupted(f"{row_id}: stopped; recorded as killed in {run_dir / 'record.json'}")
    return rec


INTERRUPTED_PREFIX = "interrupted:"
"""Start of the error of a row stopped by Ctrl-C or SIGTERM (like a --deadline kill, it runs again on resume)."""


def _kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL the child's process group (its ranks, loader workers): it has its own session, see _preexec."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def watch(proc: subprocess.Popen, out_f, t0: float, timeout_s: float | None, litgpt_dir: Path, world: int,
          on_progress: Callable[[Progress], None] | None) -> str | None:
    """Follow a running child until it exits: copy its stdout to ``out_f``, report progress (iteration, step, loss,
    tokens/s from litgpt's metrics.csv), kill it at ``timeout_s``. Returns the kill reason, or None."""
    import selectors

    killed_reason = None
    progress = Progress()
    fd = proc.stdout.fileno()
    sel = selectors.DefaultSelector()
    sel.register(fd, selectors.EVENT_READ)
    exited_at = None
    first = None
    last_tokens_read = 0.0
    pending = b""
    while True:
        if timeout_s is not None and killed_reason is None and time.monotonic() - t0 > timeout_s:
            killed_reason = f"timeout: killed after {timeout_s:.0f} s"
            _kill_group(proc)
        if sel.select(timeout=0.5):
            chunk = os.read(fd, 65536)  # never blocks on a line that has no newline yet (progress bars)
            if not chunk:
                break
            out_f.write(chunk.decode(errors="replace"))
            pending += chunk
            *lines, pending = pending.split(b"\n")
            for raw in lines:
                m = _ITER_LINE.search(raw.decode(errors="replace"))
                if not m:
                    continue
                progress.iter, progress.step = int(m.group(1)), int(m.group(2))
                progress.loss, progress.iter_ms = float(m.group(3)), float(m.group(4))
                now = time.monotonic()
                if now - last_tokens_read > 1.0:  # metrics.csv is read at most once a second
                    last_tokens_read = now
                    tokens = _latest_tokens(litgpt_dir)
                    if tokens is not None:
                        first = first or (now, tokens)
                        if now - first[0] > 0.5:
                            progress.tok_s = (tokens - first[1]) / (now - first[0]) * world
                if on_progress:
                    on_progress(progress)
        elif proc.poll() is not None:
            exited_at = exited_at or time.monotonic()
            if time.monotonic() - exited_at > 5:  # a grandchild still holds the pipe: stop reading
                break
    sel.close()
    return killed_reason


WEIGHT_SUFFIXES = (".pth", ".bin", ".safetensors", ".pth.lora", ".pth.adapter", ".pth.adapter_v2")


def prune_weights(run_dir: Path) -> list[str]:
    """Delete the model files litgpt saved under the run's out_dir (the final checkpoint, and for LoRA the merged
    full model): of random weights they are worth nothing and take 2-26 GB per run, which fills a 64 GiB disk
    within a sweep. Returns the removed paths, relative to the run directory."""
    removed = []
    for f in sorted((run_dir / "litgpt").rglob("*")):
        if f.is_file() and f.name.endswith(WEIGHT_SUFFIXES):
            f.unlink()
            removed.append(str(f.relative_to(run_dir)))
    return removed


def collect(rec: RunRecord, args: dict, stats_dir: Path, out_dir: Path, stdout: str, stderr: str,
            killed_reason: str | None, gpus: list, sample_hz: float | None, ckpt: Path,
            monitor: GPUMonitor | None = None) -> RunRecord:
    """Fill ``rec`` from the rank files, litgpt's printout and metrics.csv, and the NVML samples."""
    ranks_read = []
    for f in sorted(stats_dir.glob("rank*.json")):
        try:
            ranks_read.append(read_rank_file(json.loads(f.read_text())))
        except (ValueError, TypeError) as e:  # a rank killed mid-write, or a foreign file: said, not hidden
            rec.notes.append(f"{f.name} not read: {e}")
    ranks_read.sort(key=lambda r: r[0].rank)
    rec.ranks = [stats for stats, _ in ranks_read]
    rec.status, rec.error = _classify(rec.exit_code, killed_reason, rec.ranks, stderr[-20000:], stdout[-5000:])

    def agg(attr, fn):
        vals = [getattr(r, attr) for r in rec.ranks if getattr(r, attr) is not None]
        return fn(vals) if vals else None

    rec.peak_allocated_bytes = agg("peak_allocated_bytes", max)
    rec.peak_reserved_bytes = agg("peak_reserved_bytes", max)
    rec.num_alloc_retries = agg("num_alloc_retries", sum)
    rec.peak_rss_bytes = agg("peak_rss_bytes", max)

    lit = _parse_litgpt_report(stdout)
    rec.litgpt_training_time_s, rec.litgpt_tok_s, rec.litgpt_memory_gb = (lit["training_time_s"], lit["tok_s"],
                                                                          lit["memory_gb"])
    if lit["trainable"] is not None:
        rec.n_trainable = lit["trainable"]
        rec.n_params = lit["trainable"] + (lit["non_trainable"] or 0)

    metrics = _read_metrics(out_dir)
    losses = [float(m["loss"]) for m in metrics if m.get("loss")]
    if losses:
        rec.loss_first, rec.loss_last = losses[0], losses[-1]
    vals = [float(m["val_loss"]) for m in metrics if m.get("val_loss")]
    rec.val_loss_final = vals[-1] if vals else lit["val_loss"]
    n_iters = max([int(m["iter"]) for m in metrics if m.get("iter")] or [lit["last_iter"] or 0])
    rec.iters = n_iters or None
    rec.optimizer_steps = n_iters // rec.accumulation if n_iters and rec.accumulation else None

    ranks_iters = [iters for _, iters in ranks_read]
    rec.tokens_padded = sum(p for it in ranks_iters for _, p, _ in it[:n_iters] if p >= 0) or None
    rec.tokens_real = sum(r for it in ranks_iters for _, _, r in it[:n_iters] if r >= 0) or None
    steady = _steady_state(ranks_iters, rec.accumulation or 1, n_iters)
    for key in ("warmup_steps_excluded", "step_time_s", "iter_time_s", "tok_s_padded", "tok_s_real"):
        setattr(rec, key, steady.get(key))
    window = steady.get("window")
    if window:
        rec.steady_window_s = window[1] - window[0]
    if rec.tok_s_padded is not None:
        rec.tok_s_padded_per_device = rec.tok_s_padded / rec.device_count
    if rec.iter_time_s:
        rec.samples_s = rec.micro_batch_size * rec.device_count / rec.iter_time_s

    # compute
    try:
        from tunelab.flops import load_config

        config = load_config(ckpt)
        rec.model_name = config.name
        seq = (rec.tokens_padded / (n_iters * rec.micro_batch_size * rec.device_count)
               if rec.tokens_padded and n_iters else (rec.max_seq_length or config.block_size))
        n_lora = 0
        if rec.method in ("lora", "qlora"):
            st = settings.settings_of(args, method=rec.method, command=rec.command, recipe=rec.recipe)
            n_lora = lora_param_count(config, int(st.lora_r or 0), {t: True for t in st.lora_targets})
        fpt = flops_per_token(config, seq, "full" if rec.method == "full" else "lora", n_lora)
        rec.flops_per_token, rec.flops_formula = fpt.total, fpt.formula
        if rec.tok_s_real:
            real_per_dev = rec.tok_s_real / rec.device_count
            rec.achieved_tflops_per_device = fpt.total * real_per_dev / 1e12
            gpu = hardware.identify(rec.device_name) if rec.device_type == "cuda" else None
            matmul = next((r.float32_matmul_precision for r in rec.ranks if r.float32_matmul_precision), None)
            peak = gpu.peak_flops(rec.precision or "32-true", matmul) if gpu else None
            if peak:
                rec.peak_basis = hardware.peak_basis(rec.precision or "32-true", matmul, gpu)
                rec.peak_tflops_per_device = peak / 1e12
                rec.mfu = mfu(fpt.total, real_per_dev, peak)
                rec.mfu_padded = mfu(fpt.total, rec.tok_s_padded / rec.device_count, peak)
    except Exception as e:  # noqa: BLE001 - a compute figure must not lose the record
        rec.flops_formula = f"not computed: {e!r}"

    # GPU power and utilisation
    rec.gpus = gpus
    rec.sample_hz = sample_hz
    if gpus:
        utils = [g.util_mean for g in gpus if g.util_mean is not None]
        stds = [g.util_std for g in gpus if g.util_std is not None]
        rec.gpu_util_mean = statistics.fmean(utils) if utils else None
        rec.gpu_util_std = statistics.fmean(stds) if stds else None
        powers = [g.power_mean_w for g in gpus if g.power_mean_w is not None]
        rec.power_mean_w = sum(powers) if powers else None
        energies = [g.energy_j for g in gpus if g.energy_j is not None]
        rec.energy_j = sum(energies) if energies else None
        if rec.energy_j and rec.tokens_real:
            rec.energy_j_per_1k_tokens = rec.energy_j / rec.tokens_real * 1000
        if window and monitor is not None:  # the steady-state window: the steps tok/s is measured over
            figs = monitor.window(*window)
            utils = [f.util_mean for f in figs if f.util_mean is not None]
            stds = [f.util_std for f in figs if f.util_std is not None]
            powers = [f.power_mean_w for f in figs if f.power_mean_w is not None]
            energies = [f.energy_j for f in figs if f.energy_j is not None]
            rec.gpu_util_steady_mean = statistics.fmean(utils) if utils else None
            rec.gpu_util_steady_std = statistics.fmean(stds) if stds else None
            rec.power_steady_w = sum(powers) if powers else None
            rec.energy_steady_j = sum(energies) if energies else None
            if rec.energy_steady_j and steady.get("window_tokens_real"):
                rec.energy_steady_j_per_1k_tokens = rec.energy_steady_j / steady["window_tokens_real"] * 1000
    for name in ("step_time_s", "iter_time_s", "tok_s_padded", "tok_s_real"):
        v = getattr(rec, name)
        if v is not None and (math.isnan(v) or math.isinf(v)):
            setattr(rec, name, None)
    return rec
