"""Check a recipe before anything is built: litgpt's own argument parser first, then the rules litgpt leaves
unchecked or checks late (after the model is loaded, or never: it floors a batch size silently).

The parser is the real one of the pinned litgpt: the jsonargparse parser that ``litgpt`` builds from its
``finetune_*`` functions, captured with ``jsonargparse.capture_parser`` (not a copy of its schema). Every failure is
a :class:`Problem`: one line naming the file, the key and the fix.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import math
import os
import re
import sys
import typing
import warnings
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

from tunelab import hardware, yaml_input
from tunelab.checkpoints import unsafe_files
from tunelab.data import records as dataset_records
from tunelab.errors import InputError
from tunelab.models import load_config
from tunelab.paths import display_path, project_path
from tunelab.recipes import Recipe
from tunelab.settings import (
    accumulation,
    data_size,
    empty_epoch,
    held_out_share,
    litgpt_schedule,
    quantization_problems,
    rank0_sample_problems,
    split_sizes,
    training_problems,
    unfed_devices,
    val_split_problem,
    world_size,
)

PRECISIONS = ("32-true", "bf16-true", "bf16-mixed", "16-true", "16-mixed", "64-true")
"""Precision strings accepted here: Lightning's full names (its short aliases hide what they mean)."""
QUANTIZE_METHODS = ("finetune_lora", "finetune_adapter", "finetune_adapter_v2")


@dataclass
class Problem:
    """One thing wrong with a recipe (``severity`` 'error' fails validation, 'warning' does not)."""

    file: str
    key: str
    message: str
    fix: str
    severity: str = "error"

    def __str__(self) -> str:
        tag = "" if self.severity == "error" else "warning: "
        return f"{self.file}: {tag}{self.key}: {self.message}; fix: {self.fix}"


@dataclass
class Result:
    """The outcome of validating one recipe with its overrides."""

    recipe: Recipe
    overrides: list[str]
    problems: list[Problem] = field(default_factory=list)
    resolved: dict | None = None
    """The fully resolved litgpt arguments (defaults applied) when the parser accepted the recipe."""

    @property
    def ok(self) -> bool:
        return not any(p.severity == "error" for p in self.problems)

    def blocking(self, under_strategy: bool = False, with_file: bool = True) -> list[str]:
        """The errors that stop a launch, one line each (empty: it may start). Under tunelab's own loop
        (``under_strategy``) eval.interval and logger_name are not: that loop keeps its own metrics log, samples on
        rank 0 with the unwrapped model (no collective) and skips the sample under sharding, so no rank waits on
        another. Without ``with_file`` the lines start at the key (the caller names the file)."""
        lines = [
            str(p) if with_file else f"{p.key}: {p.message}; fix: {p.fix}"
            for p in self.problems
            if p.severity == "error" and not (under_strategy and p.key in LITGPT_LOOP_ONLY)
        ]
        return lines or (
            [] if self.resolved is not None else [f"{self.recipe.key}: litgpt could not resolve the settings"]
        )


@lru_cache(maxsize=1)
def litgpt_parser():
    """The pinned litgpt's own CLI parser, set to raise instead of exiting. Two settings make a parse about half as
    costly as under litgpt's CLI without changing what it accepts or resolves: the fields' attribute docstrings are
    not read (litgpt's CLI reads them for its ``--help`` text; jsonargparse re-reads a class's source for every
    class-typed value it checks), and jsonargparse's check of who called ``parse_known_args`` sees frames without
    their source (:class:`_FramesOnly`)."""
    os.environ.setdefault("JSONARGPARSE_DEPRECATION_WARNINGS", "off")
    import jsonargparse._core
    from jsonargparse import CLI, capture_parser, set_docstring_parse_options
    from litgpt.__main__ import PARSER_DATA

    set_docstring_parse_options(attribute_docstrings=False)  # litgpt's main sets True, for its help text only
    if jsonargparse._core.inspect is inspect:
        jsonargparse._core.inspect = _FramesOnly()
    parser = capture_parser(lambda: CLI(PARSER_DATA))
    parser.exit_on_error = False
    for action in parser._actions:
        if isinstance(getattr(action, "choices", None), dict):
            for sub in action.choices.values():
                sub.exit_on_error = False
    return parser


class _FramesOnly:
    """``inspect`` as jsonargparse's parser module sees it, except ``stack()``: jsonargparse (4.41) calls
    ``inspect.getmodule(inspect.stack()[1][0])`` on every parse to refuse ``parse_known_args`` from outside its
    package, and ``inspect.stack`` reads the source file of every frame on the stack to do it (under pytest, a third
    of a parse). Here it returns the same frames, outermost last, each as a one-item record (``[i][0]`` is the
    frame), without reading any source."""

    def __getattr__(self, name: str):
        return getattr(inspect, name)

    @staticmethod
    def stack(context: int = 1) -> list[tuple]:
        frame, records = sys._getframe(1), []
        while frame is not None:
            records.append((frame,))
            frame = frame.f_back
        return records


def split_checkpoint_override(overrides: list[str]) -> tuple[list[str], str | None]:
    """(the overrides without ``--checkpoint_dir``, its last value or None)."""
    rest, ckpt = [], None
    it = iter(overrides)
    for arg in it:
        if arg == "--checkpoint_dir":
            ckpt = next(it, "")
        elif arg.startswith("--checkpoint_dir="):
            ckpt = arg.split("=", 1)[1]
        else:
            rest.append(arg)
    return rest, ckpt


def litgpt_args(recipe: Recipe, overrides: list[str], config: str | None = None) -> list[str]:
    """The litgpt command line (after ``litgpt``) for a recipe plus litgpt-style overrides; ``config``: the recipe's
    path as the process that reads it finds it (default: as given, from the current directory).

    ``checkpoint_dir`` is positional in litgpt's parser: ``--checkpoint_dir X`` is moved to the end, after
    ``--config``, where a positional overrides the file's value.
    """
    rest, ckpt = split_checkpoint_override(overrides)
    config = str(recipe.path) if config is None else config
    return [recipe.command, "--config", config, *rest, *([ckpt] if ckpt is not None else [])]


def parse(recipe: Recipe, overrides: list[str]) -> dict:
    """Resolve the recipe plus overrides with litgpt's parser; returns the arguments as a plain dict.

    Raises ``jsonargparse.ArgumentError`` (litgpt would refuse the same command line).
    """
    cfg = litgpt_parser().parse_args(litgpt_args(recipe, overrides))
    resolved = getattr(cfg, recipe.command).as_dict()
    resolved.pop("config", None)
    return resolved


def _config_override_problem(overrides: list[str]) -> str | None:
    """Why a ``--config FILE`` among the overrides cannot be read as the plan reads it (``yaml_input.load_mapping``:
    a FIFO, a device, a directory, too large, missing, not YAML, not a mapping), or None. Checked before litgpt's
    parser, which would block on a FIFO and echo a file that is not a mapping."""

    for i, arg in enumerate(overrides):
        path = arg.split("=", 1)[1] if arg.startswith("--config=") else None
        if arg == "--config" and i + 1 < len(overrides):
            path = overrides[i + 1]
        if path is not None:
            try:
                yaml_input.load_mapping(path, "--config")
            except InputError as e:
                return str(e)
    return None


def _choices(command: str, key: str) -> tuple:
    """The values a ``Literal``-typed argument ``key`` of litgpt's ``command`` takes (empty: not such a one)."""
    from litgpt.__main__ import PARSER_DATA

    hint = typing.get_type_hints(PARSER_DATA[command]).get(key) if command in PARSER_DATA else None
    return typing.get_args(hint) if typing.get_origin(hint) is typing.Literal else ()


def _parser_problem(recipe: Recipe, err: Exception) -> Problem:
    text = " ".join(str(err).split())
    file = display_path(recipe.path)
    m = re.search(r"does not accept nested key '([^']+)'", text) or re.search(r"Unrecognized arguments: --?(\S+)", text)
    if m:
        key = m.group(1)
        if key == "quantize" and recipe.command == "finetune_full":
            return Problem(
                file,
                key,
                "quantize is only for LoRA/adapter methods (finetune_full has no quantized training)",
                "remove quantize, or use a lora/qlora recipe",
            )
        return Problem(
            file,
            key,
            f"litgpt {recipe.command} has no such argument",
            f"remove it or correct its spelling (see: litgpt {recipe.command} --help)",
        )
    if "object has no attribute 'init_args'" in text:  # jsonargparse fails replacing a class_path mapping
        return Problem(
            file,
            "optimizer",
            "litgpt's parser cannot replace the recipe's class_path/init_args optimizer from the command line",
            "put the whole optimizer (class_path and init_args) in a YAML file and add `--config FILE` after the recipe",
        )
    m = re.search(r'Parser key "([^"]+)":\s*(.*)', text)
    if m:
        key, why = m.group(1), m.group(2)
        why = re.sub(r"\s*Subtypes:.*?Given value type: <class '\w+'>\s*", " ", why)
        if choices := _choices(recipe.command, key):  # jsonargparse says "Cannot take a Union of no types."
            why = f"it takes one of {', '.join(map(str, choices))}"
        return Problem(
            file,
            key,
            f"litgpt's parser refuses the value ({why[:200]})",
            f"use a value of the type litgpt {recipe.command} --help lists for --{key}",
        )
    return Problem(
        file, "-", f"litgpt's parser refuses the recipe: {text[:300]}", f"compare with: litgpt {recipe.command} --help"
    )


def check(
    recipe: Recipe, overrides: list[str] | None = None, *, gpu: str | None = None, device: str | None = None
) -> Result:
    """Validate one recipe with litgpt-style ``overrides``.

    ``gpu`` names a row of the GPU table (enables the hardware rules: bf16 support). ``device`` is 'cpu' or 'cuda'
    when the target is known ('cpu' enables the CPU rules: no 16-bit float, no bitsandbytes).
    """
    overrides = list(overrides or [])
    result = Result(recipe=recipe, overrides=overrides)
    args, refused = parsed(recipe, overrides)
    if refused is not None:
        result.problems.append(refused)
        return result
    result.resolved = args
    result.problems.extend(semantic_problems(recipe.command, args, display_path(recipe.path), gpu=gpu, device=device))
    return result


PLANNED_OPTIMIZER_KEYS = ("optimizer", "optimizer.class_path")
"""The optimizer problems plan refuses as validate does: a class litgpt cannot build, or none named (the plan would
count another optimizer's states). An init argument litgpt drops (``--optimizer.lr``) leaves the recipe's optimizer,
whose states the plan counts: validate and run refuse it."""


def plan_refusal(recipe: Recipe, overrides: list[str], data_class: str | None = None) -> str | None:
    """The line litgpt's parser refuses a recipe to be planned with, or its optimizer (:data:`PLANNED_OPTIMIZER_KEYS`);
    None: accepted. A shipped recipe without
    overrides is not parsed again (the suite parses each): the plan stays quick where no input of the user's is read.
    A ``data_class`` of the user's own (not under ``litgpt.``) need not be installed where the plan is made: the
    parser's refusal of the data is not the plan's (it assumes the data's size, and says so)."""
    if recipe.shipped and not overrides:
        return None
    args, problem = parsed(recipe, overrides)
    if problem is None:
        found: list[Problem] = []
        _optimizer_rules(
            None, args, lambda key, what, fix: found.append(Problem(display_path(recipe.path), key, what, fix))
        )
        problem = next((p for p in found if p.key in PLANNED_OPTIMIZER_KEYS), None)
    if problem is None or (problem.key.startswith("data") and not str(data_class).startswith("litgpt.")):
        return None
    return str(problem)


def parsed(recipe: Recipe, overrides: list[str]) -> tuple[dict | None, Problem | None]:
    """litgpt's parser on a recipe plus ``overrides``: (the resolved arguments, None), or (None, the one problem it
    refuses them with; a ``--config`` file it must not read is refused before it: it would block on a FIFO)."""
    bad_config = _config_override_problem(overrides)
    if bad_config:
        why, _, fix = bad_config.partition("; fix: ")
        return None, Problem(display_path(recipe.path), "--config", why, fix or "give a regular YAML file")
    try:
        return parse(recipe, overrides), None
    except Exception as err:  # jsonargparse.ArgumentError and friends: litgpt would refuse the command line
        return None, _parser_problem(recipe, err)


def recheck(
    result: Result,
    *,
    checkpoint_dir: str | None = None,
    out_dir: str | None = None,
    gpu: str | None = None,
    device: str | None = None,
) -> Result:
    """The rules again on arguments litgpt's parser already resolved (no second parse), with the run's
    ``checkpoint_dir`` and ``out_dir`` set (paths: what the parser would have given) and the target known."""
    if result.resolved is None:
        return result
    args = dict(result.resolved)
    if checkpoint_dir is not None:
        args["checkpoint_dir"] = Path(checkpoint_dir)
    if out_dir is not None:
        args["out_dir"] = Path(out_dir)
    overrides = [
        *result.overrides,
        *(["--out_dir", str(out_dir)] if out_dir is not None else []),
        *(["--checkpoint_dir", str(checkpoint_dir)] if checkpoint_dir is not None else []),
    ]
    out = Result(recipe=result.recipe, overrides=overrides, resolved=args)
    out.problems = semantic_problems(
        result.recipe.command, args, display_path(result.recipe.path), gpu=gpu, device=device
    )
    return out


OPTIMIZER_MODULES = ("torch.optim", "bitsandbytes.optim")
"""Where an optimizer class may come from. litgpt imports whatever module the optimizer string names; a name
outside these packages is refused without importing it (importing runs the module's code)."""


def optimizer_problem(name: str) -> str | None:
    """Why ``name`` is not an optimizer class litgpt can build, or None. Imports only allowed packages."""
    module = name.rpartition(".")[0] or "torch.optim"
    if not any(module == m or module.startswith(m + ".") for m in OPTIMIZER_MODULES):
        return f"{name!r} is not in an optimizer package (tunelab imports nothing else)"
    try:
        obj = _optimizer_class(name)
    except (ImportError, AttributeError):
        return f"{name!r} cannot be imported"
    except Exception as e:  # noqa: BLE001 - e.g. bitsandbytes without its native library
        return f"{name!r}: importing {module} failed ({type(e).__name__}: {str(e)[:100]})"
    import torch

    if not (isinstance(obj, type) and issubclass(obj, torch.optim.Optimizer)):
        return f"{name!r} is not a torch.optim.Optimizer class"
    if obj is torch.optim.Optimizer:
        return f"{name!r} is the base class every optimizer derives from: it updates nothing"
    return None


def _optimizer_class(name: str):
    """The class an optimizer name names, as litgpt imports it (a bare name from torch.optim); call it only for a name
    :func:`optimizer_problem` checks or has allowed (importing runs the module's code)."""
    module, _, cls = name.rpartition(".")
    return getattr(importlib.import_module(module or "torch.optim"), cls)


PROBE_SKIPS = ("fused", "foreach", "capturable", "differentiable")
"""init_args that choose a device's implementation, left out of :func:`optimizer_refuses`' probe on the CPU."""


def optimizer_refuses(name: str, init_args: dict) -> str | None:
    """What the optimizer class ``name`` (one :func:`optimizer_problem` allows) says of ``init_args`` when built as
    litgpt builds it, on one CPU parameter: an unknown key, a negative lr or eps, betas outside [0, 1), ... (None when
    it takes them). Its own check, before any model is built; the device's implementation keys are left out."""
    import torch

    optimizer = _optimizer_class(name)
    takes = inspect.signature(optimizer).parameters
    open_ended = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in takes.values())
    if not open_ended and (unknown := sorted(set(init_args) - set(takes))):
        return f"{name} takes no {unknown[0]!r} (it takes {', '.join(k for k in takes if k != 'params')})"
    default, given = getattr(takes.get("betas"), "default", None), init_args.get("betas")
    if isinstance(default, tuple) and isinstance(given, (list, tuple)) and len(given) != len(default):
        return f"{name} takes {len(default)} betas (its default: {list(default)}), got {list(given)}"  # a step fails
    kwargs = {k: v for k, v in init_args.items() if k not in PROBE_SKIPS}
    try:
        optimizer([torch.nn.Parameter(torch.zeros(1))], **kwargs)
    except Exception as e:  # noqa: BLE001 - the class's own refusal of these values, whatever its type
        said = str(e).splitlines()[0][:160] if str(e) else ""
        return f"{name} refuses them: " + (said if isinstance(e, ValueError) else f"{type(e).__name__}: {said}")
    return None


def _irregular_files(ckpt: Path) -> list[str]:
    """Entries of a checkpoint directory that are no regular file or directory (a FIFO or a device: litgpt's read
    of it would block or never end); the first 10,000 entries are looked at."""
    try:
        with os.scandir(ckpt) as entries:
            return [e.name for _, e in zip(range(10_000), entries) if not e.is_dir() and not e.is_file()]
    except OSError:
        return []


def _unsafe_weight_files(ckpt: Path) -> list[str]:
    if not any(Path(ckpt).glob("*.pth")) and not any(Path(ckpt).glob("*.bin")):
        return []  # nothing to check: no torch import for a plan of a model that is not downloaded

    return unsafe_files(ckpt)


def _finite(value) -> bool:
    """Whether an optimizer argument (a number or a list of them, as betas) holds no NaN or infinity."""
    numbers = value if isinstance(value, (list, tuple)) else [value]
    return not any(isinstance(v, float) and not math.isfinite(v) for v in numbers)


def _optimizer_name(optimizer) -> str:
    if isinstance(optimizer, dict):
        return str(optimizer.get("class_path", ""))
    return str(optimizer)


def semantic_problems(
    command: str, a: dict, file: str, *, gpu: str | None = None, device: str | None = None
) -> list[Problem]:
    """The rules on resolved arguments ``a`` that litgpt's parser does not enforce."""
    out: list[Problem] = []

    def bad(key, message, fix, severity="error"):
        out.append(Problem(file, key, message, fix, severity))

    train, eval_ = a.get("train") or {}, a.get("eval") or {}
    precision, quantize = a.get("precision"), a.get("quantize")
    devices_raw, nodes = a.get("devices", 1), int(1 if a.get("num_nodes") is None else a["num_nodes"])
    try:
        devices = int(devices_raw)
    except (TypeError, ValueError):
        devices = None
        if devices_raw != "auto":
            bad("devices", f"{devices_raw!r} is not a device count", "give an integer such as 1 or 4")
    if devices is not None and devices < 1:
        bad(
            "devices",
            f"is {devices_raw}: tunelab records per-device figures, so it needs the count "
            "(litgpt reads -1 as 'every visible GPU')",
            "give the number of devices, such as 1 or 4",
        )
        devices = None
    if nodes < 1:
        bad("num_nodes", f"is {nodes}", "set num_nodes >= 1")
        nodes = 1
    world = world_size(devices or 1, nodes)
    c = _Context(
        command=command,
        gpu=gpu,
        device=device,
        train=train,
        eval_=eval_,
        precision=precision,
        quantize=quantize,
        devices=devices,
        nodes=nodes,
        world=world,
    )
    for rules in RULES:
        rules(c, a, bad)
    return out


@dataclass
class _Context:
    """What the rules share: the command, the target, and the figures derived once from the arguments."""

    command: str
    gpu: str | None
    device: str | None
    train: dict
    eval_: dict
    precision: str | None
    quantize: str | None
    devices: int | None
    nodes: int
    world: int
    gbs: int | None = None
    mbs: int | None = None
    steps: int | None = None
    """The run's optimizer steps (set by the schedule rules when the data size or max_steps tells)."""
    schedule: int | None = None
    """The steps litgpt's learning-rate schedule spans, by its own count (``settings.Schedule.span``)."""
    epoch_steps: int | None = None
    """The optimizer steps the epochs give, before max_steps (None: the data's size or the micro batch unknown)."""


def _precision_rules(c: _Context, a: dict, bad) -> None:
    """Lightning's full precision names; no 16-bit float on CPU; bf16 only on GPUs that have it."""
    if c.precision is not None and c.precision not in PRECISIONS:
        bad(
            "precision",
            f"{c.precision!r} is not a full Lightning precision name",
            f"use one of {', '.join(PRECISIONS)}",
        )
    if c.device == "cpu" and c.precision in ("16-true", "16-mixed"):
        bad(
            "precision",
            f"{c.precision} on CPU: 16-true gives NaN losses and 16-mixed silently becomes bf16-mixed",
            "use 32-true or bf16-true on CPU",
        )
    if c.gpu:
        try:
            g = hardware.lookup(c.gpu)
        except ValueError as e:
            bad("--gpu", str(e), "name a row of configs/hardware/gpus.yaml")
        else:
            if c.precision and c.precision.startswith("bf16") and not g.bf16:
                quantized = bool(a.get("quantize"))  # litgpt refuses quantization under mixed precision
                bad(
                    "precision",
                    f"{c.precision} on {g.name}, which has no bfloat16 (emulated: slow, or refused)",
                    "use 16-true on this GPU" if quantized else "use 16-mixed (or 16-true) on this GPU",
                )


def _batch_rules(c: _Context, a: dict, bad) -> None:
    """The global batch divides by devices x nodes x micro batch (litgpt floors the accumulation
    silently: tunelab.settings.accumulation)."""
    c.gbs, c.mbs = c.train.get("global_batch_size"), c.train.get("micro_batch_size")
    if isinstance(c.gbs, int) and isinstance(c.mbs, int):
        if c.mbs < 1 or c.gbs < 1:
            bad(
                "train.micro_batch_size" if c.mbs < 1 else "train.global_batch_size",
                "must be >= 1",
                "set a positive batch size",
            )
        else:
            unit = c.world * c.mbs
            if c.gbs % unit:
                floor = accumulation(c.gbs, c.world, c.mbs) * unit
                bad(
                    "train.global_batch_size",
                    f"{c.gbs} is not divisible by devices x num_nodes x micro_batch_size = {c.devices or 1}x{c.nodes}x{c.mbs}"
                    f" = {unit}; litgpt would floor it to {floor} samples per step"
                    if c.gbs > unit
                    else f"{c.gbs} is smaller than devices x num_nodes x micro_batch_size = {unit} (litgpt asserts)",
                    f"set train.global_batch_size to a multiple of {unit} (e.g. {(c.gbs // unit + 1) * unit})",
                )


def _interval_rules(c: _Context, a: dict, bad) -> None:
    """Intervals litgpt's loop takes the step count modulo: 0 divides by zero at the first step."""
    for key, value in (
        ("train.save_interval", c.train.get("save_interval")),
        ("train.log_interval", c.train.get("log_interval")),
        ("eval.interval", c.eval_.get("interval")),
    ):
        if isinstance(value, int) and not isinstance(value, bool) and value < 1:
            bad(
                key,
                f"is {value}; litgpt's loop takes the step count modulo it (0: ZeroDivisionError at the first step)",
                f"set {key} >= 1" + (" (or null: no intermediate checkpoints)" if key == "train.save_interval" else ""),
            )
    if c.eval_.get("max_iters") == 0:
        bad(
            "eval.max_iters",
            "is 0: each validation inside the loop averages no batch (a NaN validation loss; the final validation "
            "covers the whole set)",
            "set eval.max_iters >= 1 (100: litgpt's default)",
            "warning",
        )


def _schedule_rules(c: _Context, a: dict, bad) -> None:
    """Warm-up and epochs that litgpt's loop divides or compares by; warm-up longer than the run. Sets
    ``c.steps``: the run's optimizer steps when the data size is known."""
    warmup = c.train.get("lr_warmup_steps")
    if c.command.startswith("finetune") and (warmup is None or warmup < 1):
        bad(
            "train.lr_warmup_steps",
            f"is {warmup}; litgpt's scheduler divides by it (step / warmup_steps)",
            "set train.lr_warmup_steps >= 1 (litgpt finetune_* ignores lr_warmup_fraction)",
        )
    epochs, max_steps = c.train.get("epochs"), c.train.get("max_steps")
    if epochs is None or epochs < 1:
        bad(
            "train.epochs",
            f"is {epochs}; litgpt's fit loop compares the epoch with it and sizes the schedule",
            "set train.epochs >= 1 (and train.max_steps to stop earlier)",
        )
    n_samples = data_size(a)[0]  # a JSON file here, or a known litgpt data module
    c.steps = None
    if why := val_split_problem((a.get("data") or {}).get("init_args", {}).get("val_split_fraction")):
        bad("data.val_split_fraction", why, "set data.val_split_fraction from 0 to below 1 (0.05: 5% held out)")
    elif n_samples and isinstance(c.gbs, int) and c.gbs > 0:
        trained = split_sizes(n_samples, held_out_share(a))[0]
        if not (isinstance(c.mbs, int) and 1 <= c.mbs and c.world * c.mbs <= c.gbs):
            c.steps = trained // c.gbs  # a micro batch litgpt refuses or floors (its own rule): steps of the batch
            return
        run = litgpt_schedule(trained, c.world, c.mbs, c.gbs, epochs or 1, None)  # uncapped: what the data gives
        c.steps = c.epoch_steps = run.steps
        c.schedule = min(run.span, max_steps) if max_steps else run.span
        if unfed := unfed_devices(trained, c.world):
            bad("devices", *unfed)
        elif empty := empty_epoch(trained, c.world, c.mbs, c.gbs):
            bad("train.global_batch_size", *empty)
        elif max_steps and run.steps < max_steps:
            need = math.ceil(max_steps * accumulation(c.gbs, c.world, c.mbs) / (run.micro_batches // (epochs or 1)))
            bad(
                "train.max_steps",
                f"{max_steps} steps asked, but {epochs or 1} epoch(s) of "
                f"{trained:,} training samples at global batch {c.gbs} give {run.steps}: the "
                "run stops there",
                f"set train.epochs to {need} (or more data)",
                "warning",
            )
        if max_steps:
            c.steps = min(c.steps, max_steps)
        _warmup_against_steps(c, warmup, max_steps, bad)
    elif max_steps:
        c.steps = max_steps
        if isinstance(warmup, int) and warmup == max_steps:
            bad(
                "train.lr_warmup_steps",
                f"{warmup} warm-up steps = train.max_steps: if the data holds that many "
                "steps, litgpt's cosine schedule divides by zero (T_max = max_steps - lr_warmup_steps) at the last "
                "one",
                "lower train.lr_warmup_steps below train.max_steps",
                "warning",
            )


def _training_rules(c: _Context, a: dict, bad) -> None:
    """Values litgpt takes and then trains nothing or NaN with (``settings.training_problems``, as plan refuses)."""
    for key, what, fix in training_problems(a, c.command == "finetune_lora"):
        bad(key, what, fix)


LOGGER_PACKAGES = {"wandb": ("wandb",), "tensorboard": ("tensorboard", "tensorboardX"), "mlflow": ("mlflow",)}
"""The packages Lightning's logger behind each of litgpt's ``logger_name`` choices imports (either will do)."""
LITGPT_LOOP_ONLY = ("eval.interval", "logger_name", "train.max_steps")
"""Keys whose problems stop litgpt's own loop but not tunelab's (``--strategy``: it keeps its own metrics log and
skips the samples a sharded model cannot take on one rank)."""


def _logger_rules(c: _Context, a: dict, bad) -> None:
    """litgpt builds the logger after the model: a logger whose package is missing fails the run there. An error
    where the run is launched (``device`` known), a warning for a recipe checked to run elsewhere."""
    wanted = LOGGER_PACKAGES.get(str(a.get("logger_name")))
    if wanted and not any(importlib.util.find_spec(name) for name in wanted):
        bad(
            "logger_name",
            f"{a['logger_name']} needs the package {' or '.join(wanted)}, which is not installed here",
            f"pip install {wanted[0]}, or --logger_name csv (the default)",
            "error" if c.device else "warning",
        )


def _warmup_against_steps(c: _Context, warmup, max_steps, bad) -> None:
    """Warm-up against the span of litgpt's schedule (``c.schedule``: min(epochs x steps per epoch, max_steps)) and
    the run's optimizer steps (``c.steps``): equal to the span kills litgpt's cosine schedule at the last step;
    longer than the run never reaches the peak learning rate."""
    span = c.schedule or c.steps
    if isinstance(warmup, int) and warmup >= 1 and span and warmup == span:
        what = "train.max_steps" if warmup == max_steps else f"the {span} optimizer steps litgpt's schedule spans"
        bad(
            "train.lr_warmup_steps",
            f"{warmup} warm-up steps = {what}: litgpt's cosine schedule divides by its steps - lr_warmup_steps "
            "(CosineAnnealingLR T_max=0), so the run dies with ZeroDivisionError at its last step",
            f"lower train.lr_warmup_steps below {span}",
        )
    elif isinstance(warmup, int) and warmup >= 1 and c.steps and warmup >= c.steps:
        bad(
            "train.lr_warmup_steps",
            f"{warmup} warm-up steps >= the run's {c.steps} optimizer steps: the learning rate never reaches its peak",
            "lower train.lr_warmup_steps",
            "warning",
        )


def _model_rules(c: _Context, a: dict, bad) -> None:
    """A model litgpt knows (or a plain-data model_config.yaml), weights that load as plain tensors,
    max_seq_length within the block size."""
    ckpt = a.get("checkpoint_dir")
    block_size = None
    if ckpt is not None:
        ckpt = Path(ckpt)
        try:
            config = load_config(ckpt)
            block_size = config.block_size
        except InputError as e:  # a model_config.yaml that is there but wrong
            what, _, fix = str(e).partition("; fix: ")
            bad("checkpoint_dir", what, fix or "use the model_config.yaml `litgpt download` writes")
        except (ValueError, TypeError):
            bad(
                "checkpoint_dir",
                f"{ckpt.name!r} is not a model litgpt knows and {ckpt} has no model_config.yaml",
                "use the directory `litgpt download <repo>` creates (checkpoints/<org>/<name>)",
            )
        odd_files = _irregular_files(ckpt)  # listed once; torch.load must never open them
        for odd in odd_files:
            bad(
                "checkpoint_dir",
                f"{odd} is not a regular file (a FIFO or a device: reading it would block or never end)",
                "remove it and put the file itself there",
            )
        for unsafe in [] if odd_files else _unsafe_weight_files(ckpt):
            bad(
                "checkpoint_dir",
                f"{unsafe} is not plain tensor data (torch.load with weights_only=True refuses "
                "it: loading it would run code from the file)",
                "use checkpoints from a source you trust, converted by `litgpt download` / `litgpt convert_to_litgpt`",
            )
    seq = c.train.get("max_seq_length")
    if block_size and seq and seq > block_size:
        bad(
            "train.max_seq_length",
            f"{seq} exceeds the model's block size {block_size}",
            f"set train.max_seq_length <= {block_size}",
        )


def _quantization_rules(c: _Context, a: dict, bad) -> None:
    """QLoRA: LoRA/adapter only, one device, a -true precision, AdamW, not on CPU."""
    if c.quantize:
        if c.command not in QUANTIZE_METHODS:
            bad("quantize", "quantize is only for LoRA/adapter methods", "remove quantize or use a lora recipe")
        for key, what, fix in quantization_problems(c.quantize, c.world, c.precision):
            bad(key, what, fix)
        if "AdamW" not in _optimizer_name(a.get("optimizer")):
            bad(
                "optimizer",
                f"{_optimizer_name(a.get('optimizer'))} with quantize: litgpt only builds bitsandbytes' "
                "PagedAdamW for quantized training",
                "use optimizer torch.optim.AdamW (its init_args are passed on)",
            )
        if c.device == "cpu":
            bad(
                "quantize",
                f"{c.quantize} on CPU: bitsandbytes' 4-bit/8-bit training layers need a CUDA GPU "
                "(Lightning's BitsandbytesPrecision refuses CPU)",
                "run on a GPU, or drop quantize on CPU (LoRA)",
            )


def _lora_rules(c: _Context, a: dict, bad) -> None:
    """At least one target, a positive rank, no in-loop eval that hangs several devices."""
    if c.command == "finetune_lora":
        targets = [
            k for k in ("lora_query", "lora_key", "lora_value", "lora_projection", "lora_mlp", "lora_head") if a.get(k)
        ]
        if not targets:
            bad(
                "lora_query",
                "no lora_* target is true: nothing would be trained",
                "set at least one of lora_query/key/value/projection/mlp/head to true",
            )
        if (a.get("lora_r") or 0) < 1:
            bad("lora_r", f"is {a.get('lora_r')}", "set lora_r >= 1")
        if isinstance(c.mbs, int) and isinstance(c.gbs, int) and 1 <= c.mbs and c.world * c.mbs <= c.gbs:
            for key, what, fix in rank0_sample_problems(c.world, c.train, c.eval_, c.steps, c.epoch_steps):
                bad(key, what, fix)  # (a batch litgpt refuses: the batch rules say so first)


def _optimizer_rules(c: _Context | None, a: dict, bad) -> None:
    """A torch.optim / bitsandbytes.optim class (nothing else is imported); no override that litgpt drops; finite init
    arguments."""
    optimizer = a.get("optimizer")
    if isinstance(optimizer, dict):
        dropped = sorted(set(optimizer) - {"class_path", "init_args"})
        if dropped:  # `--optimizer.init_args.lr X` / `--optimizer.lr X` on a recipe whose optimizer is a mapping
            bad(
                f"optimizer.{dropped[0]}",
                f"litgpt ignores this override: with a class_path/init_args optimizer its parser stores "
                f"{', '.join(dropped)} beside init_args, and litgpt builds the optimizer from init_args alone "
                "(it would train with the recipe's values)",
                "put the whole optimizer (class_path and init_args) in a YAML file and add `--config FILE` after "
                "the recipe, or edit a copy of the recipe",
            )
        if "class_path" not in optimizer:
            bad(
                "optimizer.class_path",
                "is missing (a second --config that gives only init_args replaces the whole optimizer mapping)",
                "give class_path beside init_args, e.g. class_path: torch.optim.AdamW",
            )
    init = optimizer.get("init_args") if isinstance(optimizer, dict) else None
    infinite = [key for key, value in (init if isinstance(init, dict) else {}).items() if not _finite(value)]
    for key in infinite:
        bad(
            f"optimizer.init_args.{key}",
            f"is {init[key]}: not finite (the first optimizer step would turn the weights to NaN or inf)",
            f"set a finite {key}",
        )
    name = _optimizer_name(optimizer)
    if name:
        why = optimizer_problem(name)
        if why:
            bad(
                "optimizer",
                why,
                "use a torch.optim class such as AdamW or SGD (or torch.optim.AdamW, "
                f"bitsandbytes.optim.AdamW8bit); allowed packages: {', '.join(OPTIMIZER_MODULES)}",
            )
        elif isinstance(init, dict) and not infinite and (refused := optimizer_refuses(name, init)):
            bad("optimizer.init_args", refused, "give the values and keys the class takes (see its documentation)")


def _data_rules(c: _Context, a: dict, bad) -> None:
    """The JSON data file exists where litgpt will read it; workers >= 0."""
    data = a.get("data")
    if isinstance(data, dict):
        path = data.get("init_args", {}).get("json_path")
        if path is not None and not project_path(path).exists():
            bad(
                "data.json_path",
                f"{path} does not exist (relative paths are read from the project directory, "
                "where tunelab runs litgpt)",
                "give an existing file (an absolute path from anywhere else)",
            )
        elif path is not None:
            try:
                dataset_records.count(project_path(path))
            except InputError as e:
                what, _, fix = str(e).partition("; fix: ")
                bad("data.json_path", what, fix or "give an Alpaca-format dataset")
        workers = data.get("init_args", {}).get("num_workers")
        if isinstance(workers, int) and workers < 0:
            bad("data.num_workers", f"is {workers}", "set data.num_workers >= 0")


def _litgpt_refusal_rules(c: _Context, a: dict, bad) -> None:
    """What ``litgpt finetune_full`` / ``finetune_lora`` refuse in their own ``validate_args`` once the model is
    being set up (train.max_norm, max_tokens, tie_embeddings, lr_warmup_fraction set; epochs or eval.max_new_tokens
    missing): refused here, before anything is built, from litgpt's own function; tunelab's loop takes the same."""
    module = {"finetune_full": "litgpt.finetune.full", "finetune_lora": "litgpt.finetune.lora"}.get(c.command)
    if module is None or not isinstance(a.get("train"), dict):
        return
    from litgpt.args import EvalArgs, TrainArgs

    try:
        with warnings.catch_warnings():  # TrainArgs warns about a warm-up longer than the run: a rule below says so
            warnings.simplefilter("ignore")
            train, eval_args = TrainArgs(**a["train"]), EvalArgs(**(a.get("eval") or {}))
    except TypeError:
        return  # litgpt's parser gave other keys: its own error says so
    except ValueError as e:  # TrainArgs' own checks, e.g. both lr_warmup_fraction and lr_warmup_steps
        bad("train", f"litgpt's TrainArgs refuses it: {' '.join(str(e).split())[:200]}", "change the train settings")
        return
    try:
        importlib.import_module(module).validate_args(train, eval_args)
    except ValueError as e:
        for name in re.findall(r"doesn't support the '(\w+)' argument", str(e)):
            bad(f"train.{name}", f"litgpt {c.command} does not support it (its validate_args refuses it)", "remove it")
        for name in re.findall(r"requires the '(\w+)' argument", str(e)):
            key = "eval.max_new_tokens" if name == "max_new_tokens" else f"train.{name}"
            bad(key, f"is not set; litgpt {c.command} requires it", f"set {key}")


RULES = (
    _litgpt_refusal_rules,
    _precision_rules,
    _batch_rules,
    _interval_rules,
    _schedule_rules,
    _training_rules,
    _model_rules,
    _quantization_rules,
    _lora_rules,
    _optimizer_rules,
    _data_rules,
    _logger_rules,
)
"""The rule groups, in the order their problems are printed."""
