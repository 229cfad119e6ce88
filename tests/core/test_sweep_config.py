"""Sweep files: lab-part1 is the spec's s1-s14; unknown keys and impossible rows are refused before anything runs."""

from __future__ import annotations

import json

import pytest

from tunelab.sweep_file import SweepError, load, to_overrides


def test_lab_part1_is_the_spec():
    sweep = load("configs/sweeps/lab-part1.yaml")
    assert [r.id for r in sweep.rows] == [f"s{i}" for i in range(1, 15)]
    rows = {r.id: r for r in sweep.rows}
    assert rows["s1"].settings["train.micro_batch_size"] == 32 and rows["s1"].lab["status"] == "oom"
    assert rows["s3"].settings["train.global_batch_size"] == 32 and rows["s3"].settings["train.micro_batch_size"] == 8
    assert rows["s5"].settings["precision"] == "bf16-mixed" and rows["s5"].lab["tok_s"] == 11016.98
    assert rows["s8"].settings["devices"] == 1 and rows["s8"].lab["status"] == "oom"
    assert rows["s9"].settings["optimizer"] == "SGD" and rows["s9"].settings["train.max_steps"] == 25
    assert rows["s13"].recipe.key == "open-llama-7b/qlora" and rows["s13"].lab["memory_gb"] == 21.25
    assert rows["s14"].recipe.key == "open-llama-13b/lora" and rows["s14"].lab["time_s"] == 222.68


def _write(tmp_path, text):
    p = tmp_path / "sweep.yaml"
    p.write_text(text)
    return p


def test_unknown_keys_refused(tmp_path):
    with pytest.raises(SweepError, match=r"unknown key\(s\) \['colour'\]"):
        load(_write(tmp_path, "name: x\ncolour: red\nrows: [{id: a, recipe: tiny-llama-1.1b/lora}]\n"))
    with pytest.raises(SweepError, match=r"rows\[0\] \(a\): unknown key\(s\) \['precision'\]"):
        load(_write(tmp_path, "name: x\nrows: [{id: a, recipe: tiny-llama-1.1b/lora, precision: 32-true}]\n"))
    with pytest.raises(SweepError, match="row a: train.bogus: litgpt finetune_lora has no such argument"):
        load(_write(tmp_path, "name: x\nrows: [{id: a, recipe: tiny-llama-1.1b/lora, set: {train.bogus: 1}}]\n"))


def test_impossible_row_refused_before_anything_runs(tmp_path):
    text = (
        "name: x\nrows:\n  - {id: ok, recipe: tiny-llama-1.1b/lora}\n"
        "  - {id: bad, recipe: tiny-llama-1.1b/full, set: {train.global_batch_size: 30, train.micro_batch_size: 8}}\n"
    )
    with pytest.raises(SweepError, match="row bad: train.global_batch_size: 30 is not divisible"):
        load(_write(tmp_path, text))
    with pytest.raises(SweepError, match="duplicate row id"):
        load(
            _write(
                tmp_path,
                "name: x\nrows: [{id: a, recipe: tiny-llama-1.1b/lora}, {id: a, recipe: tiny-llama-1.1b/full}]\n",
            )
        )


def test_grid_expands_axes_with_explicit_settings(tmp_path):
    sweep = load(
        _write(
            tmp_path,
            "name: g\ndefaults: {train.max_steps: 3}\ngrid:\n  - recipe: tiny-llama-1.1b/full\n"
            "    axes: {train.micro_batch_size: [1, 2], precision: [32-true, bf16-true]}\n",
        )
    )
    assert [r.id for r in sweep.rows] == [
        "tiny-llama-1.1b-full-micro_batch_size1-precision32-true",
        "tiny-llama-1.1b-full-micro_batch_size1-precisionbf16-true",
        "tiny-llama-1.1b-full-micro_batch_size2-precision32-true",
        "tiny-llama-1.1b-full-micro_batch_size2-precisionbf16-true",
    ]
    assert sweep.rows[3].settings == {"train.max_steps": 3, "train.micro_batch_size": 2, "precision": "bf16-true"}


def test_overrides_are_litgpt_style():
    assert to_overrides({"train.max_steps": None, "lora_mlp": False, "optimizer": "SGD"}) == [
        "--train.max_steps",
        "null",
        "--lora_mlp",
        "false",
        "--optimizer",
        "SGD",
    ]


@pytest.mark.parametrize("bad", ["../../escaped_row", "/abs/path", "a/b", ".", "..", "", ".hidden"])
def test_row_ids_and_names_are_names_not_paths(tmp_path, bad):
    """A row id or sweep name becomes a directory: anything that is not a plain name is refused in one line."""
    from tunelab.sweep_file import SweepError, load

    for text in (
        f"name: ok\nrows:\n  - {{id: {json.dumps(bad)}, recipe: tiny-llama-1.1b/lora}}\n",
        f"name: {json.dumps(bad)}\nrows:\n  - {{id: r1, recipe: tiny-llama-1.1b/lora}}\n",
    ):
        f = tmp_path / "s.yaml"
        f.write_text(text)
        with pytest.raises(SweepError, match="is not a plain name") as e:
            load(f)
        assert "\n" not in str(e.value)


def test_lab_part2_rows_reach_the_labs_step_counts_on_the_benchmark_data():
    """The lab ran m1 for 400 steps, v2 for 50 at global batch 128, ...: on the benchmark data that random-weight
    runs read (1,000 training samples) every row reaches its max_steps; validate warns about a row that cannot."""
    from tunelab.run import runner
    from tunelab.validate import check

    sweep = load("lab-part2")
    for row in sweep.rows:
        result = check(row.recipe, runner.benchmark_overrides(row.recipe, row.overrides()))
        assert not [p for p in result.problems if p.key == "train.max_steps"], row.id
    short = check(
        sweep.rows[0].recipe,
        runner.benchmark_overrides(sweep.rows[0].recipe, [*sweep.rows[0].overrides(), "--train.epochs", "1"]),
    )
    assert any(
        p.key == "train.max_steps" and p.severity == "warning" and "give 250" in p.message for p in short.problems
    )


def test_families_gpu_rows_plan_the_architectures_they_name():
    """configs/sweeps/families-gpu.yaml (the GPU runbook's `families` stage) points TinyLlama recipes at other
    architectures by checkpoint_dir: each row plans (as plan-accuracy will plan its record) the model, method and
    micro batch it says, and every one fits one H100 by the plan, so the stage measures peaks, not OOMs."""
    from tunelab import hardware
    from tunelab.plan.recipe import plan_recipe

    sweep = load("configs/sweeps/families-gpu.yaml")
    got = {}
    for row in sweep.rows:
        planned = plan_recipe(row.recipe, to_overrides(row.settings), gpu=hardware.lookup("H100-SXM"))
        x = planned.input
        got[row.id] = (x.config.name, x.method, str(x.precision), x.micro_batch_size, x.seq_len)
        assert planned.plan.fits, row.id
    assert got == {
        f"{name}-{method}-mb{mb}": (model, method, "bf16-true", mb, 512)
        for name, model, method in [
            ("gemma-2b", "Gemma-2b", "lora"),
            ("phi-2", "phi-2", "lora"),
            ("llama-3.2-1b", "Llama-3.2-1B", "full"),
            ("llama-3.2-1b", "Llama-3.2-1B", "lora"),
            ("mistral-7b", "Mistral-7B-v0.1", "qlora"),
        ]
        for mb in (2, 4)
    }
