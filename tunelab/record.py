"""The run record: one schema that every run writes (single device, multi-device, planner probes) and every
report reads. Units are in the field names: ``_bytes`` (bytes), ``_s`` (seconds), ``_w`` (watts), ``_j`` (joules).
GB in reports means 1e9 bytes; GiB 2^30.

Records are JSON files written atomically (temp file + rename) next to the run's raw logs.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import statistics
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path

from tunelab.files import read_json, write_json_atomic

SCHEMA_VERSION = 4  # 2: phase peaks, matmul precision, steady-state power window, peak basis, pruned files;
# 3: the first iteration apart (compilation); 4: the plan made before launch
STATUSES = ("ok", "oom", "error", "killed")


@dataclass
class RankStats:
    """What one process (rank) measured about itself, from inside, at exit."""

    rank: int
    """Global rank (0 for single-device runs)."""
    device: str = "cpu"
    """torch device of the rank: 'cuda:0', 'cpu'."""
    peak_allocated_bytes: int | None = None
    """torch.cuda.max_memory_allocated(): the peak of memory held by tensors (what litgpt prints as 'Memory Used')."""
    peak_reserved_bytes: int | None = None
    """torch.cuda.max_memory_reserved(): the peak the caching allocator took from the driver (>= allocated)."""
    num_alloc_retries: int | None = None
    """memory_stats()['num_alloc_retries']: cudaMalloc failures that forced a cache flush and retry (slow steps)."""
    num_ooms: int | None = None
    """memory_stats()['num_ooms']: out-of-memory errors the allocator raised."""
    peak_rss_bytes: int | None = None
    """Peak resident host memory of the process (getrusage ru_maxrss): the CPU 'memory', and host RAM for offload."""
    exception: str | None = None
    """The exception that ended the process, as 'Type: message' (None when it exited normally)."""
    float32_matmul_precision: str | None = None
    """torch.get_float32_matmul_precision() at exit: 'high' (litgpt's CLI sets it) lets float32 matmuls run as
    TF32 on tensor cores, which sets the peak that MFU of a 32-true run divides by."""
    cuda_total_bytes: int | None = None
    """torch.cuda.mem_get_info() total: the device memory CUDA exposes (below NVML's memory.total)."""
    phase_peak_allocated: dict = field(default_factory=dict)
    """Peak allocated bytes (CUDA) up to each phase: 'loaded' (the first training batch is fetched: model,
    optimizer and any quantization are in place, and litgpt's 2-batch sanity validation has run), 'first_step'
    (after the first optimizer step), 'end'."""
    cuda_error: str | None = None
    """Why the CUDA figures are missing when reading them failed at exit (a broken CUDA context)."""
    first_iteration_s: float | None = None
    """Wall time of the first training iteration, synchronised (tunelab's loop only): a cost of its own, kept apart
    from the steady-state figures (with ``compile: blocks`` and no ``pad_to_multiple``, compilation happens here)."""
    compile_s: float | None = None
    """Wall time of compiling every shape the run will train on, before the first iteration (tunelab's loop with
    ``compile: blocks`` and ``pad_to_multiple``): a forward and backward per shape, their gradients discarded."""
    compile_cache_hits: int | None = None
    """Graphs of that compilation (a forward and a backward each) read back from inductor's FX graph cache, kept
    across runs under tunelab's cache folder (torch's ``fxgraph_cache_hit`` counter)."""
    compile_cache_misses: int | None = None
    """Graphs of that compilation inductor compiled anew (``fxgraph_cache_miss``): all of them on a cold cache."""
    graphs_compiled_in_loop: int | None = None
    """Graphs torch.compile built after the first training iteration (dynamo's ``unique_graphs`` counter):
    recompilations that fell inside the training loop. A measured window with any is refused by ``tunelab bench``."""
    recompile_limit_hits: int | None = None
    """Times torch.compile gave up on a compiled block for a new graph variant (dynamo's recompile limit): the
    block then ran eagerly for that variant, a run slower than its strategy says. ``tunelab bench`` refuses a
    measured run with any."""
    paused_s: float | None = None
    """Time spent in the loop on validation, sample generation and checkpoint saves (tunelab's loop): left out of
    the iteration it interrupted, so the steady-state figures count training only."""
    trained_until: float | None = None
    """When the last training iteration's work was done on the device (``time.monotonic()`` after a synchronisation,
    tunelab's loop): the end of the last iteration, where a host timestamp would leave queued work out."""
    fused_kernels: str | None = None
    """The strategy's ``liger`` switch as it ran: Liger's kernels in use ("liger: fused linear cross-entropy, ...")
    or why it was off ("liger off: ..."). None: not asked for."""
    fused_loss_reads: int | None = None
    """Values the fused loss read back from the GPU per micro batch, each a synchronisation (0: tunelab's, which takes
    the count of targets from the host). None: no fused loss ran, or a record from before the loop said (Liger's
    own wrapper then ran it: 2)."""
    report_training_time_s: float | None = None
    """tunelab's loop, rank 0: its Training Time as litgpt's performance report counts it (the whole fit loop, in-loop
    validation included), written here rather than read back from what it prints. None: litgpt's own script."""
    report_tok_s: float | None = None
    """tunelab's loop, rank 0: padded tokens of every rank over the Training Time less its pauses (its report's
    Tok/sec)."""
    report_memory_gb: float | None = None
    """tunelab's loop, rank 0: its report's Memory Used, ``torch.cuda.max_memory_allocated`` in GB (None on a CPU)."""
    report_val_loss: float | None = None
    """tunelab's loop, rank 0: the final validation's loss."""
    trainable_params: int | None = None
    """tunelab's loop, rank 0: parameters that train (LoRA: the adapters)."""
    frozen_params: int | None = None
    """tunelab's loop, rank 0: parameters that do not train."""
    driver_allocs: list = field(default_factory=list)
    """CUDA's caching allocator going to the driver: [iteration index, cudaMalloc calls so far, cudaFree calls so
    far] (``torch.cuda.memory_stats``' ``num_device_alloc`` / ``num_device_free``) at the start of the first
    iteration, of each iteration whose start saw them change, and at exit (index = iterations run); empty without
    CUDA. A step that takes memory from the driver pays for it on the host (a cudaFree also waits for the GPU):
    :func:`driver_calls_in` counts those of a window."""


def driver_calls_in(entries: list, first: int, end: int) -> tuple[int, int] | None:
    """(cudaMalloc, cudaFree) calls made from the start of iteration ``first`` to the start of iteration ``end``
    (:attr:`RankStats.driver_allocs`; ``end`` = iterations run: to the exit); None where the entries do not reach
    back to ``first`` or on to ``end``."""

    def at(index: int):
        seen = [e for e in entries if e[0] <= index]
        return seen[-1][1:] if seen else None

    a, b = at(first), at(end)
    if a is None or b is None or entries[-1][0] < end:
        return None
    return b[0] - a[0], b[1] - a[1]


ALLOC_CONF_ENV = "PYTORCH_CUDA_ALLOC_CONF"
"""The variable torch reads its CUDA caching allocator's settings from (:attr:`RunRecord.allocator_conf`)."""


RANK_FILE_LOG = ("iters", "pauses")
"""Keys of ``rank<N>.json`` beside the RankStats fields that stay in the rank file: ``iters``, one
[monotonic start time, padded tokens, real tokens] per micro-batch iteration, from which the runner computes the
steady-state figures (step time, tok/s, the NVML window), and ``pauses``, one [iteration index, seconds, monotonic
start] per validation or save inside the loop (subtracted from that iteration's time, and left out of the NVML
window; files made before the start was kept hold [iteration index, seconds]). Too long for the record; the rank
files stay in the run directory."""


def read_rank_file(data: dict) -> tuple[RankStats, list]:
    """(RankStats, iteration log) from a rank file's JSON; ValueError naming any key the schema does not know. The
    log holds one [start, padded tokens, real tokens, seconds paused inside the iteration, [(pause start, end), ...]
    of the pauses whose start the file kept] per iteration."""
    if not isinstance(data, dict):
        raise ValueError(f"a rank file is a JSON object, got {type(data).__name__}")
    stats = checked_fields(RankStats, {k: v for k, v in data.items() if k not in RANK_FILE_LOG}, "rank file")
    iters = data.get("iters") or []
    if not isinstance(iters, list) or not all(
        isinstance(it, list) and len(it) == 3 and all(type(x) in (int, float) and math.isfinite(x) for x in it)
        for it in iters
    ):
        raise ValueError("rank file: iters is not a list of [time, padded tokens, real tokens]")
    pauses = data.get("pauses") or []
    if not isinstance(pauses, list) or not all(
        isinstance(p, list)
        and len(p) in (2, 3)
        and type(p[0]) is int
        and all(type(x) in (int, float) and math.isfinite(x) for x in p[1:])
        and p[1] >= 0
        for p in pauses
    ):
        raise ValueError("rank file: pauses is not a list of [iteration index, seconds, start]")
    driver = stats.get("driver_allocs") or []
    if not all(isinstance(e, list) and len(e) == 3 and all(type(x) is int and x >= 0 for x in e) for e in driver):
        raise ValueError("rank file: driver_allocs is not a list of [iteration, cudaMalloc calls, cudaFree calls]")
    log = [[*it, 0.0, []] for it in iters]  # [start, padded, real, seconds paused inside it, pause intervals]
    for index, seconds, *start in pauses:  # a pause belongs to the iteration it interrupted
        if 0 <= index < len(log):
            log[index][3] += seconds
            log[index][4] += [(start[0], start[0] + seconds)] if start else []
    return RankStats(**stats), log


@dataclass
class GPUSample:
    """NVML figures for one GPU over the run (sampled by the parent at ``sample_hz``)."""

    index: int
    """NVML device index."""
    name: str
    """NVML device name."""
    peak_used_bytes: int | None = None
    """Peak used memory NVML saw on the device (all processes, CUDA context included)."""
    util_mean: float | None = None
    """Mean GPU utilisation, percent of sample time a kernel was running."""
    util_std: float | None = None
    """Standard deviation of the utilisation samples."""
    power_mean_w: float | None = None
    """Mean board power draw, W."""
    energy_j: float | None = None
    """Energy over the run, J (NVML's total-energy counter difference, else mean power x time)."""
    samples: int = 0
    """How many samples were taken."""


@dataclass
class StoredPlan:
    """The planner's prediction for a run, made by the runner before it launched (:func:`tunelab.plan.stored.for_run`)
    and kept in its record: a report prints it beside the measurement, not a later planner's."""

    planner: str = ""
    """The planner that made it: tunelab's version and git commit."""
    gpu: str | None = None
    """The GPU table row planned for (the launching machine's board, by its NVML name); None: no GPU identified
    (memory only: no fit verdict, no time)."""
    peak_allocated_bytes: int = 0
    """Predicted peak allocated per device (litgpt's 'Memory Used')."""
    predicted_reserved_bytes: int = 0
    """The allocator's reserved peak it implies."""
    breakdown_bytes: dict = field(default_factory=dict)
    """The peak by cause (weights, optimizer states, activations, ...), bytes; sums to the peak."""
    fits: bool | None = None
    """Whether reserved + CUDA context fit ``gpu`` (None without a GPU)."""
    max_micro_batch_size: int | None = None
    """The largest micro batch that fits ``gpu``."""
    seconds: float | None = None
    """Point estimate of the training time on ``gpu`` (litgpt's Training Time; tunelab.plan.model.runtime)."""
    seconds_by_cause: dict = field(default_factory=dict)
    """That time by cause (matmul, elementwise, host launches, ...), seconds; sums to ``seconds``."""

    @classmethod
    def from_dict(cls, d) -> StoredPlan:
        """A stored plan from JSON; ValueError naming the field for a wrong type or a figure that is not a finite
        non-negative number (in the breakdowns too)."""
        d = checked_fields(cls, d, "run record: plan")
        for key in ("breakdown_bytes", "seconds_by_cause"):
            for name, value in d.get(key, {}).items():
                if (
                    isinstance(value, bool)
                    or not isinstance(value, (int, float))
                    or not math.isfinite(value)
                    or value < 0
                ):
                    raise ValueError(f"run record: plan: {key}[{str(name)[:40]!r}] is not a finite non-negative number")
        return cls(**d)


@dataclass
class RunRecord:
    """One run: identity, environment, status, memory per rank, speed, compute, GPU power, loss."""

    # identity
    schema_version: int = SCHEMA_VERSION
    """Version of this schema."""
    sweep: str | None = None
    """Sweep name (None for a single `tunelab run`)."""
    row_id: str = "run"
    """Row id within the sweep."""
    recipe: str = ""
    """Recipe key (model/method) or path."""
    command: str = ""
    """litgpt subcommand, e.g. finetune_lora."""
    overrides: list = field(default_factory=list)
    """The litgpt-style overrides of this row, as given (the sweep row's settings, plus the model choice)."""
    litgpt_argv: list = field(default_factory=list)
    """The exact command line run after the entry point."""
    resolved_args: dict = field(default_factory=dict)
    """Every litgpt argument after defaults and overrides (litgpt's own parser)."""
    strategy: str = "litgpt"
    """'litgpt' (the recipe's own `litgpt finetune_*`, its built-in strategy) or the configs/strategies file's
    description (DDP, FSDP ..., FSDP2, DeepSpeed ZeRO-n) run by tunelab.run.loop."""
    strategy_file: str | None = None
    """The configs/strategies file or name the run was given (None: litgpt's own strategy)."""
    strategy_settings: dict | None = None
    """Every key of that strategy file as loaded (:meth:`tunelab.strategies.StrategyConfig.settings`; None: litgpt's
    own strategy): a record is reused only for the same settings, not merely the same description."""
    model_source: str = ""
    """'checkpoint' (the recipe's real weights), 'tiny' (embedded tiny model) or 'random' (real shapes, random)."""
    model_name: str = ""
    """litgpt config name of the model that ran."""
    git_sha: str | None = None
    """Commit of the tunelab checkout (suffix '+dirty' with uncommitted changes)."""
    started_at: str = ""
    """Start, ISO 8601 UTC."""
    ended_at: str = ""
    """End, ISO 8601 UTC."""
    wall_s: float | None = None
    """Wall time of the child process, start to exit (model load, training, validation, saving)."""

    # environment
    device_type: str = "cpu"
    """'cuda' or 'cpu'."""
    device_name: str = ""
    """GPU name as CUDA reports it, or the CPU model."""
    device_count: int = 1
    """Processes (ranks) the run used: devices x num_nodes."""
    driver: str | None = None
    """NVIDIA driver version (None on CPU)."""
    cuda: str | None = None
    """CUDA version torch was built with (None for CPU builds)."""
    versions: dict = field(default_factory=dict)
    """Package versions: python, torch, litgpt, lightning, bitsandbytes, deepspeed, tunelab."""

    # status
    status: str = "error"
    """'ok', 'oom', 'error' or 'killed' (signal or timeout)."""
    exit_code: int | None = None
    """Child exit code (negative: killed by that signal)."""
    error: str | None = None
    """Last line of the error (exception or kill reason); None when ok."""
    notes: list = field(default_factory=list)
    """What the collector could not read (a rank file cut short, ...): said here, never dropped silently."""

    # settings echoed for tables (taken from resolved_args, never parsed from names)
    method: str = ""
    """full, lora or qlora."""
    precision: str | None = None
    """Lightning precision string: the recipe's, or where it sets none the one litgpt picks on the run's device
    (``settings.training_precision``)."""
    quantize: str | None = None
    """bitsandbytes quantization (QLoRA) or None."""
    micro_batch_size: int | None = None
    """Samples per forward/backward per rank."""
    global_batch_size: int | None = None
    """Samples per optimizer step, all ranks."""
    accumulation: int | None = None
    """Micro batches per optimizer step per rank."""
    max_seq_length: int | None = None
    """Truncation length."""
    optimizer: str | None = None
    """Optimizer class."""
    n_params: int | None = None
    """Parameters of the model (all)."""
    n_trainable: int | None = None
    """Trainable parameters (LoRA adapters, or all for full)."""

    # memory
    ranks: list = field(default_factory=list)
    """RankStats of every rank that reported (a killed rank reports nothing)."""
    peak_allocated_bytes: int | None = None
    """Max over ranks of peak allocated (CUDA)."""
    peak_reserved_bytes: int | None = None
    """Max over ranks of peak reserved (CUDA)."""
    num_alloc_retries: int | None = None
    """Sum over ranks of allocator retries."""
    peak_rss_bytes: int | None = None
    """Max over ranks of peak host RSS."""

    # speed
    iters: int | None = None
    """Micro-batch iterations run (per rank)."""
    optimizer_steps: int | None = None
    """Optimizer steps run."""
    first_iteration_s: float | None = None
    """Max over ranks of the first training iteration's wall time (compilation included unless compiled ahead;
    tunelab's loop only)."""
    compile_s: float | None = None
    """Max over ranks of the time spent compiling every training shape before the first iteration (tunelab's loop
    with compiled blocks and static shapes); apart from the steady-state figures."""
    compile_cache_hits: int | None = None
    """Max over ranks of the graphs that compilation read from inductor's cache (``RankStats.compile_cache_hits``)."""
    compile_cache_misses: int | None = None
    """Max over ranks of the graphs it compiled anew: 0 with a warm cache."""
    graphs_compiled_in_loop: int | None = None
    """Max over ranks of the graphs torch.compile built after the first iteration: recompilations inside the loop
    (0 with static shapes compiled ahead; ``tunelab bench`` refuses a measured run with any)."""
    recompile_limit_hits: int | None = None
    """Max over ranks of the recompile-limit hits (blocks that then ran eagerly for a graph variant; 0 when the limit
    covers every variant; ``tunelab bench`` refuses a measured run with any)."""
    fused_kernels: str | None = None
    """Rank 0's ``liger`` switch as it ran: the Liger kernels in use, or why they were off (None: not asked for)."""
    fused_loss_reads: int | None = None
    """Values the fused loss read back from the GPU per micro batch (:attr:`RankStats.fused_loss_reads`)."""
    paused_s: float | None = None
    """Max over ranks of the time spent on validation, sample generation and checkpoints inside the loop (excluded
    from the iteration and step times)."""
    warmup_steps_excluded: int | None = None
    """Optimizer steps left out of the steady-state figures (warm-up: compilation, allocator growth)."""
    step_time_s: float | None = None
    """Median time of an optimizer step over the steady state (sum of its micro-batch iteration times)."""
    iter_time_s: float | None = None
    """Median micro-batch iteration time over the steady state."""
    step_time_mean_s: float | None = None
    """Mean optimizer step over the steady state (rank 0's counted steps: their time over their number): what a run's
    length follows. The median understates a loop that reads the loss only every few iterations (the fast path):
    the host queues ahead and the step holding the read waits for the GPU's backlog, so most steps look short."""
    padded_per_sample: float | None = None
    """Padded tokens per sample over the same steps (rank 0): the length the step's time goes with."""
    tokens_padded: int | None = None
    """Tokens fed to the model, padding included, all ranks, whole run."""
    tokens_real: int | None = None
    """Non-padding tokens (prompt template + text), all ranks, whole run."""
    tok_s_padded: float | None = None
    """Steady-state tokens/s with padding, summed over ranks."""
    tok_s_real: float | None = None
    """Steady-state tokens/s without padding, summed over ranks."""
    tok_s_padded_per_device: float | None = None
    """tok_s_padded / device_count."""
    samples_s: float | None = None
    """Steady-state samples/s, summed over ranks (samples over the counted steps' time)."""
    litgpt_training_time_s: float | None = None
    """litgpt's printed 'Training Time' (whole fit loop, warm-up and in-loop validation included)."""
    litgpt_tok_s: float | None = None
    """litgpt's printed 'Tok/sec' (padded tokens over its Training Time)."""
    litgpt_memory_gb: float | None = None
    """litgpt's printed 'Memory Used' (rank 0 peak allocated, GB = 1e9 bytes); CUDA only."""

    # compute
    flops_per_token: float | None = None
    """Training FLOPs per token (forward + backward) by the formula in flops_formula."""
    flops_formula: str | None = None
    """How flops_per_token was computed (N, attention term, sequence length used)."""
    achieved_tflops_per_device: float | None = None
    """flops_per_token x real tok/s per device / 1e12."""
    peak_tflops_per_device: float | None = None
    """The device's dense peak for the run's precision (configs/hardware/gpus.yaml); None if unknown."""
    mfu: float | None = None
    """achieved / peak, on real (non-padding) tokens; None on CPU or an unknown device."""
    mfu_padded: float | None = None
    """The same on padded tokens: the work the device did, padding included (hardware utilisation)."""
    peak_basis: str | None = None
    """Which peak MFU divides by: 'bf16 dense', 'tf32 dense (float32 matmul precision high)', 'fp32', ..."""

    # GPU utilisation and power (NVML; absent on CPU)
    gpus: list = field(default_factory=list)
    """GPUSample per GPU."""
    sample_hz: float | None = None
    """NVML sampling rate."""
    gpu_util_mean: float | None = None
    """Mean utilisation over GPUs."""
    gpu_util_std: float | None = None
    """Mean over GPUs of the utilisation standard deviation."""
    power_mean_w: float | None = None
    """Whole run (launch to exit: load, training, validation, save): summed mean power of the GPUs, W."""
    energy_j: float | None = None
    """Whole run: summed GPU energy, J."""
    energy_j_per_1k_tokens: float | None = None
    """Whole run: energy_j per 1,000 real training tokens (inflated by load/save time on short runs)."""
    steady_window_s: float | None = None
    """Length of the steady-state window: the optimizer steps tok/s is measured over (warm-up excluded)."""
    driver_mallocs_steady: int | None = None
    """cudaMalloc calls rank 0's caching allocator made inside the steady window (:func:`driver_calls_in`): memory
    taken from the driver while the loop should reuse its cache (a new, longer padded batch; fragmentation). None:
    not recorded (no CUDA, or a record made before it was)."""
    driver_frees_steady: int | None = None
    """cudaFree calls inside the same window (each waits for the GPU: the allocator freeing its cache to retry)."""
    gpu_util_steady_mean: float | None = None
    """Steady-state window: mean NVML utilisation over GPUs, %."""
    gpu_util_steady_std: float | None = None
    """Steady-state window: mean over GPUs of the utilisation standard deviation."""
    power_steady_w: float | None = None
    """Steady-state window: summed mean power of the GPUs, W."""
    energy_steady_j: float | None = None
    """Steady-state window: summed GPU energy, J (NVML energy counter, else mean power x window)."""
    energy_steady_j_per_1k_tokens: float | None = None
    """Steady-state window: energy per 1,000 real tokens trained in the window (all ranks)."""
    sm_clock_steady_mhz: float | None = None
    """Steady-state window: mean SM clock over the samples and GPUs, MHz (NVML)."""
    sm_clock_max_mhz: float | None = None
    """GPU 0's highest SM clock (NVML), MHz: a steady clock below it under load was held down (see the next)."""
    clock_capped_steady_share: float | None = None
    """Steady-state window: share of the NVML samples (mean over GPUs) whose SM clock was held down by the power cap
    or heat (tunelab.run.gpu_monitor.CAPPED_REASONS); a GPU-bound step slows with it."""
    allocator_conf: str | None = None
    """``PYTORCH_CUDA_ALLOC_CONF`` as the run's processes got it (None: unset, CUDA's caching allocator as torch
    ships it): ``expandable_segments:True`` and the like change how often a step goes to the driver
    (``driver_mallocs_steady``) and the reserved peak. A record made under another setting is run again."""
    host_cpu: str | None = None
    """The launching host's CPU model name (/proc/cpuinfo): a host-bound step follows it."""
    host_op_us: float | None = None
    """The launching host's eager dispatch speed before the run, microseconds per small autograd op
    (tunelab.run.gpu_monitor.host_op_us): what compares host-bound steps across machines."""
    device_op_us: float | None = None
    """The same op on GPU 0, dispatch and launch (tunelab.run.gpu_monitor.device_op_us), microseconds; None without
    CUDA: the per-kernel host cost a host-bound step's time follows."""
    device_memory_total_bytes: int | None = None
    """NVML memory.total of GPU 0 (what nvidia-smi prints); the CUDA-visible total is in ranks[].cuda_total_bytes."""
    saves_skipped: bool = False
    """litgpt's checkpoint saves and LoRA merge were skipped (random-weight benchmark runs): training untouched."""
    pruned: list = field(default_factory=list)
    """Files removed after the run to save disk (litgpt's final checkpoint of a random-weight run), as paths
    relative to the run directory."""
    earlier_outputs: str | None = None
    """Where an earlier run's litgpt outputs found in this run's folder were moved before it started (a path
    relative to the run directory, under ``earlier/``); None when the folder was new."""

    # loss
    loss_first: float | None = None
    """First logged training loss."""
    loss_last: float | None = None
    """Last logged training loss."""
    val_loss_final: float | None = None
    """Final validation loss (litgpt's final evaluation)."""

    # the plan
    plan: StoredPlan | None = None
    """What the planner predicted for this run before it launched (None: a record from before plans were stored,
    schema 3 and older, or a run the planner refused: ``plan_error``)."""
    plan_error: str | None = None
    """Why the runner could not plan the run (the planner's one line)."""

    # files
    log_dir: str = ""
    """Directory with stdout.log, stderr.log, litgpt's out_dir and the per-rank stats (relative to the record)."""

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> RunRecord:
        """A record from its JSON data; ValueError naming the field for an unknown field, a wrong type (a string
        for a number, a list for a mapping), a negative or non-finite figure, or an unknown status."""
        if not isinstance(d, dict):
            raise ValueError(f"a run record is a JSON object, got {type(d).__name__}")
        plan = d.get("plan")
        d = checked_fields(cls, {k: v for k, v in d.items() if k != "plan"}, "run record")
        if plan is not None:
            d["plan"] = StoredPlan.from_dict(plan)
        try:
            d["ranks"] = [RankStats(**checked_fields(RankStats, r, "ranks[]")) for r in d.get("ranks", [])]
            d["gpus"] = [GPUSample(**checked_fields(GPUSample, g, "gpus[]")) for g in d.get("gpus", [])]
            rec = cls(**d)
        except TypeError as e:  # a required field missing
            raise ValueError(f"run record: {e}") from None
        if rec.status not in STATUSES:
            raise ValueError(f"run record status {rec.status!r} is not one of {STATUSES}")
        return rec


LOSS_FIELDS = ("loss_first", "loss_last", "val_loss_final")
"""Figures that may be NaN or infinite in a real record: a diverged run's loss."""
TEXT_LISTS = ("overrides", "litgpt_argv", "notes")
"""Lists whose items are text: the command line as given and as run, the notes."""
SIGNED_FIELDS = ("exit_code",)
"""Figures that may be negative: a child killed by signal N exits with -N."""


def checked_fields(cls, d, where: str) -> dict:
    """``d`` checked against the dataclass ``cls``: known keys only, each value of its field's type (an int is a
    float, a bool is not a number), numbers finite and non-negative (losses may be NaN or infinite: divergence is
    a result; an exit code is negative for a signal). ValueError naming the field otherwise."""
    if not isinstance(d, dict):
        raise ValueError(f"{where}: a JSON object expected, got {type(d).__name__}")
    hints = _hints(cls)
    unknown = set(d) - set(hints)
    if unknown:
        raise ValueError(f"{where} has unknown keys {sorted(unknown)} (schema {SCHEMA_VERSION})")
    d = dict(d)
    for key, value in d.items():
        allowed = hints[key]
        ok = (
            (value is None and type(None) in allowed)
            or (isinstance(value, bool) and bool in allowed)
            or (type(value) is int and (int in allowed or float in allowed))
            or (type(value) is float and float in allowed)
            or (type(value) in (str, list, dict) and type(value) in allowed)
        )
        if not ok:
            want = " or ".join(t.__name__ for t in allowed if t is not type(None))
            raise ValueError(f"{where}: {key} is a {type(value).__name__}, expected {want}")
        if key in TEXT_LISTS and isinstance(value, list) and not all(isinstance(v, str) for v in value):
            raise ValueError(f"{where}: {key} holds something that is not text (a list of strings expected)")
        if type(value) is int and int not in allowed:  # a whole number where a float belongs: as the float
            value = d[key] = float(value) if abs(value) < 1e308 else math.inf
        if type(value) in (int, float) and key not in LOSS_FIELDS:
            if not math.isfinite(value) or (value < 0 and key not in SIGNED_FIELDS):
                raise ValueError(f"{where}: {key} = {str(value)[:40]} is not a finite non-negative number")
    return d


@functools.cache
def _hints(cls) -> dict[str, tuple]:
    """{field: the Python types its annotation allows} (``int | None`` -> (int, NoneType))."""
    out = {}
    for name, hint in typing.get_type_hints(cls).items():
        args = typing.get_args(hint)
        out[name] = (
            tuple(typing.get_origin(a) or a for a in args)
            if args and typing.get_origin(hint) in (typing.Union, types.UnionType)
            else (typing.get_origin(hint) or hint,)
        )
    return out


def save(record: RunRecord, path: Path) -> Path:
    """Write a record atomically (tunelab.files)."""
    return write_json_atomic(path, record.to_dict())


def load(path: Path) -> RunRecord:
    """Read a record (:func:`tunelab.files.read_json`: a regular file, bounded); ValueError (FileRefused is one)
    for a file that is not a readable record or a field of the wrong type or range."""
    return RunRecord.from_dict(read_json(path, what="run record"))


def steady_steps(
    log: list, accumulation: int, n_iters: int, end: float | None = None, drop: frozenset = frozenset()
) -> tuple[list, int, list]:
    """(the start of each counted iteration and of what follows the last, warm-up steps dropped, the steady
    optimizer steps) of one rank's iteration log (:func:`read_rank_file`): each step a list of its iterations'
    (seconds, padded tokens, real tokens), as :func:`steady_state` times them. An iteration ends where the next
    starts; the last one ends at ``end`` (:attr:`RankStats.trained_until`, a synchronised point) when the rank
    recorded one, else it is not counted (its end is unknown: the host may still have work queued). The optimizer
    steps numbered in ``drop`` (from 1) are left out: their time holds a pause the log did not note
    (:func:`interrupted_steps`)."""
    iters = [it for it in log[:n_iters] if it[1] >= 0]
    starts = [it[0] for it in iters] + ([end] if end is not None and iters and end >= iters[-1][0] else [])
    durations = [
        (starts[k + 1] - iters[k][0] - (iters[k][3] if len(iters[k]) > 3 else 0.0), iters[k][1], iters[k][2])
        for k in range(len(starts) - 1)
    ]
    n_steps_full = len(durations) // accumulation
    warm = max(1, n_steps_full // 10) if n_steps_full >= 3 else 0
    steps = range(warm, n_steps_full)
    return starts, warm, [durations[s * accumulation : (s + 1) * accumulation] for s in steps if s + 1 not in drop]


def interrupted_steps(args: dict, steps: int) -> frozenset:
    """The optimizer steps (numbered from 1) after which litgpt's loop validated, with a generated sample, or saved
    a checkpoint, by a run's resolved ``eval.interval`` and ``train.save_interval``: in a rank file that noted no
    pauses (litgpt's loop before the collector timed them), such a step's time holds that work, not training."""
    every = [(args.get("eval") or {}).get("interval"), (args.get("train") or {}).get("save_interval")]
    every = [n for n in every if isinstance(n, int) and not isinstance(n, bool) and n > 0]
    return frozenset(s for s in range(1, steps + 1) if any(s % n == 0 for n in every))


def unnoted_pauses(rec, iters: list) -> frozenset:
    """The optimizer steps of a run of litgpt's own loop that held a validation or a save its rank file did not
    note as a pause (records made before the collector timed litgpt's pauses, or a litgpt whose functions the
    probes no longer find; ``iters``: its rank-0 log as :func:`read_rank_file` reads it): left out of its steady
    window, their time being that work's, not training's."""
    if rec.strategy != "litgpt" or not iters or any(it[3] for it in iters):
        return frozenset()
    return interrupted_steps(rec.resolved_args or {}, rec.optimizer_steps or 0)


def steady_state(
    ranks_iters: list[list], accumulation: int, n_iters: int, ends: list | None = None, drop: frozenset = frozenset()
) -> dict:
    """Median step/iteration times, rank 0's mean step, and steady-state token rates from each rank's iteration log.

    Iteration k lasts from its batch fetch to the next one, less the time paused inside it (validation, sample
    generation, a checkpoint save in tunelab's loop); the last iteration ends at the rank's synchronised end of
    training (``ends``, one per rank, None where it recorded none: then it is dropped); the first 10% of optimizer
    steps (at least 1 when there are 3 or more) are dropped as warm-up, and the steps numbered in ``drop``
    (:func:`steady_steps`).
    """
    out: dict = {}
    per_rank = []
    ends = ends if ends and len(ends) == len(ranks_iters) else [None] * len(ranks_iters)
    for log, end in zip(ranks_iters, ends):
        starts, warm, steps = steady_steps(log, accumulation, n_iters, end, drop)
        if not steps:
            continue
        n_steps_full = (len(starts) - 1) // accumulation
        per_rank.append(
            {
                "warm": warm,
                "step_times": [sum(d for d, _, _ in st) for st in steps],
                "iter_times": [d for st in steps for d, _, _ in st],
                "time": sum(d for st in steps for d, _, _ in st),
                "padded": sum(p for st in steps for _, p, _ in st),
                "real": sum(r for st in steps for _, _, r in st),
                "iterations": len(steps) * accumulation,
                "t0": starts[warm * accumulation],
                "t1": starts[n_steps_full * accumulation],  # the end of the last counted iteration
                "end": n_steps_full,
            }
        )
    if not per_rank:
        return out
    r0 = per_rank[0]
    out["warmup_steps_excluded"] = r0["warm"]
    out["step_time_s"] = statistics.median(r0["step_times"])
    out["iter_time_s"] = statistics.median(r0["iter_times"])
    out["step_time_mean_s"] = r0["time"] / len(r0["step_times"])
    out["padded_per_iteration"] = r0["padded"] / r0["iterations"]
    out["iterations_s"] = sum(r["iterations"] / r["time"] for r in per_rank if r["time"] > 0)
    out["tok_s_padded"] = sum(r["padded"] / r["time"] for r in per_rank if r["time"] > 0)
    out["tok_s_real"] = sum(r["real"] / r["time"] for r in per_rank if r["time"] > 0)
    # the window NVML figures are averaged over: rank 0's counted steps, on the shared monotonic clock, less its pauses
    out["window"] = (r0["t0"], r0["t1"])
    out["pauses"] = [
        (a, b) for it in ranks_iters[0] for a, b in (it[4] if len(it) > 4 else ()) if b > r0["t0"] and a < r0["t1"]
    ]
    out["window_iterations"] = (r0["warm"] * accumulation, r0["end"] * accumulation)
    out["window_tokens_real"] = sum(r["real"] for r in per_rank)
    return out
