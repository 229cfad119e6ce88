"""YAMLs written elsewhere (litgpt's config_hub finetune YAMLs, the lab's original configs), under their own names:
every one is validated, shown and planned, passing or refused with one true line. They are read from the shared
workspace and never copied here; without it these tests skip, saying so."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import ROOT
from tests.core.test_foreign import FOREIGN

pytestmark = pytest.mark.skipif(
    not FOREIGN.is_dir(), reason=f"no foreign configs at {FOREIGN} (a clone outside the workspace): nothing to feed"
)


@pytest.mark.slow  # 1 min on 2 cores (and skipped where the foreign configs are absent); CI validates and plans each
# foreign file in-process (tests/core/test_foreign.py)
def test_one_file_per_method_runs_two_steps_on_cpu_or_is_refused_in_one_line(tmp_path):
    """`tunelab run` on foreign files as they are, for 2 optimizer steps on the tiny model: the lab's full config
    and litgpt's LoRA config train; litgpt's QLoRA config is refused before launch (bitsandbytes needs CUDA). Every
    one of them names litgpt.data.Alpaca2k, which downloads: without a network that is one line and leaves nothing
    behind; with `--data JSON --data.json_path ...` (what the line says to do) they run."""
    import json
    import subprocess
    import sys

    from tests.conftest import cpu_env

    def tunelab_run(path: Path, out: Path, *extra: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [
                sys.executable,
                "-m",
                "tunelab",
                "run",
                str(path),
                "--out",
                str(out),
                "--train.max_steps",
                "2",
                "--data.num_workers",
                "0",
                "--eval.max_iters",
                "2",
                *extra,
            ],
            cwd=ROOT,
            env=cpu_env(TUNELAB_OFFLINE="1"),
            capture_output=True,
            text=True,
            timeout=300,
        )

    json_data = ["--data", "JSON", "--data.json_path", "data/alpaca_tunelab.json"]
    data_before = sorted(p.name for p in (ROOT / "data").iterdir())
    offline = tunelab_run(FOREIGN / "lab-configs" / "tiny-llama-lora.yaml", tmp_path / "offline")
    assert offline.returncode == 2 and len(offline.stderr.strip().splitlines()) == 1, offline.stderr
    assert "Alpaca2k" in offline.stderr and "--data JSON --data.json_path" in offline.stderr
    assert not (tmp_path / "offline").exists() and sorted(p.name for p in (ROOT / "data").iterdir()) == data_before

    qlora = tunelab_run(FOREIGN / "litgpt-config-hub" / "tiny-llama" / "qlora.yaml", tmp_path / "qlora", *json_data)
    assert qlora.returncode == 2 and len(qlora.stderr.strip().splitlines()) == 1, qlora.stderr
    assert "quantize: bnb.nf4 on CPU" in qlora.stderr and not (tmp_path / "qlora").exists()

    for method, path in (
        ("full", FOREIGN / "lab-configs" / "tiny-llama-full.yaml"),
        ("lora", FOREIGN / "litgpt-config-hub" / "tiny-llama" / "lora.yaml"),
    ):
        p = tunelab_run(path, tmp_path / method, *json_data)
        assert p.returncode == 0, p.stderr[-3000:]
        rec = json.loads((tmp_path / method / "record.json").read_text())
        assert rec["status"] == "ok" and rec["optimizer_steps"] == 2 and rec["method"] == method, rec["error"]
        assert rec["resolved_args"]["data"]["class_path"].endswith("JSON") and rec["model_source"] == "tiny"
