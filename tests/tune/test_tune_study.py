"""Tuning studies (tunelab tune-study, configs/sweeps/lab-part3.yaml): the file is checked in one line per problem,
the settings run as real probes (tunelab's multi-device loop under FSDP, the tiny model, CPU), a second call reuses
every probe, and the report reads the records back: the tables, the reference figures, predicted vs probed, the
CSV in fixed columns, the plot, and the probes a time limit cut short."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from tunelab.tune import study as tune_study

STUDY = {
    "name": "fsdp-tune",
    "description": "a two-setting study of the tiny model",
    "lab_hardware": "a reference machine",
    "studies": [
        {
            "id": "tiny-fsdp",
            "recipe": "tiny-llama-1.1b/full",
            "strategy": "fsdp",
            "devices": 1,
            "checkpoint": "tiny",
            "gpu": "H100-SXM",
            "steps": 2,
            "set": {"precision": "32-true", "data.num_workers": 0},
            "settings": [
                {"id": "fsdp", "activation_checkpointing": False, "backward_prefetch": "none", "max_micro": 1},
                {"id": "fsdp-ac", "activation_checkpointing": True, "backward_prefetch": "none", "max_micro": 1},
                {
                    "id": "fsdp-ac-prefetch",
                    "activation_checkpointing": True,
                    "backward_prefetch": "pre",
                    "at_best_of": "fsdp-ac",
                },
            ],
        }
    ],
    "lab": {
        "fsdp": [
            {
                "micro": 7,
                "memory_mb": 14736,
                "util": 86.2,
                "util_std": 9.7,
                "tflops": 43.52,
                "iter_ms": 748,
                "best": True,
            },
            {"micro": 9, "status": "oom"},
        ]
    },
}


def _write(tmp_path: Path, study: dict) -> Path:
    path = tmp_path / "study.yaml"
    path.write_text(yaml.safe_dump(study, sort_keys=False))
    return path


def test_the_shipped_study_file_loads_and_names_real_recipes_strategies_and_gpus():
    sf = tune_study.load("lab-part3")
    chosen = tune_study.check(sf, None)
    assert {s.id for s in chosen} >= {"tiny-llama-1.1b-full", "open-llama-3b-full", "cpu-example"}
    assert {s.devices for s in chosen} == {1, 2, 4}
    for s in chosen:  # every study has the three tables of the reference: off, on, on + prefetch at the best
        assert [(st.activation_checkpointing, st.backward_prefetch) for st in s.settings] == [
            (False, "none"),
            (True, "none"),
            (True, "pre"),
        ]
    assert set(sf.lab) == {"fsdp", "fsdp-ac", "fsdp-ac-prefetch", "fsdp-ac-3b"}


@pytest.mark.parametrize(
    "change, expected",
    [
        (lambda s: s["studies"][0].update(color="red"), "unknown key(s) ['color']"),
        (lambda s: s["studies"][0]["settings"][2].update(at_best_of="nope"), "at_best_of: 'nope' is not an earlier"),
        (
            lambda s: s["studies"][0]["settings"][0].update(backward_prefetch="sometimes"),
            "backward_prefetch: 'sometimes'",
        ),
        (lambda s: s["studies"][0]["settings"][1].update(activation_checkpointing=False), "the same activation"),
        (lambda s: s["studies"][0].update(steps=1), "steps: too few; fix: give 2 or more"),
        (lambda s: s["studies"][0]["settings"][0].update(max_micro=0), "max_micro: 0 must be >= 1"),
        (lambda s: s.update(rows=[]), "unknown key(s) ['rows']"),
        (lambda s: s["studies"][0].update(gpu=5), "gpu: got the int '5'"),
        (lambda s: s["studies"][0].update(id="../escape"), "id '../escape' is repeated or not a plain name"),
        (
            lambda s: s["studies"][0].update(memory_limit_gb=1e400),
            "memory_limit_gb: inf is not a size; fix: a finite number",
        ),
        (lambda s: s.update(lab={"fsdp": [{"memory_mb": 9028}]}), "lab: fsdp[0]: micro: got the NoneType"),
        (lambda s: s.update(lab={"fsdp": [{"micro": 8, "iter_ms": "fast"}]}), "lab: fsdp[0]: iter_ms: got the str"),
        (lambda s: s.update(lab={"fsdp": [{"micro": 8, "iter_ms": 0}]}), "lab: fsdp[0]: iter_ms: 0 is not a time"),
    ],
)
def test_a_bad_study_file_is_refused_in_one_line_naming_the_key(tmp_path, change, expected):
    study = json.loads(json.dumps(STUDY))
    change(study)
    with pytest.raises(tune_study.StudyError) as e:
        tune_study.load(_write(tmp_path, study))
    assert expected in str(e.value) and "\n" not in str(e.value)


def test_settings_litgpt_refuses_are_refused_before_any_probe(tmp_path):
    study = json.loads(json.dumps(STUDY))
    study["studies"][0]["set"]["trian.micro_batch_size"] = 2
    with pytest.raises(tune_study.StudyError) as e:
        tune_study.check(tune_study.load(_write(tmp_path, study)), None)
    assert "study tiny-fsdp: set:" in str(e.value) and "trian.micro_batch_size" in str(e.value)


@pytest.mark.parametrize(
    "change, said",
    [
        (lambda s: s.update(recipe="tiny-llama-1.1b/qlora"), "strategy fsdp: quantize=bnb.nf4 under fsdp"),
        (lambda s: s["set"].update(precision="16-mixed"), "strategy fsdp: precision: 16-mixed needs a gradient"),
    ],
)
def test_a_study_its_strategy_refuses_is_refused_before_anything_is_written(tmp_path, change, said):
    """A QLoRA or 16-mixed study under a strategy file passed the check and ended at its first probe, naming a
    strategy file the study had written (stout/q/.../strategy-ac-off-prefetch-none.yaml); now one line first."""
    study = json.loads(json.dumps(STUDY))
    change(study["studies"][0])
    with pytest.raises(tune_study.StudyError) as e:
        tune_study.check(tune_study.load(_write(tmp_path, study)), None)
    assert "study tiny-fsdp: " + said in str(e.value) and "fix:" in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize(
    "overrides, key",
    [
        (["--train.micro_batch_size", "0"], "--train.micro_batch_size 0"),
        (["--train", "{max_steps: 3}"], "--train.max_steps 3"),
        (["--eval.final_validation", "false"], "--eval.final_validation False"),
    ],
)
def test_an_override_of_what_each_probe_sets_is_refused_not_replaced_unseen(overrides, key):
    """tune-batch and tune-study: a probe sets its own micro batch, steps and saving; an override of one of them
    (dotted or a group given whole) is refused, naming it, before any probe; one equal to the recipe's is not."""
    from tunelab.recipes import resolve
    from tunelab.tune.batch import probe_problems

    recipe = resolve("tiny-llama-1.1b/full")
    problems = probe_problems(recipe, overrides, 1, 4, False)
    assert len(problems) == 1 and problems[0].startswith(f"{key}: each probe sets it"), problems
    assert (
        probe_problems(
            recipe, ["--train.micro_batch_size", str(recipe.config["train"]["micro_batch_size"])], 1, 4, False
        )
        == []
    )
