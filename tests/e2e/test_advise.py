"""``tunelab advise`` as a child process: it answers, and bad input is one line (the search itself:
tests/plan/test_advise.py; the written recipe in-process: tests/cli/test_advise.py; the written recipe trained: below,
-m slow)."""

from __future__ import annotations

import json
import math
import os

import pytest

from tests.conftest import one_line_problems, tunelab_cli
from tests.plan.test_advise import _records


def test_the_cli_answers_and_refuses_in_one_line(tmp_path):
    """As a child process: an answer per GPU, JSON, and one line for each bad input (the README's 7B example runs as
    printed in-process, its answer compared with the docs' sample, in tests/e2e/test_printed_commands.py)."""
    proc = tunelab_cli("advise", "tiny-llama-1.1b", "--gpus", "L4,H100-SXM", "--max-devices", "2", "--tokens", "5e6")
    assert proc.returncode == 0, proc.stderr
    assert "fastest: " in proc.stdout and "cheapest: " in proc.stdout and "## H100-SXM" in proc.stdout
    js = json.loads(tunelab_cli("advise", "tiny-llama-1.1b/lora", "--gpus", "L4", "--json").stdout)
    assert js and all(r["fits"] and math.isfinite(r["hours"]) for r in js)
    bad_prices = tmp_path / "prices.yaml"
    bad_prices.write_text("prices:\n  L4: {usd_per_hour: -1, source: x, date: y}\n")
    misspelt = tmp_path / "misspelt.yaml"
    misspelt.write_text("prices:\n  H100-SMX: {usd_per_hour: 3, source: x, date: y}\n")
    twice = tmp_path / "twice.yaml"
    twice.write_text(
        "prices:\n  L4: {usd_per_hour: 1, source: x, date: y}\n  L4: {usd_per_hour: 9, source: x, date: y}\n"
    )
    for argv, fragment in [
        (["advise", "open-llama-7b", "--gpus", "nope"], "unknown GPU"),
        (["advise", "open-llama-7b", "--tokens", "inf"], "--tokens"),
        (["advise", "open-llama-7b", "--prices", bad_prices], "usd_per_hour"),
        (["advise", "open-llama-7b", "--prices", misspelt], "H100-SMX: not a GPU"),
        (["advise", "open-llama-7b", "--prices", twice], "'L4' is given twice"),
        (["advise", "open-llama-7b", "--interconnect", "smoke"], "--interconnect smoke: unknown gpu link"),
        (["advise", "no-such-model"], "no recipe"),
        (["advise", "open-llama-7b", "--nodes", "2"], "--internode"),
    ]:
        problem = one_line_problems(" ".join(map(str, argv)), tunelab_cli(*argv), fragment)
        assert problem is None, problem


def _write_choice(tmp_path):
    """``advise --write`` of the fastest single-L4 LoRA configuration on a --data file of 40 records: the
    process, the data file and the folder written."""
    data = tmp_path / "mine.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in _records(40)))
    out = tmp_path / "choice"
    proc = tunelab_cli(
        "advise", "tiny-llama-1.1b/lora", "--gpus", "L4", "--max-devices", "1", "--data", data, "--write", out
    )
    return proc, data, out


def test_bad_advise_options_are_one_line(tmp_path):
    fifo = tmp_path / "prices.fifo"
    os.mkfifo(fifo)
    a_file = tmp_path / "taken"
    a_file.write_text("mine\n")
    link = tmp_path / "link"
    link.symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    one = tmp_path / "one.json"  # one training sample: fewer than the recipe's global batch, no optimizer step
    one.write_text('[{"instruction": "a", "input": "", "output": "b"}]')
    for argv, fragment in [
        (["--data", one], "fewer than tiny-llama-1.1b/lora's global batch"),
        (["--prices", fifo], "prices.fifo"),
        (["--write", a_file], "not a folder"),
        (["--write", link], "is a link to nothing"),
        (["--strategies", "ddp,warp"], "no strategy 'warp'"),
        (["--precision", "fp8"], "--precision: fp8"),
        (["--data", tmp_path / "missing.json"], "--data"),
        (["--data", "x", "--tokens", "5"], "not allowed with"),
        (["--headroom", "0.9"], "--headroom"),
    ]:
        argv = ["advise", "tiny-llama-1.1b/lora", "--gpus", "L4", *argv]
        problem = one_line_problems(" ".join(map(str, argv)), tunelab_cli(*argv), fragment)
        assert problem is None, problem
    assert a_file.read_text() == "mine\n" and not (tmp_path / "elsewhere").exists()


@pytest.mark.slow  # 40 s on 2 cores: a training run; CI validates the written recipe (above) and trains the tiny
# model through `tunelab run` (tests/e2e/test_runner.py)
def test_the_written_choice_trains(tmp_path):
    """The written recipe as `tunelab run` takes it: the tiny model on this CPU trains on the advised data."""
    proc, _, out = _write_choice(tmp_path)
    assert proc.returncode == 0, proc.stderr
    run = tunelab_cli(
        "run", out / "lora.yaml", "--model", "tiny", "--train.max_steps", "2", "--out", tmp_path / "run", timeout=600
    )
    assert run.returncode == 0, run.stderr[-2000:]
    assert json.loads((tmp_path / "run" / "record.json").read_text())["status"] == "ok"
