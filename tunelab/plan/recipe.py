"""The planner from a recipe: litgpt-style overrides resolved once into :class:`tunelab.settings.Settings`, then the
planner's input built from them (:func:`plan_input`), the memory prediction and the fit verdict for one GPU
(:func:`plan_recipe`), and the run's size in tokens for the runtime projection.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from pathlib import Path

from tunelab import hardware
from tunelab.data import records as dataset_records
from tunelab.data.lengths import (
    default_padded_per_sample,
    longest_sample_tokens,
    module_lengths,
    module_longest,
    sample_lengths,
    tokens_scale,
)
from tunelab.errors import InputError
from tunelab.models import load_config
from tunelab.paths import project_path
from tunelab.plan.model import memory, runtime, strategies
from tunelab.plan.model.fast_step import FAST_MODEL_ERROR
from tunelab.plan.model.memory import Plan, PlanInput
from tunelab.plan.trace.tables import TRACED
from tunelab.recipes import Recipe
from tunelab.settings import (
    Settings,
    data_class_problem,
    data_init_args,
    data_size,
    empty_epoch,
    litgpt_schedule,
    quantization_problems,
    rank0_sample_problems,
    resolve,
    split_sizes,
    training_precision,
    training_problems,
    unfed_devices,
    val_split_problem,
)
from tunelab.strategies import BNB_OPTIMIZERS, StrategyConfig, StrategyError, load_strategy
from tunelab.validate import PRECISIONS

LAB_DATA_SAMPLES = 2000
"""Samples assumed when the run's data size is not known here: the lab's 2,000-sample Alpaca subset."""


@dataclass
class PlannedRecipe:
    """A recipe planned for one configuration: what went in, what came out, and where the sequence length came
    from."""

    settings: Settings
    """The recipe's resolved settings (overrides and --devices applied)."""
    input: PlanInput
    plan: Plan
    seq_source: str
    """Where the planned sequence length comes from (the recipe's max_seq_length, or the dataset's longest sample)."""
    strategy: str = "litgpt"
    """The strategy as a run record names it ('litgpt', or the strategy file's description)."""
    strategy_config: StrategyConfig | None = None
    """The strategy file as loaded (None: litgpt's own strategy): its batching switches change the padding."""
    warnings: list[str] = field(default_factory=list)
    """Where litgpt's own loop would never end (a sample on rank 0 alone): validate and run refuse the run; the
    plan's answer says each in full."""


PLANNED_METHODS = ("full", "lora", "qlora")
"""The fine-tuning methods the planner models (litgpt's adapter and adapter_v2 are not)."""


def check_ranges(settings: Settings) -> None:
    """ValueError naming the key when a count the plan divides or multiplies by is not a positive integer, the
    precision is not a full Lightning name, or one micro batch exceeds the global batch (several devices' micro
    batches may: tunelab's loop then takes one micro batch per step on each)."""
    for key, value in (
        ("train.micro_batch_size", settings.micro_batch_size),
        ("train.global_batch_size", settings.global_batch_size),
        ("train.max_seq_length", settings.max_seq_length),
        ("devices", settings.args.get("devices")),
        ("num_nodes", settings.args.get("num_nodes")),
        ("lora_r", settings.args.get("lora_r")),
        ("train.epochs", (settings.args.get("train") or {}).get("epochs")),
        ("train.save_interval", (settings.args.get("train") or {}).get("save_interval")),
        ("train.log_interval", (settings.args.get("train") or {}).get("log_interval")),
        ("eval.interval", (settings.args.get("eval") or {}).get("interval")),
    ):
        if value is None and key not in ("train.micro_batch_size", "train.global_batch_size"):
            continue  # a default applies; the batch sizes have none (an empty value, `--train.micro_batch_size ''`)
        if key == "devices" and value in ("auto", -1):  # litgpt's every visible GPU: a count the plan cannot know
            raise ValueError(f"devices: {value!r} takes every GPU litgpt finds, unknown here; fix: --devices N")
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{key}: {value!r} must be a positive integer; fix: set --{key} to 1 or more")
    if settings.precision is not None and settings.precision not in PRECISIONS:
        raise ValueError(
            f"precision: {settings.precision!r} is not a full Lightning precision name; fix: use one of "
            f"{', '.join(PRECISIONS)}"
        )
    if why := val_split_problem(settings.val_split_fraction):
        raise ValueError(f"data.val_split_fraction: {why}; fix: set it from 0 to below 1 (0.05: 5% held out)")
    if why := data_class_problem(settings.data_class):
        raise ValueError(why)
    if problems := training_problems(settings.args, settings.lora):
        raise ValueError("{}: {}; fix: {}".format(*problems[0]))
    max_steps = (settings.args.get("train") or {}).get("max_steps")
    if max_steps is not None and (isinstance(max_steps, bool) or not isinstance(max_steps, int) or max_steps < 0):
        raise ValueError(  # litgpt reads 0 and None as no limit
            f"train.max_steps: {max_steps!r} must be a whole number of steps (0 or empty: no limit); fix: set "
            "--train.max_steps to 1 or more"
        )
    if settings.micro_batch_size > settings.global_batch_size:  # one micro batch is more than a whole step's samples
        raise ValueError(
            f"train.micro_batch_size {settings.micro_batch_size:,} is more than train.global_batch_size "
            f"{settings.global_batch_size:,} (the samples of one optimizer step); fix: a micro batch of at most the global "
            "batch, or a larger --train.global_batch_size"
        )


def strategy_fields(strategy: StrategyConfig | None, world: int) -> dict:
    """PlanInput fields for a configs/strategies file (None: litgpt's own choice, which is one device, or FSDP when
    there are several: FSDP for full fine-tuning, FSDP2 with the same division for LoRA): how it divides the model
    states, and the speed switches that change memory (fused or bitsandbytes optimizer, compiled blocks, Liger's fused
    loss)."""
    fields = strategies.fields_of(strategy, world)
    if strategy is not None:  # a strategies file runs tunelab's own loop, not litgpt's script under Fabric
        fields.update(
            fused_optimizer=strategy.fused_optimizer,
            compiled=bool(strategy.compile),
            fabric=False,
            fused_loss=strategy.liger is not None,
            loss_read_interval=strategy.log_interval or 1,
        )
        # tunelab's loop checkpoints only where the file says so (tunelab.parallel.wrap), LoRA included
        fields.setdefault("activation_checkpointing", strategy.activation_checkpointing)
        if strategy.optimizer:
            fields["optimizer"] = f"bitsandbytes.optim.{BNB_OPTIMIZERS[strategy.optimizer]}"
    return fields


def plan_input(settings: Settings, config, *, seq_len: int | None = None, bf16: bool = True, **fields) -> PlanInput:
    """The planner's input from resolved Settings (world size, accumulation, optimizer and LoRA targets as
    Settings computed them) and a strategy's :func:`strategy_fields`. LoRA on several devices under litgpt's own
    choice checkpoints activations per block, as both of litgpt's paths do (LoRA: FSDP2 over ``checkpoint_wrapper``
    blocks; full fine-tuning: FSDP1, Lightning's ``FSDPStrategy`` with ``activation_checkpointing_policy={Block}``);
    a strategy file says for itself. A precision the recipe leaves unset is litgpt's pick (``bf16``: whether the
    GPU computes bfloat16)."""
    lora = {"lora_r": settings.lora_r, "lora_targets": settings.lora_targets} if settings.lora else {}
    fields.setdefault("strategy", "single")
    fields.setdefault("optimizer", settings.built_optimizer)
    for key, value in strategies.litgpt_defaults(fields["strategy"], settings.world_size, settings.lora).items():
        fields.setdefault(key, value)
    return PlanInput.of(
        config=config,
        tables=TRACED,
        method=settings.method,
        precision=training_precision(settings.precision, bf16),
        quantize=settings.quantize,
        micro_batch_size=settings.micro_batch_size,
        seq_len=seq_len or min(settings.max_seq_length or config.block_size, config.block_size),
        accumulation=settings.accumulation,
        optimizer_init=settings.optimizer_init,
        devices=settings.devices,
        num_nodes=settings.num_nodes,
        **lora,
        **fields,
    )


def _dataset_seq_len(settings: Settings, dataset: Path) -> tuple[int, str]:
    ckpt = Path(settings.checkpoint_dir)
    if not (ckpt / "tokenizer.json").is_file() and not (ckpt / "tokenizer.model").is_file():
        raise ValueError(
            f"--dataset needs the model's tokenizer, and {ckpt} has none; fix: download the checkpoint (`tunelab show "
            "RECIPE` prints the command), or leave --dataset out"
        )
    longest = longest_sample_tokens(dataset, ckpt)
    cap = settings.max_seq_length
    capped = " capped at max_seq_length" if cap and longest > cap else ""
    return (min(longest, cap) if cap else longest), f"the dataset's longest sample ({longest} tokens){capped}"


def _seq_len(settings: Settings, config, dataset: Path | None) -> tuple[int | None, str]:
    """(the sequence memory is planned at, None for the recipe's max_seq_length or the block size; whose): without
    a max_seq_length litgpt pads its longest micro batch to the longest example (``--dataset``'s, or a measured data
    module's where published), else to what the model's block size bounds."""
    if dataset is not None:
        return _dataset_seq_len(settings, dataset)
    if settings.max_seq_length:
        return None, "the recipe's train.max_seq_length"
    known = module_longest(settings.data_class, config.vocab_size)
    if known:
        return min(known[0], config.block_size), f"{known[1]}: train.max_seq_length is not set"
    return None, "the model's block size: train.max_seq_length is not set (--dataset: its longest sample)"


def plan_recipe(
    recipe: Recipe,
    overrides: list[str],
    *,
    gpu: hardware.GPU | None,
    devices: int | None = None,
    strategy: str | StrategyConfig | None = None,
    activation_checkpointing: bool = False,
    dataset: Path | None = None,
) -> PlannedRecipe:
    """Plan a recipe with overrides for ``gpu`` (None: no verdict).

    ``strategy``: a configs/strategies file or name (``fsdp``, ``fsdp-no-wrap``, ``deepspeed-zero3-offload``, ...)
    or a loaded StrategyConfig; None or 'litgpt' for litgpt's own choice (one device; FSDP on several).
    ``activation_checkpointing`` turns it on whatever the strategy says."""
    extra = [*overrides, "--devices", str(devices)] if devices else overrides
    settings = resolve(recipe, extra)
    strategy_config = (
        load_strategy(strategy)
        if isinstance(strategy, (str, Path)) and strategy != "litgpt"
        else strategy
        if isinstance(strategy, StrategyConfig)
        else None
    )
    named = f"--strategy {strategy}" if isinstance(strategy, (str, Path)) else None
    return plan_settings(
        settings,
        gpu=gpu,
        strategy=strategy_config,
        activation_checkpointing=activation_checkpointing,
        dataset=dataset,
        strategy_named=named,
    )


def plan_settings(
    settings: Settings,
    *,
    gpu: hardware.GPU | None,
    strategy: StrategyConfig | None = None,
    activation_checkpointing: bool = False,
    dataset: Path | None = None,
    strategy_named: str | None = None,
) -> PlannedRecipe:
    """Plan resolved Settings under a loaded strategy (None: litgpt's own choice) for ``gpu`` (None: no verdict):
    the planner's typed front door, which :func:`plan_recipe` (a recipe and override strings) and the runner (the
    Settings it launches) both enter. ``strategy_named``: how the user named the strategy, for its messages."""
    check_ranges(settings)
    if settings.method not in PLANNED_METHODS:
        raise ValueError(
            f"{settings.recipe or 'the recipe'}: method {settings.method} (litgpt {settings.command}): the planner "
            f"models {', '.join(PLANNED_METHODS)} fine-tuning, not litgpt's adapters; fix: plan the model's LoRA "
            "recipe as the nearest it models, or run this one and read its record"
        )
    if not settings.checkpoint_dir:
        raise ValueError(
            f"{settings.recipe or 'the recipe'}: checkpoint_dir: not set, and the plan needs the model; fix: add "
            "checkpoint_dir to the recipe or give --checkpoint_dir checkpoints/<org>/<name> (as `litgpt download` writes it)"
        )
    strategy_config = strategy
    refuse_unrunnable(settings, strategy_config, strategy_named)
    fields = strategy_fields(strategy_config, settings.world_size)
    if activation_checkpointing:
        fields["activation_checkpointing"] = True
    config = load_config(settings.checkpoint_dir)
    seq, seq_source = _seq_len(settings, config, dataset)
    bf16 = gpu is None or gpu.bf16
    case = plan_input(settings, config, seq_len=seq, bf16=bf16, **fields)
    if gpu is not None and str(case.precision).startswith("bf16") and not gpu.bf16:
        case.attention_math = True
    plan = memory.predict(case)
    if strategy_config is not None and strategy_config.fast:
        plan.notes.append(fast_note(strategy_config.fast))
    hangs = _hangs(settings) if strategy_config is None and settings.command == "finetune_lora" else []
    plan.notes += _batch_notes(settings)
    if gpu is not None:
        memory.verdict(plan, gpu)
        plan.max_micro_batch_size = memory.max_micro_batch(case, gpu)
    label = strategy_config.describe() if strategy_config is not None else "litgpt"
    return PlannedRecipe(
        settings=settings,
        input=case,
        plan=plan,
        seq_source=seq_source,
        strategy=label,
        strategy_config=strategy_config,
        warnings=[f"{key}: {what}; fix: {fix} (validate and run refuse it)" for key, what, fix in hangs],
    )


def replanned(planned: PlannedRecipe, gpu, **changes) -> PlannedRecipe:
    """``planned`` with its case changed (:meth:`PlanInput.changed`: a loop feature, a strategy option, the model's
    config), its memory, verdict for ``gpu`` and largest micro batch planned again; its time follows the case. How a
    check set's runs are planned as the versions that ran them (the plan's notes are the memory model's own)."""
    case = planned.input.changed(**changes)
    plan = memory.verdict(memory.predict(case), gpu)
    plan.max_micro_batch_size = memory.max_micro_batch(case, gpu)
    return dataclasses.replace(planned, input=case, plan=plan)


def _hangs(settings: Settings) -> list[tuple[str, str, str]]:
    """The samples litgpt's own LoRA loop would take on rank 0 alone while the other ranks wait (``settings``: a run
    on several devices; its data counted as :func:`train_samples` counts it)."""
    train, _, _ = train_samples(settings)
    micro, gbs, epochs = settings.micro_batch_size, settings.global_batch_size, settings.epochs or 1
    by_epochs = litgpt_schedule(train, settings.world_size, micro, gbs, epochs, None).steps
    steps = min(by_epochs, settings.max_steps) if settings.max_steps else by_epochs
    args = settings.args
    return rank0_sample_problems(settings.world_size, args.get("train") or {}, args.get("eval") or {}, steps, by_epochs)


def _batch_notes(settings: Settings) -> list[str]:
    """Notes where the run's batches are not the recipe's: a global batch litgpt floors (not micro batch x devices x
    accumulation) or one under a micro batch on each device, and devices that each hold fewer training samples than
    the micro batch (litgpt's sampler gives each its share: every micro batch is that share; the plan, made at the
    micro batch, is an upper bound)."""
    notes, micro = [], settings.micro_batch_size
    if (step := settings.accumulation * micro * settings.world_size) < settings.global_batch_size:
        notes.append(
            f"train.global_batch_size {settings.global_batch_size} is not micro batch x devices x accumulation: "
            f"litgpt floors the accumulation to {settings.accumulation}, {step} samples a step (validate refuses it)"
        )
    elif step > settings.global_batch_size:  # planned under a strategy file (litgpt's own scripts assert it)
        notes.append(
            f"train.global_batch_size {settings.global_batch_size} is less than a micro batch on each device "
            f"({settings.world_size} x {micro}): tunelab's loop steps every {step} samples (validate and run refuse it)"
        )
    train, _, _ = train_samples(settings)
    if train and (share := math.ceil(train / max(1, settings.world_size))) < micro:
        notes.append(
            f"each device's share of the {train:,} training samples is {share:,}, under the micro batch {micro}: "
            f"every micro batch holds {share:,} samples; memory is planned at {micro}, an upper bound"
        )
    return notes


def refuse_unrunnable(settings: Settings, strategy: StrategyConfig | None, strategy_named: str | None) -> None:
    """Refuse, before planning, what litgpt or tunelab's loop would refuse to run: a world the strategy never
    synchronises or the batch cannot feed, QLoRA on several devices or under mixed precision (as validate and run
    say), and on a GPU what the strategy file's loop refuses (QLoRA, 16-mixed, Liger past a wrapper)."""
    source = strategy_named or (strategy.name if strategy is not None else "")
    if strategy is not None:
        strategy.check_world(settings.world_size, source, per_node=settings.devices)
    check_feeds(settings, litgpt=strategy is None)
    for key, what, fix in quantization_problems(settings.args.get("quantize"), settings.world_size, settings.precision):
        raise ValueError(f"{key}: {what}; fix: {fix}")  # as validate says it, before planning
    if strategy is not None:
        try:
            strategy.check(settings.args, device="cuda")
        except StrategyError as e:
            raise StrategyError(f"{source}: {e}") from None


def fast_note(switches) -> str:
    """The note a fast-path plan carries: how its time is had and the band around it, by what bounds the run
    (:func:`~tunelab.plan.model.runtime.fast_band`)."""
    band = ", ".join(f"{bound}-bound {runtime.fast_band(bound):.0%}" for bound in FAST_MODEL_ERROR)
    return (
        f"tunelab's fast path ({', '.join(switches)}): its time is tunelab's loop with these switches, kernel by "
        f"kernel (tunelab/plan/model/fast_step.py), banded by its widest miss over our benches' compiled runs, "
        f"the kernel model's where wider ({band} either side: reports/planner-accuracy/runtime.md); --calibrate "
        "with its run records (tunelab "
        "bench) uses their measured MFU for the MFU range"
    )


def check_feeds(settings: Settings, litgpt: bool) -> None:
    """ValueError naming the key when the devices cannot all be fed: one micro batch on each of them needs more
    samples than the global batch (litgpt's own scripts assert it), the devices outnumber the training samples
    (:func:`tunelab.settings.unfed_devices`), or an epoch holds no optimizer step (:func:`tunelab.settings.empty_epoch`),
    as validate says each."""
    unit = settings.world_size * settings.micro_batch_size
    if litgpt and settings.world_size > 1 and unit > settings.global_batch_size:
        raise ValueError(
            f"train.global_batch_size: {settings.global_batch_size} is smaller than devices x num_nodes x micro_batch_size "
            f"= {unit} (litgpt asserts); fix: fewer devices or train.global_batch_size {unit}"
        )
    train, _, src = train_samples(settings)
    if unfed := unfed_devices(train, settings.world_size):
        what, fix = unfed
        raise ValueError(f"devices: {what} ({src}); fix: {fix}")
    if empty := empty_epoch(train, settings.world_size, settings.micro_batch_size, settings.global_batch_size):
        what, fix = empty  # as the time model and validate refuse it: with or without --gpu
        raise ValueError(f"train.global_batch_size: {what}; fix: {fix}")


def train_samples(settings: Settings) -> tuple[int, int, str]:
    """(training samples, validation samples, where the figure comes from) of the run's data: the file here or a
    known litgpt data module, split by its val_split_fraction; else the lab's 2,000 samples, said so."""
    n, src = data_size(settings.args)
    if n is None:
        n, src = LAB_DATA_SAMPLES, f"the lab's 2,000-sample Alpaca subset assumed: {src}"
    train, held_out = split_sizes(n, settings.val_split_fraction)
    return train, held_out, src


def epoch_tokens(
    settings: Settings, tokens_per_sample: float | None, vocab_size: int | None = None, source: str = ""
) -> tuple[float, str]:
    """Padded tokens of the recipe's training run (epochs over its data, or max_steps), and how they were counted
    (``vocab_size``: the model's, whose tokenizer the default length distribution is scaled to; ``source``: whose
    lengths ``tokens_per_sample`` was padded from, in words, where it says more than the figure)."""
    micro, cap = settings.micro_batch_size or 1, settings.max_seq_length
    per_sample = tokens_per_sample or default_padded_per_sample(micro, cap, vocab_size)
    scaled = tokens_scale(vocab_size)[1]
    how = f"{per_sample:.0f} padded tokens/sample" + (
        (f" ({source}, padded at micro {settings.micro_batch_size})" if source else "")
        if tokens_per_sample
        else f" (the default Alpaca-like length distribution{f', {scaled},' if scaled else ''} padded at micro "
        f"{settings.micro_batch_size}; --tokens-per-sample to change)"
    )
    train, _, src = train_samples(settings)
    epochs = settings.epochs or 1
    world, gbs = settings.world_size, settings.global_batch_size
    run = litgpt_schedule(train, world, micro, gbs, epochs, settings.max_steps)  # as litgpt's loop counts them
    if settings.max_steps and run.steps == settings.max_steps:
        return run.samples * per_sample, f"max_steps {settings.max_steps} x global batch {gbs} x {how}"
    # litgpt's loop also stops at the end of its last epoch, whichever comes first
    ends = f", which end before max_steps {settings.max_steps}" if settings.max_steps else ""
    return run.samples * per_sample, f"{epochs} epoch(s) of {train} training samples ({src}){ends} x {how}"


def data_lengths(settings: Settings, vocab_size: int | None = None) -> tuple[list[int], str] | None:
    """(token lengths of (a seeded sample of) the recipe's data, whose): its file's records, tokenised with the
    model's tokenizer where it is here, else estimated from their characters under the tokenizer of a model of
    ``vocab_size`` (as ``tunelab advise --data`` counts them: :func:`tunelab.data.lengths.sample_lengths`); else a
    litgpt data module's measured records (:func:`tunelab.data.lengths.module_lengths`); None for data known
    neither way."""
    data = data_init_args(settings.args)
    path, ckpt = data.get("json_path"), Path(settings.checkpoint_dir)
    if not path or not project_path(path).is_file():
        found = module_lengths(settings.data_class, vocab_size, settings.max_seq_length)
        return (list(found[0]), found[1]) if found else None
    lengths, _, how = sample_lengths(
        dataset_records.read(project_path(path)),
        ckpt,
        data.get("prompt_style", "alpaca"),
        settings.max_seq_length,
        data.get("seed", 42),
        vocab_size,
    )
    return lengths, "the data's lengths" if (ckpt / "tokenizer.json").is_file() else f"the data's lengths, {how}"


def runtime_terms(
    settings: Settings,
    case: PlanInput,
    tokens_per_sample: float | None,
    real_per_sample: float | None = None,
    tokens: float | None = None,
):
    """The recipe's run as tunelab.plan.model.runtime.Terms: its data's size and split (or the lab's 2,000 samples),
    epochs or max_steps, eval settings, padded tokens per sample (default: :func:`default_padded_per_sample` at
    the run's micro batch) and, where known, real (unpadded) tokens per sample. ``tokens`` (``plan --tokens``): the
    run is that many padded tokens instead, in one pass (the recipe's epochs and max_steps set aside), validated and
    saved at the recipe's intervals; InputError where they make no optimizer step."""
    train, val, _ = train_samples(settings)
    cap, vocab = settings.max_seq_length, case.config.vocab_size
    per_sample = tokens_per_sample or default_padded_per_sample(case.micro_batch_size, cap, vocab)
    args = settings.args
    if tokens:
        train, step = round(tokens / per_sample), case.micro_batch_size * case.accumulation * case.world
        if train < step:
            raise InputError(
                f"--tokens {tokens:,.6g}: fewer than one optimizer step ({step} samples of {per_sample:.0f} padded "
                f"tokens); fix: --tokens {step * per_sample:.0f} or more"
            )
        args = {**args, "train": {**args["train"], "epochs": 1, "max_steps": None}}
    t = runtime.terms(case, args, train, val, per_sample)
    t.detail["real_tokens_per_sample"] = real_per_sample
    return t
