"""``tunelab tune-batch``: the largest micro batch that fits, and the fastest one, found by real short probes.

Starting from the planner's largest fitting micro batch (or 1), each probe is a real run of a few optimizer steps
written as a run record. The micro batch doubles until a probe runs out of memory, then bisects between the last fit
and the first failure. The fastest is the highest steady-state real tokens/s among the probes that fit without
allocator retries (retries cost time before they cost an OOM). Each probe's window ends at a synchronised point.
On CPU ``--memory-limit-gb`` caps each probe's address space, so the search runs here too (docs/commands.md)."""

from __future__ import annotations

import dataclasses
import json
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from tunelab import hardware
from tunelab import record as record_mod
from tunelab.errors import InputError
from tunelab.files import Busy, exclusive_lock, set_aside, write_json_atomic, write_text_atomic
from tunelab.plan.recipe import plan_recipe
from tunelab.progress import ProgressLine
from tunelab.recipes import Recipe
from tunelab.run.resume import resume_state, same_overrides, settings_changed, strategy_label, strategy_settings
from tunelab.run.runner import RunOptions, run
from tunelab.settings import data_size, overridden, resolve, split_sizes
from tunelab.strategies import load_strategy
from tunelab.units import GB, fmt, gb
from tunelab.validate import check


@dataclass
class TuneResult:
    """One search: the largest fitting micro batch, the best one, and every probe."""

    largest_fitting: int
    """Largest micro batch whose probe finished (0 if even the smallest tried failed)."""
    best: int | None
    """Micro batch with the highest padded tok/s among fitting probes without allocator retries."""
    start: int
    """Where the search started, and why (start_reason)."""
    start_reason: str
    probes: list = field(default_factory=list)
    """One entry per probe: micro batch, status, tok/s, retries, peak memory, utilisation, TFLOP/s, record path."""
    setting: str = ""
    """The strategy and activation-checkpointing setting searched ('' for the recipe's own litgpt run)."""
    predicted_largest: int | None = None
    """The planner's largest fitting micro batch for the same setting on the named GPU (None without --gpu)."""
    capped: str = ""
    """Why the search stopped below its --max-micro ('' where it did not): a probe's global batch (micro x devices)
    cannot exceed the training samples, or an epoch has no optimizer step."""


def probe_overrides(overrides: list[str], micro: int, world: int, steps: int) -> list[str]:
    """A probe: ``steps`` optimizer steps of one micro batch each, one warm-up step (litgpt's cosine schedule divides
    by its steps - lr_warmup_steps, so a recipe's warm-up equal to the probe's steps would crash it), as many epochs
    as steps (the schedule spans min(epochs x steps per epoch, max_steps): a micro batch near the data's size has
    one step an epoch), no saving."""
    return [
        *overrides,
        "--train.epochs",
        str(steps),
        "--train.micro_batch_size",
        str(micro),
        "--train.global_batch_size",
        str(micro * world),
        "--train.max_steps",
        str(steps),
        "--train.lr_warmup_steps",
        "1",
        "--eval.final_validation",
        "false",
        "--train.save_interval",
        "null",
    ]


PROBE_SETS = tuple(key.removeprefix("--") for key in probe_overrides([], 1, 1, 1)[::2])
"""What each probe sets itself (:func:`probe_overrides`): an override of one of them would be replaced unseen."""


def probe_problems(recipe: Recipe, overrides: list[str], world: int, steps: int, strategy: bool) -> list[str]:
    """An override of what each probe sets (:data:`PROBE_SETS`), then what the validator refuses in a probe as it
    will run (under tunelab's multi-device loop, ``strategy``, the in-loop evaluation litgpt could hang on is not
    run, so eval.interval is not a problem there)."""
    replaced = [
        f"--{key} {value}: each probe sets it (one micro batch an optimizer step, its --steps steps, no saving); fix: "
        "leave it out (the search tries the micro batches from --start to --max-micro)"
        for key, value in overridden(recipe, overrides, PROBE_SETS).items()
    ]
    return replaced or check(recipe, probe_overrides(overrides, 1, world, steps)).blocking(under_strategy=strategy)


def data_cap(recipe: Recipe, overrides: list[str], world: int) -> tuple[int | None, str]:
    """(the largest micro batch a probe on ``world`` devices can take: the training samples // world, or None where
    the data's size is not known here; why)."""
    settings = resolve(recipe, overrides)
    samples = data_size(settings.args)[0]
    if not samples:
        return None, ""
    trained = split_sizes(samples, settings.val_split_fraction)[0]
    return (
        trained // world,
        f"{trained:,} training samples on {world} device(s), a probe's global batch micro x devices",
    )


def planned_start(
    recipe: Recipe,
    overrides: list[str],
    gpu: hardware.GPU | None,
    strategy: str | None,
    activation_checkpointing: bool,
    model: str,
) -> tuple[int | None, int, str]:
    """(the planner's largest fitting micro batch on ``gpu``, or None without one; the micro batch a search starts
    from; why). The tiny model is nothing like the GPU row's model: its searches start at 1."""
    if gpu is None:
        return None, 1, "no GPU row for the planner to predict from"
    plan = plan_recipe(
        recipe, overrides, gpu=gpu, strategy=strategy, activation_checkpointing=activation_checkpointing
    ).plan
    predicted = plan.max_micro_batch_size
    if predicted and model != "tiny":
        return predicted, max(1, predicted), f"the planner's largest fitting micro batch on {gpu.name}"
    return predicted, 1, "the tiny model: the planner's prediction is for the real one"


class TuneError(InputError):
    """A search that cannot go on: a probe failed or was refused, or another search holds the directory; the
    message names the cause and the probes finished before it."""


@dataclass
class Probes:
    """What a micro-batch search probes (:func:`tune`): its bounds, the steps of each probe, and where it says so."""

    max_micro: int = 1024
    """The largest micro batch probed (the cap itself is probed)."""
    steps: int = 3
    """Optimizer steps per probe."""
    world: int = 1
    """Devices each probe runs on (its global batch: micro x world)."""
    also: list[int] | None = None
    """Micro batches probed first, for the table (the shape of the curve)."""
    stream: object = field(default_factory=lambda: sys.stderr)
    """Where each probe's line goes (the process's stderr when the options are made)."""


def tune(
    recipe: Recipe,
    overrides: list[str],
    out_dir: Path,
    options: RunOptions | None = None,
    probes: Probes | None = None,
    *,
    start: int = 1,
    start_reason: str = "",
    setting: str = "",
    predicted_largest: int | None = None,
) -> TuneResult:
    """Search the micro batch by real probes (see the module docstring); every probe is a run record under
    ``out_dir/mbs<N>/``, and one already there with the same settings is reused. ``options``: how each probe runs
    (its weights, limits, strategy file); ``probes``: what is probed."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    prober = _Prober(recipe, overrides, out_dir, options or RunOptions(), probes or Probes())
    try:
        lock = exclusive_lock(out_dir / ".lock")
    except Busy as e:
        raise TuneError(
            f"{out_dir} is being searched by {e}; fix: wait for it to finish, or use another --out"
        ) from None
    cap, why = data_cap(recipe, overrides, prober.probes.world)
    capped = f"capped at {cap}: {why}" if cap is not None and cap < prober.probes.max_micro else ""
    if capped:
        prober.probes = dataclasses.replace(prober.probes, max_micro=max(cap, 1))
        print(f"micro batches {capped}", file=prober.probes.stream, flush=True)
    try:
        for m in sorted(set(prober.probes.also or ())):  # rows for the table (the curve's shape), real probes, first:
            if m <= prober.probes.max_micro:  # a search cut short by a time limit still leaves them, reused
                prober(m)
        lo = _largest_fitting(prober, max(1, min(start, prober.probes.max_micro)), prober.probes.max_micro)
        _largest_without_retries(prober)
    except (RuntimeError, InputError) as e:  # a probe that failed, or one refused before launch
        done = ", ".join(f"micro {m} {r.status}" for m, r in sorted(prober.results.items())) or "none"
        raise TuneError(f"{e}; probes finished before it: {done} (records under {out_dir})") from None
    finally:
        lock.close()
    res = _result(prober.results, out_dir, lo, start, start_reason, setting, predicted_largest)
    res.capped = capped
    write_json_atomic(out_dir / "tune-batch.json", res.__dict__)
    return res


class _Prober:
    """One probe per micro batch, each a run record under ``out_dir/mbs<N>/`` (one already there with the same
    settings is reused); calling it probes a micro batch and says whether it fitted."""

    def __init__(self, recipe: Recipe, overrides: list[str], out_dir: Path, options: RunOptions, probes: Probes):
        self.recipe, self.overrides, self.out_dir, self.options, self.probes = (
            recipe,
            overrides,
            out_dir,
            options,
            probes,
        )
        self.results: dict[int, record_mod.RunRecord] = {}
        self.progress = ProgressLine(None, probes.stream)

    def __call__(self, m: int) -> bool:
        if m in self.results:
            return self.results[m].status == "ok"
        o, pr, recipe, run_dir = self.options, self.probes, self.recipe, self.out_dir / f"mbs{m}"
        wanted = probe_overrides(self.overrides, m, pr.world, pr.steps)
        rec = reusable(run_dir / "record.json", recipe, wanted, o.strategy, o.model)
        if rec is None and (run_dir / "record.json").is_file():  # another probe's record: kept aside, not lost
            set_aside(run_dir / "record.json", "settings changed")
        if rec is None:
            self.progress.started(len(self.results), f"probe micro {m} {recipe.key}")
            probe_options = dataclasses.replace(o, sweep="tune-batch", row_id=f"mbs{m}", on_progress=self.progress.show)
            rec = run(recipe, wanted, run_dir, probe_options)
            shutil.rmtree(run_dir / "litgpt" / "final", ignore_errors=True)  # probes keep records and logs only
            again = ""
        else:
            again = " [recorded earlier: not run again]"
        self.results[m] = rec
        mem = rec.peak_allocated_bytes or rec.peak_rss_bytes
        pr.stream.write(
            f"probe micro {m}{again}: {rec.status}"
            + (f" ({rec.error})" if rec.status != "ok" else "")
            + (f" | {rec.tok_s_padded:,.0f} tok/s" if rec.tok_s_padded else "")
            + (f" | peak {mem / GB:.2f} GB" if mem else "")
            + "\n"
        )
        pr.stream.flush()
        if rec.status not in ("ok", "oom"):
            raise RuntimeError(f"probe micro {m} ended with {rec.status}: {rec.error} (see {run_dir}/stderr.log)")
        return rec.status == "ok"


def _largest_fitting(probe: _Prober, m: int, max_micro: int) -> int:
    """The largest micro batch that fits (0: none): from ``m``, doubling up to ``max_micro`` (the cap itself is
    probed: 244 fitting under a cap of 256 says nothing of 256) or halving down, then bisecting the bracket."""
    if probe(m):
        lo, hi = m, None
        while hi is None and lo < max_micro:
            nxt = min(lo * 2, max_micro)
            if probe(nxt):
                lo = nxt
            else:
                hi = nxt
    else:
        hi, lo = m, 0
        while hi > 1:
            nxt = hi // 2
            if probe(nxt):
                lo = nxt
                break
            hi = nxt
    if hi is not None and lo:
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if probe(mid):
                lo = mid
            else:
                hi = mid
    return lo


def _largest_without_retries(probe: _Prober) -> None:
    """The largest micro batch that fits without allocator retries (seed 000: 8 fit, but its cudaMalloc retries
    made 7 the fastest): bisect between the largest clean probe and the smallest one that retried or ran out."""
    results = probe.results

    def clean(m: int) -> bool:
        return results[m].status == "ok" and not results[m].num_alloc_retries

    while True:
        lo_c = max([m for m in results if clean(m)], default=0)
        hi_c = min([m for m in results if m > lo_c and not clean(m)], default=None)
        if hi_c is None or hi_c - lo_c <= 1:
            break
        probe(max(1, (lo_c + hi_c) // 2))


def _result(
    results: dict, out_dir: Path, lo: int, start: int, start_reason: str, setting: str, predicted: int | None
) -> TuneResult:
    """The search's result: the largest fitting micro batch, the best (the fastest clean probe: no allocator
    retries, nothing compiled inside the loop, whose time would hold its compilation), every probe."""
    fitting = [(m, r) for m, r in results.items() if r.status == "ok"]
    clean = [(m, r) for m, r in fitting if not r.num_alloc_retries and not r.graphs_compiled_in_loop and r.tok_s_padded]
    best = max(clean, key=lambda mr: mr[1].tok_s_padded)[0] if clean else None
    probes = [
        {
            "micro_batch_size": m,
            "status": r.status,
            "tok_s_padded": r.tok_s_padded,
            "num_alloc_retries": r.num_alloc_retries,
            "peak_allocated_bytes": r.peak_allocated_bytes,
            "peak_reserved_bytes": r.peak_reserved_bytes,
            "peak_rss_bytes": r.peak_rss_bytes,
            "gpu_util_mean": r.gpu_util_steady_mean,
            "gpu_util_std": r.gpu_util_steady_std,
            "tflops_per_device": r.achieved_tflops_per_device,
            "iter_time_s": r.iter_time_s,
            "error": r.error,
            "record": str(out_dir / f"mbs{m}" / "record.json"),
        }
        for m, r in sorted(results.items())
    ]
    return TuneResult(
        largest_fitting=lo,
        best=best,
        start=start,
        start_reason=start_reason,
        setting=setting,
        predicted_largest=predicted,
        probes=probes,
    )


def reusable(
    record_path: Path, recipe: Recipe, overrides: list[str], strategy: str | None, model: str
) -> record_mod.RunRecord | None:
    """An earlier probe's record that answers this probe (same recipe, overrides, strategy file and model choice;
    finished or out of memory, not cut short): a search stopped by a time limit or Ctrl-C goes on where it was."""
    done, _ = resume_state(record_path)
    if not done:
        return None
    try:
        rec = record_mod.load(record_path)
    except (OSError, ValueError, TypeError):
        return None
    same = (
        rec.recipe == recipe.key
        and same_overrides(rec.overrides, overrides)
        and (rec.strategy or "litgpt") == strategy_label(strategy)
        and not settings_changed(rec.strategy_settings, strategy_settings(strategy))
        and rec.status in ("ok", "oom")
        and (model in ("auto", rec.model_source) or (model == "checkpoint" and rec.model_source == "checkpoint"))
    )
    return rec if same else None


PREFETCH = {"pre": "BACKWARD_PRE", "post": "BACKWARD_POST", "none": None}
"""``--backward-prefetch`` words and the FSDP BackwardPrefetch member each names (none: no prefetch)."""


def strategy_variant(
    strategy: str, activation_checkpointing: bool | None, out_dir: Path, backward_prefetch: str | None = None
) -> Path:
    """A copy of a configs/strategies file with ``activation_checkpointing`` (and, if given, ``backward_prefetch``:
    a key of :data:`PREFETCH`) set, written into ``out_dir``."""
    cfg = dataclasses.asdict(load_strategy(strategy))
    what = []
    if activation_checkpointing is not None:
        cfg["activation_checkpointing"] = activation_checkpointing
        what.append(f"activation checkpointing {'on' if activation_checkpointing else 'off'}")
    if backward_prefetch is not None:
        cfg["backward_prefetch"] = PREFETCH[backward_prefetch]
        what.append(f"backward prefetch {backward_prefetch}")
    cfg["description"] = (cfg.get("description") or cfg["name"]) + f" ({', '.join(what)}: tunelab tune-batch)"
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"strategy-{variant_name(activation_checkpointing, backward_prefetch)}.yaml"
    write_text_atomic(path, yaml.safe_dump(cfg, sort_keys=False))
    return path


def variant_name(activation_checkpointing: bool | None, backward_prefetch: str | None) -> str:
    """The directory/file stem of a setting: ``ac-on``, ``ac-off-prefetch-none``, ``prefetch-pre``."""
    parts = [] if activation_checkpointing is None else [f"ac-{'on' if activation_checkpointing else 'off'}"]
    if backward_prefetch is not None:
        parts.append(f"prefetch-{backward_prefetch}")
    return "-".join(parts) or "strategy"


AC_SETTINGS = {"on": [True], "off": [False], "both": [False, True], None: [None]}
"""``--activation-checkpointing`` words and the settings each searches (None: the strategy file's own)."""


def search(
    recipe: Recipe,
    overrides: list[str],
    out: Path,
    options: RunOptions,
    probes: Probes,
    *,
    gpu: hardware.GPU | None,
    activation_checkpointing: str | None = None,
    backward_prefetch: str | None = None,
    start: int | None = None,
) -> list[TuneResult]:
    """``tunelab tune-batch``: one :func:`tune` per activation-checkpointing setting (``on``, ``off``, ``both``),
    each under its own copy of the strategy file (``options.strategy``) with that setting (and
    ``backward_prefetch``) written into its own directory under ``out``; the search starts at the planner's largest
    fitting micro batch unless ``start``."""
    results = []
    strategy, model = options.strategy, options.model
    for setting in AC_SETTINGS[activation_checkpointing]:
        variant, sub_out, label = strategy, out, strategy or ""
        if setting is not None or backward_prefetch:
            sub_out = out / variant_name(setting, backward_prefetch)
            variant = str(strategy_variant(strategy, setting, sub_out, backward_prefetch))
            label = ", ".join(
                [strategy]
                + ([] if setting is None else [f"activation checkpointing {'on' if setting else 'off'}"])
                + ([] if not backward_prefetch else [f"backward prefetch {backward_prefetch}"])
            )
        predicted, first, why = planned_start(recipe, overrides, gpu, variant, bool(setting), model)
        if start:
            first, why = start, "--start"
        results.append(
            tune(
                recipe,
                overrides,
                sub_out,
                dataclasses.replace(options, strategy=variant),
                probes,
                start=first,
                start_reason=why,
                setting=label,
                predicted_largest=predicted,
            )
        )
    return results


def render(res: TuneResult) -> str:
    """The probes as the FSDP tuning study tabled them, the best micro batch starred."""
    lines = [
        f"{res.setting or 'litgpt'}: started at micro batch {res.start} ({res.start_reason})",
        "  micro  status  alloc GB  reserved GB  RSS GB  GPU util %   TFLOP/s/dev  iter ms  tok/s padded  retries",
    ]
    for p in res.probes:
        util = (
            "" if p.get("gpu_util_mean") is None else f"{p['gpu_util_mean']:.0f} +/- {p.get('gpu_util_std') or 0:.0f}"
        )
        star = "*" if p["micro_batch_size"] == res.best else " "
        retries = "" if p["num_alloc_retries"] is None else str(p["num_alloc_retries"])
        lines.append(
            f"{star}{p['micro_batch_size']:>6}  {p['status']:<6}  {gb(p.get('peak_allocated_bytes') or None):>8}  "
            f"{gb(p.get('peak_reserved_bytes') or None):>11}  {gb(p.get('peak_rss_bytes') or None):>6}  {util:>10}  "
            f"{fmt(p.get('tflops_per_device'), '.1f'):>11}  {fmt(p.get('iter_time_s'), '.0f', scale=1000):>7}  "
            f"{p['tok_s_padded'] or 0:>12,.0f}  {retries:>7}"
        )
    predicted = "" if res.predicted_largest is None else f" (planner predicted {res.predicted_largest})"
    lines.append(
        f"largest micro batch that fits: {res.largest_fitting}{predicted}; best (* fastest without allocator "
        f"retries): {res.best}" + (f"; search {res.capped}" if res.capped else "")
    )
    return "\n".join(lines)


def summary_json(res: TuneResult) -> str:
    """A search as JSON (what ``tune-batch --json`` prints)."""
    return json.dumps(res.__dict__, indent=2, default=str)
