"""The run record's identity comes from the resolved run, not from the recipe file's name."""

import pytest

from tunelab.recipes import resolve
from tunelab.run import runner


@pytest.mark.parametrize(
    ("recipe", "overrides", "method", "quantize"),
    [
        ("tiny-llama-1.1b/lora", ["--quantize", "bnb.nf4"], "qlora", "bnb.nf4"),
        ("tiny-llama-1.1b/qlora", ["--quantize", "null"], "lora", None),
        ("tiny-llama-1.1b/lora", [], "lora", None),
    ],
)
def test_the_record_names_the_method_the_run_resolves_to(tmp_path, monkeypatch, recipe, overrides, method, quantize):
    """litgpt runs LoRA and QLoRA through one ``finetune_lora``: ``--quantize`` decides which the record says. The
    GPU is stood in for (bitsandbytes' 4-bit weights are refused on CPU before launch); nothing is launched."""
    monkeypatch.setattr(runner, "cuda_available", lambda: True)
    monkeypatch.setattr(runner, "git_sha", lambda: "")  # a unit test starts no child process (git)
    prepared = runner.prepare(resolve(recipe), overrides, tmp_path / "run", "tiny", None)
    record = runner.new_record(prepared, ["-m", "tunelab.run.entry"], 1, None, "row")
    assert (record.method, record.quantize, record.recipe) == (method, quantize, recipe)
