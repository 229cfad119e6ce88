"""tunelab.run.handoff: what the parent hands every rank of tunelab's loop comes back exactly as it was resolved (paths
as paths), and a hand-off that is not one is refused in one line."""

import json

import pytest

from tunelab.recipes import discover
from tunelab.run import handoff
from tunelab.strategies import load_strategy
from tunelab.validate import parse


@pytest.mark.parametrize("recipe", [r for r in discover() if r.method != "qlora"], ids=lambda r: r.key)
def test_every_recipes_resolved_arguments_come_back_as_they_were(recipe, tmp_path):
    args = parse(recipe, ["--out_dir", str(tmp_path / "litgpt")])
    strategy = load_strategy("fsdp")
    path = handoff.write(tmp_path, "full" if recipe.method == "full" else "lora", args, strategy)
    method, back, strat_back = handoff.read(path)
    assert back == args and method in ("full", "lora") and strat_back.settings() == strategy.settings()
    assert type(back["checkpoint_dir"]) is type(args["checkpoint_dir"])  # a path stays a path
    assert json.loads(path.read_text())["args"]["out_dir"] == {"path": str(tmp_path / "litgpt")}


def test_a_hand_off_that_is_not_one_is_refused(tmp_path):
    good = {"method": "lora", "args": {}, "strategy": load_strategy("ddp").settings()}
    for bad in ({**good, "extra": 1}, {**good, "method": "qlora"}, {**good, "args": []}, [good]):
        (tmp_path / "h.json").write_text(json.dumps(bad))
        with pytest.raises(ValueError):
            handoff.read(tmp_path / "h.json")
    (tmp_path / "h.json").write_text(json.dumps({**good, "strategy": {**good["strategy"], "name": "nccl"}}))
    with pytest.raises(ValueError):  # the strategy's own checks (StrategyError is an InputError, a ValueError)
        handoff.read(tmp_path / "h.json")
    with pytest.raises(ValueError):  # a value JSON cannot carry is refused when written, not lost
        handoff.write(tmp_path, "lora", {"x": object()}, load_strategy("ddp"))


def test_a_fifo_or_a_missing_file_in_place_of_the_hand_off_is_refused_without_blocking(tmp_path):
    import os

    os.mkfifo(tmp_path / "fifo.json")
    for path in (tmp_path / "fifo.json", tmp_path / "absent.json"):
        with pytest.raises(ValueError, match="hand-off file; fix"):
            handoff.read(path)
