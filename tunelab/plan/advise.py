"""``tunelab advise``: every configuration of a model worth renting, planned and ranked.

For each GPU asked about, each method, precision, micro batch, activation checkpointing, strategy file and device
count: the planner's memory (:func:`tunelab.plan.model.memory.predict` on the recipe's case with those fields
replaced, one recipe resolution per method) and its time (:meth:`tunelab.plan.model.runtime.Terms.by_cause`, with
the communication of :mod:`tunelab.plan.model.comm`), priced from ``configs/hardware/prices.yaml``. Only what fits
with ``--headroom`` to spare is ranked, by time and by cost; times within the model's error of the best are marked
as ties a measurement must decide. ``--write DIR`` leaves the chosen recipe and its launch command
(docs/commands.md)."""

from __future__ import annotations

import copy
import dataclasses
import datetime
import functools
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import yaml

from tunelab import hardware, recipes, yaml_input
from tunelab.data import records as dataset_records
from tunelab.data.lengths import (
    LAB_PADDED_TOKENS_PER_SAMPLE,
    default_lengths,
    module_lengths,
    padded_tokens_per_sample,
    sample_lengths,
)
from tunelab.errors import InputError
from tunelab.files import unwritable_dir, write_text_atomic
from tunelab.models import load_config
from tunelab.paths import CONFIGS_DIR, display_path
from tunelab.plan.model import comm, memory, runtime
from tunelab.plan.model import strategies as planned_strategies
from tunelab.plan.recipe import plan_settings, strategy_fields, train_samples
from tunelab.recipes import Recipe
from tunelab.settings import DATA_MODULE_SIZES, from_args, overridden, resolve, resolve_args, split_sizes
from tunelab.strategies import StrategyConfig, StrategyError, load_strategy
from tunelab.units import GB, duration, energy, figure
from tunelab.validate import PRECISIONS

PRICE_TABLE = CONFIGS_DIR / "hardware" / "prices.yaml"
MICRO_BATCHES = (1, 2, 4, 8, 16, 32, 64)
"""Micro batches tried (per device)."""
STRATEGIES = ("ddp", "fsdp", "deepspeed-zero2", "deepspeed-zero3")
"""configs/strategies files tried on several devices (and fsdp-hybrid on several nodes). Offload is tried only when
asked (``--strategies deepspeed-zero3-offload``): the runtime has no term for its optimizer step on the CPU."""


@dataclass(frozen=True)
class Price:
    """An hourly price per GPU, where it comes from and when."""

    usd_per_hour: float
    source: str
    date: str


def prices(path=PRICE_TABLE) -> dict[str, Price]:
    """{GPU name: Price} from a price file (``prices: {GPU: {usd_per_hour, source, date}}``), checked."""
    raw = yaml_input.load_mapping(path, "a price table").get("prices")
    if not isinstance(raw, dict):
        raise InputError(f"{path}: prices: a mapping of GPU names to {{usd_per_hour, source, date}}")
    out = {}
    for name, row in raw.items():
        ok = isinstance(row, dict) and set(row) == {"usd_per_hour", "source", "date"}
        usd = row.get("usd_per_hour") if isinstance(row, dict) else None
        if not ok or type(usd) not in (int, float) or not 0 < usd < 1e4:
            raise InputError(
                f"{path}: prices: {name}: give usd_per_hour (a positive number), source and date; fix: see "
                "configs/hardware/prices.yaml"
            )
        if (
            not isinstance(row["source"], str)
            or not row["source"].strip()
            or not isinstance(row["date"], (str, datetime.date))
        ):
            raise InputError(
                f"{path}: prices: {name}: source and date are text (where the price comes from, and when; a date "
                f"may be a YAML date); got {row['source']!r}, {row['date']!r}"
            )
        if str(name) not in hardware.table():  # a misspelt name would leave its GPU unpriced without a word
            raise InputError(
                f"{path}: prices: {name}: not a GPU of configs/hardware/gpus.yaml; fix: one of "
                f"{', '.join(hardware.table())}"
            )
        out[str(name)] = Price(float(usd), str(row["source"]), str(row["date"]))
    return out


@dataclass(frozen=True)
class Workload:
    """What is to be trained: samples and how many tokens each takes once padded, from --tokens or --data."""

    samples: int
    """Training samples per epoch."""
    epochs: int = 1
    """Passes over them."""
    tokens_per_sample: float = LAB_PADDED_TOKENS_PER_SAMPLE
    """Padded tokens per sample at the lab's micro batch 8 where no lengths are known (--tokens; a litgpt data
    module not here): how many samples a token count makes."""
    lengths: tuple = ()
    """Token lengths of a sample of the data (--data FILE): padding is computed per micro batch from them."""
    longest: int | None = None
    """The longest sample in tokens (the sequence length memory is planned at), or None: the recipe's."""
    how: str = ""
    """Where the figures come from, in words."""
    val_samples: int | None = None
    """Samples litgpt validates on (the data's held-out split), at the recipe's ``eval`` settings; None (--tokens):
    the recipe's own data's split, as ``tunelab plan --tokens`` counts it."""

    def per_sample(self, micro: int, strategy=None, cap: int = 512, vocab_size: int | None = None) -> float:
        """Padded tokens per sample at this micro batch (each micro batch padded to its longest sample): from the
        data's lengths, else from the default length distribution (:func:`tunelab.data.lengths.default_lengths`,
        437 at micro 8 as the lab measured); under a ``strategy`` (a loaded file) that forms its micro batches its
        own way, as its loop forms them (:func:`tunelab.data.lengths.padded_tokens_per_sample`; ``cap``: the sequence
        length no micro batch is padded past; ``vocab_size``: the model's, whose tokenizer scales the default
        lengths)."""
        lengths = self.lengths or default_lengths(cap, vocab_size)
        return padded_tokens_per_sample(list(lengths), micro, strategy, cap)

    @property
    def tokens(self) -> float:
        """Tokens before padding (or as given)."""
        real = sum(self.lengths) / len(self.lengths) if self.lengths else self.tokens_per_sample
        return self.samples * self.epochs * real


def workload_from_tokens(tokens: float, epochs: int = 1) -> Workload:
    """``--tokens N``: N padded tokens per epoch, as samples of the lab's Alpaca length."""
    return Workload(
        samples=max(1, int(tokens / LAB_PADDED_TOKENS_PER_SAMPLE)),
        epochs=epochs,
        how=f"{tokens:,.0f} padded tokens x {epochs} epoch(s) as samples of {LAB_PADDED_TOKENS_PER_SAMPLE} padded tokens "
        "(the lab's Alpaca figure at micro 8; padding per micro batch from the default length distribution)",
    )


def workload_from_data(data: str, recipe: Recipe, epochs: int = 1) -> Workload:
    """``--data FILE`` (a dataset as litgpt reads it: .json, .jsonl, or a directory of train and val files) or
    ``--data MODULE`` (a litgpt data module that downloads its data: its known size, and its records' measured
    lengths where measured, else the lab's tokens per sample)."""
    settings = resolve(recipe, [])
    path = Path(data)
    if path.exists():
        parts = dataset_records.split_files(path)
        records = dataset_records.read(parts[0])
        if len(parts) == 1:  # litgpt's JSON module holds out val_split_fraction of one file, a seeded random
            kept, held_out = split_sizes(len(records), settings.val_split_fraction)  # split: lengths from all of it
        else:
            kept, held_out = len(records), len(dataset_records.read(parts[1]))
        if kept < 1:
            raise InputError(f"--data {data}: no training records; fix: give a dataset with records")
        vocab = load_config(settings.checkpoint_dir).vocab_size  # a tokenizer not here: the published figure
        lengths, longest, how = sample_lengths(
            records, Path(settings.checkpoint_dir), "alpaca", settings.max_seq_length, vocab_size=vocab
        )
        return Workload(
            samples=kept,
            epochs=epochs,
            lengths=tuple(lengths),
            longest=longest,
            how=f"{kept:,} training samples of {data} x {epochs} epoch(s), lengths {how}",
            val_samples=held_out,
        )
    name = data if "." in data else f"litgpt.data.{data}"
    if name not in DATA_MODULE_SIZES:
        known = ", ".join(k.rsplit(".", 1)[1] for k in DATA_MODULE_SIZES)
        raise InputError(
            f"--data {data}: neither a file here nor a data module of known size; fix: a file or one of {known}"
        )
    n, what = DATA_MODULE_SIZES[name]
    held_out = resolve(recipe, ["--data", name]).val_split_fraction or 0  # what `--data NAME` keeps of the recipe
    train, val = split_sizes(n, held_out)
    how = f"{train:,} training samples ({what}; val_split_fraction {held_out:g} held out) x {epochs} epoch(s) x "
    measured = module_lengths(name, load_config(settings.checkpoint_dir).vocab_size, settings.max_seq_length)
    if measured:  # its records' lengths were measured: padding per micro batch from them
        return Workload(samples=train, epochs=epochs, lengths=measured[0], how=how + measured[1], val_samples=val)
    return Workload(
        samples=train,
        epochs=epochs,
        val_samples=val,
        how=how + f"{LAB_PADDED_TOKENS_PER_SAMPLE} padded tokens (the lab's Alpaca figure at micro 8; padding per "
        "micro batch from the default length distribution)",
    )


@dataclass
class Candidate:
    """One configuration, planned."""

    gpu: str
    method: str
    precision: str
    strategy: str
    devices: int
    nodes: int
    micro_batch_size: int
    accumulation: int
    activation_checkpointing: bool
    peak_gb: float
    """Predicted peak allocated per device, GB (1e9 bytes)."""
    fits: bool
    edge: bool
    """Within the planner's edge margin: fragmentation decides; said, not hidden."""
    tight: bool
    """Fits, but leaves less than the headroom free: allocator retries likely (not ranked unless --headroom 0)."""
    hours: float
    """Predicted wall time of the training run (the plan's point estimate: its time by cause where the kernel model
    applies, else the fitted curve)."""
    comm_s_per_step: float
    energy_kwh: float
    """Board power x devices x time: an upper bound."""
    cost_usd: float | None
    """devices x hours x the hourly price (None without a price for the GPU)."""
    recipe: str
    """The recipe it starts from."""
    global_batch_size: int = 0
    """Samples per optimizer step (the recipe's, or micro x devices with a free global batch)."""
    links: str = ""
    """The links its traffic crosses (between a node's GPUs, between nodes); empty on one device."""

    @property
    def world(self) -> int:
        """Devices in all."""
        return self.devices * self.nodes


def precisions(gpu: hardware.GPU, asked: list[str] | None = None, method: str = "full") -> list[str]:
    """The precisions tried on ``gpu``: by default bf16-true and bf16-mixed where it computes bfloat16, 16-mixed
    where not (16-true trains without a loss scaler; 32-true is slower everywhere), but QLoRA, which litgpt refuses
    under mixed precision, 16-true there; ``asked`` replaces them, less the bfloat16 ones on a GPU without
    bfloat16."""
    if asked is None:
        return ["bf16-true", "bf16-mixed"] if gpu.bf16 else ["16-true" if method == "qlora" else "16-mixed"]
    return [p for p in asked if gpu.bf16 or not p.startswith("bf16")]


def candidates(
    recipes: dict[str, Recipe],
    gpus: list[hardware.GPU],
    *,
    tokens: float | None = None,
    workload: Workload | None = None,
    max_devices: int = 8,
    nodes: int = 1,
    interconnect: str | None = None,
    internode: str | None = None,
    price_table: dict[str, Price] | None = None,
    precision: list[str] | None = None,
    strategies: list[str] | None = None,
    global_batch: str = "keep",
    headroom: float = memory.ALLOCATOR_HEADROOM,
    host_us_per_op: float | None = None,
    refused: dict[str, set] | None = None,
) -> list[Candidate]:
    """Every configuration of ``recipes`` ({method: recipe}) on each GPU, planned (fitting or not); ``refused``, where
    given, receives what was not planned, by reason: the strategy files (at a precision) that tunelab's loop refuses,
    the device counts the recipe's global batch does not divide among. Several nodes need ``internode``.

    ``global_batch``: 'keep' the recipe's (micro batches of :data:`MICRO_BATCHES` that divide it) or 'free'
    (no accumulation: global = micro x devices; micro batches up to the planner's largest within ``headroom``).
    ``strategies``: strategy files to try (default: one device alone, :data:`STRATEGIES` on several; 'single'
    names one device without a strategy file). ``host_us_per_op``: microseconds an op of litgpt's loop on the
    launching host where known (else the median machine we measured)."""
    price_table = price_table or {}
    if nodes > 1 and not internode:  # said before any plan, whatever the recipe's global batch
        raise InputError(
            f"--nodes {nodes}: a run on several nodes needs the network between them; fix: give --internode LINK"
        )
    ask = _Ask(
        work=workload or workload_from_tokens(tokens if tokens is not None else 5e7),
        device_counts=[1] + [d for d in (2, 4, 8, 16) if d <= max_devices],
        nodes=nodes,
        strategies=strategies,
        global_batch=global_batch,
        headroom=headroom,
        load=functools.cache(strategy_file),  # each strategy file read once, not per GPU and precision
        host_s_per_op=host_us_per_op * 1e-6 if host_us_per_op else None,
        refused=refused if refused is not None else {},
    )
    out = []
    for gpu in gpus:
        if not any(gpu.peak_tflops.values()) or not gpu.bandwidth_gbs:
            continue
        links = (
            _link(interconnect, gpu, "gpu"),
            comm.lookup(internode, "node", given=True) if internode else None,
            comm.lookup("host-pcie4", "host"),
        )
        for method, recipe in recipes.items():
            for prec in precisions(gpu, precision, method):
                if method == "qlora" and "mixed" in prec:  # litgpt refuses quantization under mixed precision
                    continue
                out += _configurations(ask, _OnGPU(gpu, links, price_table.get(gpu.name)), recipe, method, prec)
    return _dedupe(out)


@dataclass
class _Ask:
    """What :func:`candidates` was asked to cover, the same for every GPU, recipe and precision."""

    work: Workload
    """The training the configurations are timed and priced for."""
    device_counts: list[int]
    """Devices per node to try."""
    nodes: int
    """Nodes."""
    strategies: list[str] | None
    """Strategy files to try (None: the default per device count)."""
    global_batch: str
    """'keep' the recipe's global batch or 'free' it."""
    headroom: float
    """The planner's memory headroom for the largest micro batch."""
    load: Callable
    """Reads a strategy file (cached)."""
    host_s_per_op: float | None = None
    """The launching host's seconds per op of litgpt's loop where known (None: the median machine we measured)."""
    refused: dict[str, set] = dataclasses.field(default_factory=dict)
    """What was not planned, by reason: strategy files tunelab's loop refuses (at a precision), device counts the
    global batch does not divide among."""


@dataclass(frozen=True)
class _OnGPU:
    """One GPU row of the search with what comes with it: its links and its price."""

    gpu: hardware.GPU
    links: tuple
    """(between the GPUs, between nodes or None, to the host)."""
    price: Price | None
    """Its price per GPU hour (None: the price table lacks it)."""


def strategy_file(name: str) -> StrategyConfig | None:
    """The strategy file ``name`` names, loaded; None for ``single``, advise's word for one device without a file
    (litgpt's own command)."""
    return None if planned_strategies.without_file(name) else load_strategy(name)


def _tried(ask: _Ask, method: str, world: int) -> list[str]:
    """The strategy files tried for ``method`` on ``world`` devices: one device alone, :data:`STRATEGIES` on several
    (and HYBRID_SHARD across nodes), or those asked; QLoRA on one device without a strategy only (litgpt quantizes
    there)."""
    if method == "qlora":
        return [planned_strategies.ONE_DEVICE]
    return ask.strategies or (
        [planned_strategies.ONE_DEVICE] if world == 1 else [*STRATEGIES, *(["fsdp-hybrid"] if ask.nodes > 1 else [])]
    )


def _one_step_at_least(work: Workload, key: str, batch: int) -> None:
    """InputError unless an epoch of ``work`` holds one optimizer step of the recipe ``key``'s global ``batch``
    (litgpt sizes its schedule in whole steps an epoch), with a fix the advisor accepts."""
    if batch <= work.samples:
        return
    smallest = batch * LAB_PADDED_TOKENS_PER_SAMPLE
    more = (  # --tokens goes alone: with --data, the data is what grows
        f"--tokens {smallest} or more (one step of {batch} samples of {LAB_PADDED_TOKENS_PER_SAMPLE} tokens)"
        if work.val_samples is None
        else f"a dataset of {batch} training records or more, after its held-out split"
    )
    raise InputError(
        f"{work.samples:,} training sample(s) per epoch (from {work.how.split(' x ')[0]}), fewer than "
        f"{key}'s global batch of {batch} (one optimizer step); fix: {more}, "
        "or --global-batch free (global batch = micro batch x devices)"
    )


def _configurations(ask: _Ask, on: _OnGPU, recipe: Recipe, method: str, prec: str) -> list[Candidate]:
    """Every device count, strategy, activation checkpointing and micro batch of one recipe at one precision on
    one GPU row, planned."""
    gpu = on.gpu
    args = {**resolve_args(recipe, []), "precision": prec, "devices": 1, "num_nodes": 1}  # the counts: tried below
    base = plan_settings(from_args(recipe, args), gpu=gpu)
    settings, base_case, work = base.settings, base.input, ask.work
    if ask.global_batch == "keep":
        _one_step_at_least(work, recipe.key, settings.global_batch_size)
    if work.longest:
        base_case = dataclasses.replace(base_case, seq_len=work.longest)
    evaluation = _evaluation(settings, work)
    out = []
    for d in ask.device_counts:
        world = d * ask.nodes
        if method == "qlora" and world > 1:
            continue
        if ask.global_batch == "keep" and not any(
            settings.global_batch_size % (mb * world) == 0 for mb in MICRO_BATCHES
        ):
            why = (
                f"a global batch of {settings.global_batch_size} samples does not divide among that many devices "
                "(micro batch x devices x accumulation); fix: fewer devices or nodes, or --global-batch free"
            )
            ask.refused.setdefault(why, set()).add(
                f"{world} devices" + (f" ({ask.nodes} nodes x {d})" * (ask.nodes > 1))
            )
            continue
        for strategy_name in _tried(ask, method, world):
            config = ask.load(strategy_name)
            if world > 1 and (config is None or not config.averages_gradients(world, per_node=d)):
                continue  # fast.yaml on several devices, HYBRID_SHARD with one per node: the ranks never synchronise
            if config is not None and (why := _refused(config, {**settings.args, "precision": prec})):
                ask.refused.setdefault(why, set()).add(f"{strategy_name} at {prec}")
                continue  # what `tunelab run --strategy` would refuse (16-mixed in tunelab's loop), said by render
            fields = strategy_fields(config, world)
            tries = planned_strategies.of(base_case.changed(**fields)).advised_with_checkpointing
            for ac in (False, True) if tries else (False,):  # where a file sets it
                # as tunelab's loop runs it: checkpointing only where asked
                checkpointing = ac or fields.get("activation_checkpointing", False)
                strategy_case = base_case.changed(
                    **{**fields, "activation_checkpointing": checkpointing}, devices=d, num_nodes=ask.nodes
                )
                for mb, acc in _micro_batches(
                    strategy_case, gpu, settings.global_batch_size, world, ask.global_batch, ask.headroom
                ):
                    if mb * acc * world > work.samples:  # a global batch past the data: no step
                        continue  # (tunelab validate refuses it too)
                    case = dataclasses.replace(strategy_case, micro_batch_size=mb, accumulation=acc)
                    out.append(_planned(ask, on, case, strategy_name, recipe, config, evaluation))
    return out


def _refused(config: StrategyConfig, args: dict) -> str | None:
    """Why tunelab's loop refuses ``config`` for a run of ``args`` on a GPU (its :meth:`StrategyConfig.check`),
    else None."""
    try:
        config.check({**args, "devices": 1, "num_nodes": 1}, device="cuda")  # the world is checked apart
    except StrategyError as e:
        return str(e)
    return None


def _link(name: str | None, gpu: hardware.GPU, scope: str) -> comm.Link:
    """The link ``name`` (or the GPU's usual one from the GPU table), named by where it came from when unknown."""
    if name:
        return comm.lookup(name, scope, given=True)
    try:
        return comm.lookup(gpu.link or "pcie4", scope)
    except InputError as e:
        raise InputError(f"{hardware.GPU_TABLE}: gpus: {gpu.name}: link: {e}") from None


def _micro_batches(case, gpu, gbs: int, world: int, global_batch: str, headroom: float) -> list[tuple[int, int]]:
    """(micro batch, accumulation) pairs to plan."""
    if global_batch == "keep":
        return [(mb, gbs // (mb * world)) for mb in MICRO_BATCHES if gbs % (mb * world) == 0]
    top = memory.max_micro_batch(case, gpu, headroom=headroom)
    return [(mb, 1) for mb in sorted({*(m for m in MICRO_BATCHES if m < top), top} - {0})] or [(1, 1)]


def _evaluation(settings, work: Workload) -> tuple[dict, int]:
    """(the recipe's ``eval`` settings, the samples litgpt validates on): the workload's held-out split, else (--tokens)
    the recipe's own data's, as ``tunelab plan`` counts them."""
    val = work.val_samples if work.val_samples is not None else train_samples(settings)[1]
    return settings.args.get("eval") or {}, val


def _planned(ask: _Ask, on: _OnGPU, case, strategy_name: str, recipe: Recipe, config, evaluation: tuple) -> Candidate:
    """One configuration planned: its peak and verdict, its time by cause (communication over ``on``'s links;
    validation and generated samples at the recipe's ``eval`` settings: ``evaluation`` from :func:`_evaluation`),
    energy and price."""
    gpu, links, work = on.gpu, on.links, ask.work
    plan = memory.verdict(memory.predict(case), gpu)
    gbs = case.micro_batch_size * case.accumulation * case.world
    eval_args, val_samples = evaluation
    args = {"train": {"global_batch_size": gbs, "epochs": work.epochs}, "eval": eval_args}
    terms = runtime.terms(
        case,
        args,
        work.samples,
        val_samples,
        work.per_sample(case.micro_batch_size, config, case.seq_len, case.config.vocab_size),
    )
    terms.host_s_per_op = ask.host_s_per_op
    if case.world > 1:
        terms.comm = comm.per_step(case, *links)
    seconds = terms.seconds_on(gpu, gpu.training_peak(case.precision) or 0.0)
    hours = seconds / 3600
    return Candidate(
        gpu=gpu.name,
        method=case.method,
        precision=case.precision,
        strategy=strategy_name,
        devices=case.devices,
        nodes=case.num_nodes,
        micro_batch_size=case.micro_batch_size,
        accumulation=case.accumulation,
        activation_checkpointing=case.activation_checkpointing,
        peak_gb=plan.peak_allocated_bytes / GB,
        fits=bool(plan.fits),
        edge=plan.edge,
        tight=bool(plan.fits) and memory.tight(plan, gpu, ask.headroom),
        hours=hours,
        comm_s_per_step=terms.comm.seconds if terms.comm is not None else 0.0,
        energy_kwh=gpu.tdp_w * case.world * seconds / 3.6e6,
        cost_usd=None if on.price is None else on.price.usd_per_hour * case.world * hours,
        recipe=recipe.key,
        global_batch_size=gbs,
        links=" + ".join(link.name for link in links[:2] if link is not None) if case.world > 1 else "",
    )


def _dedupe(cands: list[Candidate]) -> list[Candidate]:
    seen, out = set(), []
    for c in cands:
        key = (
            c.gpu,
            c.method,
            c.precision,
            c.strategy,
            c.devices,
            c.nodes,
            c.micro_batch_size,
            c.activation_checkpointing,
        )
        if key not in seen:
            seen.add(key)
            out.append(c)
    return out


def rank(
    cands: list[Candidate],
    by: str = "time",
    deadline_h: float | None = None,
    budget: float | None = None,
    tight_ok: bool = False,
):
    """The fitting candidates (not tight, unless ``tight_ok``) within the deadline and budget, fastest first
    (``by='cost'``: cheapest first, time breaking ties)."""
    keep = [c for c in cands if why_not(c, deadline_h, budget, tight_ok) is None]
    if by == "cost":
        return sorted(keep, key=lambda c: (math.inf if c.cost_usd is None else c.cost_usd, c.hours))
    return sorted(keep, key=lambda c: (c.hours, c.world))


def why_not(c: Candidate, deadline_h=None, budget=None, tight_ok=False) -> str | None:
    """Why ``c`` is not ranked ('does not fit', 'tight', 'deadline', 'budget'), or None."""
    if not c.fits or not math.isfinite(c.hours):
        return "does not fit"
    if c.tight and not tight_ok:
        return "tight"
    if deadline_h is not None and c.hours > deadline_h:
        return "deadline"
    if budget is not None and (c.cost_usd is None or c.cost_usd > budget):
        return "budget"
    return None


TIE = runtime.LOO_MEAN_ABS_ERROR
"""Configurations within this fraction of the best time are marked a tie (the fitted curve's mean leave-one-out
error on the lab's rows, kept as the margin: the kernel model that ranks errs less between configurations on one
machine, ``reports/planner-accuracy/runtime.md``); a measurement (``tunelab tune-batch``, ``tunelab bench``) decides
them."""


def render(
    cands, ranked, gpus, price_table, top: int, work: Workload, limits: dict | None = None, host=None, refused=None
) -> str:
    """The answer as text: per GPU its best ``top`` configurations and why the rest lost, then the fastest and
    the cheapest overall; ``host``: (microseconds an op, where they came from) where the host is known;
    ``refused``: what :func:`candidates` did not plan, by reason (:func:`refusals`)."""
    limits = limits or {}
    lines = _header(work, cands, ranked, host) + refusals(refused or {})
    ranked_on: dict[str, list[Candidate]] = {}
    planned_on: dict[str, list[Candidate]] = {}
    for group, among in ((ranked_on, ranked), (planned_on, cands)):  # one pass each, in rank order
        for c in among:
            group.setdefault(c.gpu, []).append(c)
    for gpu in gpus:
        mine = ranked_on.get(gpu.name, [])
        planned = planned_on.get(gpu.name, [])
        price = price_table.get(gpu.name)
        lines += [
            f"## {gpu.name} ({price.usd_per_hour:g} USD/h: {price.source}, {price.date})"
            if price
            else f"## {gpu.name} (no price: cost not computed)",
            "",
            f"times checked: {hardware.time_checked(gpu)}",
            "",
        ]
        if mine:
            lines += _table(mine, top)
        else:
            lines += ["nothing fits within the limits given" if planned else "no configuration asked applies", ""]
        if planned:  # nothing planned: no one lost (the line above, and any 'not planned' line, say why)
            lines += [f"why the others lost on {gpu.name}:", *_why_lost(planned, mine, gpu, limits), ""]
    if any("offload" in c.strategy for c in ranked):
        lines += [
            "offload: the time counts the host-link traffic, not the optimizer step on the CPU (no measurement to "
            "fit it yet): a lower bound",
            "",
        ]
    if ranked:
        fast = ranked[0]
        priced = [c for c in ranked if c.cost_usd is not None]
        lines.append(f"fastest: {_words(fast)}")
        if priced:
            lines.append(f"cheapest: {_words(min(priced, key=lambda c: (c.cost_usd, c.hours)))}")
    return "\n".join(lines)


def _table(mine: list[Candidate], top: int) -> list[str]:
    """One GPU's best ``top`` configurations as a table, '~' on each within the estimate's error of the best where
    two or more are (the best alone ties with nothing)."""
    best = min(c.hours for c in mine)
    tied = {id(c) for c in mine if c.hours <= best * (1 + TIE)}
    tied = tied if len(tied) > 1 else set()
    lines = []
    if links := next((c.links for c in mine if c.links), ""):
        lines += [f"links (between the GPUs + between nodes): {links}", ""]
    lines += [
        "| method | precision | strategy | devices | micro x accumulation | act. ckpt | peak GB | time | "
        "comm s/step | energy | USD |",
        "|" + "---|" * 11,
    ]
    for c in mine[:top]:
        lines.append(
            f"| {c.method} | {c.precision} | {c.strategy} | {c.world} | {c.micro_batch_size} x "
            f"{c.accumulation} | {'on' if c.activation_checkpointing else 'off'} | {c.peak_gb:.1f}"
            f"{' (edge)' if c.edge else ''} | {duration(c.hours * 3600)}{' ~' if id(c) in tied else ''} "
            f"| {c.comm_s_per_step:.3f} | {energy(c.energy_kwh * 3.6e6)} | "
            f"{'' if c.cost_usd is None else figure(c.cost_usd)} |"
        )
    return [*lines, ""]


def refusals(refused: dict[str, set]) -> list[str]:
    """One line per reason :func:`candidates` left configurations unplanned (``refused``), naming them."""

    def order(name: str) -> tuple:  # device counts by number ("8 devices" before "16 devices"), then by name
        count = name.split(" ", 1)[0]
        return (int(count) if count.isdigit() else 0, name)

    lines = [f"not planned: {', '.join(sorted(names, key=order))}: {why}" for why, names in refused.items()]
    return lines + [""] * bool(refused)


def _header(work: Workload, cands: list, ranked: list, host=None) -> list[str]:
    """:func:`render`'s first lines: the workload, the counts and what the columns hold; where the host's time per
    op (``host``: given or measured, else the machines we measured) and the links come from."""
    low, high = runtime.LITGPT_HOST_S_PER_OP_RANGE
    known = f"host: litgpt's loop at {host[0]:.3g} us an op, {host[1]}" if host else ""
    return [
        f"advise: {work.how}; {len(cands)} configurations planned, {len(ranked)} fit and qualify "
        f"(peak GB: predicted peak allocated per device, GB = 1e9 bytes; time: predicted wall time; "
        f"~ within {TIE:.0%} of the GPU's best, the runtime estimate's error: a tie)",
        (
            known
            or f"host: litgpt's loop at {runtime.LITGPT_HOST_S_PER_OP * 1e6:.0f} us an op, the median machine's (the "
            f"machines we measured took {low * 1e6:.0f}-{high * 1e6:.0f}: a faster CPU shortens host-bound runs)"
        )
        + "; links: each GPU's own between its GPUs unless --interconnect, --internode between nodes",
        "",
    ]


def _why_lost(planned: list[Candidate], ranked: list[Candidate], gpu, limits: dict) -> list[str]:
    """One line per method and one per strategy: its best ranked time against the GPU's best, or why none of its
    configurations is ranked (none fits: the smallest peak; tight; past the deadline or budget)."""
    best = min((c.hours for c in ranked), default=None)
    out = []
    for label, key in (("method", lambda c: f"{c.method} {c.precision}"), ("strategy", lambda c: c.strategy)):
        groups: dict[str, list[Candidate]] = {}
        for c in planned:
            groups.setdefault(key(c), []).append(c)
        parts = []
        for name, group in groups.items():
            ok = [c for c in group if c in ranked]
            if ok:
                h = min(c.hours for c in ok)
                parts.append(f"{name} {duration(h * 3600)}" + ("" if h == best else f" ({h / best:.2f}x)"))
                continue
            reasons = {
                why_not(c, limits.get("deadline_h"), limits.get("budget"), limits.get("tight_ok")) for c in group
            }
            if reasons == {"does not fit"}:
                need = min(c.peak_gb for c in group)
                parts.append(f"{name}: does not fit (at least {need:.1f} GB of {gpu.memory_bytes / GB:.1f})")
            elif reasons - {"does not fit"} == {"tight"}:
                need = min(c.peak_gb for c in group if c.fits)
                parts.append(
                    f"{name}: tight (at least {need:.1f} GB of {gpu.memory_bytes / GB:.1f}, within the headroom)"
                )
            else:
                parts.append(
                    f"{name}: {', '.join(_missed(r, group, limits) for r in sorted(reasons - {'does not fit'}))}"
                )
        if parts:
            out.append(f"- by {label}: " + "; ".join(parts))
    return out


def _missed(reason: str, group: list[Candidate], limits: dict) -> str:
    """A reason of :func:`why_not` with the group's nearest miss: its fastest time past a deadline, its cheapest
    cost past a budget (among the configurations that fit)."""
    fit = [c for c in group if why_not(c, tight_ok=limits.get("tight_ok")) is None]
    if reason == "deadline" and fit:
        return f"deadline (its fastest {duration(min(c.hours for c in fit) * 3600)})"
    priced = [c.cost_usd for c in fit if c.cost_usd is not None]
    if reason == "budget" and priced:
        return f"budget (its cheapest {figure(min(priced))} USD)"
    return reason


def _words(c: Candidate) -> str:
    cost = "" if c.cost_usd is None else f", {figure(c.cost_usd)} USD"
    return (
        f"{c.world}x {c.gpu}, {c.method} ({c.recipe}), {c.precision}, {c.strategy}, micro {c.micro_batch_size} x "
        f"{c.accumulation}{', activation checkpointing' if c.activation_checkpointing else ''}: "
        f"{duration(c.hours * 3600)}{cost}"
    )


def write_choice(
    c: Candidate, recipe: Recipe, out_dir, data: str | None = None, overrides: list[str] = ()
) -> list[str]:
    """The chosen configuration as files a user launches: ``<method>.yaml`` (the recipe with its devices, nodes,
    precision, micro batch, global batch and, for ``data`` a dataset file, its ``json_path``; its header names the
    ``overrides`` it carries), ``strategy.yaml`` where a strategy was chosen (the strategy file with activation
    checkpointing as chosen), and ``launch.txt``; returns the launch commands."""
    out_dir = Path(out_dir)
    config = dict(recipe.config)
    config["precision"] = c.precision
    config["devices"] = c.devices
    config["num_nodes"] = c.nodes
    config["train"] = {
        **(config.get("train") or {}),
        "micro_batch_size": c.micro_batch_size,
        "global_batch_size": c.global_batch_size,
    }
    block = config.get("data")
    if data and Path(data).exists() and isinstance(block, dict) and isinstance(block.get("init_args"), dict):
        config["data"] = {**block, "init_args": {**block["init_args"], "json_path": str(Path(data).resolve())}}
    elif data:  # a litgpt data module: its class, as `--data NAME` switches it
        config["data"] = resolve_args(recipe, ["--data", data])["data"]
    head = (
        f"# tunelab advise: {_words(c)}\n# from {display_path(recipe.path)}"
        f"{' with ' + ' '.join(overrides) if overrides else ''}; predicted peak {c.peak_gb:.1f} GB per "
        f"device (GB = 1e9 bytes), a plan, not a measurement\n"
    )
    recipe_path = write_text_atomic(
        out_dir / f"{recipe.path.stem}.yaml", head + yaml.safe_dump(config, sort_keys=False)
    )
    commands = [f"tunelab run {recipe_path}"]
    chosen = strategy_file(c.strategy)
    if chosen is not None:
        strategy_fields = dataclasses.asdict(chosen)
        strategy_fields["activation_checkpointing"] = c.activation_checkpointing
        strategy_path = write_text_atomic(out_dir / "strategy.yaml", yaml.safe_dump(strategy_fields, sort_keys=False))
        commands = [f"tunelab run {recipe_path} --strategy {strategy_path}"]
        if c.nodes > 1:
            commands = [f"{commands[0]} --nnodes {c.nodes} --node-rank <this node's rank> --master-addr <node 0>"]
    else:
        commands.append(f"litgpt {recipe.command} --config {recipe_path}")
    write_text_atomic(out_dir / "launch.txt", "\n".join(commands) + "\n")
    ours = {recipe_path.name, "launch.txt", *(["strategy.yaml"] if chosen is not None else [])}
    for name in set(WRITTEN) - ours:  # what an earlier answer left here would read as part of this one
        stale = out_dir / name
        if stale.is_file() and not stale.is_symlink():
            stale.unlink()
    return commands


WRITTEN = ("full.yaml", "lora.yaml", "qlora.yaml", "strategy.yaml", "launch.txt")
"""The files ``advise --write`` writes into its folder (:func:`write_choice`): an answer replaces all of them."""


def _recipes_of(model: str, method: str) -> dict:
    """{method: recipe} to advise on: a folder of recipes/ gives each of its methods (those ``method`` allows), a
    recipe key or path the one."""
    folder = recipes.RECIPES_DIR / model
    if folder.is_dir() and "/" not in model:
        methods = ["full", "lora", "qlora"] if method == "any" else [method]
        return {m: recipes.resolve(f"{model}/{m}") for m in methods if (folder / f"{m}.yaml").is_file()}
    recipe = recipes.resolve(model)
    return {recipe.method: recipe}  # from its contents, whatever the file is called


SEARCHED = {
    "precision": "--precision",
    "devices": "--max-devices",
    "num_nodes": "--nodes",
    "train.micro_batch_size": "--global-batch free",
}
"""What advise tries itself, with the option that steers it: an override may not set these."""


def with_overrides(found: dict[str, Recipe], overrides: list[str]) -> dict[str, Recipe]:
    """``found`` ({method: recipe}) with litgpt-style ``overrides`` applied to each recipe: every top-level group
    they change, as litgpt resolves it (``--checkpoint_dir``: any model litgpt knows; ``--train.max_seq_length``,
    ``--lora_r``, ...). InputError (one line) for an override litgpt's command refuses, one that sets what advise
    tries itself (:data:`SEARCHED`), or one that makes the recipe another method."""
    if not overrides:
        return found
    out = {}
    for method, recipe in found.items():
        if clash := overridden(recipe, overrides, SEARCHED):
            key, value = next(iter(clash.items()))
            raise InputError(
                f"--{key} {value}: advise tries every {key.rsplit('.', 1)[-1]} itself; fix: leave it out (steer "
                f"the search with {SEARCHED[key]}), or `tunelab plan` the one configuration"
            )
        given, plain = resolve_args(recipe, overrides), resolve_args(recipe, [])
        config = copy.deepcopy(recipe.config)
        config.update({group: given[group] for group in given if given[group] != plain[group]})
        if given["checkpoint_dir"] != plain["checkpoint_dir"] and given["out_dir"] == plain["out_dir"]:
            config["out_dir"] = f"out/finetune/{Path(given['checkpoint_dir']).name}/{method}"  # not the folder's model
        derived = Recipe(recipe.path, config)
        if derived.method != method:
            raise InputError(
                f"{' '.join(overrides)}: makes {recipe.key} a {derived.method} recipe; fix: leave it out and "
                f"advise --method {derived.method} on the model's folder"
            )
        out[method] = derived
    return out


def model_line(found: dict[str, Recipe], overrides: list[str]) -> str:
    """What a ranking with ``overrides`` is of: the model they name and the recipes whose settings it keeps."""
    name = load_config(resolve(next(iter(found.values())), []).checkpoint_dir).name
    keys = ", ".join(r.key for r in found.values())
    return f"model: {name} (the settings of {keys}, with {' '.join(overrides)})"


def asked(args, names: list, precision: list | None, strategies: list | None, overrides: list[str] = ()) -> tuple:
    """(recipes, GPUs, precisions, strategies) ``tunelab advise``'s options name (``args``: its parsed options;
    ``names``, ``precision``, ``strategies``: its lists, split; ``overrides``: litgpt-style, applied to every
    recipe, :func:`with_overrides`); InputError (one line) for one that names nothing, does not apply, or is not
    known, before anything is planned."""
    if args.data is not None and not args.data.strip():
        raise InputError("--data '': names nothing (an unset shell variable?); fix: a dataset or a data module")
    found = with_overrides(_recipes_of(args.model, args.method), list(overrides))
    if not found:
        raise InputError(f"{args.model}: no {args.method} recipe there; fix: --method any")
    if args.method != "any" and (other := [r for r in found.values() if r.method != args.method]):
        raise InputError(
            f"--method {args.method}: {other[0].key} is a {other[0].method} recipe; fix: name a "
            f"{args.method} recipe or the model's folder, or leave --method out"
        )
    try:
        gpus = list({g.name: g for g in (hardware.lookup(n) for n in names)}.values())
    except ValueError as e:
        raise InputError(f"--gpus: {e}") from None
    if precision and (bad := sorted(set(precision) - set(PRECISIONS))):
        raise InputError(f"--precision: {', '.join(bad)} unknown; fix: one of {', '.join(PRECISIONS)}")
    if {r.method for r in found.values()} == {"qlora"}:  # what candidates() skips for QLoRA, said before planning
        if precision and all("mixed" in p for p in precision):
            raise InputError(
                f"--precision {args.precision}: QLoRA trains under a true precision (litgpt refuses quantization "
                "under mixed precision); fix: bf16-true, or 16-true on a GPU without bfloat16"
            )
        if args.nodes > 1:
            raise InputError(f"--nodes {args.nodes}: QLoRA trains on one device; fix: --nodes 1, or --method lora")
    for gpu in gpus:
        if precision and not precisions(gpu, precision):
            raise InputError(
                f"--precision {args.precision}: {gpu.name} has no bfloat16 (it computes float16 and float32); fix: "
                "16-mixed or 32-true on it, or leave --precision out"
            )
    for name in strategies or []:
        try:
            strategy_file(name)
        except StrategyError as e:
            raise InputError(f"--strategies: {e}") from None
    if args.write is not None and (why := unwritable_dir(args.write, list(WRITTEN))):
        raise InputError(f"--write {args.write}: {why}; fix: give a new or empty folder")
    return found, gpus, precision, strategies
