"""The settings of one run, resolved once: a recipe plus litgpt-style overrides -> :class:`Settings`.

Everything tunelab derives from litgpt's arguments (world size, gradient accumulation, LoRA targets, the data
module) is computed here and nowhere else. Two ways in, one result: :func:`resolve_args` reads litgpt's own defaults
from the pinned litgpt's source with ``ast`` (nothing of litgpt, torch or Lightning imported), then the recipe and
the overrides (the planner's way: a fraction of a second); ``tunelab.validate.parse`` runs litgpt's real
jsonargparse parser (seconds; it also refuses bad types: the runner's way). ``tests/core/test_settings.py`` holds
the two equal on every recipe and sweep row."""

from __future__ import annotations

import copy
import json
import math
from dataclasses import dataclass, field

from tunelab import yaml_input
from tunelab.data import records as dataset_records
from tunelab.errors import InputError
from tunelab.litgpt_source import command_defaults, data_classes, data_defaults
from tunelab.paths import display_path, project_path

LORA_TARGETS = ("query", "key", "value", "projection", "mlp", "head")
"""litgpt's ``lora_<target>`` switches: the one list of LoRA target names (the planner, the activation model, the
measurement and the multi-device loop read it)."""
LITGPT_LORA_R = 8
"""litgpt's default LoRA rank (``finetune_lora``'s ``lora_r``)."""


def world_size(devices: int, num_nodes: int = 1) -> int:
    """Data-parallel ranks: devices per node x nodes."""
    return max(1, int(devices)) * max(1, int(num_nodes))


def training_precision(precision: str | None, bf16: bool = True) -> str:
    """The precision litgpt's fine-tuning trains at: ``precision`` where set, else what its scripts pick
    (``litgpt.utils.get_default_supported_precision(training=True)``): bf16-mixed, or 16-mixed on a CUDA GPU
    without bfloat16 (``bf16`` False)."""
    return precision or ("bf16-mixed" if bf16 else "16-mixed")


def quantization_problems(quantize: str | None, world: int, precision: str | None) -> list[tuple[str, str, str]]:
    """(key, what, fix) for each thing litgpt refuses of a quantized (QLoRA) run, as ``validate`` and ``plan`` say it:
    several devices (Lightning's BitsandbytesPrecision is single-device), a mixed precision (a precision left unset
    is litgpt's mixed pick). Empty without ``quantize``."""
    out = []
    if quantize and world > 1:
        out.append(
            (
                "quantize",
                f"{quantize} on {world} devices: litgpt's quantized training (QLoRA, through Lightning's "
                "BitsandbytesPrecision) is single-device",
                "--devices 1 and --num_nodes 1, or a LoRA recipe (LoRA shards over GPUs)",
            )
        )
    if quantize and "mixed" in training_precision(precision):
        given = precision or "not set (litgpt then picks bf16-mixed, 16-mixed without bfloat16)"
        out.append(
            (
                "precision",
                f"{given} with quantize {quantize}: litgpt refuses quantization under mixed precision",
                "--precision bf16-true (16-true on a GPU without bfloat16)",
            )
        )
    return out


def val_split_problem(fraction) -> str | None:
    """Why litgpt cannot hold ``fraction`` of the data out for validation (its data modules split with torch's
    ``random_split``, which refuses a share outside 0-1; a share of 1 leaves nothing to train on), else None."""
    if fraction is None or (not isinstance(fraction, bool) and isinstance(fraction, int | float) and 0 <= fraction < 1):
        return None
    return f"{fraction!r} is not a share of the data from 0 to below 1 (the rest trains)"


JSON_FILE_VAL_SPLIT = 0.05
"""The share litgpt's JSON module holds out of a single file when ``val_split_fraction`` is unset (its
``__post_init__``, with a warning); a folder's train.json and val.json are read as they are."""


def data_init_args(args: dict) -> dict:
    """The data module's ``init_args`` of resolved arguments ({} for a data class named alone, or none)."""
    data = args.get("data")
    return (data.get("init_args") or {}) if isinstance(data, dict) else {}


def held_out_share(args: dict) -> float | None:
    """The share of the data litgpt holds out for validation, as its data module takes ``val_split_fraction``: the
    value set, :data:`JSON_FILE_VAL_SPLIT` for a single JSON file without one, None for a folder (its val.json)."""
    init = data_init_args(args)
    fraction, path = init.get("val_split_fraction"), init.get("json_path")
    if path is not None and project_path(path).is_dir():
        return None
    if fraction is None and path is not None and project_path(path).is_file():
        return JSON_FILE_VAL_SPLIT
    return fraction


def data_class_problem(data_class: str | None) -> str | None:
    """Why ``data_class`` (a class path) names no data module of litgpt's, for a path under ``litgpt.data``; None for
    one litgpt has, or a class of the user's own (its size is then assumed, and said)."""
    module, _, name = str(data_class).rpartition(".")
    if module != "litgpt.data" or name in data_classes():
        return None
    known = sorted(n for n in data_classes() if n[0].isupper() and n not in ("DataModule", "SFTDataset"))
    return f"data: {name!r} is not a litgpt data module; fix: one of {', '.join(known)}, or a class path of your own"


def split_sizes(samples: int, fraction: float | None) -> tuple[int, int]:
    """(training, validation) samples of torch's ``random_split`` into shares ``1 - fraction`` and ``fraction``, as
    litgpt's data modules call it: each share floored, the samples left over dealt one by one from the first."""
    sizes = [math.floor(samples * (1 - (fraction or 0))), math.floor(samples * (fraction or 0))]
    for i in range(samples - sum(sizes)):
        sizes[i % 2] += 1
    return sizes[0], sizes[1]


def training_problems(args: dict, lora: bool) -> list[tuple[str, str, str]]:
    """(key, what, fix) for values litgpt takes and then trains nothing, or to a NaN loss, or refuses only once the
    model is built: a sequence of one token, LoRA scaled by 0, a dropout that is no probability, a validation share
    that holds out no sample (counted where one file is split; a folder brings its own val.json). One rule for
    ``tunelab validate`` and ``tunelab plan``."""
    out, train = [], args.get("train") or {}
    seq = train.get("max_seq_length")
    if isinstance(seq, int) and not isinstance(seq, bool) and seq < 2:
        what = f"is {seq}: litgpt predicts each token from the ones before it, so a sample cut to {seq} token(s) has "
        out.append(("train.max_seq_length", what + "nothing to predict (a loss of 0 or NaN)", "set it >= 2, or null"))
    if lora and args.get("lora_alpha") == 0:
        what = "is 0: litgpt scales the adapters by lora_alpha / lora_r: they add nothing and get no gradient"
        out.append(("lora_alpha", what, "set lora_alpha > 0 (the recipes use 16)"))
    dropout = args.get("lora_dropout")
    if lora and isinstance(dropout, int | float) and not 0 <= dropout < 1:
        what = f"is {dropout}: not a probability from 0 to below 1 (torch's Dropout refuses it once the model is built)"
        out.append(("lora_dropout", what, "set lora_dropout from 0 to below 1 (the recipes use 0.05)"))
    init = data_init_args(args)
    if init.get("json_path") is not None and project_path(init["json_path"]).is_dir():
        if init.get("val_split_fraction") is not None and data_size(args)[0] is not None:  # else its own problem
            what = f"is {init['val_split_fraction']}, but data.json_path is a folder: litgpt reads its train.json and "
            out.append(("data.val_split_fraction", what + "val.json and refuses a split", "set it to null"))
        return out
    fraction = held_out_share(args)
    if isinstance(fraction, int | float) and not val_split_problem(fraction):
        samples = data_size(args)[0] if fraction else None
        if fraction == 0 or (samples and split_sizes(samples, fraction)[1] == 0):
            held = "0" if fraction == 0 else f"{fraction:g} of {samples:,} samples"
            what = f"{held} holds out no validation sample: litgpt validates before training and at the end, over none"
            out.append(("data.val_split_fraction", what + " (NaN)", "hold out at least one sample (0.05: 5%)"))
    return out


@dataclass(frozen=True)
class Schedule:
    """litgpt's fit loop over a run's training samples, counted as it counts them (:func:`litgpt_schedule`)."""

    steps_per_epoch: int
    """``len(train_dataloader) // accumulation``: what litgpt sizes its learning-rate schedule by (0: it fails)."""
    span: int
    """The steps the learning-rate schedule spans: min(epochs x steps_per_epoch, max_steps)."""
    micro_batches: int
    """Micro batches each rank runs (a short last one each epoch; one past the last step runs without a step)."""
    samples: int
    """Samples trained, summed over the ranks (DistributedSampler's repeated samples included)."""
    steps: int
    """Optimizer steps: one every accumulation-th micro batch, counted on across epochs, cut at max_steps."""


def litgpt_schedule(
    samples: int, world: int, micro_batch_size: int, global_batch_size: int, epochs: int, max_steps: int | None
) -> Schedule:
    """litgpt's fit loop over ``samples`` training samples: each rank's DistributedSampler share (padded to a
    multiple of the ranks) in micro batches, the last one short; ``epochs`` passes of them, the micro batches counted
    on across epochs; an optimizer step at every accumulation-th; stopped at ``max_steps``."""
    world, micro, epochs = max(1, world), max(1, micro_batch_size), max(1, epochs or 1)
    share = math.ceil(samples / world)
    per_epoch = math.ceil(share / micro)
    acc = accumulation(global_batch_size, world, micro)
    if per_epoch == 0:
        return Schedule(0, 0, 0, 0, 0)
    batches = per_epoch * epochs
    steps = batches // acc
    if max_steps and steps >= max_steps:
        steps, batches = max_steps, max_steps * acc
    full, part = divmod(batches, per_epoch)
    by_epochs = epochs * (per_epoch // acc)  # what litgpt's learning-rate schedule is sized by
    span = min(by_epochs, max_steps) if max_steps else by_epochs
    return Schedule(per_epoch // acc, span, batches, world * (full * share + part * micro), steps)


def rank0_sample_problems(
    world: int, train: dict, eval_: dict, steps: int | None, epoch_steps: int | None
) -> list[tuple[str, str, str]]:
    """(key, what, fix) for each sample litgpt's own LoRA loop would take on rank 0 alone on ``world`` devices while
    the other ranks wait for it forever: one every ``eval.interval`` steps inside the run (``steps``: its optimizer
    steps, None where unknown), and one when its epochs end it (``epoch_steps``: the steps they give, None where
    unknown; max_steps at most that many ends the loop first). A 2-process run hung at the latter."""
    if world < 2:
        return []
    out = []
    interval, max_steps = eval_.get("interval"), train.get("max_steps")
    if interval is not None and (steps is None or interval <= steps):
        out.append(
            (
                "eval.interval",
                f"{interval} falls inside the {steps if steps else 'unbounded'}-step run on {world} devices: litgpt's "
                "LoRA eval generates a sample on rank 0 only and the other ranks hang",
                f"set eval.interval above the run's optimizer steps (e.g. {(steps or 0) + 1 if steps else 10**6})",
            )
        )
    if not max_steps or (epoch_steps is not None and epoch_steps < max_steps):
        given = f"{max_steps}, more than the {epoch_steps} steps the epochs give" if max_steps else "not set"
        count = f"{epoch_steps} (the epochs' steps)" if epoch_steps else "the run's optimizer steps"
        out.append(
            (
                "train.max_steps",
                f"{given}: the run ends with its epochs, where litgpt's LoRA loop generates a sample on rank 0 alone "
                f"and the other {world - 1} rank(s) wait for it forever (the final checkpoint is never written)",
                f"set train.max_steps to {count}: the loop then ends without that sample",
            )
        )
    return out


def empty_epoch(samples: int, world: int, micro_batch_size: int, global_batch_size: int) -> tuple[str, str] | None:
    """(what, fix) where an epoch of ``samples`` training samples holds no optimizer step by litgpt's count (it sizes
    its schedule by the steps per epoch, and fails), else None."""
    world, micro = max(1, world), max(1, micro_batch_size)
    if not samples or litgpt_schedule(samples, world, micro, global_batch_size, 1, None).steps_per_epoch:
        return None
    acc = accumulation(global_batch_size, world, micro)
    most = math.ceil(math.ceil(samples / world) / micro) * micro * world
    what = (
        f"{global_batch_size:,} is {acc} micro batches of {micro} a step on {world} device(s), more than the "
        f"{samples:,} training samples make: an epoch has no optimizer step (litgpt sizes its schedule by them)"
    )
    return what, f"lower train.global_batch_size to at most {most:,}, or give more data"


def unfed_devices(samples: int, world: int) -> tuple[str, str] | None:
    """(what, fix) where the training samples are fewer than the devices: litgpt's DistributedSampler (and tunelab's
    loop) would hand some devices nothing but other devices' samples again, a run of rented GPUs with no data of their
    own; else None. Fewer samples than devices x micro batch is not refused: the micro batches are shorter."""
    if not samples or world <= samples:
        return None
    return (
        f"{world:,} devices, more than the {samples:,} training samples: some would train only on samples other "
        "devices hold (the sampler repeats samples to give each device a share)",
        f"at most {samples:,} devices, or more data",
    )


def accumulation(global_batch_size: int, world: int, micro_batch_size: int) -> int:
    """Gradient-accumulation iterations per optimizer step, as litgpt computes it: ``(global // world) // micro``
    (floored, silently: ``tunelab validate`` refuses a global batch that does not divide), at least 1."""
    return max(1, (int(global_batch_size) // max(1, world)) // max(1, int(micro_batch_size)))


@dataclass(frozen=True)
class Settings:
    """One run's litgpt arguments that tunelab reasons about, after defaults and overrides."""

    recipe: str
    """The recipe key (``tiny-llama-1.1b/lora``) or the YAML path."""
    method: str
    """full, lora, qlora, adapter or adapter_v2."""
    command: str
    """The litgpt subcommand (``finetune_lora``)."""
    checkpoint_dir: str
    """The model's checkpoint directory (its name or model_config.yaml names the architecture)."""
    precision: str | None
    """Lightning precision (``bf16-true``, ``32-true``, ...); None lets litgpt choose."""
    quantize: str | None
    """bitsandbytes quantization (``bnb.nf4``) for QLoRA, else None."""
    devices: int
    """Devices per node (``auto`` / -1 are refused by the validator: figures are per device)."""
    num_nodes: int
    """Nodes."""
    micro_batch_size: int
    """Samples per rank per forward/backward."""
    global_batch_size: int
    """Samples per optimizer step, all ranks together."""
    max_steps: int | None
    """Optimizer steps to stop after (None: the epochs decide)."""
    epochs: int | None
    """Passes over the training split."""
    lr_warmup_steps: int | None
    """Linear warm-up, in optimizer steps."""
    max_seq_length: int | None
    """Longest sequence after truncation (None: the model's block size)."""
    lora_r: int | None
    """LoRA rank (None for full fine-tuning)."""
    lora_targets: tuple[str, ...]
    """Which of litgpt's LoRA targets are on (``query``, ``mlp``, ...); empty for full fine-tuning."""
    optimizer: str
    """The optimizer class as the recipe names it (``AdamW`` or a dotted path)."""
    optimizer_init: tuple
    """The optimizer's init arguments as (name, value) pairs (``momentum``, ``amsgrad``: states they add)."""
    data_class: str | None
    """The data module's class path (None: litgpt's default, Alpaca)."""
    data_path: str | None
    """``json_path`` of a JSON data module."""
    val_split_fraction: float | None
    """The data module's validation split, when it has one."""
    args: dict = field(default_factory=dict, compare=False, repr=False)
    """Every resolved litgpt argument (plain data)."""

    @property
    def world_size(self) -> int:
        return world_size(self.devices, self.num_nodes)

    @property
    def accumulation(self) -> int:
        return accumulation(self.global_batch_size, self.world_size, self.micro_batch_size)

    @property
    def built_optimizer(self) -> str:
        """The optimizer litgpt builds: for quantized training (``quantize`` set) an AdamW becomes bitsandbytes'
        PagedAdamW (``litgpt.utils.instantiate_bnb_optimizer``); otherwise the recipe's."""
        if self.quantize and "AdamW" in self.optimizer:
            return "bitsandbytes.optim.PagedAdamW"
        return self.optimizer

    @property
    def lora(self) -> bool:
        """Whether the run trains LoRA adapters (lora and qlora)."""
        return self.command == "finetune_lora"


def lora_of(run) -> tuple:
    """(rank, targets) of a run that trains LoRA adapters (a :class:`Settings` or a planned input: anything with
    ``lora``, ``lora_r`` and ``lora_targets``), () for full fine-tuning: what the kernel model traces a step with."""
    return (run.lora_r, tuple(run.lora_targets)) if run.lora else ()


def from_args(recipe, args: dict) -> Settings:
    """Settings of a recipe from its resolved litgpt arguments (either resolver's). The method is the resolved run's:
    a LoRA recipe given ``--quantize`` is QLoRA (litgpt's ``finetune_lora`` either way), a QLoRA one given
    ``--quantize null`` LoRA."""
    method = recipe.method
    if recipe.command == "finetune_lora":
        method = "qlora" if args.get("quantize") else "lora"
    return settings_of(args, method=method, command=recipe.command, recipe=recipe.key)


def settings_of(args: dict, *, method: str, command: str, recipe: str = "") -> Settings:
    """Settings from resolved litgpt arguments, given the method and litgpt command that run them."""
    train = args.get("train") or {}
    data = args.get("data")
    data_class, data_init = None, {}
    if isinstance(data, dict):
        data_class, data_init = data.get("class_path"), data.get("init_args") or {}
    elif isinstance(data, str):
        data_class = data if "." in data else f"litgpt.data.{data}"
    opt = args.get("optimizer") or "AdamW"
    opt_init = (opt.get("init_args") or {}) if isinstance(opt, dict) else {}
    lora = command == "finetune_lora"
    devices = args.get("devices", 1)
    return Settings(
        recipe=recipe,
        method=method,
        command=command,
        checkpoint_dir=str(args.get("checkpoint_dir") or ""),
        precision=args.get("precision"),
        quantize=args.get("quantize"),
        devices=int(devices) if str(devices).lstrip("-").isdigit() else 1,  # else refused by the range checks
        num_nodes=int(nodes) if str(nodes := args.get("num_nodes") or 1).lstrip("-").isdigit() else 1,
        micro_batch_size=train.get("micro_batch_size"),
        global_batch_size=train.get("global_batch_size"),
        max_steps=train.get("max_steps"),
        epochs=train.get("epochs"),
        lr_warmup_steps=train.get("lr_warmup_steps"),
        max_seq_length=train.get("max_seq_length"),
        lora_r=args.get("lora_r") if lora else None,
        lora_targets=tuple(t for t in LORA_TARGETS if lora and args.get(f"lora_{t}")),
        optimizer=str(opt.get("class_path") if isinstance(opt, dict) else opt),
        optimizer_init=tuple(
            sorted((str(k), v) for k, v in opt_init.items() if isinstance(v, (bool, int, float, str)))
        ),
        data_class=data_class,
        data_path=None if data_init.get("json_path") is None else str(data_init["json_path"]),
        val_split_fraction=held_out_share(args),
        args=args,
    )


def resolve(recipe, overrides: list[str] | None = None) -> Settings:
    """Settings of a recipe with litgpt-style overrides (the fast resolver)."""
    return from_args(recipe, resolve_args(recipe, overrides or []))


# ---------------------------------------------------------------------------------------------------------------
# The fast resolver


def overridden(recipe, overrides: list[str], keys) -> dict:
    """{dotted key: the value given} for each of ``keys`` whose value ``overrides`` change from the recipe's, both
    resolved as litgpt resolves them (:func:`resolve_args`: a group given whole or a ``--config`` file included)."""
    given, plain = resolve_args(recipe, overrides), resolve_args(recipe, [])
    return {key: dotted(given, key) for key in keys if dotted(given, key) != dotted(plain, key)}


def dotted(tree: dict, key: str, default=None):
    """The value at a dotted key (``train.micro_batch_size``) in litgpt's nested arguments, reading the ``init_args``
    of class_path blocks too (``data.val_split_fraction``); ``default`` where there is none."""
    node = tree
    for part in key.split("."):
        if isinstance(node, dict) and "init_args" in node and part not in node:
            node = node["init_args"]
        if not isinstance(node, dict) or part not in node:
            return default
        node = node[part]
    return node


def resolve_args(recipe, overrides: list[str]) -> dict:
    """litgpt's arguments for ``recipe`` + ``overrides``: litgpt's defaults, the recipe's keys, the overrides
    (``--train.micro_batch_size 8``, ``--key=value``, ``--data Alpaca``); values are read as YAML, as litgpt's
    parser reads them. InputError for an override without a value or one litgpt's command has no argument for."""
    defaults = command_defaults(recipe.command)  # read only: the arguments the command takes
    out = litgpt_defaults(recipe.command)
    _merge(out, copy.deepcopy(recipe.config))
    it = iter(overrides)
    for arg in it:
        if not arg.startswith("--"):
            raise InputError(f"override {arg!r} is not an option; fix: --dotted.key VALUE, e.g. --train.max_steps 5")
        key, sep, value = arg[2:].partition("=")
        if not sep:
            value = next(it, None)
            if value is None:
                now = dotted(out, key)
                example = f"{now} (its value now)" if isinstance(now, (str, int, float)) else "VALUE"
                raise InputError(f"override --{key} has no value; fix: give one, e.g. --{key} {example}")
        if key == "config":  # litgpt's own: a YAML file whose keys apply where it stands among the overrides
            _merge(out, _config_file(value, defaults, recipe))
            continue
        try:  # plain data, as a file's: no alias, no deep nesting (a value that is not YAML stays text)
            parsed = yaml_input.loads(value, f"--{key}")
        except InputError:
            parsed = value
        if key == "checkpoint_dir" or key == "out_dir":
            parsed = value  # paths stay text
        _known(key, defaults, recipe, value=parsed)
        group = dotted(out, key)
        if key == "data" and isinstance(parsed, str):  # `--data Alpaca`: switch the class, as jsonargparse does
            out["data"] = _switch_data_class(out.get("data"), parsed)
        elif isinstance(parsed, dict) and isinstance(group, dict) and "class_path" not in {**group, **parsed}:
            _merge(group, parsed)  # `--train '{epochs: 2}'`: into the group's values, as jsonargparse does
        else:
            _set(out, key.split("."), parsed)
    if isinstance(out.get("data"), dict) and out["data"].get("class_path"):
        out["data"] = {
            "class_path": out["data"]["class_path"],
            "init_args": {**data_defaults(out["data"]["class_path"]), **(out["data"].get("init_args") or {})},
        }
    return out


_UNSET = object()


def _known(key: str, defaults: dict, recipe, where: str | None = None, value=_UNSET) -> None:
    """InputError unless litgpt's command has an argument ``key`` (dotted): a top-level one, or a field of one of its
    argument groups (``train``, ``eval``, ``log``), a group given whole as a mapping (``value``, where known);
    ``data`` and ``optimizer`` take their class's own fields. ``where``: the --config file that set it (else an
    override on the command line)."""
    top, _, field = key.partition(".")
    group = defaults.get(top)
    shown = f"{where or display_path(recipe.path)}: {'' if where else '--'}{key}"
    if top not in defaults or (field and isinstance(group, dict) and field.split(".")[0] not in group):
        raise InputError(
            f"{shown}: litgpt {recipe.command} has no such argument; fix: remove it or correct its spelling (see: "
            f"litgpt {recipe.command} --help)"
        )
    if not field and isinstance(group, dict) and value is not _UNSET and not isinstance(value, dict):
        raise InputError(
            f"{shown}: a group of fields ({', '.join(sorted(group))}), got {str(value)[:40]!r}; fix: give a field, "
            f"e.g. --{top}.{next(iter(sorted(group)))} VALUE"
        )


def _config_file(path: str, defaults: dict, recipe) -> dict:
    """A ``--config FILE`` override's mapping (a bounded, regular YAML file, relative paths from the project as the
    run's litgpt reads them), each key one litgpt's command has."""
    config = yaml_input.load_mapping(project_path(path), "--config", path)
    for key, value in config.items():
        _known(str(key), defaults, recipe, where=path, value=value)
        if isinstance(value, dict) and isinstance(defaults.get(key), dict):
            for sub in value:
                _known(f"{key}.{sub}", defaults, recipe, where=path)
    return config


DATA_MODULE_SIZES = {
    "litgpt.data.Alpaca": (
        52_002,
        "Stanford Alpaca's 52,002 instructions (litgpt downloads a cleaned copy of about the same size)",
    ),
    "litgpt.data.AlpacaGPT4": (52_002, "Alpaca's 52,002 instructions answered by GPT-4"),
    "litgpt.data.Alpaca2k": (2_000, "the 2,000-sample Alpaca subset (mhenrichsen/alpaca_2k_test), the lab's data"),
    "litgpt.data.LIMA": (1_030, "LIMA's 1,030 training conversations"),
}
"""Records of the litgpt data modules that download their data (before the validation split), for the warm-up
check and the runtime projection when the file is not here."""


def data_size(args: dict) -> tuple[int | None, str]:
    """(records before the validation split, where the figure comes from) for resolved args: the JSON file's
    records when it is here, a known litgpt data module's size, else (None, why)."""
    data = args.get("data")
    if not isinstance(data, dict):
        return None, "litgpt's default data module (Alpaca) is not named"
    init = data.get("init_args") or {}
    path = init.get("json_path")
    if path is not None:
        f = project_path(path)
        if not f.exists():
            return None, f"{path} is not here"
        try:
            return dataset_records.count(f)
        except InputError as e:  # validation names it as a problem of data.json_path
            return None, str(e)
    known = DATA_MODULE_SIZES.get(str(data.get("class_path")))
    if known:
        return known
    return None, f"{data.get('class_path')}: size not known here"


def _switch_data_class(old, name: str) -> dict:
    """``--data NAME`` on top of a recipe's data block: the new class, keeping the old init_args it accepts
    (jsonargparse's rule), its own defaults for the rest."""
    class_path = name if "." in name else f"litgpt.data.{name}"
    accepted = data_defaults(class_path)
    kept = (
        {k: v for k, v in ((old or {}).get("init_args") or {}).items() if k in accepted}
        if isinstance(old, dict)
        else {}
    )
    return {"class_path": class_path, "init_args": kept}


def _merge(base: dict, top: dict) -> None:
    for k, v in top.items():
        if isinstance(v, dict) and isinstance(base.get(k), dict) and "class_path" not in v:
            _merge(base[k], v)
        else:
            base[k] = v


def _set(node: dict, parts: list[str], value) -> None:
    for part in parts[:-1]:
        if part not in node and isinstance(node.get("init_args"), dict):
            node = node["init_args"]
        if not isinstance(node.get(part), dict):
            node[part] = {}
        node = node[part]
    if parts[-1] not in node and isinstance(node.get("init_args"), dict):
        node = node["init_args"]
    node[parts[-1]] = value


def litgpt_defaults(command: str) -> dict:
    """The defaults of ``litgpt <command>``'s arguments, as plain data (a fresh copy)."""
    return copy.deepcopy(command_defaults(command))


def override_text(value) -> str:
    """A value as litgpt's command line writes it (YAML: null, true/false, JSON for lists and mappings)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, dict)):
        return json.dumps(value)
    return str(value)


def to_overrides(values: dict) -> list[str]:
    """{'train.micro_batch_size': 8} -> ['--train.micro_batch_size', '8'] (litgpt style; what resolve_args reads)."""
    out = []
    for key, value in values.items():
        out += [f"--{key}", override_text(value)]
    return out
