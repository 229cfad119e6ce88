"""``tunelab advise``: every configuration of a model worth renting, planned and ranked.

For each GPU of the table asked about, each method (full, LoRA, QLoRA), micro batch (powers of two), activation
checkpointing (off, on: under FSDP, whose strategy files set it; LoRA on several devices always checkpoints, as
the planner models litgpt's path), strategy (one device; DDP, FSDP, DeepSpeed ZeRO-2 and ZeRO-3 on 2, 4, 8 ... devices per
node): the planner's memory (:func:`tunelab.plan.memory.predict` on the recipe's planner input with those fields
replaced: one recipe resolution per method, not one per candidate) and its time (:mod:`tunelab.plan.runtime` with
the communication term of :mod:`tunelab.plan.comm`) for the token budget; kept when the planner says it fits (at
the edge: marked), ranked by predicted wall time, with energy (board power x devices x time, an upper bound) and
cost (devices x hours x the hourly price of ``configs/hardware/prices.yaml`` or ``--prices FILE``).

The recipe's global batch is kept (it is part of the training maths): a micro batch x devices that does not divide
it is not a candidate. QLoRA runs on one device (litgpt's QLoRA path).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from tunelab import hardware, yaml_input
from tunelab.errors import InputError
from tunelab.paths import CONFIGS_DIR
from tunelab.plan import comm, memory, runtime
from tunelab.plan.recipe import LAB_PADDED_TOKENS_PER_SAMPLE, plan_recipe, strategy_fields
from tunelab.recipes import Recipe
from tunelab.strategies import load_strategy

PRICE_TABLE = CONFIGS_DIR / "hardware" / "prices.yaml"
MICRO_BATCHES = (1, 2, 4, 8, 16, 32, 64)
"""Micro batches tried (per device)."""
STRATEGIES = ("ddp", "fsdp", "deepspeed-zero2", "deepspeed-zero3")
"""configs/strategies files tried on several devices."""


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
        out[str(name)] = Price(float(usd), str(row["source"]), str(row["date"]))
    return out


@dataclass
class Candidate:
    """One configuration, planned."""

    gpu: str
    method: str
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
    hours: float
    """Predicted wall time of the training run (compute, memory-bound work, overhead, exposed communication)."""
    comm_s_per_step: float
    energy_kwh: float
    """Board power x devices x time: an upper bound."""
    cost_usd: float | None
    """devices x hours x the hourly price (None without a price for the GPU)."""
    recipe: str
    """The recipe it starts from."""

    @property
    def world(self) -> int:
        """Devices in all."""
        return self.devices * self.nodes


def candidates(
    recipes: dict[str, Recipe],
    gpus: list[hardware.GPU],
    *,
    tokens: float,
    max_devices: int = 8,
    nodes: int = 1,
    tokens_per_sample: float = LAB_PADDED_TOKENS_PER_SAMPLE,
    interconnect: str | None = None,
    internode: str | None = None,
    price_table: dict[str, Price] | None = None,
) -> list[Candidate]:
    """Every configuration of ``recipes`` ({method: recipe}) on each GPU, planned (fitting or not)."""
    price_table = price_table or {}
    out = []
    device_counts = [1] + [d for d in (2, 4, 8, 16) if d <= max_devices]
    for gpu in gpus:
        peak = gpu.peak_flops("bf16-true" if gpu.bf16 else "16-true", "high")
        if not peak or not gpu.bandwidth_gbs:
            continue
        links = (
            comm.lookup(interconnect or gpu.link or "pcie4", "gpu"),
            comm.lookup(internode, "node") if internode else None,
            comm.lookup("host-pcie4", "host"),
        )
        for method, recipe in recipes.items():
            precision = [] if gpu.bf16 else ["--precision", "16-mixed"]
            base = plan_recipe(recipe, precision, gpu=gpu)
            s, x0 = base.settings, base.input
            gbs = s.global_batch_size
            for d in device_counts:
                if method == "qlora" and d * nodes > 1:
                    continue
                for strat in ["single"] if d * nodes == 1 else STRATEGIES:
                    fields = strategy_fields(None if strat == "single" else load_strategy(strat), d * nodes)
                    for mb in MICRO_BATCHES:
                        if gbs % (mb * d * nodes):
                            continue
                        for ac in (False, True) if strat == "fsdp" else (False,):  # where a file sets it
                            world = d * nodes
                            x = dataclasses.replace(
                                x0,
                                **{
                                    **fields,
                                    "activation_checkpointing": ac
                                    or fields.get("activation_checkpointing", False)
                                    or (x0.lora and world > 1),
                                },
                                micro_batch_size=mb,
                                devices=d,
                                num_nodes=nodes,
                                accumulation=gbs // (mb * world),
                            )
                            out.append(_planned(x, gpu, peak, links, s, tokens, tokens_per_sample, strat, recipe,
                                                price_table.get(gpu.name)))  # fmt: skip
    return _dedupe(out)


def _planned(x, gpu, peak, links, s, tokens, tps, strat, recipe, price) -> Candidate:
    plan = memory.verdict(memory.predict(x), gpu)
    train_samples = max(1, int(tokens / tps))
    args = {"train": {"global_batch_size": s.global_batch_size, "epochs": 1}, "eval": {"interval": None}}
    work = runtime.terms(x, args, train_samples, 0, tps)
    if x.world > 1:
        work.comm = comm.per_step(x, *links)
    seconds = work.seconds(peak, gpu.bandwidth_gbs * 1e9)
    hours = seconds / 3600
    return Candidate(
        gpu=gpu.name,
        method=x.method,
        strategy=strat,
        devices=x.devices,
        nodes=x.num_nodes,
        micro_batch_size=x.micro_batch_size,
        accumulation=x.accumulation,
        activation_checkpointing=x.activation_checkpointing,
        peak_gb=plan.peak_allocated_bytes / 1e9,
        fits=bool(plan.fits),
        edge=plan.edge,
        hours=hours,
        comm_s_per_step=work.comm.seconds if work.comm is not None else 0.0,
        energy_kwh=gpu.tdp_w * x.world * seconds / 3.6e6,
        cost_usd=None if price is None else price.usd_per_hour * x.world * hours,
        recipe=recipe.key,
    )


def _dedupe(cands: list[Candidate]) -> list[Candidate]:
    seen, out = set(), []
    for c in cands:
        key = (c.gpu, c.method, c.strategy, c.devices, c.nodes, c.micro_batch_size, c.activation_checkpointing)
        if key not in seen:
            seen.add(key)
            out.append(c)
    return out


def rank(cands: list[Candidate], by: str = "time", deadline_h: float | None = None, budget: float | None = None):
    """The fitting candidates within the deadline and budget, fastest first (``by='cost'``: cheapest first, time
    breaking ties)."""
    keep = [
        c
        for c in cands
        if c.fits
        and math.isfinite(c.hours)
        and (deadline_h is None or c.hours <= deadline_h)
        and (budget is None or (c.cost_usd is not None and c.cost_usd <= budget))
    ]
    if by == "cost":
        return sorted(keep, key=lambda c: (math.inf if c.cost_usd is None else c.cost_usd, c.hours))
    return sorted(keep, key=lambda c: (c.hours, c.world))


def render(cands, ranked, gpus, price_table, top: int, tokens: float) -> str:
    """The answer as text: per GPU its best ``top`` configurations and why the rest lost, then the fastest and
    the cheapest overall."""
    head = (
        "| method | strategy | devices | micro x accumulation | act. ckpt | peak GB | hours | comm s/step | kWh | USD |"
    )
    lines = [f"advise: {tokens:,.0f} tokens; {len(cands)} configurations planned, {len(ranked)} fit and qualify", ""]
    for gpu in gpus:
        mine = [c for c in ranked if c.gpu == gpu.name]
        planned = [c for c in cands if c.gpu == gpu.name]
        price = price_table.get(gpu.name)
        lines += [
            f"## {gpu.name} ({price.usd_per_hour:g} USD/h: {price.source}, {price.date})"
            if price
            else f"## {gpu.name} (no price: cost not computed)",
            "",
        ]
        if not mine:
            lines += ["nothing fits within the limits given", ""]
            continue
        lines += [head, "|" + "---|" * 10]
        for c in mine[:top]:
            lines.append(
                f"| {c.method} | {c.strategy} | {c.world} | {c.micro_batch_size} x {c.accumulation} | "
                f"{'on' if c.activation_checkpointing else 'off'} | {c.peak_gb:.1f}{' (edge)' if c.edge else ''} | "
                f"{c.hours:.2f} | {c.comm_s_per_step:.3f} | {c.energy_kwh:.1f} | "
                f"{'' if c.cost_usd is None else f'{c.cost_usd:,.2f}'} |"
            )
        too_big = sum(not c.fits for c in planned)
        lines += [
            "",
            f"the others: {too_big} do not fit in {gpu.memory_bytes / 1e9:.1f} GB, {len(mine) - min(top, len(mine))} "
            f"fit but are slower, {len(planned) - too_big - len(mine)} fit but miss the deadline or budget",
            "",
        ]
    if ranked:
        fast = ranked[0]
        priced = [c for c in ranked if c.cost_usd is not None]
        lines.append(f"fastest: {_words(fast)}")
        if priced:
            lines.append(f"cheapest: {_words(min(priced, key=lambda c: (c.cost_usd, c.hours)))}")
    return "\n".join(lines)


def _words(c: Candidate) -> str:
    cost = "" if c.cost_usd is None else f", {c.cost_usd:,.2f} USD"
    return (
        f"{c.world}x {c.gpu}, {c.method} ({c.recipe}), {c.strategy}, micro {c.micro_batch_size} x "
        f"{c.accumulation}, activation checkpointing {'on' if c.activation_checkpointing else 'off'}: "
        f"{c.hours:.2f} h{cost}"
    )


def write_choice(c: Candidate, recipe: Recipe, out_dir) -> list[str]:
    """The chosen configuration as files a user launches: ``<method>.yaml`` (the recipe with its devices, micro
    batch and, where the GPU has no bfloat16, precision set), ``strategy.yaml`` on several devices (the strategy
    file with activation checkpointing as chosen), and ``launch.txt``; returns the launch commands."""
    from pathlib import Path

    import yaml

    from tunelab.files import write_text_atomic
    from tunelab.recipes import display_path

    out_dir = Path(out_dir)
    config = dict(recipe.config)
    config["devices"] = c.devices
    config["num_nodes"] = c.nodes
    config["train"] = {**(config.get("train") or {}), "micro_batch_size": c.micro_batch_size}
    if not hardware.lookup(c.gpu).bf16 and str(config.get("precision", "")).startswith("bf16"):
        config["precision"] = "16-mixed"
    head = (
        f"# tunelab advise: {_words(c)}\n# from {display_path(recipe.path)}; predicted peak {c.peak_gb:.1f} GB per "
        f"device (GB = 1e9 bytes), a plan, not a measurement\n"
    )
    recipe_path = write_text_atomic(
        out_dir / f"{recipe.path.stem}.yaml", head + yaml.safe_dump(config, sort_keys=False)
    )
    commands = [f"tunelab run {recipe_path}"]
    if c.world > 1:
        strat = dataclasses.asdict(load_strategy(c.strategy))
        strat["activation_checkpointing"] = c.activation_checkpointing
        strat_path = write_text_atomic(out_dir / "strategy.yaml", yaml.safe_dump(strat, sort_keys=False))
        commands = [f"tunelab run {recipe_path} --strategy {strat_path}"]
        if c.nodes > 1:
            commands = [f"{commands[0]} --nnodes {c.nodes} --node-rank <this node's rank> --master-addr <node 0>"]
    else:
        commands.append(f"litgpt {recipe.command} --config {recipe_path}")
    write_text_atomic(out_dir / "launch.txt", "\n".join(commands) + "\n")
    return commands
