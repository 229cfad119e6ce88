"""YAMLs written elsewhere (litgpt's config_hub finetune YAMLs, the lab's original configs), under their own names:
every one is validated, shown and planned, passing or refused with one true line. They are read from the shared
workspace and never copied here; without it these tests skip, saying so."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.conftest import ROOT

FOREIGN = ROOT.parent / "shared" / "foreign"
pytestmark = pytest.mark.skipif(
    not FOREIGN.is_dir(), reason=f"no foreign configs at {FOREIGN} (a clone outside the workspace): nothing to feed"
)
YAMLS = sorted(FOREIGN.glob("*/**/*.yaml")) if FOREIGN.is_dir() else []


def test_every_foreign_yaml_is_validated_shown_and_planned(capsys):
    from tunelab import cli, hardware
    from tunelab.plan.recipe import plan_recipe
    from tunelab.recipes import load
    from tunelab.validate import check

    assert len(YAMLS) >= 40
    for path in YAMLS:
        recipe = load(path)  # refused here only if its name contradicts its contents: none of these do
        expected = (
            "qlora"
            if recipe.config.get("quantize")
            else "lora"
            if any(k.startswith("lora_") for k in recipe.config)
            else "full"
        )
        assert recipe.method == expected, path
        result = check(recipe, [], gpu="A10G")
        assert all("\n" not in str(p) for p in result.problems), path
        errors = [p for p in result.problems if p.severity == "error"]
        # what a clone without the data and checkpoints can still refuse: nothing, for these files
        assert not errors, (path, [str(p) for p in errors])
        plan = plan_recipe(recipe, [], gpu=hardware.lookup("A10G")).plan
        assert plan.peak_allocated_bytes > 0 and plan.fits in (True, False), path
        assert cli.main(["show", str(path)]) == 0
        shown = capsys.readouterr().out
        assert f"litgpt {recipe.command} --config" in shown and "$(tunelab build-model tiny)" in shown


def test_the_labs_full_configs_are_warned_about_their_warm_up():
    """The lab's full configs warm up for 100 steps of a 62-step epoch (Alpaca2k, half held out, batch 16)."""
    from tunelab.recipes import load
    from tunelab.validate import check

    for name in ("tiny-llama-full.yaml", "open-llama-3b-full.yaml"):
        result = check(load(FOREIGN / "lab-configs" / name), [])
        assert any(p.key == "train.lr_warmup_steps" and p.severity == "warning" for p in result.problems), name


def test_a_name_that_contradicts_the_contents_is_refused(tmp_path):
    """litgpt's full.yaml saved as lora.yaml would run as finetune_lora: refused, with the reason."""
    from tunelab.recipes import RecipeError, load

    shutil.copy(FOREIGN / "litgpt-config-hub" / "gemma-2b" / "full.yaml", tmp_path / "lora.yaml")
    with pytest.raises(RecipeError, match="named lora but holds a full config"):
        load(tmp_path / "lora.yaml")
    shutil.copy(FOREIGN / "litgpt-config-hub" / "gemma-2b" / "lora.yaml", tmp_path / "full.yaml")
    with pytest.raises(RecipeError, match="named full but holds a lora config"):
        load(tmp_path / "full.yaml")
    assert load(Path(FOREIGN / "lab-configs" / "tiny-llama-lora.yaml")).command == "finetune_lora"
