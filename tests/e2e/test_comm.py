"""The planner's communication term (tunelab/plan/comm.py): volumes by strategy as the ring algorithms move them,
their growth with devices and fall with bandwidth, nodes, offload, and the lab's Part 2 steps it must explain."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import ROOT, cpu_env


def test_plan_prints_the_communication_and_needs_the_network_for_nodes():
    def plan(*args):
        return subprocess.run(
            [sys.executable, "-m", "tunelab", "plan", "open-llama-7b/full", "--gpu", "A100-80GB", *args],
            cwd=ROOT,
            env=cpu_env(),
            capture_output=True,
            text=True,
            timeout=120,
        )

    slow = json.loads(plan("--strategy", "ddp", "--devices", "4", "--interconnect", "pcie4", "--json").stdout)
    fast = json.loads(plan("--strategy", "ddp", "--devices", "4", "--json").stdout)
    assert slow["projection"]["comm_bytes_per_step"]["gpu"] == pytest.approx(
        fast["projection"]["comm_bytes_per_step"]["gpu"]
    )
    assert slow["projection"]["seconds"] > fast["projection"]["seconds"]
    assert "nvlink3" in fast["projection"]["comm_source"]
    proc = plan("--strategy", "ddp", "--devices", "4", "--num_nodes", "2")
    assert proc.returncode == 2 and "--internode" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    proc = plan("--strategy", "ddp", "--devices", "4", "--interconnect", "carrier-pigeon")
    assert proc.returncode == 2 and "--interconnect carrier-pigeon: unknown gpu link 'carrier-pigeon'" in proc.stderr
