"""The simulated step (litgpt's model on fake tensors under torch's MemTracker) and the planner terms named from it:
the fast CPU subset of `tunelab plan-families --simulate` (TinyLlama and Llama 3.2 1B: a 32k and a 128k vocabulary),
the CLI, and QLoRA's terms against our H100 runs."""

from __future__ import annotations

import json

import pytest

from tests.conftest import ROOT, tunelab_cli


def test_plan_simulate_prints_beside_the_plan_and_refuses_sharding():
    proc = tunelab_cli("plan", "tiny-llama-1.1b/lora", "--gpu", "A100-80GB", "--simulate", timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "simulated step" in proc.stdout and "peak: " in proc.stdout and "planned" in proc.stdout
    # bf16: CUDA's flash kernel, which keeps what torch's CPU kernel keeps (at 32-true CUDA runs the memory-efficient
    # kernel, whose output the projection reads as a view: the plan counts one copy per block less than the CPU)
    js = json.loads(
        tunelab_cli(
            "plan", "tiny-llama-1.1b/full", "--precision", "bf16-true", "--simulate", "--json", timeout=300
        ).stdout
    )
    assert js["simulated"]["peak_phase"] in ("forward", "backward", "optimizer step")
    assert js["simulated"]["peak_bytes"] == pytest.approx(js["peak_memory_gb"] * 1e9, rel=0.03)


def test_the_replay_script_refuses_bad_archives_and_outputs_in_one_line_before_replaying(tmp_path):
    """scripts/replay_allocator.py: a file that is not a tar, a record that is not JSON, a rank file without
    iterations, an unknown recipe, and an --out whose folder is missing are each one line and exit 2, the output
    checked before any replay (a replay takes minutes)."""
    import io
    import subprocess
    import sys
    import tarfile

    def archive(members: dict):
        path = tmp_path / f"a{len(list(tmp_path.iterdir()))}.tgz"
        with tarfile.open(path, "w:gz") as tar:
            for name, text in members.items():
                data = text.encode()
                info = tarfile.TarInfo(f"records/{name}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
        return path

    rec = '{"status": "ok", "row_id": "r", "recipe": "%s", "overrides": []}'
    not_tar = tmp_path / "x.tgz"
    not_tar.write_text("not a tar")
    cases = [
        ([not_tar, "r"], "not a tar archive"),
        ([archive({"r/record.json": "{not json"}), "r"], "row r"),
        ([archive({"r/record.json": rec % "tiny-llama-1.1b/lora", "r/stats/rank0.json": '{"iters": []}'}), "r"],
         "no iterations"),
        ([archive({"r/record.json": rec % "no/such", "r/stats/rank0.json": '{"iters": [[1, 2, 3]]}'}), "r"],
         "no/such"),
        ([not_tar, "r", "--out", tmp_path / "missing" / "t.md"], "--out"),
    ]  # fmt: skip
    for argv, fragment in cases:
        proc = subprocess.run(
            [sys.executable, str(ROOT / "scripts" / "replay_allocator.py"), *map(str, argv)],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        lines = (proc.stdout + proc.stderr).strip().splitlines()
        assert proc.returncode == 2 and len(lines) == 1 and fragment in lines[0], (argv, lines)
        assert "Traceback" not in proc.stderr
