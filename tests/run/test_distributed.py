"""Multi-device strategies for real on CPU: 2 processes over gloo under DDP, FSDP (each sharding), FSDP2 and
DeepSpeed ZeRO-2/3 (+ CPU offload), each against the single-process `litgpt finetune_full` run with the same
global batch; two-rank records; a two-"node" torchrun on localhost; the refusals."""

from __future__ import annotations

from pathlib import Path

import pytest

from tunelab.recipes import resolve
from tunelab.run.runner import RunError, RunOptions, run

ROOT = Path(__file__).resolve().parents[2]
STRATEGIES = [
    "ddp",
    "fsdp",
    "fsdp-shard-grad-op",
    "fsdp-hybrid",
    "fsdp-no-shard",
    "fsdp-offload",
    "fsdp-no-wrap",
    "fsdp2",
    "deepspeed-zero2",
    "deepspeed-zero3",
    "deepspeed-zero3-offload",
]


def test_refusals(tiny_ckpt, tmp_path):
    with pytest.raises(RunError, match="single-device"):
        run(
            resolve("tiny-llama-1.1b/qlora"),
            ["--devices", "2", "--checkpoint_dir", str(tiny_ckpt)],
            tmp_path / "q",
            RunOptions(model="checkpoint", strategy="fsdp"),
        )
    with pytest.raises(RunError, match="no strategy 'zero9'"):
        run(
            resolve("tiny-llama-1.1b/full"),
            ["--checkpoint_dir", str(tiny_ckpt)],
            tmp_path / "z",
            RunOptions(model="checkpoint", strategy="zero9"),
        )
    from tunelab.strategies import StrategyError, load_strategy

    with pytest.raises(StrategyError, match="QLoRA runs on one device"):
        load_strategy("fsdp2").check({"quantize": "bnb.nf4"})
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: fsdp\nsharding: FULL\n")
    with pytest.raises(RunError, match=r"unknown key\(s\) \['sharding'\]"):
        run(
            resolve("tiny-llama-1.1b/full"),
            ["--checkpoint_dir", str(tiny_ckpt)],
            tmp_path / "b",
            RunOptions(model="checkpoint", strategy=str(bad)),
        )


def test_every_strategy_file_for_several_devices_is_trained_on_two_ranks_here():
    """The two-rank test above (its losses equal the single process's only if the ranks average their gradients)
    covers every strategy file that runs several devices; a one-device file (name: single) is refused on two."""
    from tunelab.strategies import StrategyError, load_strategy

    files = sorted(p.stem for p in (ROOT / "configs" / "strategies").glob("*.yaml"))
    several = {f for f in files if load_strategy(f).name != "single"}
    assert several == set(STRATEGIES)
    for f in set(files) - several:
        with pytest.raises(StrategyError, match="name: single runs one device"):
            load_strategy(f).check_world(2, f)


def test_hybrid_shard_shards_within_the_node_torchrun_launched(monkeypatch):
    """HYBRID_SHARD is wrapped on a (nodes, devices per node) mesh from torchrun's LOCAL_WORLD_SIZE: left to FSDP1's
    own groups a CPU counts as a node of one device, FSDP1 switches that group of one to NO_SHARD and the ranks never
    average a gradient (the two-rank run's losses then part from the single process's at the second step). One
    device per node is refused, before a model is built and again where the mesh is made."""
    import torch

    from tunelab.parallel import hybrid_mesh
    from tunelab.strategies import StrategyError, load_strategy

    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")
    with pytest.raises(ValueError, match="needs 2 or more devices per node"):
        hybrid_mesh(torch.device("cpu"), 2)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "3")
    with pytest.raises(ValueError, match="the same number on each"):
        hybrid_mesh(torch.device("cpu"), 4)
    hybrid = load_strategy("fsdp-hybrid")
    with pytest.raises(StrategyError, match="HYBRID_SHARD with 1 device per node"):
        hybrid.check({"devices": 1, "num_nodes": 2})
    hybrid.check({"devices": 2, "num_nodes": 2})  # two per node: sharded within each
    load_strategy("ddp").check({"devices": 1, "num_nodes": 2})
