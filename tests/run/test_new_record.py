"""The run record's identity comes from the resolved run, not from the recipe file's name."""

import pytest

from tunelab.paths import RECIPES_DIR, ROOT
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


def test_a_recipe_given_from_another_directory_is_the_file_the_child_reads(tmp_path, monkeypatch):
    """A recipe path is taken from the directory the command runs in, as a shell user means it; litgpt's child runs
    in the project root, so its ``--config`` names the same file from there (absolute, outside the project), and a
    recipe inside the project keeps its project-relative path."""
    monkeypatch.setattr(runner, "git_sha", lambda: "")  # a unit test starts no child process (git)
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "lora.yaml").write_text((RECIPES_DIR / "tiny-llama-1.1b" / "lora.yaml").read_text())
    monkeypatch.chdir(mine)
    for given, shown in [("lora.yaml", str(mine / "lora.yaml")), ("tiny-llama-1.1b/lora", None)]:
        prepared = runner.prepare(resolve(given), [], tmp_path / given.replace("/", "-"), "tiny", None)
        launch, _ = runner.launch_command(prepared)
        config = launch[launch.index("--config") + 1]
        assert (ROOT / config).resolve() == prepared.recipe.path.resolve()  # what the child, in ROOT, opens
        assert config == (shown or "recipes/tiny-llama-1.1b/lora.yaml")
