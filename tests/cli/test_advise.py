"""`tunelab advise --write` run in-process: the chosen configuration written as a recipe that `tunelab validate`
accepts, with its launch commands (the same written recipe trained by `tunelab run`: tests/e2e/test_advise.py, -m
slow)."""

from __future__ import annotations

import json

import yaml

from tests.conftest import tunelab_here
from tests.plan.test_advise import _records


def test_the_written_choice_validates(tmp_path):
    """--write: the fastest configuration as a recipe that `tunelab validate` accepts, on the --data file advised
    on, with its launch commands (one on one GPU, one with a strategy file on several)."""
    data = tmp_path / "mine.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in _records(40)))
    out = tmp_path / "choice"
    code, stdout, err = tunelab_here(
        "advise", "tiny-llama-1.1b/lora", "--gpus", "L4", "--max-devices", "1", "--data", data, "--write", out
    )
    assert code == 0, err
    assert "20 training samples of" in stdout  # the recipe's val_split_fraction 0.5 holds out half
    assert (out / "lora.yaml").is_file() and "litgpt finetune_lora --config" in (out / "launch.txt").read_text()
    assert f"launch: tunelab run {out / 'lora.yaml'}" in stdout
    written = yaml.safe_load((out / "lora.yaml").read_text())
    assert written["data"]["init_args"]["json_path"] == str(data.resolve())
    assert tunelab_here("validate", out / "lora.yaml")[0] == 0
    several = tmp_path / "several"
    code, _, err = tunelab_here("advise", "open-llama-7b/lora", "--gpus", "H100-SXM", "--write", several)
    assert code == 0 and (several / "strategy.yaml").is_file(), err
    assert "--strategy" in (several / "launch.txt").read_text()
    assert tunelab_here("validate", several / "lora.yaml")[0] == 0
    # --json with --write: stdout is the JSON alone (no row repeated for a GPU asked twice), the choice written
    as_json = tmp_path / "as-json"
    code, stdout, err = tunelab_here(
        "advise", "tiny-llama-1.1b/lora", "--gpus", "L4,L4", "--max-devices", "1", "--json", "--write", as_json
    )
    assert code == 0, err
    rows = json.loads(stdout)
    assert rows and len({json.dumps(r, sort_keys=True) for r in rows}) == len(rows)
    assert (as_json / "lora.yaml").is_file() and "launch: tunelab run" in err
