"""The strategies of ``configs/strategies/`` applied to litgpt's model: one place for the multi-device run
(:mod:`tunelab.run.loop`) and its simulation on fake tensors (:mod:`tunelab.plan.trace.ranks`), so that what is planned
is what runs.

DDP (``DistributedDataParallel`` with the file's buckets), FSDP1 (``FullyShardedDataParallel``: each litgpt
``Block`` a unit, the file's sharding, prefetch, offload, mixed precision and ``limit_all_gathers``), FSDP2
(``fully_shard`` on each block, then the root, as litgpt's own FSDP2 path does) and activation checkpointing per
block. DeepSpeed wraps the model with its optimizer (``tunelab.run.loop``).
"""

from __future__ import annotations

import functools
import os
import sys

import torch
import torch.distributed as dist

from tunelab.strategies import StrategyConfig


def wrap(model, strategy: StrategyConfig, device: torch.device, world: int, mesh=None):
    """Apply the strategy to litgpt's model; returns the module to train (DeepSpeed is wrapped later, with the
    optimizer). ``mesh``: FSDP2's device mesh (default: one dimension of ``world`` ranks of ``device``'s type; the
    simulation makes its own outside fake-tensor mode, where a mesh cannot be built); under FSDP1's HYBRID_SHARD a
    two-dimensional (nodes, devices per node) mesh (default: :func:`hybrid_mesh`, the node as torchrun launched it;
    the simulation names one node of ``world``)."""

    wrapper = WRAPS.get(strategy.name)
    if strategy.activation_checkpointing and wrapper is not _fsdp1:  # FSDP1 applies it through FSDP
        from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

        model.transformer.h = torch.nn.ModuleList([checkpoint_wrapper(b) for b in model.transformer.h])
    if wrapper is None or world == 1 and wrapper is _ddp:  # one device, or DeepSpeed (wrapped with its optimizer)
        return model
    return wrapper(model, strategy, device, world, mesh)


def _ddp(model, strategy: StrategyConfig, device: torch.device, world: int, mesh=None):
    """DDP with the file's buckets."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    return DDP(
        model,
        device_ids=[device.index] if device.type == "cuda" else None,
        bucket_cap_mb=strategy.bucket_cap_mb,
        gradient_as_bucket_view=strategy.gradient_as_bucket_view,
        find_unused_parameters=False,
    )


def _fsdp2(model, strategy: StrategyConfig, device: torch.device, world: int, mesh=None):
    """``fully_shard`` on each block, then the root, as litgpt's own FSDP2 path (its ``parallelize_fn``) does."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = mesh or init_device_mesh(device.type, (world,))
    for block in model.transformer.h:
        fully_shard(block, mesh=mesh, reshard_after_forward=strategy.reshard_after_forward)
    fully_shard(model, mesh=mesh, reshard_after_forward=strategy.reshard_after_forward)
    return model


def hybrid_mesh(device: torch.device, world: int):
    """HYBRID_SHARD's (nodes, devices per node) mesh, the node as torchrun launched it (``LOCAL_WORLD_SIZE``): shards
    within a node, replicas across nodes. Without it FSDP1 takes the devices its device handle counts as the node: a
    CPU counts one (and a GPU machine all its GPUs, however many ranks run), so each rank shards over a group of
    one, FSDP1 switches that to NO_SHARD and no gradient is ever averaged across ranks."""

    from torch.distributed.device_mesh import init_device_mesh

    per_node = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    if per_node < 2 or world % per_node:
        raise ValueError(
            f"HYBRID_SHARD on {world} ranks of {per_node} per node: it shards within a node, so it needs 2 or more "
            "devices per node and the same number on each (with one, torch's FSDP1 averages no gradient)"
        )
    return init_device_mesh(device.type, (world // per_node, per_node), mesh_dim_names=("replicate", "shard"))


def _fsdp1(model, strategy: StrategyConfig, device: torch.device, world: int, mesh=None):
    """FSDP1 (``FullyShardedDataParallel``) as a ``name: fsdp`` file says: its sharding, each block a unit (or none),
    backward prefetch, mixed-precision dtypes, ``use_orig_params``, ``limit_all_gathers``, and activation
    checkpointing per block applied through FSDP."""
    if strategy.sharding_strategy == "HYBRID_SHARD" and mesh is None and world > 1:  # one rank: nothing to average
        mesh = hybrid_mesh(device, world)
    from litgpt.model import Block
    from torch.distributed.fsdp import BackwardPrefetch, CPUOffload, MixedPrecision, ShardingStrategy
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp.wrap import transformer_auto_wrap_policy

    mp = None
    if strategy.mixed_precision:
        mp = MixedPrecision(**{k: getattr(torch, v) for k, v in strategy.mixed_precision.items()})
    policy = (
        functools.partial(transformer_auto_wrap_policy, transformer_layer_cls={Block})
        if strategy.auto_wrap == "block"
        else None
    )
    # on a CPU device the parameters are in host RAM already (and torch's FSDP offload needs an accelerator)
    offload = strategy.cpu_offload and device.type != "cpu"
    if strategy.cpu_offload and not offload and dist.get_rank() == 0:
        print("cpu_offload: not applied on a CPU device (the parameters live in host RAM already)", file=sys.stderr)
    fsdp = FSDP(
        model,
        sharding_strategy=getattr(ShardingStrategy, strategy.sharding_strategy),
        auto_wrap_policy=policy,
        cpu_offload=CPUOffload(offload_params=offload),
        backward_prefetch=getattr(BackwardPrefetch, strategy.backward_prefetch) if strategy.backward_prefetch else None,
        mixed_precision=mp,
        device_id=device,
        use_orig_params=True,
        limit_all_gathers=strategy.limit_all_gathers,
        **({"device_mesh": mesh} if mesh is not None and strategy.sharding_strategy == "HYBRID_SHARD" else {}),
    )
    if strategy.activation_checkpointing:
        from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import apply_activation_checkpointing

        apply_activation_checkpointing(fsdp, check_fn=lambda m: isinstance(m, Block))
    return fsdp


WRAPS = {"ddp": _ddp, "fsdp": _fsdp1, "fsdp2": _fsdp2}
"""How each strategy that wraps litgpt's model wraps it, by its file's ``name`` (one device trains the model as it is;
DeepSpeed wraps it with its optimizer in :mod:`tunelab.run.loop`)."""
