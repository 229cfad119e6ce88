"""tunelab's own training loop: litgpt's recipe under a chosen strategy (DDP, FSDP1, FSDP2, DeepSpeed ZeRO 2/3 with
offload) on one or several devices, and the fast path's speed switches. Launched by torchrun, one process per device
(``tunelab run RECIPE --strategy FILE`` launches it; the record keeps the command).

Why a loop of our own: ``litgpt finetune_*`` hard-codes its strategy and offers neither DDP nor DeepSpeed. ``fit``
follows litgpt's ``finetune/full.py`` and ``finetune/lora.py`` (sample order, schedule, loss, accumulation,
validation, checkpoints as :mod:`tunelab.run.outputs` writes them); each rank leaves its figures in its rank file as
litgpt's observed runs do. The differences the speed switches make: docs/strategies.md, "The fast path"."""

from __future__ import annotations

import argparse
import atexit
import contextlib
import copy
import csv
import dataclasses
import importlib
import inspect
import math
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

from tunelab import checkpoints, files, parallel, settings
from tunelab.recipes import resolve
from tunelab.run import batching, fused, handoff, outputs, rank_stats
from tunelab.strategies import BNB_OPTIMIZERS, StrategyConfig, StrategyError, load_strategy
from tunelab.units import GB
from tunelab.validate import parse


def _dtype(precision: str) -> torch.dtype:
    return torch.bfloat16 if precision == "bf16-true" else torch.float16 if precision == "16-true" else torch.float32


def build_model(args: dict, method: str, device: torch.device, precision: str):
    """litgpt's GPT (or LoRA GPT) as ``litgpt finetune_*`` builds it, with the checkpoint's weights and the trainable
    parameters marked: ``seed_everything(seed)`` (Python, NumPy, torch and CUDA), then the model constructed on the
    device in the training dtype (what ``fabric.init_module`` does under a true precision; fp32 under a mixed one),
    so LoRA's randomly initialised adapters draw the same numbers as litgpt's on the same device."""
    from lightning.fabric.utilities.seed import seed_everything

    ckpt = Path(args["checkpoint_dir"])
    if method == "full":
        from litgpt.model import GPT, Config

        config = Config.from_file(ckpt / "model_config.yaml")
    else:
        from litgpt.lora import GPT, Config, mark_only_lora_as_trainable

        config = Config.from_file(
            ckpt / "model_config.yaml",
            **{
                k: args[k]
                for k in (
                    "lora_r",
                    "lora_alpha",
                    "lora_dropout",
                    "lora_query",
                    "lora_key",
                    "lora_value",
                    "lora_projection",
                    "lora_mlp",
                    "lora_head",
                )
            },
        )
    seed_everything(args.get("seed", 1337), verbose=False)  # same init on every rank (litgpt: fabric.seed_everything)
    dtype = _dtype(precision) if "true" in precision else torch.float32
    model = checkpoints.construct(GPT, config, device, dtype)
    if method != "full":
        mark_only_lora_as_trainable(model)
    state = torch.load(ckpt / "lit_model.pth", map_location="cpu", weights_only=True)
    model.load_state_dict(state.get("model", state), strict=method == "full")
    return model, config


def deepspeed_config(strategy: StrategyConfig, micro: int, accumulation: int, precision: str) -> dict:
    """The DeepSpeed config of a strategy file for this run's batch, accumulation and precision."""
    zero: dict = {
        "stage": strategy.zero_stage,
        "reduce_bucket_size": strategy.reduce_bucket_size,
        "allgather_bucket_size": strategy.allgather_bucket_size,
        "overlap_comm": False,
        "contiguous_gradients": True,
    }
    if strategy.zero_stage == 3:
        zero["stage3_max_live_parameters"] = strategy.max_live_parameters
        zero["stage3_max_reuse_distance"] = strategy.max_reuse_distance
    if strategy.offload_optimizer:
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": torch.cuda.is_available()}
    if strategy.offload_params:
        zero["offload_param"] = {"device": "cpu", "pin_memory": torch.cuda.is_available()}
    return {
        "train_micro_batch_size_per_gpu": micro,
        "gradient_accumulation_steps": accumulation,
        "zero_optimization": zero,
        "bf16": {"enabled": precision.startswith("bf16")},
        "zero_allow_untested_optimizer": True,
        "zero_force_ds_cpu_optimizer": strategy.cpu_adam,
        "steps_per_print": 10**9,
        "wall_clock_breakdown": False,
    }


class _Data:
    """The training batches of each epoch and the validation loader, on this rank.

    Without the fast switches: litgpt's data module and collate function through a DataLoader (its workers tokenise
    each sample every epoch), each rank its share of litgpt's order. With ``pretokenize`` (or ``length_grouping``):
    every sample tokenised once by the same code, micro batches planned per epoch (litgpt's order, or grouped by
    length), collated in this process; with ``prefetch`` the next batch is on the GPU before it is needed. Every
    batch carries its ``padded``, ``real`` and ``raw`` token counts and the loss's ``counted`` targets as ints."""

    def __init__(self, args: dict, tokenizer, micro: int, rank: int, world: int, strategy: StrategyConfig, device):
        from torch.utils.data import DataLoader

        spec = args["data"]
        module, _, cls = spec["class_path"].rpartition(".")
        data = getattr(importlib.import_module(module), cls)(**spec.get("init_args", {}))
        data.connect(tokenizer=tokenizer, batch_size=micro, max_seq_length=args["train"].get("max_seq_length"))
        if rank == 0:
            data.prepare_data()
        if world > 1:
            dist.barrier()
        data.setup()
        self.micro, self.rank, self.world, self.device = micro, rank, world, device
        self.seed, self.strategy = getattr(data, "seed", 42), strategy
        train_dl, val_dl = data.train_dataloader(), data.val_dataloader()
        self.shuffle = isinstance(train_dl.sampler, torch.utils.data.RandomSampler)
        self.collate_fn = train_dl.collate_fn
        self.module, self.max_seq_length = data, None
        self.fast = strategy.pretokenize or bool(strategy.length_grouping) or bool(strategy.pad_to_multiple)
        if self.fast:
            self.tokenized = batching.Tokenized.of(train_dl.dataset)
            self.lengths = self.tokenized.lengths
        else:
            sampler = batching.LitgptOrderSampler(len(train_dl.dataset), rank, world, self.seed, self.shuffle)
            workers = getattr(data, "num_workers", 0)
            self.loader = DataLoader(
                train_dl.dataset, batch_size=micro, sampler=sampler, collate_fn=self.collate_fn, num_workers=workers
            )
        val_sampler = batching.LitgptOrderSampler(
            len(val_dl.dataset), rank, world, self.seed, isinstance(val_dl.sampler, torch.utils.data.RandomSampler)
        )
        self.val = DataLoader(
            val_dl.dataset,
            batch_size=micro,
            sampler=val_sampler,
            collate_fn=val_dl.collate_fn,
            num_workers=getattr(data, "num_workers", 0),
        )

    def plan(self, epoch: int) -> list[list[int]]:
        """This rank's micro batches of an epoch (fast path), as sample indices."""
        order = batching.litgpt_order(len(self.tokenized), self.seed, epoch, self.shuffle)
        if not self.strategy.length_grouping:  # litgpt's order: each rank batches its share of samples
            return batching.plan_epoch(batching.rank_share(order, self.rank, self.world), self.micro)
        plan = batching.plan_epoch(order, self.micro, self.lengths, self.strategy.length_grouping, self.seed, epoch)
        return batching.rank_batches(plan, self.rank, self.world)

    def longest(self) -> int:
        """The longest tokenised sample of the training and validation splits (litgpt's ``get_longest_seq_length``,
        which sets the model's ``max_seq_length``)."""
        train = self.tokenized.samples if self.fast else self.loader.dataset
        val = self.val.dataset
        return max(
            max(len(train[i]["input_ids"]) for i in range(len(train))),
            max((len(val[i]["input_ids"]) for i in range(len(val))), default=0),
        )

    def shapes(self, epochs: int, iterations: float) -> list[tuple[int, int]]:
        """The (rows, length) shapes of this rank's first ``iterations`` training micro batches (at most ``epochs``
        epochs), when static (``pad_to_multiple``): what compiled code will see. Empty without static shapes."""
        if not (self.fast and self.strategy.pad_to_multiple):
            return []
        lengths = [len(s["input_ids"]) for s in self.tokenized.samples]
        found, seen = set(), 0
        for epoch in range(epochs):
            for b in self.plan(epoch):
                if seen >= iterations:
                    break
                found.add(
                    batching.bucket(max(lengths[i] for i in b), self.strategy.pad_to_multiple, self.max_seq_length)
                )
                seen += 1
        return [(self.micro, n) for n in sorted(found)]

    def iterations_per_epoch(self) -> int:
        """Micro batches this rank runs per epoch."""
        return len(self.plan(0)) if self.fast else len(self.loader)

    def epochs(self, n: int):
        """(epoch, batch) over ``n`` epochs, each batch with its token counts as ints."""
        for epoch in range(n):
            if self.fast:
                static = self.strategy.pad_to_multiple
                batches = (
                    batching.collate(
                        self.tokenized,
                        b,
                        self.collate_fn,
                        rows=self.micro if static else None,
                        multiple=static,
                        cap=self.max_seq_length or 0,
                    )
                    for b in self.plan(epoch)
                )
            else:
                self.loader.sampler.set_epoch(epoch)
                batches = map(_with_counts, self.loader)
            if self.strategy.prefetch:
                batches = batching.Prefetcher(batches, self.device)
            for batch in batches:
                yield epoch, batch


def _with_counts(batch: dict) -> dict:
    """A litgpt loader batch with its token counts as ints (read from its CPU tensors)."""
    batch["padded"] = int(batch["input_ids"].numel())
    batch["real"] = int(batch["token_counts"]["raw_plus_prompt_template"].sum())
    batch["raw"] = int(batch["token_counts"]["raw"].sum())
    batch["counted"] = batching.counted_targets(batch["labels"])
    return batch


METRICS_COLUMNS = [
    "epoch",
    "iter",
    "iter_time",
    "learning_rate",
    "loss",
    "step",
    "tokens",
    "total_tokens",
    "val_loss",
    "val_ppl",
]
"""litgpt's metrics.csv columns (rank 0 writes them under ``<out_dir>/logs/csv/version_0``)."""


class _MetricsLog:
    """Rank 0's metrics.csv and litgpt's per-iteration line; the other ranks write nothing."""

    def __init__(self, out_dir: Path, rank: int):
        self.file = None
        if rank == 0:
            path = out_dir / "logs" / "csv" / "version_0" / "metrics.csv"
            path.parent.mkdir(parents=True, exist_ok=True)
            self.file = open(path, "w", newline="")
            self.writer = csv.DictWriter(self.file, fieldnames=METRICS_COLUMNS)
            self.writer.writeheader()

    def row(self, values: dict) -> None:
        if self.file is not None:
            self.writer.writerow(values)
            self.file.flush()

    def close(self) -> None:
        if self.file is not None:
            self.file.close()


def _setup_device() -> tuple[int, int, torch.device]:
    """(rank, world size, this rank's device): its GPU when there is one, else the CPU."""
    local = int(os.environ.get("LOCAL_RANK", 0))
    device = torch.device("cuda", local) if torch.cuda.is_available() else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    return dist.get_rank(), dist.get_world_size(), device


def _fused_kernels(strategy: StrategyConfig, device, rank: int) -> StrategyConfig:
    """The strategy as it runs on ``device``: the ``liger`` switch off (said, and in the record) where Liger's
    kernels cannot run (a CPU outside Triton's interpreter); under the interpreter only the fused loss (Liger's
    RMSNorm and SwiGLU kernels take float arguments the interpreter cannot pass)."""
    if not strategy.liger:
        return strategy
    why = fused.unavailable(device)
    if why is None and device.type != "cuda" and strategy.liger == "all":
        why, keep = "RMSNorm and SwiGLU off under Triton's interpreter (float kernel arguments it cannot run)", "loss"
    else:
        keep = None if why else strategy.liger
    if why:
        rank_stats.note_fused_kernels(f"liger {strategy.liger} -> {keep or 'off'}: {why}")
        if rank == 0:
            print(f"liger: {strategy.liger} -> {keep or 'off'}: {why}", flush=True)
        return dataclasses.replace(strategy, liger=keep)
    return strategy


def _setup_model(
    args: dict,
    method: str,
    strategy: StrategyConfig,
    device,
    precision: str,
    rank: int,
    world: int,
    max_seq_length: int,
    n_shapes: int,
):
    """The model with the checkpoint's weights, its trainable parameters marked, its ``max_seq_length`` set as
    litgpt's fit sets it (the longest sample, at most ``train.max_seq_length``: assigning it rebuilds RoPE's cos/sin
    in float32, as under litgpt), compiled when asked, under the strategy."""
    model, _ = build_model(args, method, device, precision)
    model.max_seq_length = max_seq_length
    if strategy.liger:
        rank_stats.note_fused_kernels("liger: " + ", ".join(fused.apply(model, strategy.liger)))
        rank_stats.note_fused_loss_reads(fused.READS_PER_MICRO_BATCH)
    if strategy.compile == "blocks":  # regional: each block compiled in place, its graphs shared by all of them
        import torch._dynamo.config as dynamo_config

        # Per training shape up to three graph variants: the blocks whose input requires grad, block 0 whose input
        # does not where the embedding is frozen (LoRA: dynamo guards on requires_grad), and validation's (no
        # grad). Past the limit dynamo runs a block eagerly for a new variant without failing: counted, refused by
        # the bench (the limit of n_shapes + 2 did this to every LoRA run: the longest shapes ran eagerly).
        dynamo_config.recompile_limit = max(dynamo_config.recompile_limit, 3 * n_shapes + 2)
        rank_stats.count_recompile_limit_hits()
        for block in model.transformer.h:
            block.compile(dynamic=False) if strategy.pad_to_multiple else block.compile()
    if rank == 0:
        n_train = sum(p.numel() for p in model.parameters() if p.requires_grad)
        n_frozen = sum(p.numel() for p in model.parameters() if not p.requires_grad)
        print(f"Number of trainable parameters: {n_train:,}")
        print(f"Number of non-trainable parameters: {n_frozen:,}")
        rank_stats.note_report(trainable_params=n_train, frozen_params=n_frozen)
        print(f"Strategy: {strategy.describe()} on {world} process(es), device {device.type}")
    return parallel.wrap(model, strategy, device, world)


def _setup_optimizer(
    args: dict, model, strategy: StrategyConfig, device, precision: str, micro: int, accumulation: int, max_steps: int
):
    """(model or DeepSpeed engine, optimizer, scheduler, engine or None): litgpt's optimizer and schedule (linear
    warm-up, then cosine), handed to DeepSpeed under a ZeRO strategy."""
    from litgpt.finetune.full import get_lr_scheduler
    from litgpt.utils import instantiate_torch_optimizer

    params = [p for p in model.parameters() if p.requires_grad]
    if strategy.optimizer:
        optimizer = _bnb_optimizer(strategy.optimizer, args["optimizer"], params)
    elif strategy.fused_optimizer:  # kept only by classes that take it (optimizers.FUSED: Adam, AdamW, Adagrad, SGD)
        # a copy: litgpt's helper adds ``fused`` to the init_args it is given, which the run's saved arguments
        # (hyperparameters.yaml) would then carry
        optimizer = instantiate_torch_optimizer(copy.deepcopy(args["optimizer"]), params, fused=True)
    else:
        optimizer = instantiate_torch_optimizer(copy.deepcopy(args["optimizer"]), params)
    scheduler = get_lr_scheduler(optimizer, warmup_steps=args["train"]["lr_warmup_steps"], max_steps=max_steps)
    if not strategy.kind.engine:
        return model, optimizer, scheduler, None
    import deepspeed

    if device.type == "cpu":
        # On CPU DeepSpeed JIT-compiles a shared-memory all-reduce op at first use, every rank into one
        # torch-extensions folder under a file lock; a build killed midway leaves the lock and every later run
        # waits on it forever (seen here). gloo's all-reduce does the same job.
        deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
    engine, optimizer, _, scheduler = deepspeed.initialize(
        model=model,
        optimizer=optimizer,
        lr_scheduler=scheduler,
        config=deepspeed_config(strategy, micro, accumulation, precision),
    )
    return engine, optimizer, scheduler, engine


def _bnb_optimizer(name: str, recipe_optimizer, params):
    """bitsandbytes' ``name`` optimizer with the recipe optimizer's learning rate, betas, eps and weight decay."""

    import bitsandbytes as bnb

    cls = getattr(bnb.optim, BNB_OPTIMIZERS[name])
    init = (recipe_optimizer.get("init_args") or {}) if isinstance(recipe_optimizer, dict) else {}
    accepted = set(inspect.signature(cls).parameters)
    return cls(params, **{k: v for k, v in init.items() if k in accepted})


def litgpt_loss(model, input_ids, targets, method: str, strategy: StrategyConfig, counted: int | None = None):
    """litgpt's loss: chunked cross-entropy on shifted targets (LoRA: the head in 128-token chunks), on float32
    logits: Fabric's precision plugins hand a model's outputs back in float32 under every precision litgpt runs
    (bf16-true and bf16-mixed included), so the loss is computed in float32 there too. ``counted``: the shifted
    targets that are not ignored, from the batch's host copy (the fused loss's mean, read without a synchronisation)."""
    from litgpt.utils import chunked_cross_entropy

    if strategy.liger:  # the head and the loss fused (one device): the logits are never materialised
        if counted is None:
            raise ValueError("the fused loss takes the batch's count of targets from the host (counted)")
        return fused.loss(model, input_ids, targets, counted)
    if method == "full" or not strategy.kind.chunks_head(strategy):  # ZeRO-3 runs the head whole (same loss)
        logits = model(input_ids).float()
        logits = logits[..., :-1, :]
    else:
        logits = [chunk.float() for chunk in model(input_ids, lm_head_chunk_size=128)]
        logits[-1] = logits[-1][..., :-1, :]
    return chunked_cross_entropy(logits, targets[..., 1:])


def _forward_backward(
    model,
    engine,
    input_ids,
    targets,
    method: str,
    strategy: StrategyConfig,
    autocast,
    accumulation: int,
    is_accumulating: bool,
    counted: int | None = None,
):
    """One micro batch's forward and backward; gradients are synchronised only on the last micro batch of a step
    (``counted``: :func:`litgpt_loss`'s)."""
    with strategy.kind.accumulating(model, is_accumulating):
        with autocast:
            loss = litgpt_loss(model, input_ids, targets, method, strategy, counted)
        if engine is not None:
            engine.backward(loss)  # DeepSpeed divides by gradient_accumulation_steps itself
        else:
            (loss / accumulation).backward()
    return loss


def _optimizer_step(engine, optimizer, scheduler, is_accumulating: bool) -> bool:
    """Step at an accumulation boundary (DeepSpeed decides that itself); whether an optimizer step was taken."""
    if engine is not None:
        engine.step()  # steps the optimizer and scheduler at accumulation boundaries only
        return not is_accumulating
    if is_accumulating:
        return False
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    scheduler.step()
    return True


class _LossLog:
    """Every iteration's loss kept on the device (no host read in the loop) and read at the log interval as litgpt
    logs it: the mean over the last accumulation window (litgpt's ``RunningMean``), here also over ranks. At the end
    :meth:`all_losses` reads every iteration's loss in one transfer, for the point-by-point comparison."""

    def __init__(self, accumulation: int, interval: int, world: int):
        self.accumulation, self.interval, self.world = accumulation, interval, world
        self.losses: list[torch.Tensor] = []
        self.pending = 0

    def add(self, loss) -> None:
        self.losses.append(loss.detach().float())
        self.pending += 1

    def due(self, iter_num: int) -> bool:
        return iter_num % self.interval == 0

    def read(self) -> float:
        """The mean over the window and the ranks (an all-reduce on several ranks, and one ``.item()``)."""
        window = torch.stack(self.losses[-self.accumulation :]).mean()
        if self.world > 1:
            dist.all_reduce(window, op=dist.ReduceOp.SUM)
        self.pending = 0
        return window.item() / self.world

    def all_losses(self) -> list[float]:
        """This rank's loss of every iteration (one device-to-host copy)."""
        return torch.stack(self.losses).tolist() if self.losses else []


def _first_iteration_done(t0: float, device: torch.device) -> None:
    """Record the first iteration's wall time (compilation included): one synchronisation, before the steady state."""
    _synchronize(device)
    rank_stats.note_first_iteration(time.monotonic() - t0)


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _graphs_compiled() -> int:
    """Graphs torch.compile has built in this process so far (dynamo's counter; 0 without compilation)."""
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


def _cache_counts() -> tuple[int, int]:
    """(hits, misses) of inductor's FX graph cache in this process so far: compiled graphs, a forward and a backward
    each, read back from the cache or compiled anew (torch's own counters)."""
    from torch._dynamo.utils import counters

    return int(counters["inductor"]["fxgraph_cache_hit"]), int(counters["inductor"]["fxgraph_cache_miss"])


def _compile_shapes(model, shapes, device, method, strategy, autocast, engine) -> None:
    """Compile every training shape before the first iteration: a forward and backward of a batch of padding per
    (rows, length), gradients discarded, random state restored (dropout's draws stay litgpt's)."""
    if not shapes or strategy.compile != "blocks" or engine is not None:
        return
    t0, cache0 = time.monotonic(), _cache_counts()
    cpu_rng = torch.get_rng_state()
    cuda_rng = torch.cuda.get_rng_state(device) if device.type == "cuda" else None
    for rows, length in shapes:
        ids = torch.zeros((rows, length), dtype=torch.long, device=device)
        labels = torch.full((rows, length), -100, dtype=torch.long, device=device)
        labels[:, 1] = 0  # one counted target a row, so the backward runs through every block
        _forward_backward(model, None, ids, labels, method, strategy, autocast, 1, True, counted=rows)
    for p in model.parameters():
        p.grad = None
    torch.set_rng_state(cpu_rng)
    if cuda_rng is not None:
        torch.cuda.set_rng_state(cuda_rng, device)
    _synchronize(device)
    hits, misses = (after - before for after, before in zip(_cache_counts(), cache0))
    rank_stats.note_compile(time.monotonic() - t0, hits, misses)
    if rank_stats.global_rank() == 0:
        import torch._dynamo.config as dynamo_config

        print(
            f"shapes compiled: {len(shapes)} in {time.monotonic() - t0:.1f} s, {_graphs_compiled()} graphs "
            f"(recompile limit {dynamo_config.recompile_limit}); inductor's cache: {hits} read, {misses} compiled",
            flush=True,
        )


def _eval_args(args: dict):
    """litgpt's EvalArgs from the resolved arguments."""
    from litgpt.args import EvalArgs

    return EvalArgs(**(args.get("eval") or {}))


def loop_precision(args: dict) -> str:
    """The recipe's precision, or where it sets none the one litgpt picks on this device (bf16-mixed, 16-mixed
    without bfloat16); 16-mixed is refused: it needs a gradient scaler tunelab's loop does not have (a set 16-mixed
    is refused before launch)."""
    from litgpt.utils import get_default_supported_precision

    precision = args.get("precision") or get_default_supported_precision(training=True)
    if precision == "16-mixed":
        raise StrategyError(
            "precision: not set, and litgpt's pick on this GPU (no bfloat16) is 16-mixed, which needs a gradient "
            "scaler tunelab's loop does not have; fix: --precision 32-true, or no strategy file"
        )
    return precision


class _Loop:
    """One rank's training run (``fit``): the state litgpt's fit loop keeps, and the steps around the iterations
    (validation and its sample, checkpoints) that are timed apart from them."""

    def __init__(self, args: dict, method: str, strategy: StrategyConfig):
        from litgpt.tokenizer import Tokenizer

        self.rank, self.world, self.device = _setup_device()
        strategy = _fused_kernels(strategy, self.device, self.rank)
        self.args, self.method, self.strategy = args, method, strategy
        self.precision = loop_precision(args)
        self.train = args["train"]
        self.eval_args = _eval_args(args)
        self.out_dir = Path(args["out_dir"])
        self.micro, self.epochs = self.train["micro_batch_size"], self.train.get("epochs") or 1
        self.accumulation = settings.accumulation(self.train["global_batch_size"], self.world, self.micro)
        self.tokenizer = Tokenizer(Path(args["checkpoint_dir"]))
        self.data = _Data(args, self.tokenizer, self.micro, self.rank, self.world, strategy, self.device)
        self.data.max_seq_length = min(self.data.longest(), self.train.get("max_seq_length") or 10**9)
        # as litgpt's fit: the loop runs to train.max_steps or through the epochs (a trailing micro batch short of a
        # whole accumulation window included); the schedule spans the optimizer steps the epochs hold
        self.max_steps = self.train.get("max_steps") or float("inf")
        schedule = min(self.epochs * (self.data.iterations_per_epoch() // self.accumulation), self.max_steps)
        shapes = self.data.shapes(self.epochs, self.max_steps * self.accumulation)
        model = _setup_model(
            args,
            method,
            strategy,
            self.device,
            self.precision,
            self.rank,
            self.world,
            self.data.max_seq_length,
            len(shapes),
        )
        self.model, self.optimizer, self.scheduler, self.engine = _setup_optimizer(
            args, model, strategy, self.device, self.precision, self.micro, self.accumulation, schedule
        )
        self.autocast = (
            torch.autocast(self.device.type, dtype=torch.bfloat16)
            if self.precision == "bf16-mixed"
            else contextlib.nullcontext()
        )
        self.log = _MetricsLog(self.out_dir, self.rank)
        self.losses = _LossLog(self.accumulation, strategy.log_interval or 1, self.world)
        self.lrs: list[float] = []
        self.val_loss = "n/a"
        _compile_shapes(self.model, shapes, self.device, method, strategy, self.autocast, self.engine)

    @property
    def gpt(self):
        """The litgpt GPT inside the wrappers (DDP's ``module``; FSDP keeps the GPT as the root)."""
        model = self.engine.module if self.engine is not None else self.model
        return getattr(model, "module", model)

    @property
    def sharded(self) -> bool:
        return self.strategy.kind.holds_shard(self.strategy)

    def validate(self, max_iters: int) -> float:
        """litgpt's validation (the mean of the first ``max_iters`` batches' losses, on float32 logits), eagerly."""
        with torch.compiler.set_stance("force_eager"):
            return validate(self.model, self.data.val, self.device, self.autocast, max_iters, self.world)

    def generate(self) -> None:
        """litgpt's sample after a validation (rank 0; not under sharding, where the forward is a collective)."""
        if self.rank != 0:
            return
        if self.sharded:
            print("Sample generation skipped: the model is sharded across ranks")
            return
        text = outputs.generate_example(
            self.gpt, self.tokenizer, self.eval_args, self.data.module, self.device, _dtype(self.precision)
        )
        print(text if text is not None else "Sample generation skipped: prompt + eval.max_new_tokens too long")

    def save(self, directory: Path, with_state: bool, iter_num: int, step_count: int) -> None:
        state = None
        if with_state and self.method == "full" and not self.sharded and self.engine is None:
            state = {
                "optimizer": self.optimizer.state_dict(),
                "scheduler": self.scheduler.state_dict(),
                "iter_num": iter_num,
                "step_count": step_count,
            }
        path = outputs.save(
            directory,
            self.method,
            self.model,
            self.engine,
            self.args,
            self.data.module.prompt_style,
            state,
            sharded=self.strategy.kind.sharded,
        )
        if path is not None:
            print(f"Saving checkpoint to {str(directory)!r}", flush=True)
        if self.world > 1:
            dist.barrier()

    def before_training(self) -> None:
        """litgpt's initial validation (the whole validation set) or its 2-batch sanity check."""
        if self.eval_args.initial_validation:
            self.val_loss = f"{self.validate(len(self.data.val)):.3f}"
            if self.rank == 0:
                print(f"Initial validation | val loss: {self.val_loss}", flush=True)
        else:
            if self.rank == 0:
                print("Verifying settings ...", flush=True)
            self.validate(2)

    def after_step(self, iter_num: int, step_count: int, is_accumulating: bool) -> None:
        """At an optimizer step, as litgpt: validation + sample every ``eval.interval`` steps, a checkpoint every
        ``train.save_interval`` steps; their time is noted as a pause of this iteration."""
        save_interval = self.train.get("save_interval")
        validating = step_count % self.eval_args.interval == 0
        saving = bool(save_interval) and step_count % save_interval == 0
        if is_accumulating or not (validating or saving):
            return
        _synchronize(self.device)  # the training work queued before the pause stays this iteration's
        t0 = time.monotonic()
        if validating:
            val = self.validate(self.eval_args.max_iters)
            self.generate()
            if self.rank == 0:
                print(f"iter {iter_num}: val loss {val:.4f}", flush=True)
            self.log.row({"iter": iter_num, "step": iter_num, "val_loss": val, "val_ppl": math.exp(val)})
            self.val_loss = f"{val:.3f}"
        if saving:
            self.save(self.out_dir / f"step-{step_count:06d}", True, iter_num, step_count)
        _synchronize(self.device)
        rank_stats.note_pause(t0, time.monotonic())

    def report(self, epoch: int, iter_num: int, step_count: int, iter_t0: float, is_accumulating: bool) -> None:
        """litgpt's iteration line and metrics.csv row (the loss read from the device: a synchronisation)."""
        loss_value, t1 = self.losses.read(), time.monotonic()
        tokens = self.token_counts["raw_plus_prompt_template"]
        if self.rank == 0:
            print(
                f"Epoch {epoch + 1} | iter {iter_num} step {step_count} | loss train: {loss_value:.3f}, val: "
                f"{self.val_loss} | iter time: {(t1 - iter_t0) * 1000:.2f} ms{' (step)' if not is_accumulating else ''}",
                flush=True,
            )
        self.log.row(
            {
                "epoch": epoch,
                "iter": iter_num,
                "iter_time": t1 - iter_t0,
                "learning_rate": self.lrs[-1],
                "loss": loss_value,
                "step": iter_num,
                "tokens": tokens,
                "total_tokens": tokens * self.world,
            }
        )

    def run(self) -> None:
        """litgpt's fit: iterate micro batches until the run's optimizer steps are done (or the epochs, or LoRA's
        ``train.max_time``), then its performance report, final validation and checkpoint."""
        self.before_training()
        self.token_counts = {"raw": 0, "raw_plus_prompt_template": 0, "padded": 0}
        step_count, iter_num, epoch, iter_t0, is_accumulating = 0, 0, 0, time.monotonic(), True
        ended_early = False  # by the epochs or max_time, not max_steps: litgpt's LoRA loop then samples
        max_time = (self.train.get("max_time") if self.method != "full" else None) or float("inf")
        train_t0 = time.monotonic()
        batches = self.data.epochs(self.epochs)
        graphs_at_start = None
        self.model.train()
        while step_count < self.max_steps:
            iter_t0 = time.monotonic()
            epoch, batch = next(batches, (epoch, None))
            if batch is None:
                ended_early = True
                break
            if iter_t0 - train_t0 > max_time:
                if self.rank == 0:
                    print(f"Max time ({max_time / 60.0:.2f}m) reached, stopping training...")
                ended_early = True
                break
            iter_num += 1
            rank_stats.note_phase("loaded")
            rank_stats.record_iteration(iter_t0, batch["padded"], batch["real"])
            input_ids, targets = batch["input_ids"].to(self.device), batch["labels"].to(self.device)
            is_accumulating = iter_num % self.accumulation != 0
            loss = _forward_backward(
                self.model,
                self.engine,
                input_ids,
                targets,
                self.method,
                self.strategy,
                self.autocast,
                self.accumulation,
                is_accumulating,
                batch["counted"],
            )
            self.losses.add(loss)
            step_count += _optimizer_step(self.engine, self.optimizer, self.scheduler, is_accumulating)
            self.lrs.append(self.optimizer.param_groups[0]["lr"])
            for key, field_ in (("raw", "raw"), ("raw_plus_prompt_template", "real"), ("padded", "padded")):
                self.token_counts[key] += batch[field_]
            if iter_num == 1:
                _first_iteration_done(iter_t0, self.device)
                graphs_at_start = _graphs_compiled()
            if self.losses.due(iter_num):
                self.report(epoch, iter_num, step_count, iter_t0, is_accumulating)
            self.after_step(iter_num, step_count, is_accumulating)
        if self.losses.pending:  # the last iterations since the last read: the run's final figures
            self.report(epoch, iter_num, step_count, iter_t0, is_accumulating)
        _synchronize(self.device)  # the last iteration's work done: where its time, and the window, end
        rank_stats.mark_trained(time.monotonic())
        if graphs_at_start is not None:
            rank_stats.note_graphs_compiled_in_loop(_graphs_compiled() - graphs_at_start)
        if ended_early and self.method != "full":
            self.generate()  # litgpt's LoRA loop samples when the epochs or max_time end it
        self.finish(time.monotonic() - train_t0, iter_num)

    def finish(self, training_time: float, iter_num: int) -> None:
        """litgpt's performance report, the final validation, the final checkpoint (LoRA: merged by litgpt's
        ``merge_lora``), every iteration's loss and learning rate for comparisons."""
        counts = self.token_counts
        totals = reduce_sum(
            [counts["raw"], counts["raw_plus_prompt_template"], counts["padded"]], self.device, self.world
        )
        paused = rank_stats.paused_seconds()
        if self.rank == 0:  # litgpt's performance report (its Training Time includes in-loop validation too)
            tok_s = totals[2].item() / max(training_time - paused, 1e-9)
            memory = torch.cuda.max_memory_allocated() / GB if self.device.type == "cuda" else None
            rank_stats.note_report(report_training_time_s=training_time, report_tok_s=tok_s, report_memory_gb=memory)
            print(
                f"| - Total Tokens (w/ Padding) :  {int(totals[2])}\n| - Training Time             :  "
                f"{training_time:.2f} s\n| - Tok/sec                   :  {tok_s:.2f} tok/s"
            )
            if memory is not None:
                print(f"| - Memory Used               :  {memory:.02f} GB")
        if self.eval_args.final_validation:
            val = self.validate(len(self.data.val))
            if self.rank == 0:
                rank_stats.note_report(report_val_loss=val)
                print(f"Final evaluation | val loss: {val:.3f} | val ppl: {math.exp(val):.3f}")
            self.log.row({"iter": iter_num, "step": iter_num, "val_loss": val, "val_ppl": math.exp(val)})
        self.log.close()
        self._write_iterations()
        final = self.out_dir / "final"
        self.save(final, False, iter_num, 0)
        if self.rank == 0 and self.method != "full":
            outputs.merge(final, self.args)

    def _write_iterations(self) -> None:
        """``<out_dir>/logs/csv/version_0/iterations.csv`` (rank 0): every iteration's own loss, the loss litgpt
        would log there (the mean over the accumulation window) and the learning rate after it."""
        losses = self.losses.all_losses()
        if self.rank != 0:
            return
        path = self.out_dir / "logs" / "csv" / "version_0" / "iterations.csv"
        rows = ["iter,loss,logged_loss,learning_rate"]
        for i, (loss, lr) in enumerate(zip(losses, self.lrs, strict=True), start=1):
            window = losses[max(0, i - self.accumulation) : i]
            rows.append(f"{i},{loss!r},{sum(window) / len(window)!r},{lr!r}")
        files.write_text_atomic(path, "\n".join(rows) + "\n")


def fit(args: dict, method: str, strategy: StrategyConfig) -> None:
    """Train ``args`` (litgpt's resolved arguments) under ``strategy`` on this rank, as litgpt's fit loop does."""
    _Loop(args, method, strategy).run()


def reduce_sum(values: list[float], device: torch.device, world: int) -> torch.Tensor:
    """Sum ``values`` over ranks (no collective on one rank). The tensor lives on the rank's compute device: NCCL,
    the backend on GPUs, only reduces CUDA tensors (a CPU tensor there fails at the end of every run)."""
    t = torch.tensor(values, dtype=torch.float64, device=device)
    if world > 1:
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t


@torch.no_grad()
@torch.no_grad()
def validate(model, val_dl, device, autocast, max_iters: int, world: int) -> float:
    """litgpt's ``validate``: the mean of the first ``max_iters`` validation batches' losses (float32 logits,
    ``chunk_size=0``; eval mode, no autograd graph), here also averaged over ranks."""
    from litgpt.utils import chunked_cross_entropy

    model.eval()
    losses = []
    for k, batch in enumerate(val_dl):
        if k >= max_iters:
            break
        input_ids, targets = batch["input_ids"].to(device), batch["labels"].to(device)
        with autocast:
            logits = model(input_ids).float()
        losses.append(chunked_cross_entropy(logits[..., :-1, :], targets[..., 1:], chunk_size=0).float())
    model.train()
    total = reduce_sum([torch.stack(losses).mean().item() if losses else 0.0], device, world)
    return total[0].item() / world


def main(argv: list[str] | None = None) -> int:
    """torchrun's entry: resolve the recipe with litgpt's parser, set up the process group, train."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--handoff", help="the run folder's hand-off file (tunelab run writes it: tunelab.run.handoff)")
    p.add_argument("--recipe", help="recipe key or YAML path (without --handoff: resolved here by litgpt's parser)")
    p.add_argument("--strategy", help="a configs/strategies/*.yaml file (without --handoff)")
    ns, overrides = p.parse_known_args(argv)
    if not ns.handoff and not (ns.recipe and ns.strategy):
        p.error("give --handoff FILE, or --recipe and --strategy")
    rank_stats.die_with_parent()
    sys.excepthook = rank_stats.excepthook

    atexit.register(rank_stats.write)
    rank_stats.install_step_hook()
    if ns.handoff:  # what the parent resolved and checked once
        method, args, strategy = handoff.read(ns.handoff)
    else:
        recipe = resolve(ns.recipe)
        args = parse(recipe, overrides)  # litgpt's own parser resolves the recipe and overrides
        method, strategy = ("full" if recipe.method == "full" else "lora"), load_strategy(ns.strategy)
    strategy.check(args, "cuda" if torch.cuda.is_available() else "cpu")
    # as litgpt's CLI does (litgpt/__main__.py): float32 matmuls may use TF32 tensor cores. The same recipe then
    # computes the same way under `litgpt finetune_*` and under a --strategy run, and MFU divides by the same peak.
    torch.set_float32_matmul_precision("high")
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    dist.init_process_group(backend=backend)
    try:
        fit(args, method, strategy)
    except BaseException as e:
        rank_stats.record_exception(e)
        raise
    finally:
        rank_stats.write()
        atexit.unregister(rank_stats.write)
    # all ranks leave together: tearing gloo down while a peer is still in a collective aborts the process
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
