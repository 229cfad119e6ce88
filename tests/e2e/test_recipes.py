"""The recipe collection: 12 files, each a complete litgpt config with its header, accepted by litgpt itself."""

from __future__ import annotations

import subprocess
import sys

from tests.core.test_recipes import RECIPES


def test_ls_and_show_read_the_files():
    out = subprocess.run([sys.executable, "-m", "tunelab", "ls"], capture_output=True, text=True, check=True).stdout
    header = out.splitlines()[0].split()
    assert header[:9] == ["recipe", "model", "method", "precision", "quantize", "micro", "global", "accum", "devices"]
    row = next(ln.split() for ln in out.splitlines() if ln.startswith("open-llama-13b/full "))
    assert row[3:9] == ["bf16-true", "-", "1", "16", "4", "4"]  # accumulation 16 / (4 devices x micro 1)
    assert len([ln for ln in out.splitlines()[2:] if ln.strip()]) == len(RECIPES)

    shown = subprocess.run(
        [sys.executable, "-m", "tunelab", "show", "open-llama-7b/qlora"], capture_output=True, text=True, check=True
    ).stdout
    assert "quantize: bnb.nf4" in shown
    assert "# launch:   litgpt finetune_lora --config recipes/open-llama-7b/qlora.yaml" in shown
    assert "# download: litgpt download openlm-research/open_llama_7b" in shown


def test_show_unknown_recipe_is_one_line_error():
    p = subprocess.run([sys.executable, "-m", "tunelab", "show", "nope/lora"], capture_output=True, text=True)
    assert p.returncode == 2
    assert p.stderr.count("\n") == 1 and "no recipe 'nope/lora'" in p.stderr
