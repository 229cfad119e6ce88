"""Run one recipe as a child process through the real ``litgpt finetune_*`` (via ``tunelab.run.entry``) and collect
everything about it into one :class:`~tunelab.record.RunRecord`, written atomically next to its raw logs.

Layout of a run directory::

    <run_dir>/record.json      the record (written last, atomically)
    <run_dir>/stdout.log       the child's stdout (litgpt's own printout), stderr.log
    <run_dir>/stats/rank*.json what each rank measured about itself at exit
    <run_dir>/litgpt/          litgpt's out_dir (metrics.csv under logs/csv/, final checkpoint)
"""

from __future__ import annotations

import ctypes
import importlib.metadata
import json
import os
import platform
import re
import resource
import selectors
import signal
import socket
import stat
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import tunelab
from tunelab import checkpoints, paths, settings
from tunelab.data import benchmark
from tunelab.data import modules as data_modules
from tunelab.errors import InputError, Interrupted
from tunelab.files import Busy, exclusive_lock, kind, open_output, read_tail
from tunelab.paths import DATASET, ROOT, child_path, output_root
from tunelab.plan import stored
from tunelab.recipes import Recipe
from tunelab.record import ALLOC_CONF_ENV, RunRecord, save
from tunelab.run import handoff
from tunelab.run.collect import Finished, collect, last_error_line, latest_tokens
from tunelab.run.entry import SKIP_SAVE_ENV
from tunelab.run.gpu_monitor import GPUMonitor, cpu_name, device_name, device_op_us, host_op_us
from tunelab.run.resume import INTERRUPTED_PREFIX
from tunelab.strategies import StrategyConfig, StrategyError, load_strategy
from tunelab.validate import Result, check, litgpt_args, recheck, split_checkpoint_override

MODEL_CHOICES = ("auto", "checkpoint", "tiny", "random")
_ITER_LINE = re.compile(r"iter (\d+) step (\d+) \| loss train: ([\d.naninf]+).*iter time: ([\d.]+) ms")


INDUCTOR_CACHE_ENV = "TORCHINDUCTOR_CACHE_DIR"
"""Where torch.compile keeps its caches; a run's child gets tunelab's cache folder unless the user set one."""


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
    """Now, ISO 8601 UTC, seconds."""
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def git_sha() -> str | None:
    """The checkout's commit (``+dirty`` with uncommitted changes), or None outside a git checkout."""
    try:
        sha = subprocess.run(
            ["git", "-C", str(ROOT), "rev-parse", "--short=12", "HEAD"], capture_output=True, text=True, timeout=10
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
        return (sha + ("+dirty" if dirty else "")) or None
    except (OSError, subprocess.SubprocessError):
        return None


def versions() -> dict:
    """Versions of Python and the packages a run depends on (None where not installed)."""
    out = {"python": platform.python_version()}
    for pkg in ("torch", "litgpt", "lightning", "bitsandbytes", "deepspeed", "tunelab"):
        try:
            out[pkg] = importlib.metadata.version(pkg)
        except importlib.metadata.PackageNotFoundError:
            out[pkg] = None
    if out["tunelab"] is None:  # run from a checkout on PYTHONPATH (the GPU runbook), not pip-installed
        out["tunelab"] = f"{getattr(tunelab, '__version__', '?')} (source checkout)"
    return out


def cuda_available() -> bool:
    """Whether torch sees a CUDA device (imports torch)."""
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
        from litgpt import Config  # imports torch: only for random weights

        try:
            name = Config.from_name(ckpt.name).name
        except ValueError:
            raise RunError(
                f"{recipe.key}: cannot tell the architecture of {ckpt} for --weights random; fix: a checkpoint_dir "
                "named by a litgpt config (checkpoints/<org>/<name>)"
            ) from None
        # built in a child process, on the GPU when there is one (a 13B model takes minutes on a CPU): the memory
        # it took is the child's and goes with it, so this process holds no CUDA memory while the run trains
        return "random", build_in_child(name, device="cuda" if cuda_available() else "cpu")
    odd = [n for n in ("lit_model.pth", "model_config.yaml") if (ckpt / n).exists() and not (ckpt / n).is_file()]
    if not have_real and odd:
        raise RunError(
            f"{recipe.key}: {ckpt / odd[0]} is not a regular file (a FIFO, a device or a directory: reading it "
            "would block or fail); fix: put the file itself there"
        )
    if not have_real:
        raise RunError(
            f"{recipe.key}: no checkpoint at {ckpt}; fix: download it ({recipe.download_command()}), or use "
            "--model tiny (embedded tiny model) or --weights random (real architecture, random weights)"
        )
    return "checkpoint", None


def build_in_child(name: str, device: str = "cpu", timeout_s: float = 1800) -> Path:
    """``tunelab build-model NAME`` as a child process (see choose_model); RunError with the reason if it fails
    ('disk full' when the disk ran out)."""
    cached = checkpoints.default_dir(name)
    if checkpoints.is_complete(cached):
        return cached
    proc = subprocess.run(
        [sys.executable, "-m", "tunelab", "build-model", name, "--device", device],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        env=dict(os.environ, PYTHONUNBUFFERED="1"),
    )
    if proc.returncode != 0 or not checkpoints.is_complete(cached):
        text = proc.stderr + proc.stdout
        reason = (
            "disk full"
            if ("No space left on device" in text or "ENOSPC" in text)
            else (last_error_line(text) or f"exit code {proc.returncode}")
        )
        raise RunError(f"building the random-weight checkpoint {name} failed: {reason}")
    return cached


def benchmark_overrides(recipe: Recipe, overrides: list[str]) -> list[str]:
    """Random weights are a benchmark: a recipe reading the project's small JSON data reads the benchmark dataset
    instead (tunelab.data.benchmark: the lab's 2,000 samples and batch shapes under the benchmark tokenizer the
    random-weight checkpoint carries). The override is added to the run's overrides, so the record says so. A row
    that sets its own data keeps it."""
    if any(
        o in ("--data", "--data.json_path", "--data.class_path") or o.startswith(("--data=", "--data.json_path="))
        for o in overrides
    ):
        return overrides
    path = recipe.get("data.json_path")
    if not path or (ROOT / path).resolve() != DATASET.resolve():
        return overrides
    data_path = benchmark.ensure()
    if data_path.is_relative_to(ROOT):  # the child runs in ROOT; a relative path keeps machine paths out of records
        data_path = data_path.relative_to(ROOT)
    return [*overrides, "--data.json_path", str(data_path)]


def _free_port() -> int:
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
    """The strategy file asked for (a name or a path; None: litgpt's own command)."""
    strategy_config: object | None
    """That file, loaded (tunelab.strategies.StrategyConfig)."""
    run_dir: Path


def _run_directory(recipe: Recipe, run_dir: Path | None) -> Path:
    """The run's directory (default: a new one under the output root), absolute where the child, which runs in the
    checkout, would read a relative one elsewhere; RunError where a file the run writes there is a symbolic link."""
    run_dir = Path(run_dir or output_root() / "runs" / "single" / f"{recipe.model}-{recipe.method}-{int(time.time())}")
    if not run_dir.is_absolute() and Path.cwd().resolve() != ROOT.resolve():
        run_dir = run_dir.absolute()  # the child runs in ROOT: a path relative to here must not move there
    for inside in ("litgpt", "stats", "stdout.log", "stderr.log", "record.json", ".lock"):  # a resumed row's own
        if (run_dir / inside).is_symlink():
            raise RunError(
                f"{run_dir / inside}: is a symbolic link; tunelab never writes through links (the run would "
                "write wherever it points); fix: remove the link"
            )
    if blocker := _not_plain(run_dir / "litgpt"):
        raise RunError(
            f"{blocker}: is {blocker_kind(blocker)} inside the run's output folder; tunelab never writes through "
            "links, FIFOs or devices (the run would write wherever it leads); fix: remove it"
        )
    return run_dir


MAX_ENTRIES_CHECKED = 100_000
"""Entries of an earlier output folder looked at before a run (a folder of more is refused: see :func:`_not_plain`)."""


def blocker_kind(path: Path) -> str:
    """What ``path`` is, in words (a symbolic link, a FIFO, ...)."""

    return kind(os.lstat(path).st_mode)


def _not_plain(folder: Path) -> Path | None:
    """The first entry under ``folder`` (itself included) that is neither a folder nor a regular file: a link, a
    FIFO, a device, a socket; None when there is none. Links are never followed; the walk is bounded."""
    if not os.path.lexists(folder):
        return None
    seen = 0
    pending = [folder]
    while pending:
        path = pending.pop()
        mode = os.lstat(path).st_mode
        seen += 1
        if seen > MAX_ENTRIES_CHECKED:
            raise RunError(f"{folder}: holds more than {MAX_ENTRIES_CHECKED:,} entries; fix: give another --out")
        if stat.S_ISDIR(mode):
            pending.extend(sorted(path.iterdir(), reverse=True))
        elif not stat.S_ISREG(mode):
            return path
    return None


EARLIER = "earlier"
"""The folder of a run directory an earlier run's litgpt outputs are moved into (:func:`_own_output_folder`)."""


def _own_output_folder(run_dir: Path) -> str | None:
    """Give the run an output folder of its own: an earlier run's ``litgpt/`` (its ``final/``, its step
    checkpoints, its logs) is moved whole to ``earlier/litgpt-<time>/``, kept, and named (the path relative to the
    run directory; None when there was none). Mixed in, litgpt would keep the earlier merged model ("already
    merged") and ``--resume`` would take the earlier run's highest step."""
    litgpt_dir = run_dir / "litgpt"
    if not litgpt_dir.is_dir() or not any(litgpt_dir.iterdir()):
        return None
    dest = run_dir / EARLIER / f"litgpt-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
    dest.parent.mkdir(parents=True, exist_ok=True)
    os.replace(litgpt_dir, dest)
    return str(dest.relative_to(run_dir))


def prepare(
    recipe: Recipe,
    overrides: list[str],
    run_dir: Path | None,
    model: str,
    strategy: str | None,
    strategy_config: StrategyConfig | None = None,
    checked: Result | None = None,
) -> Prepared:
    """Step 1: choose the model, resolve and validate everything; RunError (one line) before anything starts.

    ``checked``: the recipe with ``overrides`` as the validator already resolved it (a sweep row): its arguments
    are checked again for this run's model and device without a second parse. ``strategy_config``: the strategy
    file already loaded."""
    overrides = list(overrides)
    config = strategy_config
    if strategy and config is None:  # the file first: an unreadable one is refused before litgpt is imported
        try:
            config = load_strategy(strategy)
        except StrategyError as e:
            raise RunError(f"{recipe.key}: {e}") from None
    source, ckpt = choose_model(recipe, model, split_checkpoint_override(overrides)[1])
    if source == "random":
        overrides = benchmark_overrides(recipe, overrides)
    run_dir = _run_directory(recipe, run_dir)
    full_overrides = [*overrides, "--out_dir", str(run_dir / "litgpt")]
    if ckpt is not None:
        full_overrides += ["--checkpoint_dir", str(ckpt)]
    # the CPU rules (no bitsandbytes, no 16-bit float) apply when the child will find no GPU: one line now, not
    # Lightning's error after the model is built
    device = "cuda" if cuda_available() else "cpu"
    if checked is not None and checked.overrides == overrides:
        result = recheck(
            checked, out_dir=str(run_dir / "litgpt"), device=device, checkpoint_dir=None if ckpt is None else str(ckpt)
        )
    else:
        result = check(recipe, full_overrides, device=device)
    problems = result.blocking(under_strategy=bool(strategy))
    if problems:
        raise RunError("; ".join(problems))
    missing = data_modules.problem(result.resolved)  # before anything starts: nothing left behind
    if missing:
        raise RunError(f"{recipe.key}: {missing}")
    if strategy:
        try:
            config.check(result.resolved, device)
        except StrategyError as e:
            raise RunError(f"{recipe.key}: --strategy {strategy}: {e}") from None
    return Prepared(
        recipe=recipe,
        overrides=overrides,
        full_overrides=full_overrides,
        args=result.resolved,
        settings=settings.from_args(recipe, result.resolved),
        source=source,
        ckpt=ckpt,
        strategy=strategy,
        strategy_config=config,
        run_dir=run_dir,
    )


def launch_command(
    prep: Prepared, nnodes: int = 1, node_rank: int = 0, master_addr: str = "127.0.0.1", master_port: int | None = None
) -> tuple[list[str], int]:
    """Step 2: the child's command line (after ``python``) and the world size: ``litgpt finetune_*`` behind
    tunelab.run.entry, or torchrun running tunelab's multi-device loop under a strategy file."""
    s = prep.settings
    if prep.strategy_config is None:
        args = litgpt_args(prep.recipe, prep.full_overrides, child_path(prep.recipe.path))  # the child runs in ROOT
        return ["-m", "tunelab.run.entry", *args], s.world_size
    port = master_port or _free_port()
    launch = [
        "-m",
        "torch.distributed.run",
        f"--nproc_per_node={s.devices}",
        f"--nnodes={nnodes}",
        f"--node_rank={node_rank}",
        f"--master_addr={master_addr}",
        f"--master_port={port}",
        "-m",
        "tunelab.run.loop",
        "--handoff",
        str(prep.run_dir / handoff.NAME),
    ]
    return launch, settings.world_size(s.devices, nnodes)


def new_record(prep: Prepared, launch: list[str], world: int, sweep: str | None, row_id: str) -> RunRecord:
    """The record's identity and settings, before the run (never parsed from names: from the resolved args)."""
    s = prep.settings
    return RunRecord(
        sweep=sweep,
        row_id=row_id,
        recipe=prep.recipe.key,
        command=prep.recipe.command,
        overrides=prep.overrides,
        litgpt_argv=launch,
        strategy=prep.strategy_config.describe() if prep.strategy_config else "litgpt",
        strategy_file=prep.strategy,
        strategy_settings=prep.strategy_config.settings() if prep.strategy_config else None,
        resolved_args=json.loads(json.dumps(prep.args, default=str)),
        model_source=prep.source,
        git_sha=git_sha(),
        versions=versions(),
        device_count=world,
        method=s.method,
        precision=s.precision,
        quantize=s.quantize,
        micro_batch_size=s.micro_batch_size,
        global_batch_size=s.global_batch_size,
        accumulation=settings.accumulation(s.global_batch_size, world, s.micro_batch_size),
        max_seq_length=s.max_seq_length,
        optimizer=s.optimizer,
        log_dir=".",
    )


@dataclass
class RunOptions:
    """How one run is launched, watched and recorded: everything :func:`run` takes beside the recipe, its overrides
    and its folder (one object from the CLI, a sweep, a tuning search or a bench to the runner)."""

    sweep: str | None = None
    """The sweep the run is a row of (recorded; None: a run on its own)."""
    row_id: str = "run"
    """The row's id within its sweep (recorded)."""
    model: str = "auto"
    """Where the weights come from: 'auto', 'tiny', 'random', 'checkpoint' (:func:`prepare`)."""
    timeout_s: float | None = None
    """Kill the run after this many seconds (None: no limit)."""
    memory_limit_bytes: int | None = None
    """The child's address-space cap (RLIMIT_AS; None: none)."""
    on_progress: Callable[[Progress], None] | None = None
    """Called with each progress reading while the child runs."""
    nvml_hz: float = 4.0
    """GPU samples per second (NVML)."""
    extra_env: dict | None = None
    """Environment variables added to the child's."""
    strategy: str | None = None
    """A configs/strategies file (tunelab's loop under torchrun); None: litgpt's own script."""
    strategy_config: StrategyConfig | None = None
    """That file already loaded (:func:`prepare`)."""
    checked: Result | None = None
    """The recipe already validated with these overrides (:func:`prepare`)."""
    nnodes: int = 1
    """Nodes the run spans."""
    node_rank: int = 0
    """This node's rank (node 0 writes the record)."""
    master_addr: str = "127.0.0.1"
    """The rendezvous address (node 0's)."""
    master_port: int | None = None
    """The rendezvous port (None: a free one on one node)."""


def run(
    recipe: Recipe,
    overrides: list[str] | None = None,
    run_dir: Path | None = None,
    options: RunOptions | None = None,
) -> RunRecord:
    """Validate, launch, watch and record one run. Refuses (RunError) before launching if the recipe is invalid.

    Without ``options.strategy`` the child is ``litgpt finetune_*`` itself (behind tunelab.run.entry). With a
    configs/strategies file, the child is torchrun running tunelab.run.loop with ``devices`` processes
    per node; for several nodes every node runs this with its ``options.node_rank`` and the same run directory (a
    shared filesystem), and node 0 writes the record once all ranks have reported. ``options``: how
    (:class:`RunOptions`; its defaults without them).
    """
    o = options or RunOptions()
    prep = prepare(recipe, overrides or [], run_dir, o.model, o.strategy, o.strategy_config, o.checked)
    run_dir = prep.run_dir
    run_dir.mkdir(parents=True, exist_ok=True)
    if o.node_rank:  # the other nodes of a multi-node run share node 0's folder (and node 0 holds it)
        return _run_locked(prep, o)
    try:  # one run per output folder at a time (released when this process ends, however it ends)
        lock = exclusive_lock(run_dir / ".lock")
    except Busy as e:
        raise RunError(
            f"{run_dir}: another run is writing into this folder ({e}); fix: wait for it to end or give another --out"
        ) from None
    with lock:
        return _run_locked(prep, o)


def _run_locked(prep: Prepared, o: RunOptions) -> RunRecord:
    """:func:`run` once its output folder is held."""
    run_dir = prep.run_dir
    earlier = _own_output_folder(run_dir) if o.node_rank == 0 else None
    if earlier:
        print(
            f"tunelab: {run_dir / 'litgpt'} held an earlier run's outputs: moved to {run_dir / earlier}",
            file=sys.stderr,
            flush=True,
        )
    stats_dir = run_dir / "stats"
    if o.node_rank == 0:
        for old in stats_dir.glob("rank*.json"):
            old.unlink()
    if prep.strategy_config is not None:  # every rank trains what was checked here, without parsing it again
        handoff.write(run_dir, "full" if prep.recipe.method == "full" else "lora", prep.args, prep.strategy_config)
    launch, world = launch_command(prep, o.nnodes, o.node_rank, o.master_addr, o.master_port)
    rec = new_record(prep, launch, world, o.sweep, o.row_id)
    rec.earlier_outputs = earlier
    monitor = GPUMonitor(hz=o.nvml_hz)
    _machine_and_plan(rec, prep, monitor, o.node_rank)
    env = dict(
        os.environ,
        TUNELAB_STATS_DIR=str(stats_dir),
        PYTHONUNBUFFERED="1",
        JSONARGPARSE_DEPRECATION_WARNINGS="off",
        **(o.extra_env or {}),
    )
    # torch.compile's caches (inductor's FX graphs, AOTAutograd's) kept with tunelab's own, across runs and reboots
    # (inductor's default is the system temp folder): a second run of a recipe compiles from them
    env.setdefault(INDUCTOR_CACHE_ENV, str(paths.cache_dir() / "inductor"))
    if prep.source == "random":  # random weights: a benchmark, nothing worth saving (see tunelab.run.entry)
        env[SKIP_SAVE_ENV] = "1"
        rec.saves_skipped = True
    rec.driver = monitor.driver_version()
    rec.sm_clock_max_mhz = monitor.max_sm_clock_mhz()
    rec.host_cpu, rec.host_op_us, rec.device_op_us = cpu_name(), host_op_us(), device_op_us()
    rec.allocator_conf = env.get(ALLOC_CONF_ENV) or None
    rec.started_at = now_iso()
    t0 = time.monotonic()
    proc, killed_reason, gpus, interrupted = _launch_and_watch(prep, o, launch, world, env, monitor, t0)
    rec.wall_s = round(time.monotonic() - t0, 3)
    rec.ended_at = now_iso()
    rec.exit_code = proc.returncode
    if o.node_rank:  # node 0 writes the record (its ranks finish after every rank's final barrier)
        return rec

    _collect_and_save(rec, prep, o, killed_reason, gpus, monitor)
    if interrupted:
        raise Interrupted(f"{o.row_id}: stopped; recorded as killed in {run_dir / 'record.json'}")
    return rec


def _launch_and_watch(prep: Prepared, o: RunOptions, launch: list, world: int, env: dict, monitor, t0: float):
    """Step 3: the child started and watched to its end, its output in the run's logs; whatever happens (an
    interrupt, a full disk while logging) no rank is left running. (process, why it was killed or None, the GPU
    samples, whether Ctrl-C or SIGTERM stopped it)."""
    interrupted = False
    suffix = f".node{o.node_rank}" if o.node_rank else ""
    with (
        open_output(prep.run_dir / f"stdout{suffix}.log") as out_f,
        open_output(prep.run_dir / f"stderr{suffix}.log") as err_f,
    ):
        monitor.start()
        proc = subprocess.Popen(
            [sys.executable, *launch],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=err_f,
            preexec_fn=_preexec(o.memory_limit_bytes),
        )
        try:
            killed_reason = watch(proc, out_f, t0, o.timeout_s, prep.run_dir / "litgpt", world, o.on_progress)
            proc.wait()  # exited: its stdout closed
        except KeyboardInterrupt:  # Ctrl-C, or SIGTERM (tunelab.cli turns it into this): record, then stop
            killed_reason = f"{INTERRUPTED_PREFIX} stopped by Ctrl-C or SIGTERM; the row runs again on resume"
            interrupted = True
        finally:
            _kill_group(proc)
            proc.wait()
            gpus = monitor.stop()
    return proc, killed_reason, gpus, interrupted


def _machine_and_plan(rec: RunRecord, prep: Prepared, monitor: GPUMonitor, node_rank: int) -> None:
    """The device the run gets (named by NVML: nothing here touches CUDA, no context or memory on the GPU in this
    process) and, on node 0, the plan for this run made before it runs, into ``rec``."""
    import torch  # the run's environment: torch's CUDA build

    rec.device_type = "cuda" if cuda_available() else "cpu"
    rec.device_name = device_name(monitor)
    rec.device_memory_total_bytes = (monitor.memory_total_bytes() or [None])[0]
    rec.cuda = torch.version.cuda
    if node_rank == 0:
        planner = f"tunelab {rec.versions.get('tunelab', '?')}, git {rec.git_sha or 'unknown'}"
        cuda_name = rec.device_name if rec.device_type == "cuda" else None
        rec.plan, rec.plan_error = stored.for_run(prep.settings, prep.strategy_config, cuda_name, planner)


def _collect_and_save(rec: RunRecord, prep: Prepared, o: RunOptions, killed_reason, gpus, monitor) -> None:
    """Step 4: the record from what the run left, ``ok`` only when its final checkpoint is whole; written last."""
    run_dir = prep.run_dir
    stdout = read_tail(run_dir / "stdout.log")  # the last 256 MiB: millions of iteration lines
    stderr = read_tail(run_dir / "stderr.log")
    ckpt = prep.ckpt or Path(prep.args["checkpoint_dir"])
    hz = o.nvml_hz if gpus else None
    collect(rec, Finished(prep.settings, run_dir, stdout, stderr, killed_reason, gpus, hz, ckpt, monitor))
    if prep.source == "random":
        rec.pruned = prune_weights(run_dir)
    elif rec.status == "ok" and (why := outputs_not_whole(run_dir, prep.recipe.method)):
        rec.status, rec.error = "failed", f"outputs: {why}"
    save(rec, run_dir / "record.json")


def _kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL the child's process group (its ranks, loader workers): it has its own session, see _preexec."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def watch(
    proc: subprocess.Popen,
    out_f,
    t0: float,
    timeout_s: float | None,
    litgpt_dir: Path,
    world: int,
    on_progress: Callable[[Progress], None] | None,
) -> str | None:
    """Follow a running child until it exits: copy its stdout to ``out_f``, report progress (iteration, step, loss,
    tokens/s from litgpt's metrics.csv), kill it at ``timeout_s``. Returns the kill reason, or None."""
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
                    tokens = latest_tokens(litgpt_dir)
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


def outputs_not_whole(run_dir: Path, method: str) -> str | None:
    """Why the final checkpoint a run left is not what litgpt loads (:func:`tunelab.run.outputs.whole`), or None."""
    from tunelab.run.outputs import whole

    return whole(run_dir / "litgpt" / "final", method)


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
