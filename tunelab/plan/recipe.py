"""The planner from a recipe: litgpt-style overrides resolved once into :class:`tunelab.settings.Settings`, then the
planner's input built from them (:func:`plan_input`), the memory prediction and the fit verdict for one GPU
(:func:`plan_recipe`), and the run's size in tokens for the runtime projection.
"""

from __future__ import annotations

import functools
import math
import random
from dataclasses import dataclass
from pathlib import Path

from tunelab import hardware
from tunelab.data import benchmark
from tunelab.data import records as dataset_records
from tunelab.data.grouping import bucket, plan_epoch
from tunelab.errors import InputError
from tunelab.files import read_json
from tunelab.models import load_config
from tunelab.paths import project_path
from tunelab.plan.model import memory, runtime, strategies
from tunelab.plan.model.memory import Plan, PlanInput
from tunelab.plan.trace.tables import TRACED
from tunelab.recipes import Recipe
from tunelab.settings import Settings, data_size, resolve
from tunelab.strategies import StrategyConfig, load_strategy

LAB_PADDED_TOKENS_PER_SAMPLE = 437
"""The lab's padded tokens per training sample (spec: 7,646 tok/s x 57.19 s over 1,000 samples, micro 8)."""
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


def check_ranges(settings: Settings) -> None:
    """ValueError naming the key when a count the plan divides or multiplies by is not a positive integer, or one
    micro batch exceeds the global batch (several devices' micro batches may: tunelab's loop then takes one micro
    batch per step on each)."""
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
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{key}: {value!r} must be a positive integer; fix: set --{key} to 1 or more")
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


BNB_OPTIMIZERS = {"adamw8bit": "AdamW8bit", "paged_adamw": "PagedAdamW", "paged_adamw8bit": "PagedAdamW8bit"}
"""A strategy's ``optimizer`` memory options: the bitsandbytes classes they name."""


def plan_input(settings: Settings, config, *, seq_len: int | None = None, **fields) -> PlanInput:
    """The planner's input from resolved Settings (world size, accumulation, optimizer and LoRA targets as
    Settings computed them) and a strategy's :func:`strategy_fields`. LoRA on several devices under litgpt's own
    choice checkpoints activations per block, as both of litgpt's paths do (LoRA: FSDP2 over ``checkpoint_wrapper``
    blocks; full fine-tuning: FSDP1, Lightning's ``FSDPStrategy`` with ``activation_checkpointing_policy={Block}``);
    a strategy file says for itself."""
    lora = {"lora_r": settings.lora_r, "lora_targets": settings.lora_targets} if settings.lora else {}
    fields.setdefault("strategy", "single")
    fields.setdefault("optimizer", settings.built_optimizer)
    for key, value in strategies.litgpt_defaults(fields["strategy"], settings.world_size, settings.lora).items():
        fields.setdefault(key, value)
    return PlanInput.of(
        config=config,
        tables=TRACED,
        method=settings.method,
        precision=settings.precision or "bf16-true",
        quantize=settings.quantize,
        micro_batch_size=settings.micro_batch_size,
        seq_len=seq_len or min(settings.max_seq_length or config.block_size, config.block_size),
        accumulation=settings.accumulation,
        momentum=settings.momentum,
        devices=settings.devices,
        num_nodes=settings.num_nodes,
        **lora,
        **fields,
    )


TOKENIZED_MAX = 2_000
"""Records the planner tokenises at most: the longest by characters for ``--dataset`` (the longest in tokens is
among them in any natural text), a seeded sample for the padded tokens per sample; a million-record file plans in
seconds."""


def longest_sample_tokens(json_path: Path, checkpoint_dir: Path, prompt_style: str = "alpaca") -> int:
    """Token count of the dataset's longest sample with its prompt template (needs the checkpoint's tokenizer):
    the :data:`TOKENIZED_MAX` longest records by characters are tokenised."""
    records = [r for part in dataset_records.split_files(json_path) for r in dataset_records.read(part)]
    return sample_lengths(records, checkpoint_dir, prompt_style)[1]


def _dataset_seq_len(settings: Settings, dataset: Path) -> tuple[int, str]:
    ckpt = Path(settings.checkpoint_dir)
    if not (ckpt / "tokenizer.json").is_file() and not (ckpt / "tokenizer.model").is_file():
        raise ValueError(f"--dataset needs the model's tokenizer, and {ckpt} has none (download the checkpoint)")
    longest = longest_sample_tokens(dataset, ckpt)
    cap = settings.max_seq_length
    capped = " capped at max_seq_length" if cap and longest > cap else ""
    return (min(longest, cap) if cap else longest), f"the dataset's longest sample ({longest} tokens){capped}"


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
    strategy_config = strategy
    if strategy_config is not None:
        strategy_config.check_world(
            settings.world_size, strategy_named or strategy_config.name, per_node=settings.devices
        )
    check_feeds(settings, litgpt=strategy_config is None)
    fields = strategy_fields(strategy_config, settings.world_size)
    if activation_checkpointing:
        fields["activation_checkpointing"] = True
    seq, seq_source = None, "the recipe's train.max_seq_length"
    if dataset is not None:
        seq, seq_source = _dataset_seq_len(settings, dataset)
    x = plan_input(settings, load_config(settings.checkpoint_dir), seq_len=seq, **fields)
    if gpu is not None and str(x.precision).startswith("bf16") and not gpu.bf16:
        x.attention_math = True
    plan = memory.predict(x)
    if strategy_config is not None and strategy_config.fast:
        plan.notes.append(
            f"tunelab's fast path ({', '.join(strategy_config.fast)}): its time is tunelab's loop with these switches, "
            "kernel by kernel (tunelab/plan/model/fast_step.py; against our H100 bench of TinyLlama full: -14% to +12% "
            "at micro 8, where the host bounds it, -1% to -7% at micro 58-97, where the GPU does; LoRA not yet "
            "measured compiled throughout; "
            "reports/planner-accuracy/runtime.md); --calibrate with its run records (tunelab bench) uses their "
            "measured MFU for the MFU range"
        )
    if gpu is not None:
        memory.verdict(plan, gpu)
        plan.max_micro_batch_size = memory.max_micro_batch(x, gpu)
    label = strategy_config.describe() if strategy_config is not None else "litgpt"
    return PlannedRecipe(
        settings=settings, input=x, plan=plan, seq_source=seq_source, strategy=label, strategy_config=strategy_config
    )


def check_feeds(settings: Settings, litgpt: bool) -> None:
    """ValueError naming the key when the devices cannot all be fed: one micro batch on each of them needs more
    samples than the global batch (litgpt's own scripts assert it) or than the whole training split (no optimizer
    step would run)."""
    unit = settings.world_size * settings.micro_batch_size
    if litgpt and settings.world_size > 1 and unit > settings.global_batch_size:
        raise ValueError(
            f"train.global_batch_size: {settings.global_batch_size} is smaller than devices x num_nodes x micro_batch_size "
            f"= {unit} (litgpt asserts); fix: fewer devices or train.global_batch_size {unit}"
        )
    train, _, src = train_samples(settings)
    if unit > train:
        raise ValueError(
            f"devices: {settings.world_size} devices x micro batch {settings.micro_batch_size} = {unit} samples a step, more than "
            f"the {train} training samples ({src}); fix: at most {max(train // settings.micro_batch_size, 1)} devices"
        )


def _data_init(settings: Settings) -> dict:
    data = settings.args.get("data")
    return (data.get("init_args") or {}) if isinstance(data, dict) else {}


def train_samples(settings: Settings) -> tuple[int, int, str]:
    """(training samples, validation samples, where the figure comes from) of the run's data: the file here or a
    known litgpt data module, split by its val_split_fraction; else the lab's 2,000 samples, said so."""
    n, src = data_size(settings.args)
    if n is None:
        n, src = LAB_DATA_SAMPLES, f"the lab's 2,000-sample Alpaca subset assumed: {src}"
    train = int(n * (1 - (settings.val_split_fraction or 0)))
    return train, n - train, src


def epoch_tokens(settings: Settings, tokens_per_sample: float | None) -> tuple[float, str]:
    """Padded tokens of the recipe's training run (epochs over its data, or max_steps), and how they were counted."""
    per_sample = tokens_per_sample or default_padded_per_sample(settings.micro_batch_size or 1, settings.max_seq_length)
    how = f"{per_sample:.0f} padded tokens/sample" + (
        ""
        if tokens_per_sample
        else f" (the default Alpaca-like length distribution padded at micro {settings.micro_batch_size}; "
        "--tokens-per-sample to change)"
    )
    train, _, src = train_samples(settings)
    epochs = settings.epochs or 1
    if settings.max_steps and settings.max_steps * settings.global_batch_size <= train * epochs:
        samples = settings.max_steps * settings.global_batch_size
        return (
            samples * per_sample,
            f"max_steps {settings.max_steps} x global batch {settings.global_batch_size} x {how}",
        )
    # litgpt's loop also stops at the end of its last epoch, whichever comes first
    ends = f", which end before max_steps {settings.max_steps}" if settings.max_steps else ""
    return train * epochs * per_sample, f"{epochs} epoch(s) of {train} training samples ({src}){ends} x {how}"


def data_lengths(settings: Settings) -> list[int] | None:
    """Token lengths of (a seeded sample of) the recipe's data, or None without its file and tokenizer here."""
    data = _data_init(settings)
    path, ckpt = data.get("json_path"), Path(settings.checkpoint_dir)
    if not path or not project_path(path).is_file() or not (ckpt / "tokenizer.json").is_file():
        return None
    return sample_lengths(
        dataset_records.read(project_path(path)),
        ckpt,
        data.get("prompt_style", "alpaca"),
        settings.max_seq_length,
        data.get("seed", 42),
    )[0]


CHARS_PER_TOKEN = 4.0
"""Characters per token where the model's tokenizer is not here: about 4 for English prose under LLaMA-style
tokenizers (an estimate; give the checkpoint to count exactly)."""


def has_tokenizer(checkpoint_dir: Path) -> bool:
    """Whether the checkpoint directory holds a tokenizer litgpt can load."""
    return (Path(checkpoint_dir) / "tokenizer.json").is_file() or (Path(checkpoint_dir) / "tokenizer.model").is_file()


TOKENIZER_MAX_BYTES = 64 * 2**20
"""Largest tokenizer file read (64 MiB: the largest litgpt models' tokenizer.json are under 35 MB)."""


def load_tokenizer(checkpoint_dir: Path):
    """litgpt's Tokenizer of a checkpoint, its JSON files checked first (bounded, UTF-8, valid JSON: one line
    naming the file), and anything litgpt or the tokenizers library then refuses said in one line too."""
    from litgpt.tokenizer import Tokenizer

    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        if (checkpoint_dir / name).exists():
            read_json(checkpoint_dir / name, TOKENIZER_MAX_BYTES, "tokenizer file")
    try:
        return Tokenizer(checkpoint_dir)
    except Exception as e:  # the tokenizers library's own errors (a malformed model) have no common class
        raise InputError(
            f"{checkpoint_dir}: its tokenizer could not be loaded ({type(e).__name__}: {str(e)[:200]}); fix: "
            "download the checkpoint's tokenizer files again"
        ) from None


def sample_lengths(
    records: list[dict], checkpoint_dir: Path, prompt_style: str = "alpaca", cap: int | None = None, seed: int = 42
) -> tuple[list[int], int, str]:
    """(token lengths of a seeded sample of at most :data:`TOKENIZED_MAX` records, the longest sample's length
    (among the :data:`TOKENIZED_MAX` longest by characters), how they were counted), each with the prompt template
    and EOS, capped at ``cap``: with the checkpoint's tokenizer, else characters / :data:`CHARS_PER_TOKEN`."""
    from litgpt.prompts import PromptStyle

    style = PromptStyle.from_name(prompt_style)
    if has_tokenizer(checkpoint_dir):
        tok = load_tokenizer(Path(checkpoint_dir))
        how = "tokenised with the model's tokenizer"

        def count(text):
            return len(tok.encode(text, eos=True))
    else:
        how = f"estimated at {CHARS_PER_TOKEN:g} characters per token (no tokenizer in {checkpoint_dir})"

        def count(text):
            return math.ceil(len(text) / CHARS_PER_TOKEN) + 1

    def text(r):
        return style.apply(r["instruction"], input=r.get("input", "")) + r["output"]

    limit = cap or 10**9
    picked = random.Random(seed).sample(records, TOKENIZED_MAX) if len(records) > TOKENIZED_MAX else records
    lengths = [min(limit, count(text(r))) for r in picked]
    longest_texts = sorted((text(r) for r in records), key=len)[-TOKENIZED_MAX:]
    longest = min(limit, max((count(t) for t in longest_texts), default=0))
    return lengths, longest, how


def padded_per_sample(lengths: list[int], micro: int, seed: int = 42) -> float:
    """Mean tokens per sample after padding each micro batch to its longest sample, the samples shuffled as
    litgpt's loader shuffles them (seeded)."""
    if not lengths:
        return 0.0
    order = list(lengths)
    random.Random(seed).shuffle(order)
    batches = [order[i : i + micro] for i in range(0, len(order), micro)]
    return sum(max(b) * len(b) for b in batches) / len(order)


def grouped_padded_per_sample(
    lengths: list[int], micro: int, group: int | None, multiple: int | None, cap: int, seed: int = 42
) -> float:
    """Mean tokens per sample under tunelab's fast path: the micro batches its loop forms (length-grouped within
    windows of ``group`` micro batches, :func:`tunelab.data.grouping.plan_epoch`, the loop's own code), each padded
    to its longest sample rounded up to ``multiple`` (:func:`tunelab.data.grouping.bucket`), the order shuffled as
    litgpt's loader shuffles (seeded)."""

    if not lengths:
        return 0.0
    order = list(range(len(lengths)))
    random.Random(seed).shuffle(order)
    batches = plan_epoch(order, micro, lengths, group, seed, 0)
    return sum(bucket(max(lengths[i] for i in b), multiple, cap) * len(b) for b in batches) / len(lengths)


def padded_tokens_per_sample(lengths: list[int], micro: int, strategy: StrategyConfig | None, cap: int) -> float:
    """Padded tokens per sample of a run: as its strategy's loop forms the micro batches where it forms them its own
    way (:attr:`StrategyConfig.regroups`: :func:`grouped_padded_per_sample`), else as litgpt pads
    (:func:`padded_per_sample`). ``cap``: the sequence length no micro batch is padded past. Remembered per lengths
    and settings (advise asks the same figure for hundreds of configurations)."""
    if strategy is not None and strategy.regroups:
        return _padded(tuple(lengths), micro, (strategy.length_grouping, strategy.pad_to_multiple), cap)
    return _padded(tuple(lengths), micro, None, cap)


@functools.lru_cache(maxsize=256)
def _padded(lengths: tuple, micro: int, grouping: tuple | None, cap: int) -> float:
    if grouping is not None:
        return grouped_padded_per_sample(list(lengths), micro, grouping[0], grouping[1], cap)
    return padded_per_sample(list(lengths), micro)


DEFAULT_LENGTH_DRAWS = 20_000
"""Sample lengths drawn from the default distribution (seeded): enough for the mean padding at micro 128."""


@functools.cache
def default_lengths(cap: int = 512) -> tuple:
    """Sample lengths in tokens where the data's are not known: the benchmark data's stated distribution (the
    lab's Alpaca subset: LogNormal(5.43, 0.5) tokens, at least 48; ``tunelab/data/benchmark.py``), capped at
    ``cap`` (the recipe's max_seq_length). Padded per micro batch as litgpt pads (:func:`padded_per_sample`):
    253 tokens per sample at micro 1, 383 at 4, 440 at 8 (the lab measured 437 there), 482 at 16, 505 at 32."""

    rng = random.Random(benchmark.SEED)
    draw = lambda: max(benchmark.MIN_LEN, round(math.exp(rng.gauss(benchmark.LOG_MEAN, benchmark.LOG_STD))))  # noqa: E731
    return tuple(min(cap, draw()) for _ in range(DEFAULT_LENGTH_DRAWS))


def default_padded_per_sample(micro: int, cap: int | None = None) -> float:
    """Padded tokens per sample at ``micro`` under :func:`default_lengths`."""
    return padded_per_sample(list(default_lengths(cap or 512)), micro)


def runtime_terms(
    settings: Settings, case: PlanInput, tokens_per_sample: float | None, real_per_sample: float | None = None
):
    """The recipe's run as tunelab.plan.model.runtime.Terms: its data's size and split (or the lab's 2,000 samples),
    epochs or max_steps, eval settings, padded tokens per sample (default: :func:`default_padded_per_sample` at
    the run's micro batch) and, where known, real (unpadded) tokens per sample."""
    train, val, _ = train_samples(settings)
    per_sample = tokens_per_sample or default_padded_per_sample(case.micro_batch_size, settings.max_seq_length)
    t = runtime.terms(case, settings.args, train, val, per_sample)
    t.detail["real_tokens_per_sample"] = real_per_sample
    return t
