"""Several devices simulated per rank (tunelab.plan.trace.ranks): FSDP2 sharded as the run shards it under a fake process
group, DDP's buckets; the plan checked against the simulation, the traced collectives against comm.py."""

from __future__ import annotations

import json

import pytest

from tests.conftest import one_line_problems, tunelab_cli


@pytest.mark.slow  # 1 min on 2 cores; CI keeps the simulation against the plan in tests/accuracy/test_ranks.py
def test_plan_simulates_rank_0_beside_the_plan_and_refuses_what_it_cannot():
    proc = tunelab_cli(
        "plan", "tiny-llama-1.1b/lora", "--devices", "2", "--strategy", "ddp", "--simulate", "--json", timeout=300
    )
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)["simulated"]
    assert out["strategy"] == "ddp" and out["world"] == 2 and out["collectives"][0]["kind"] == "all-reduce"
    proc = tunelab_cli("plan", "tiny-llama-1.1b/lora", "--devices", "2", "--simulate", timeout=300)  # litgpt's own
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "simulated rank 0 of 2 under litgpt" in proc.stdout and "parallelize_fn" in proc.stdout
    batch64 = ["--train.global_batch_size", "64"]  # 2 x 2 devices need a global batch of 64
    for argv, fragment in (
        (["plan", "tiny-llama-1.1b/full", "--devices", "2", "--num_nodes", "2", "--simulate", *batch64], "one node"),
        (["plan", "tiny-llama-1.1b/qlora", "--devices", "2", "--strategy", "fsdp2", "--simulate"], "QLoRA"),
    ):
        assert one_line_problems(" ".join(argv), tunelab_cli(*argv), fragment) is None
