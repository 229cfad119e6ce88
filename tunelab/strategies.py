"""Strategy settings (``configs/strategies/*.yaml``): one dataclass, every knob documented, unknown keys refused."""

from __future__ import annotations

import contextlib
import json
import shutil
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

from tunelab import yaml_input
from tunelab.errors import InputError
from tunelab.paths import CONFIGS_DIR, SAFE_NAME


class StrategyError(InputError):
    """A strategy file or combination that cannot run, with the reason."""


class Kind:
    """What one strategy (a file's ``name``) is apart from its knobs: how it is named, what it refuses, how the loop
    accumulates and saves under it. One device's answers; each kind below overrides what differs. The model is
    wrapped by :func:`tunelab.parallel.wrap`, planned by :mod:`tunelab.plan.model.strategies`."""

    divides = False
    """Whether the ranks divide the work and synchronise (a one-device kind refuses several)."""
    sharded = False
    """Whether each rank holds a shard of the model: the loop gathers the state dict before it saves."""
    engine = False
    """Whether the strategy wraps the model with its optimizer (DeepSpeed's engine)."""
    prefetches = False
    """Whether a file's ``backward_prefetch`` applies (FSDP1's units prefetch the next one's parameters)."""

    def describe(self, config: StrategyConfig) -> str:
        """The strategy in words, as records and reports name it."""
        return config.name + (f" ({', '.join(config.fast)})" if config.fast else "")

    def world_problem(self, config: StrategyConfig, world: int, per_node: int | None) -> str | None:
        """Why the ranks of this world would never average a gradient (None: they do)."""
        if world > 1 and not self.divides:
            return (
                f"name: {config.name} runs one device, not {world} (each rank would train its own copy and never "
                "average a gradient); fix: --devices 1, or a strategy that synchronises (ddp, fsdp, fsdp2, "
                "deepspeed-*)"
            )
        return None

    def problem(self, config: StrategyConfig) -> str | None:
        """Why a file of this kind cannot run as written (None: it can)."""
        return None

    def holds_shard(self, config: StrategyConfig) -> bool:
        """Whether each rank holds only its shard of the weights (the loop's saves gather them)."""
        return self.sharded

    def chunks_head(self, config: StrategyConfig) -> bool:
        """Whether LoRA's head may run in 128-token chunks as litgpt's loop runs it."""
        return True

    def accumulating(self, model, accumulating: bool):
        """The context a micro batch runs in: gradient sync skipped while ``accumulating`` where the wrapper can."""
        return contextlib.nullcontext()


class DDPKind(Kind):
    """DDP (``name: ddp``): every rank the whole model; gradient sync skipped under ``no_sync()`` while accumulating."""

    divides = True

    def describe(self, config: StrategyConfig) -> str:
        return "DDP" + (f" ({', '.join(config.fast)})" if config.fast else "")

    def accumulating(self, model, accumulating: bool):
        return model.no_sync() if accumulating and hasattr(model, "no_sync") else contextlib.nullcontext()


class FSDP1Kind(DDPKind):
    """FSDP1 (``name: fsdp``): its sharding variants and their refusals, ``no_sync()`` as DDP."""

    sharded = prefetches = True

    def describe(self, config: StrategyConfig) -> str:
        prefetch = {None: ", no backward prefetch", "BACKWARD_POST": ", backward prefetch post"}
        return (
            f"FSDP {config.sharding_strategy}, wrap {config.auto_wrap}"
            + (", activation checkpointing" if config.activation_checkpointing else "")
            + prefetch.get(config.backward_prefetch, "")
            + (", CPU offload" if config.cpu_offload else "")
        )

    def world_problem(self, config: StrategyConfig, world: int, per_node: int | None) -> str | None:
        if config.sharding_strategy == "HYBRID_SHARD" and world > 1 and per_node == 1:
            return (
                f"sharding_strategy: HYBRID_SHARD with 1 device per node ({world} nodes): it shards within a node, "
                "and over a group of one torch's FSDP1 switches to NO_SHARD and averages no gradient across nodes; "
                "fix: --devices 2 or more per node, or the ddp strategy (one device per node)"
            )
        return None

    def problem(self, config: StrategyConfig) -> str | None:
        if config.sharding_strategy not in SHARDINGS:
            return f"sharding_strategy {config.sharding_strategy!r} is not a torch ShardingStrategy"
        return None


class FSDP2Kind(Kind):
    """FSDP2 (``name: fsdp2``): gradient sync turned off on the module while accumulating."""

    divides = sharded = True

    def describe(self, config: StrategyConfig) -> str:
        return f"FSDP2 fully_shard (reshard_after_forward={config.reshard_after_forward})"

    def accumulating(self, model, accumulating: bool):
        model.set_requires_gradient_sync(not accumulating)
        return contextlib.nullcontext()


class DeepSpeedKind(Kind):
    """DeepSpeed ZeRO (``name: deepspeed``): its engine wraps the model with the optimizer."""

    divides = engine = True

    def describe(self, config: StrategyConfig) -> str:
        off = [n for n, on in (("optimizer", config.offload_optimizer), ("params", config.offload_params)) if on]
        return f"DeepSpeed ZeRO-{config.zero_stage}" + (f", offload {'+'.join(off)} to CPU" if off else "")

    def problem(self, config: StrategyConfig) -> str | None:
        return "offload_params needs zero_stage: 3" if config.offload_params and config.zero_stage != 3 else None

    def holds_shard(self, config: StrategyConfig) -> bool:
        return config.zero_stage == 3

    def chunks_head(self, config: StrategyConfig) -> bool:
        """ZeRO-3 hangs when a module (the chunked LoRA head) runs a data-dependent number of times per forward (its
        prefetch trace changes between steps): there the head is not chunked (same loss)."""
        return config.zero_stage != 3


SHARDINGS = ("FULL_SHARD", "SHARD_GRAD_OP", "HYBRID_SHARD", "NO_SHARD")
"""torch's FSDP1 sharding strategies."""
KINDS: dict[str, Kind] = {
    "single": Kind(),
    "ddp": DDPKind(),
    "fsdp": FSDP1Kind(),
    "fsdp2": FSDP2Kind(),
    "deepspeed": DeepSpeedKind(),
}
"""Every strategy a file can name, by its ``name`` (the registry: the one place a name is read)."""
NAMES = tuple(KINDS)
"""The ``name`` values a strategy file takes."""


@dataclass
class StrategyConfig:
    """One strategy file: the strategy and its knobs (every field documented; unknown keys refused)."""

    name: str
    """single, ddp, fsdp (FSDP1 FullyShardedDataParallel), fsdp2 (fully_shard) or deepspeed."""
    description: str = ""
    """Free text for reports."""
    # DDP
    bucket_cap_mb: int = 25
    """DDP: gradient bucket size in MB (larger: fewer all-reduces, more memory)."""
    gradient_as_bucket_view: bool = False
    """DDP: gradients are views into the buckets (saves one gradient copy)."""
    # FSDP1
    sharding_strategy: str = "FULL_SHARD"
    """FSDP: FULL_SHARD (params+grads+states, like ZeRO-3), SHARD_GRAD_OP (grads+states, ZeRO-2), HYBRID_SHARD
    (full shard within a node, replicate across nodes), NO_SHARD (DDP)."""
    auto_wrap: str = "block"
    """FSDP: 'block' wraps each litgpt transformer Block as a unit; 'none' makes the whole model one unit."""
    activation_checkpointing: bool = False
    """Recompute each block's activations in backward (True reduces memory, costs ~one extra forward)."""
    backward_prefetch: str | None = "BACKWARD_PRE"
    """FSDP: BACKWARD_PRE, BACKWARD_POST or null (prefetch the next unit's parameters during backward)."""
    cpu_offload: bool = False
    """FSDP: keep sharded parameters (and gradients) in host RAM."""
    limit_all_gathers: bool = True
    """FSDP: rate-limit all-gathers (bounds memory of prefetched units)."""
    mixed_precision: dict | None = None
    """FSDP: MixedPrecision dtypes, e.g. {param_dtype: bfloat16, reduce_dtype: float32, buffer_dtype: bfloat16}."""
    # FSDP2
    reshard_after_forward: bool = True
    """FSDP2: free gathered parameters after forward (True: ZeRO-3-like; False: ZeRO-2-like, faster, more memory)."""
    # DeepSpeed
    zero_stage: int = 2
    """DeepSpeed ZeRO stage: 1 optimizer states, 2 + gradients, 3 + parameters sharded."""
    offload_optimizer: bool = False
    """DeepSpeed: optimizer states (and fp32 master weights) in host RAM."""
    offload_params: bool = False
    """DeepSpeed ZeRO-3: parameters in host RAM."""
    cpu_adam: bool = False
    """DeepSpeed: use DeepSpeedCPUAdam for offloaded states (compiled op, much faster) instead of torch AdamW."""
    reduce_bucket_size: int = 200_000_000
    """DeepSpeed: elements per gradient reduce bucket (memory vs communication efficiency)."""
    allgather_bucket_size: int = 200_000_000
    """DeepSpeed: elements per all-gather bucket."""
    max_live_parameters: int = 1_000_000_000
    """DeepSpeed ZeRO-3 (``stage3_max_live_parameters``, its default): parameters its prefetch may hold gathered;
    with the reuse distance, what stays gathered from the forward into the backward (memory vs regathering)."""
    max_reuse_distance: int = 1_000_000_000
    """DeepSpeed ZeRO-3 (``stage3_max_reuse_distance``, its default): a parameter used again within this many
    parameters' fetches is kept gathered; about half of it stays gathered at the forward's end."""
    # Speed switches of tunelab's loop (any strategy; configs/strategies/fast.yaml turns them all on for one GPU)
    pretokenize: bool = False
    """Tokenise every sample once before the loop (litgpt's own dataset code) instead of in a loader per batch, and
    take the batch's token counts from the tokenised lengths (no tensor read)."""
    prefetch: bool = False
    """Copy the next batch to the GPU (pinned memory, a side stream) while the current one trains."""
    log_interval: int | None = None
    """Read the loss from the device every N iterations (accumulated there in between, with the token counts as plain
    ints): no host synchronisation in between. None: every iteration, as litgpt's recipes log (a ``.item()`` each)."""
    fused_optimizer: bool = False
    """torch's fused AdamW / Adam kernel (``fused=True``: one kernel for all parameters) in place of the recipe's
    for-each implementation; the same update, computed in one pass."""
    optimizer: str | None = None
    """A memory option that changes the optimizer's maths: ``adamw8bit`` (bitsandbytes 8-bit states),
    ``paged_adamw`` or ``paged_adamw8bit`` (states in CUDA unified memory), with the recipe's learning rate, betas
    and weight decay. None: the recipe's optimizer."""
    compile: str | None = None
    """``blocks``: ``torch.compile`` each transformer block (regional compilation: one compiled graph reused by every
    block, so compilation takes seconds; its time is the first iteration's, reported apart). None: eager."""
    pad_to_multiple: int | None = None
    """Static shapes for compiled code: pad each micro batch's length on to a multiple of N tokens (never past the
    model's max_seq_length) and fill a short last micro batch with rows of padding (litgpt's own pad id and ignore
    index: the loss and gradients are unchanged, only padded work grows). With ``compile: blocks`` every shape the
    epoch plan holds is compiled before the first iteration, so the training loop never recompiles. None: litgpt's
    shapes (the longest sample of each micro batch)."""
    length_grouping: int | None = None
    """Form micro batches from samples of similar length: litgpt's order cut into windows of N micro batches, each
    window sorted by length, the micro batches shuffled. Every sample once per epoch, attention and loss unchanged;
    the sample order (which samples share a micro batch) changes. None: litgpt's order."""
    liger: str | None = None
    """Liger-Kernel's fused Triton kernels in litgpt's model (one device, tunelab.run.fused): ``loss`` fuses the
    lm_head with the cross-entropy, so the logits (micro x sequence x vocabulary, fp32 for the loss) are never
    materialised; ``all`` also runs Liger's RMSNorm and SwiGLU (not with ``compile: blocks``, whose inductor kernels
    already fuse them). Same maths as litgpt's modules (fp32 softmax and norms); off on a CPU (said in the record),
    where Triton's kernels cannot run. None: litgpt's modules and loss."""
    extra: dict = field(default_factory=dict)
    """Unused; reserved."""

    @property
    def regroups(self) -> bool:
        """Whether its loop forms micro batches its own way (by length, or padded to a multiple): their padding is
        not litgpt's."""
        return bool(self.length_grouping or self.pad_to_multiple)

    @property
    def fast(self) -> list[str]:
        """The speed switches that are on, in words (empty: tunelab's loop runs as litgpt's does)."""
        return [
            w
            for w, on in (
                ("tokenised once", self.pretokenize),
                ("prefetch", self.prefetch),
                (f"loss read every {self.log_interval} iterations", self.log_interval),
                ("fused optimizer", self.fused_optimizer),
                (f"optimizer {self.optimizer}", self.optimizer),
                (f"compiled {self.compile}", self.compile),
                (f"lengths padded to multiples of {self.pad_to_multiple}", self.pad_to_multiple),
                (f"length-grouped micro batches (windows of {self.length_grouping})", self.length_grouping),
                (f"Liger kernels ({self.liger})", self.liger),
            )
            if on
        ]

    def settings(self) -> dict:
        """Every key as loaded, the description left out, as JSON keeps it: what a record stores, so that a record
        made under other settings (a key its :meth:`describe` does not show) is never taken for this strategy's."""
        return json.loads(json.dumps({k: v for k, v in asdict(self).items() if k != "description"}))

    @property
    def kind(self) -> Kind:
        """What this file's strategy is apart from its knobs (:data:`KINDS`)."""
        return KINDS[self.name]

    def describe(self) -> str:
        """The strategy in words, as records and reports name it."""
        return self.kind.describe(self)

    def label(self) -> str:
        """The strategy in a few words, for a plan's first line: its description without the speed switches, which
        ``, fast path`` stands for."""
        text = self.describe().removesuffix(f" ({', '.join(self.fast)})")
        return text + (", fast path" if self.fast else "")

    def check_world(self, world: int, source: str = "", per_node: int | None = None) -> None:
        """Refuse a world on which the ranks would never average a gradient (:meth:`Kind.world_problem`: several
        devices under a one-device strategy, HYBRID_SHARD with one device per node). One check for plan, advise,
        run and sweeps."""
        if why := self.kind.world_problem(self, world, per_node):
            raise StrategyError(f"{source}: {why}" if source else why)

    def averages_gradients(self, world: int, per_node: int | None = None) -> bool:
        """Whether the ranks of this world average their gradients under this strategy (:meth:`check_world` passes)."""
        try:
            self.check_world(world, per_node=per_node)
        except StrategyError:
            return False
        return True

    def check(self, args: dict, device: str | None = None) -> None:
        """Refuse, with the reason, what this stack cannot run (``device``: 'cpu' or 'cuda' when known)."""
        devices = args.get("devices")
        self.check_world(world_of(args), per_node=devices if isinstance(devices, int) else None)
        if self.optimizer and device == "cpu":
            raise StrategyError(
                f"optimizer: {self.optimizer} is a bitsandbytes optimizer, which needs a CUDA GPU; "
                "fix: leave optimizer out on CPU (fused_optimizer: true keeps the recipe's AdamW)"
            )
        if self.compile and device == "cpu" and not (shutil.which("c++") or shutil.which("g++")):
            raise StrategyError(
                "compile: blocks on CPU: torch.compile's inductor builds C++ kernels and there is no "
                "C++ compiler here; fix: install g++, or leave compile out"
            )
        if args.get("quantize"):
            raise StrategyError(
                f"quantize={args['quantize']} under {self.name}: litgpt quantizes through Lightning's "
                "BitsandbytesPrecision, which it allows on one device only, and sharding 4-bit weights (FSDP-QLoRA) "
                "needs bitsandbytes quant_storage wiring that litgpt lacks; fix: no strategy file (QLoRA runs on one "
                "device with `litgpt finetune_lora`), or a LoRA recipe under this strategy"
            )
        if why := self.kind.problem(self):
            raise StrategyError(why)
        if self.liger:
            self._check_liger()
        if args.get("precision") in ("16-mixed",):
            raise StrategyError(
                "precision: 16-mixed needs a gradient scaler, which litgpt's Fabric keeps and tunelab's loop (every "
                "strategy file) does not; fix: bf16-mixed or bf16-true where the GPU computes bfloat16, else "
                "32-true, or one device without a strategy file (litgpt's own loop)"
            )

    def _check_liger(self) -> None:
        if self.kind.divides:
            raise StrategyError(
                f"liger: {self.liger} under {self.name}: the fused loss calls the model's blocks and head itself, "
                "past the forward that DDP, FSDP and DeepSpeed wrap; fix: use it with name: single (one device)"
            )
        if self.liger == "all" and self.compile:
            raise StrategyError(
                "liger: all with compile: blocks: inductor already fuses the norms and SwiGLU of compiled blocks, "
                "and Liger's kernels inside them are not what it was checked with; fix: liger: loss with compile, "
                "or liger: all with compile: null"
            )


def world_of(settings: dict) -> int:
    """Ranks named by a mapping of litgpt settings (``devices`` x ``num_nodes``; a value that is not a count, such as
    litgpt's "auto", counts as 1)."""
    devices, nodes = settings.get("devices"), settings.get("num_nodes")
    return (devices if isinstance(devices, int) else 1) * (nodes if isinstance(nodes, int) else 1)


def load_strategy(path: str | Path) -> StrategyConfig:
    """A strategy file from a path or a name under configs/strategies/, type- and range-checked;
    StrategyError naming the file and key."""
    known = ", ".join(sorted(x.stem for x in (CONFIGS_DIR / "strategies").glob("*.yaml")))
    if not str(path).strip():  # Path("") is the working directory
        raise StrategyError(f"no strategy named (an empty name); fix: give a YAML path or one of: {known}")
    p = Path(path)
    try:
        here = p.exists()
    except OSError as e:  # a name too long for the file system, ...
        raise StrategyError(
            f"strategy {str(path)[:80]!r}: {e.strerror}; fix: give a YAML path or one of: {known}"
        ) from None
    named = CONFIGS_DIR / "strategies" / f"{path}.yaml"
    if not here and SAFE_NAME.fullmatch(str(path)) and named.is_file():  # a name: only a plain one, never a path
        p, here = named, True
    if not here:  # what is there but is no regular file (a FIFO, a directory) is refused by the reader
        raise StrategyError(f"no strategy {str(path)[:80]!r}; fix: give a YAML path or one of: {known}")
    try:
        raw = yaml_input.load_mapping(p, "a strategy")
    except InputError as e:
        raise StrategyError(f"strategy: {e}") from None  # e names the file
    return strategy_from_mapping(raw, p)


def strategy_from_mapping(raw: dict, p) -> StrategyConfig:
    """A strategy from its keys (a file's, or a record's ``strategy_settings``), type- and range-checked;
    StrategyError naming ``p`` (where they came from) and the key."""
    if not isinstance(raw, dict):
        raise StrategyError(
            f"{p}: not a mapping of strategy keys; fix: give name: and the keys configs/strategies/ use"
        )
    allowed = {f.name for f in fields(StrategyConfig)}
    bad = set(raw) - allowed
    if bad:
        raise StrategyError(f"{p}: unknown key(s) {sorted(bad)}; fix: remove them or use one of {sorted(allowed)}")
    if raw.get("name") not in NAMES:
        raise StrategyError(f"{p}: name: {str(raw.get('name'))[:40]!r} is not a strategy; fix: one of {NAMES}")
    for f in fields(StrategyConfig):
        if f.name in raw and not _type_ok(raw[f.name], f.type):
            raise StrategyError(
                f"{p}: {f.name}: {raw[f.name]!r} is not a {f.type}; fix: see the field's "
                "description in tunelab/strategies.py"
            )
    for key, allowed_values in CHOICES.items():
        if key in raw and raw[key] not in allowed_values:
            raise StrategyError(f"{p}: {key}: {str(raw[key])[:40]!r} is not a choice; fix: one of {allowed_values}")
    for key, high in RANGES.items():
        if raw.get(key) is not None and not 1 <= raw[key] <= high:
            raise StrategyError(f"{p}: {key}: {raw[key]} is out of range; fix: a value from 1 to {high:,}")
    for key, value in (raw.get("mixed_precision") or {}).items():
        if key not in MIXED_PRECISION_KEYS or value not in MIXED_PRECISION_DTYPES:
            raise StrategyError(
                f"{p}: mixed_precision: {str(key)[:40]}: {str(value)[:40]!r} is not a setting; fix: keys "
                f"{MIXED_PRECISION_KEYS}, values one of {MIXED_PRECISION_DTYPES}"
            )
    return StrategyConfig(**raw)


RANGES = {
    "bucket_cap_mb": 100_000,
    "reduce_bucket_size": 10**11,
    "allgather_bucket_size": 10**11,
    "max_live_parameters": 10**13,
    "max_reuse_distance": 10**13,
    "log_interval": 1_000_000,
    "length_grouping": 10_000,
    "pad_to_multiple": 65_536,
}
"""Integer keys and their largest accepted value (the smallest is 1): a 1e30 bucket fails in the ranks."""
MIXED_PRECISION_KEYS = ("param_dtype", "reduce_dtype", "buffer_dtype")
MIXED_PRECISION_DTYPES = ("float32", "bfloat16", "float16")
"""FSDP MixedPrecision: the keys torch takes and the dtypes the loop maps to torch dtypes."""


BNB_OPTIMIZERS = {"adamw8bit": "AdamW8bit", "paged_adamw": "PagedAdamW", "paged_adamw8bit": "PagedAdamW8bit"}
"""A strategy's ``optimizer`` memory options: the bitsandbytes classes they name."""


CHOICES = {
    "sharding_strategy": ("FULL_SHARD", "SHARD_GRAD_OP", "HYBRID_SHARD", "NO_SHARD"),
    "auto_wrap": ("block", "none"),
    "backward_prefetch": ("BACKWARD_PRE", "BACKWARD_POST", None),
    "zero_stage": (1, 2, 3),
    "optimizer": (*BNB_OPTIMIZERS, None),
    "compile": ("blocks", None),
    "liger": ("loss", "all", None),
}
"""Keys whose values come from a fixed set."""

_TYPES = {"int": (int,), "bool": (bool,), "str": (str,), "dict": (dict,), "None": (type(None),)}


def _type_ok(value, annotation: str) -> bool:
    """Whether ``value`` (from YAML) matches a field annotation such as 'int' or 'dict | None' (bool is no int)."""
    allowed = tuple(t for part in str(annotation).split("|") for t in _TYPES.get(part.strip(), (object,)))
    if isinstance(value, bool) and bool not in allowed:
        return False
    return isinstance(value, allowed)
