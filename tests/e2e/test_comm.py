"""`tunelab plan`'s refusals about the network, as a child process (the communication term's own checks:
tests/plan/test_comm.py; what plan prints of it: tests/cli/test_plan_json.py)."""

from __future__ import annotations

import subprocess
import sys

from tests.conftest import ROOT, cpu_env


def test_plan_refuses_nodes_without_a_network_and_an_unknown_link_in_one_line():
    """As a child process: exit 2 and one line (tests/cli/test_plan_json.py checks the communication printed)."""

    def plan(*args):
        return subprocess.run(
            [sys.executable, "-m", "tunelab", "plan", "open-llama-7b/full", "--gpu", "A100-80GB", *args],
            cwd=ROOT,
            env=cpu_env(),
            capture_output=True,
            text=True,
            timeout=120,
        )

    proc = plan("--strategy", "ddp", "--devices", "4", "--num_nodes", "2")
    assert proc.returncode == 2 and "--internode" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    proc = plan("--strategy", "ddp", "--devices", "4", "--interconnect", "carrier-pigeon")
    assert proc.returncode == 2 and "--interconnect carrier-pigeon: unknown gpu link 'carrier-pigeon'" in proc.stderr
