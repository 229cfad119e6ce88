"""The recipe collection: 12 files, each a complete litgpt config with its header, accepted by litgpt itself."""

from __future__ import annotations

import sys

import pytest
import yaml

from tunelab.recipes import COMMANDS, discover, resolve
from tunelab.validate import check

MODELS = ["tiny-llama-1.1b", "open-llama-3b", "open-llama-7b", "open-llama-13b"]
METHODS = ["full", "lora", "qlora"]
RECIPES = discover()


def test_the_twelve_recipes_exist():
    keys = {r.key for r in RECIPES}
    assert {f"{m}/{x}" for m in MODELS for x in METHODS} <= keys


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda r: r.key)
def test_header_and_commented_keys(recipe):
    text = recipe.path.read_text()
    header = text.split("checkpoint_dir:")[0]
    for word in ("What for:", "Download:", "Launch:", "Override:", "Lab measurements", "Limits:"):
        assert word in header, f"{recipe.key}: header lacks {word!r}"
    assert f"litgpt {recipe.command} --config recipes/{recipe.key}.yaml" in header
    # keys that matter for memory or speed carry a comment on their line
    for key in ("precision:", "micro_batch_size:", "global_batch_size:", "max_seq_length:", "devices:"):
        line = next(ln for ln in text.splitlines() if ln.strip().startswith(key))
        assert "#" in line, f"{recipe.key}: {key} has no comment"


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda r: r.key)
def test_lab_common_settings(recipe):
    c = recipe.config
    assert c["data"]["class_path"] == "litgpt.data.JSON"
    assert c["data"]["init_args"]["val_split_fraction"] == 0.5 and c["data"]["init_args"]["seed"] == 42
    assert c["train"]["max_seq_length"] == 512 and c["train"]["epochs"] == 1 and c["seed"] == 1337
    assert c["optimizer"]["init_args"] == {"lr": 0.0002, "weight_decay": 0.0, "betas": [0.9, 0.95]}
    if recipe.method in ("lora", "qlora"):
        assert (c["lora_r"], c["lora_alpha"], c["lora_dropout"]) == (32, 16, 0.05)
        assert all(c[k] for k in ("lora_query", "lora_key", "lora_value", "lora_projection", "lora_mlp", "lora_head"))
        assert c["precision"] == "bf16-true" and c["train"]["micro_batch_size"] == 4
    assert (c.get("quantize") == "bnb.nf4") == (recipe.method == "qlora")


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda r: r.key)
def test_every_recipe_validates(recipe):
    result = check(recipe, gpu="A100-80GB")
    assert result.ok, [str(p) for p in result.problems]
    assert result.resolved["train"]["global_batch_size"] == recipe.config["train"]["global_batch_size"]


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda r: r.key)
def test_litgpt_print_config_accepts_recipe(recipe, monkeypatch, capsys):
    """`litgpt finetune_<method> --config <file> --print_config` through litgpt's own entry point."""
    from litgpt.__main__ import main

    monkeypatch.setattr(sys, "argv", ["litgpt", recipe.command, "--config", str(recipe.path), "--print_config"])
    with pytest.raises(SystemExit) as exit_info:
        main()
    assert exit_info.value.code in (0, None)
    printed = yaml.safe_load(capsys.readouterr().out)
    assert printed["checkpoint_dir"] == recipe.config["checkpoint_dir"]
    assert printed["train"]["micro_batch_size"] == recipe.config["train"]["micro_batch_size"]


def test_method_comes_from_file_name():
    assert resolve("open-llama-3b/qlora").command == COMMANDS["qlora"] == "finetune_lora"
    assert resolve("recipes/open-llama-3b/full.yaml").command == "finetune_full"
