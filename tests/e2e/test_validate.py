"""`tunelab validate`: every bad input is refused with one line naming the file, the key and the fix."""

from __future__ import annotations

import subprocess
import sys


# (recipe, overrides, options, key, words expected in the message)
def test_cli_exit_codes_and_one_line_per_problem():
    ok = subprocess.run(
        [sys.executable, "-m", "tunelab", "validate", "tiny-llama-1.1b/lora"], capture_output=True, text=True
    )
    assert ok.returncode == 0 and "ok  tiny-llama-1.1b/lora" in ok.stdout
    bad = subprocess.run(
        [
            sys.executable,
            "-m",
            "tunelab",
            "validate",
            "tiny-llama-1.1b/lora",
            "open-llama-7b/qlora",
            "--devices",
            "2",
            "--train.lr_warmup_steps",
            "0",
        ],
        capture_output=True,
        text=True,
    )
    assert bad.returncode == 1
    lines = bad.stdout.splitlines()
    assert "recipes/open-llama-7b/qlora.yaml: quantize: bnb.nf4 on 2 devices: " in bad.stdout
    assert sum(ln.startswith("recipes/tiny-llama-1.1b/lora.yaml: train.lr_warmup_steps:") for ln in lines) == 1
    assert lines[-1] == "0 of 2 recipes valid"
