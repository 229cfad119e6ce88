"""Multi-device fine-tuning of a litgpt recipe under a chosen strategy: DDP, FSDP (FSDP1 with its knobs),
FSDP2 (``fully_shard``) or DeepSpeed ZeRO 2/3 with CPU offload. Launched by torchrun (one process per device):

    python -m torch.distributed.run --nproc_per_node 4 -m tunelab.distributed.train \\
        --recipe recipes/open-llama-7b/full.yaml --strategy configs/strategies/fsdp.yaml [litgpt overrides]

Why a loop of our own: ``litgpt finetune_*`` hard-codes its strategy (FSDP for full, FSDP2 for LoRA) and offers
neither DDP nor DeepSpeed. This ``fit`` is a faithful copy of litgpt 0.5.13's ``finetune/full.py`` and
``finetune/lora.py`` fit loops, minus checkpoint saving and in-loop evaluation (the lab's Part 2 scripts had
neither): the same model classes and checkpoint loading, the same data module, the same loss
(``chunked_cross_entropy`` on shifted targets, LoRA's ``lm_head_chunk_size=128``), the same accumulation (loss
divided by the accumulation steps, gradient sync only on the last micro batch), the same optimizer construction
(``instantiate_torch_optimizer``) and learning-rate schedule (``get_lr_scheduler``: linear warm-up then cosine),
the same token counting. Each rank takes its share of litgpt's single-device sample order (LitgptOrderSampler), so
the global batch of every step holds the same samples as ``litgpt finetune_*`` on one device.

Each rank writes ``rank<N>.json`` into ``$TUNELAB_STATS_DIR`` (tunelab.entry's format: allocator peaks, retries,
RSS, per-iteration tokens); rank 0 writes litgpt's ``metrics.csv`` columns under ``<out_dir>/logs/csv/version_0``
and prints litgpt's per-iteration line, so ``tunelab run`` collects the same record as for a single device.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import functools
import math
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

from tunelab import rank_stats, settings
from tunelab.distributed.strategy import StrategyConfig, load_strategy


def _dtype(precision: str) -> torch.dtype:
    return torch.bfloat16 if precision == "bf16-true" else torch.float16 if precision == "16-true" else torch.float32


def build_model(args: dict, method: str, device: torch.device, precision: str):
    """litgpt's GPT (or LoRA GPT) with the checkpoint's weights, in the training dtype, trainable params marked."""
    ckpt = Path(args["checkpoint_dir"])
    if method == "full":
        from litgpt.model import GPT, Config

        config = Config.from_file(ckpt / "model_config.yaml")
    else:
        from litgpt.lora import GPT, Config, mark_only_lora_as_trainable

        config = Config.from_file(ckpt / "model_config.yaml", **{k: args[k] for k in (
            "lora_r", "lora_alpha", "lora_dropout", "lora_query", "lora_key", "lora_value", "lora_projection",
            "lora_mlp", "lora_head")})
    torch.manual_seed(args.get("seed", 1337))  # same init on every rank (litgpt: fabric.seed_everything)
    model = GPT(config)
    state = torch.load(ckpt / "lit_model.pth", map_location="cpu", weights_only=True)
    model.load_state_dict(state, strict=method == "full")
    if method != "full":
        mark_only_lora_as_trainable(model)
    model = model.to(device=device, dtype=_dtype(precision) if "true" in precision else torch.float32)
    return model, config


def wrap(model, strategy: StrategyConfig, device: torch.device, precision: str, world: int):
    """Apply the strategy; returns the module to train (DeepSpeed is wrapped later, with the optimizer)."""
    from litgpt.model import Block

    kind = strategy.name
    if strategy.activation_checkpointing and kind not in ("fsdp",):
        from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

        model.transformer.h = torch.nn.ModuleList([checkpoint_wrapper(b) for b in model.transformer.h])
    if kind == "single" or world == 1 and kind == "ddp":
        return model
    if kind == "ddp":
        from torch.nn.parallel import DistributedDataParallel as DDP

        return DDP(model, device_ids=[device.index] if device.type == "cuda" else None,
                   bucket_cap_mb=strategy.bucket_cap_mb, gradient_as_bucket_view=strategy.gradient_as_bucket_view,
                   find_unused_parameters=False)
    if kind == "fsdp":
        from torch.distributed.fsdp import BackwardPrefetch, CPUOffload, MixedPrecision, ShardingStrategy
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
        from torch.distributed.fsdp.wrap import transformer_auto_wrap_policy

        mp = None
        if strategy.mixed_precision:
            mp = MixedPrecision(**{k: getattr(torch, v) for k, v in strategy.mixed_precision.items()})
        policy = functools.partial(transformer_auto_wrap_policy, transformer_layer_cls={Block}) \
            if strategy.auto_wrap == "block" else None
        # on a CPU device the parameters are in host RAM already (and torch's FSDP offload needs an accelerator)
        offload = strategy.cpu_offload and device.type == "cuda"
        if strategy.cpu_offload and not offload and dist.get_rank() == 0:
            print("cpu_offload: not applied on a CPU device (the parameters live in host RAM already)")
        fsdp = FSDP(model, sharding_strategy=getattr(ShardingStrategy, strategy.sharding_strategy),
                    auto_wrap_policy=policy, cpu_offload=CPUOffload(offload_params=offload),
                    backward_prefetch=getattr(BackwardPrefetch, strategy.backward_prefetch)
                    if strategy.backward_prefetch else None, mixed_precision=mp,
                    device_id=device, use_orig_params=True,
                    limit_all_gathers=strategy.limit_all_gathers)
        if strategy.activation_checkpointing:
            from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import apply_activation_checkpointing

            apply_activation_checkpointing(fsdp, check_fn=lambda m: isinstance(m, Block))
        return fsdp
    if kind == "fsdp2":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        mesh = init_device_mesh(device.type, (world,))
        for block in model.transformer.h:  # litgpt's parallelize_fn: each block, then the root
            fully_shard(block, mesh=mesh, reshard_after_forward=strategy.reshard_after_forward)
        fully_shard(model, mesh=mesh, reshard_after_forward=strategy.reshard_after_forward)
        return model
    if kind == "deepspeed":
        return model
    raise ValueError(f"unknown strategy {kind!r}")


def deepspeed_config(strategy: StrategyConfig, micro: int, accumulation: int, precision: str) -> dict:
    zero: dict = {"stage": strategy.zero_stage, "reduce_bucket_size": strategy.reduce_bucket_size,
                  "allgather_bucket_size": strategy.allgather_bucket_size, "overlap_comm": False,
                  "contiguous_gradients": True}
    if strategy.offload_optimizer:
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": torch.cuda.is_available()}
    if strategy.offload_params:
        zero["offload_param"] = {"device": "cpu", "pin_memory": torch.cuda.is_available()}
    return {"train_micro_batch_size_per_gpu": micro, "gradient_accumulation_steps": accumulation,
            "zero_optimization": zero, "bf16": {"enabled": precision.startswith("bf16")},
            "zero_allow_untested_optimizer": True, "zero_force_ds_cpu_optimizer": strategy.cpu_adam,
            "steps_per_print": 10**9, "wall_clock_breakdown": False}


class LitgptOrderSampler(torch.utils.data.Sampler):
    """The global sample order of litgpt's single-device run, dealt out to the ranks like DistributedSampler.

    litgpt's data modules build ``DataLoader(shuffle=True, generator=Generator().manual_seed(seed))``; each epoch's
    iterator first draws one base seed from that generator, then RandomSampler draws its permutation. Replaying
    that here means the global batch of every optimizer step holds the same samples as ``litgpt finetune_*`` on
    one device, for any number of ranks (rank r takes positions r, r + world, ... as DistributedSampler does,
    padding the last round by wrapping around).
    """

    def __init__(self, n: int, rank: int, world: int, seed: int, shuffle: bool = True):
        self.n, self.rank, self.world, self.seed, self.shuffle = n, rank, world, seed, shuffle
        self.epoch = 0
        self.per_rank = math.ceil(n / world)

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return self.per_rank

    def __iter__(self):
        if self.shuffle:
            g = torch.Generator()
            g.manual_seed(self.seed)
            for _ in range(self.epoch + 1):  # one DataLoader iterator per epoch: base-seed draw, then randperm
                torch.empty((), dtype=torch.int64).random_(generator=g)
                order = torch.randperm(self.n, generator=g).tolist()
        else:
            order = list(range(self.n))
        order += order[: self.per_rank * self.world - self.n]
        return iter(order[self.rank::self.world])


def dataloaders(args: dict, tokenizer, micro: int, rank: int, world: int):
    """litgpt's data module (from the recipe), each rank batching its share of litgpt's global sample order."""
    import importlib

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
    out = []
    for dl in (data.train_dataloader(), data.val_dataloader()):
        sampler = LitgptOrderSampler(len(dl.dataset), rank, world, seed=getattr(data, "seed", 42),
                                     shuffle=isinstance(dl.sampler, torch.utils.data.RandomSampler))
        out.append(DataLoader(dl.dataset, batch_size=micro, sampler=sampler, collate_fn=dl.collate_fn,
                              num_workers=getattr(data, "num_workers", 0)))
    return out


def fit(args: dict, method: str, strategy: StrategyConfig) -> None:
    from litgpt.finetune.full import get_lr_scheduler
    from litgpt.tokenizer import Tokenizer
    from litgpt.utils import chunked_cross_entropy, instantiate_torch_optimizer

    rank, world = dist.get_rank(), dist.get_world_size()
    local = int(os.environ.get("LOCAL_RANK", 0))
    device = torch.device("cuda", local) if torch.cuda.is_available() else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    precision = args.get("precision") or "bf16-true"
    train = args["train"]
    micro = train["micro_batch_size"]
    accumulation = settings.accumulation(train["global_batch_size"], world, micro)
    model, config = build_model(args, method, device, precision)
    trainable = [p for p in model.parameters() if p.requires_grad]
    if rank == 0:
        print(f"Number of trainable parameters: {sum(p.numel() for p in trainable):,}")
        print(f"Number of non-trainable parameters: "
              f"{sum(p.numel() for p in model.parameters() if not p.requires_grad):,}")
        print(f"Strategy: {strategy.describe()} on {world} process(es), device {device.type}")
    model = wrap(model, strategy, device, precision, world)
    optimizer = instantiate_torch_optimizer(args["optimizer"], [p for p in model.parameters() if p.requires_grad])
    tokenizer = Tokenizer(Path(args["checkpoint_dir"]))
    train_dl, val_dl = dataloaders(args, tokenizer, micro, rank, world)
    steps_per_epoch = len(train_dl) // accumulation
    max_steps = min((train.get("epochs") or 1) * steps_per_epoch, train.get("max_steps") or float("inf"))
    scheduler = get_lr_scheduler(optimizer, warmup_steps=train["lr_warmup_steps"], max_steps=max_steps)
    engine = None
    if strategy.name == "deepspeed":
        import deepspeed

        if device.type == "cpu":
            # On CPU DeepSpeed JIT-compiles a shared-memory all-reduce op at first use, every rank into one
            # torch-extensions folder under a file lock; a build killed midway leaves the lock and every later run
            # waits on it forever (seen here). gloo's all-reduce does the same job.
            deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False

        engine, optimizer, _, scheduler = deepspeed.initialize(
            model=model, optimizer=optimizer, lr_scheduler=scheduler,
            config=deepspeed_config(strategy, micro, accumulation, precision))
        model = engine
    autocast = torch.autocast(device.type, dtype=torch.bfloat16) if precision == "bf16-mixed" else \
        contextlib.nullcontext()

    out_dir = Path(args["out_dir"])
    csv_path = out_dir / "logs" / "csv" / "version_0" / "metrics.csv"
    writer = None
    if rank == 0:
        csv_path.parent.mkdir(parents=True, exist_ok=True)
        csv_file = open(csv_path, "w", newline="")
        writer = csv.DictWriter(csv_file, fieldnames=["epoch", "iter", "iter_time", "learning_rate", "loss", "step",
                                                      "tokens", "total_tokens", "val_loss", "val_ppl"])
        writer.writeheader()

    token_counts = {"raw": 0, "raw_plus_prompt_template": 0, "padded": 0}
    step_count, iter_num, epoch = 0, 0, 0
    running = []
    train_t0 = time.monotonic()
    train_dl.sampler.set_epoch(epoch)
    batches = iter(train_dl)
    model.train()
    while step_count < max_steps:
        iter_t0 = time.monotonic()
        try:
            batch = next(batches)
        except StopIteration:
            epoch += 1
            if epoch >= (train.get("epochs") or 1):
                break
            train_dl.sampler.set_epoch(epoch)
            batches = iter(train_dl)
            batch = next(batches)
        iter_num += 1
        rank_stats.note_phase("loaded")
        rank_stats.record_iteration(iter_t0, int(batch["input_ids"].numel()),
                                    int(batch["token_counts"]["raw_plus_prompt_template"].sum()))
        input_ids, targets = batch["input_ids"].to(device), batch["labels"].to(device)
        is_accumulating = iter_num % accumulation != 0
        sync = contextlib.nullcontext()
        if is_accumulating and strategy.name in ("ddp", "fsdp") and hasattr(model, "no_sync"):
            sync = model.no_sync()
        elif strategy.name == "fsdp2":
            model.set_requires_gradient_sync(not is_accumulating)
        with sync:
            with autocast:
                # ZeRO-3 hangs when a module (the chunked LoRA head) runs a data-dependent number of times per
                # forward (its prefetch trace changes between steps): there the head is not chunked (same loss).
                if method == "full" or (strategy.name == "deepspeed" and strategy.zero_stage == 3):
                    logits = model(input_ids)
                    logits = logits[..., :-1, :]
                else:
                    logits = model(input_ids, lm_head_chunk_size=128)
                    logits[-1] = logits[-1][..., :-1, :]
                loss = chunked_cross_entropy(logits, targets[..., 1:])
            if engine is not None:
                engine.backward(loss)  # DeepSpeed divides by gradient_accumulation_steps itself
            else:
                (loss / accumulation).backward()
        running.append(loss.detach().float())
        if engine is not None:
            engine.step()  # steps the optimizer and scheduler at accumulation boundaries only
            if not is_accumulating:
                step_count += 1
        elif not is_accumulating:
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            scheduler.step()
            step_count += 1
        token_counts["raw"] += int(batch["token_counts"]["raw"].sum())
        token_counts["raw_plus_prompt_template"] += int(batch["token_counts"]["raw_plus_prompt_template"].sum())
        token_counts["padded"] += int(input_ids.numel())
        # litgpt: RunningMean over the accumulation window; here also averaged over ranks for the log
        window = torch.stack(running[-accumulation:]).mean()
        dist.all_reduce(window, op=dist.ReduceOp.SUM)
        loss_value = window.item() / world
        t1 = time.monotonic()
        if rank == 0:
            lr = (optimizer.param_groups[0]["lr"])
            print(f"Epoch {epoch + 1} | iter {iter_num} step {step_count} | loss train: {loss_value:.3f}, val: n/a |"
                  f" iter time: {(t1 - iter_t0) * 1000:.2f} ms{' (step)' if not is_accumulating else ''}", flush=True)
            writer.writerow({"epoch": epoch, "iter": iter_num, "iter_time": t1 - iter_t0, "learning_rate": lr,
                             "loss": loss_value, "step": iter_num, "tokens": token_counts["raw_plus_prompt_template"],
                             "total_tokens": token_counts["raw_plus_prompt_template"] * world})
            csv_file.flush()
    training_time = time.monotonic() - train_t0
    totals = reduce_sum([token_counts["raw"], token_counts["raw_plus_prompt_template"], token_counts["padded"]],
                        device)
    if rank == 0:  # litgpt's performance report
        print(f"| - Total Tokens (w/ Padding) :  {int(totals[2])}\n| - Training Time             :  "
              f"{training_time:.2f} s\n| - Tok/sec                   :  {totals[2].item() / training_time:.2f} tok/s")
        if device.type == "cuda":
            print(f"| - Memory Used               :  {torch.cuda.max_memory_allocated() / 1e9:.02f} GB")
    if args.get("eval", {}).get("final_validation", True):
        val = validate(model, val_dl, device, autocast, method)
        if rank == 0:
            print(f"Final evaluation | val loss: {val:.3f} | val ppl: {math.exp(val):.3f}")
            writer.writerow({"iter": iter_num, "step": iter_num, "val_loss": val, "val_ppl": math.exp(val)})
    if rank == 0:
        csv_file.close()


def reduce_sum(values: list[float], device: torch.device) -> torch.Tensor:
    """Sum ``values`` over ranks. The tensor lives on the rank's compute device: NCCL, the backend on GPUs, only
    reduces CUDA tensors (a CPU tensor there fails at the end of every run); gloo takes CPU ones."""
    t = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t


@torch.no_grad()
def validate(model, val_dl, device, autocast, method) -> float:
    from litgpt.utils import chunked_cross_entropy

    model.eval()
    loss_sum, batches = 0.0, 0
    for batch in val_dl:
        input_ids, targets = batch["input_ids"].to(device), batch["labels"].to(device)
        with autocast:
            logits = model(input_ids)
        loss_sum += chunked_cross_entropy(logits[..., :-1, :], targets[..., 1:], chunk_size=0).float().item()
        batches += 1
    total = reduce_sum([loss_sum, batches], device)
    model.train()
    return (total[0] / total[1]).item()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--recipe", required=True, help="recipe key or YAML path")
    p.add_argument("--strategy", required=True, help="a configs/strategies/*.yaml file")
    ns, overrides = p.parse_known_args(argv)
    rank_stats.die_with_parent()
    from tunelab.recipes import resolve
    from tunelab.validate import parse

    sys.excepthook = rank_stats.excepthook
    import atexit

    atexit.register(rank_stats.write)
    rank_stats.install_step_hook()
    recipe = resolve(ns.recipe)
    args = parse(recipe, overrides)  # litgpt's own parser resolves the recipe and overrides
    strategy = load_strategy(ns.strategy)
    strategy.check(recipe.method, args)
    # as litgpt's CLI does (litgpt/__main__.py): float32 matmuls may use TF32 tensor cores. The same recipe then
    # computes the same way under `litgpt finetune_*` and under a --strategy run, and MFU divides by the same peak.
    torch.set_float32_matmul_precision("high")
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    dist.init_process_group(backend=backend)
    try:
        fit(args, "full" if recipe.method == "full" else "lora", strategy)
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
