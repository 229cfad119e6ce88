"""``tunelab advise``: the search keeps only what the planner says fits, ranks by the planner's own numbers, costs
by the price table, and answers in a moment; bad input is one line."""

from __future__ import annotations

import json
import math

import pytest

from tests.conftest import one_line_problems, tunelab_cli
from tunelab import hardware
from tunelab.plan import advise
from tunelab.recipes import resolve

GPUS = ("A10G", "A100-80GB", "H100-SXM")


@pytest.fixture(scope="module")
def planned():
    recipes = {m: resolve(f"open-llama-7b/{m}") for m in ("full", "lora", "qlora")}
    return advise.candidates(
        recipes, [hardware.lookup(g) for g in GPUS], tokens=5e7, max_devices=8, price_table=advise.prices()
    )


def test_the_advice_never_proposes_what_does_not_fit(planned):
    ranked = advise.rank(planned)
    assert ranked and all(c.fits for c in ranked)
    assert any(not c.fits for c in planned)  # the search did meet configurations that do not fit
    full_one_a10g = [c for c in planned if c.gpu == "A10G" and c.method == "full" and c.world == 1]
    assert full_one_a10g and not any(c.fits for c in full_one_a10g)  # 7B full fine-tuning needs more than 24 GB


def test_each_candidate_is_the_planners_own_prediction(planned):
    """A candidate's peak is memory.predict of the same configuration planned alone through plan_recipe."""
    from tunelab.plan.recipe import plan_recipe

    c = next(c for c in planned if c.gpu == "H100-SXM" and c.method == "lora" and c.strategy == "fsdp")
    alone = plan_recipe(
        resolve("open-llama-7b/lora"),
        ["--train.micro_batch_size", str(c.micro_batch_size), "--devices", str(c.devices)],
        gpu=hardware.lookup("H100-SXM"),
        strategy="fsdp",
        activation_checkpointing=c.activation_checkpointing,
    ).plan
    assert c.peak_gb == pytest.approx(alone.peak_allocated_bytes / 1e9)


def test_ranking_follows_time_and_cost(planned):
    by_time = advise.rank(planned)
    assert [c.hours for c in by_time] == sorted(c.hours for c in by_time)
    by_cost = advise.rank(planned, by="cost")
    priced = [c.cost_usd for c in by_cost if c.cost_usd is not None]
    assert priced == sorted(priced)
    price = advise.prices()["H100-SXM"].usd_per_hour
    c = next(c for c in by_time if c.gpu == "H100-SXM")
    assert c.cost_usd == pytest.approx(c.world * c.hours * price)
    assert all(c.hours <= 0.5 for c in advise.rank(planned, deadline_h=0.5))
    assert all(c.cost_usd <= 10 for c in advise.rank(planned, budget=10))


def test_more_tokens_take_longer_and_slower_links_cost_time():
    recipes = {"full": resolve("open-llama-7b/full")}
    gpu = [hardware.lookup("A100-80GB")]
    small = advise.candidates(recipes, gpu, tokens=1e7, max_devices=4)
    big = advise.candidates(recipes, gpu, tokens=1e8, max_devices=4)
    assert all(b.hours > s.hours for s, b in zip(small, big))
    slow = advise.candidates(recipes, gpu, tokens=1e7, max_devices=4, interconnect="pcie4")
    multi = [(f, s) for f, s in zip(small, slow) if f.world > 1]
    assert multi and all(s.hours > f.hours and s.comm_s_per_step > f.comm_s_per_step for f, s in multi)


def test_the_cli_answers_and_refuses_in_one_line(tmp_path):
    proc = tunelab_cli("advise", "open-llama-7b", "--gpus", ",".join(GPUS), "--max-devices", "8", "--tokens", "5e7")
    assert proc.returncode == 0, proc.stderr
    assert "fastest: " in proc.stdout and "cheapest: " in proc.stdout and "## H100-SXM" in proc.stdout
    js = json.loads(tunelab_cli("advise", "tiny-llama-1.1b/lora", "--gpus", "L4", "--json").stdout)
    assert js and all(r["fits"] and math.isfinite(r["hours"]) for r in js)
    bad_prices = tmp_path / "prices.yaml"
    bad_prices.write_text("prices:\n  L4: {usd_per_hour: -1, source: x, date: y}\n")
    for argv, fragment in [
        (["advise", "open-llama-7b", "--gpus", "nope"], "unknown GPU"),
        (["advise", "open-llama-7b", "--tokens", "inf"], "--tokens"),
        (["advise", "open-llama-7b", "--prices", bad_prices], "usd_per_hour"),
        (["advise", "open-llama-7b", "--interconnect", "smoke"], "unknown gpu link"),
        (["advise", "no-such-model"], "no recipe"),
        (["advise", "open-llama-7b", "--nodes", "2"], "--internode"),
    ]:
        problem = one_line_problems(" ".join(map(str, argv)), tunelab_cli(*argv), fragment)
        assert problem is None, problem


def test_the_written_choice_validates_and_runs(tmp_path):
    """--write: the fastest configuration as a recipe that `tunelab validate` accepts and `tunelab run` trains
    (the tiny model on this CPU), with its launch commands."""
    out = tmp_path / "choice"
    proc = tunelab_cli("advise", "tiny-llama-1.1b/lora", "--gpus", "L4", "--max-devices", "1", "--write", out)
    assert proc.returncode == 0, proc.stderr
    assert (out / "lora.yaml").is_file() and "litgpt finetune_lora --config" in (out / "launch.txt").read_text()
    assert f"launch: tunelab run {out / 'lora.yaml'}" in proc.stdout
    assert tunelab_cli("validate", out / "lora.yaml").returncode == 0
    run = tunelab_cli(
        "run", out / "lora.yaml", "--model", "tiny", "--train.max_steps", "2", "--out", tmp_path / "run", timeout=600
    )
    assert run.returncode == 0, run.stderr[-2000:]
    assert json.loads((tmp_path / "run" / "record.json").read_text())["status"] == "ok"
    several = tmp_path / "several"
    proc = tunelab_cli("advise", "open-llama-7b/lora", "--gpus", "H100-SXM", "--write", several)
    assert proc.returncode == 0 and (several / "strategy.yaml").is_file(), proc.stderr
    assert "--strategy" in (several / "launch.txt").read_text()
    assert tunelab_cli("validate", several / "lora.yaml").returncode == 0
