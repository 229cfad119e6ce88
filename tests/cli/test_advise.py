"""`tunelab advise --write` run in-process: the chosen configuration written as a recipe that `tunelab validate`
accepts, with its launch commands (the same written recipe trained by `tunelab run`: tests/e2e/test_advise.py, -m
slow)."""

from __future__ import annotations

import json

import pytest
import yaml

from tests.conftest import ROOT, tunelab_here
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
    # as launch.txt runs it (tunelab's loop); litgpt's own would end with its LoRA sample on rank 0 alone
    assert tunelab_here("validate", several / "lora.yaml", "--strategy", several / "strategy.yaml")[0] == 0
    assert "rank 0 alone" in tunelab_here("validate", several / "lora.yaml")[1]
    # --json with --write: stdout is the JSON alone (no row repeated for a GPU asked twice), the choice written
    as_json = tmp_path / "as-json"
    code, stdout, err = tunelab_here(
        "advise", "tiny-llama-1.1b/lora", "--gpus", "L4,L4", "--max-devices", "1", "--json", "--write", as_json
    )
    assert code == 0, err
    rows = json.loads(stdout)
    assert rows and len({json.dumps(r, sort_keys=True) for r in rows}) == len(rows)
    assert (as_json / "lora.yaml").is_file() and "launch: tunelab run" in err


def test_a_known_host_times_every_configuration_and_the_header_says_where_it_came_from(monkeypatch):
    """`--host-us-per-op` (`--host`): litgpt's host-bound one-device LoRA runs take the figure given (a slower host,
    a longer run), the DDP candidates too (their micro batches are timed at the same loop's host cost); the header
    names where it came from; `--host auto` uses the figure measured here, and without CUDA refuses in one line."""
    import torch

    from tunelab.plan.trace import host_probe

    def advised(*extra):
        argv = ("advise", "tiny-llama-1.1b/lora", "--gpus", "H100-SXM", "--max-devices", "2", "--top", "40")
        code, out, err = tunelab_here(*argv, *extra)
        assert code == 0, err
        return out

    def hours(argv: tuple) -> dict:
        code, out, err = tunelab_here(
            "advise", "tiny-llama-1.1b/lora", "--gpus", "H100-SXM", "--max-devices", "2", "--json", *argv
        )
        assert code == 0, err
        return {(c["strategy"], c["precision"], c["micro_batch_size"]): c["hours"] for c in json.loads(out)}

    fast, median, slow = hours(("--host", "30")), hours(()), hours(("--host-us-per-op", "120"))
    assert fast.keys() == median.keys() == slow.keys()
    for strategy in ("single", "ddp"):
        key = next(k for k in median if k[0] == strategy and k[2] == 1)  # micro 1: launch-bound
        assert fast[key] < median[key] < slow[key], (key, fast[key], median[key], slow[key])
    assert "host: litgpt's loop at 30 us an op, as given (--host-us-per-op)" in advised("--host", "30")
    assert "the median machine's" in advised()
    if not torch.cuda.is_available():
        code, out, err = tunelab_here("advise", "tiny-llama-1.1b/lora", "--gpus", "H100-SXM", "--host", "auto")
        assert code == 2 and len(err.strip().splitlines()) == 1 and "no CUDA device here" in err, err
    probe = host_probe.HostProbe(30.0, 29.0, 31.5, 4000.0, 5, "cuda")
    monkeypatch.setattr(host_probe, "measure_here", lambda case: probe)
    assert f"host: litgpt's loop at 30 us an op, {probe.how()}" in advised("--host", "auto")
    assert hours(("--host", "auto")) == fast


def test_overrides_rank_any_model_litgpt_knows_as_plan_plans_it(tmp_path):
    """Litgpt-style overrides apply to every recipe advised on: `--checkpoint_dir` ranks another model (the answer
    names it), each configuration's peak is `tunelab plan`'s for the same overrides, and the written recipe carries
    them; an override of what advise tries itself, one that changes the method, or one litgpt refuses is one line."""
    pythia = ("--checkpoint_dir", "checkpoints/EleutherAI/pythia-160m", "--train.max_seq_length", "256")
    argv = ("advise", "tiny-llama-1.1b/lora", "--gpus", "L4", "--max-devices", "1", "--tokens", "1e6")
    code, out, err = tunelab_here(*argv, *pythia, "--json")
    assert code == 0, err
    ranked = json.loads(out)
    code, plain, err = tunelab_here(*argv, "--json")
    assert code == 0, err
    assert {c["peak_gb"] for c in ranked}.isdisjoint(c["peak_gb"] for c in json.loads(plain))  # another model
    for c in ranked[:3]:
        code, planned, err = tunelab_here(
            "plan",
            "tiny-llama-1.1b/lora",
            *pythia,
            "--gpu",
            "L4",
            "--json",
            "--precision",
            c["precision"],
            "--train.micro_batch_size",
            c["micro_batch_size"],
            "--train.global_batch_size",
            c["global_batch_size"],
        )
        assert code == 0, err
        assert json.loads(planned)["peak_memory_gb"] == pytest.approx(c["peak_gb"], abs=0.01), c
    code, out, err = tunelab_here(*argv, *pythia, "--write", tmp_path / "choice")
    assert code == 0, err
    assert out.startswith("model: pythia-160m (the settings of tiny-llama-1.1b/lora, with --checkpoint_dir")
    text = (tmp_path / "choice" / "lora.yaml").read_text()
    assert f"# from recipes/tiny-llama-1.1b/lora.yaml with {' '.join(pythia)}; predicted peak" in text
    written = yaml.safe_load(text)
    assert written["checkpoint_dir"] == pythia[1] and written["train"]["max_seq_length"] == 256
    assert written["out_dir"] == "out/finetune/pythia-160m/lora"  # not the folder's model's outputs
    recipe = yaml.safe_load((ROOT / "recipes" / "tiny-llama-1.1b" / "lora.yaml").read_text())
    assert written["lora_r"] == recipe["lora_r"] and written["data"] == recipe["data"]  # untouched: the recipe's
    for extra, words in (
        (("--devices", "2"), "--devices 2: advise tries every devices itself; fix:"),
        (("--train.micro_batch_size", "2"), "advise tries every micro_batch_size itself; fix:"),
        (("--quantize", "bnb.nf4"), "makes tiny-llama-1.1b/lora a qlora recipe; fix:"),
        (("--lora_rank", "4"), "lora_rank"),
        (("--checkpoint_dir", "checkpoints/foo/bar"), "'bar' is not a model litgpt knows"),
    ):
        code, out, err = tunelab_here(*argv, *extra)
        assert code == 2 and len(err.strip().splitlines()) == 1 and words in err, (extra, err)


def test_too_little_data_for_one_step_is_answered_with_a_fix_that_runs(tmp_path):
    """Fewer training samples than one optimizer step: one line whose fix the advisor then accepts; with --data it
    never suggests --tokens (argparse refuses the two together), with --tokens it gives the count that makes a step."""
    data = tmp_path / "three.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in _records(3)))
    ask = ("advise", "tiny-llama-1.1b/lora", "--gpus", "L4", "--max-devices", "1")
    code, out, err = tunelab_here(*ask, "--data", data)
    assert code == 2 and not out and len(err.strip().splitlines()) == 1, err
    assert "--tokens" not in err and "training records or more, after its held-out split" in err, err
    fix = err.split("fix: ")[1]
    assert "--global-batch free" in fix
    assert tunelab_here(*ask, "--data", data, "--global-batch", "free")[0] == 0
    code, _, err = tunelab_here(*ask, "--tokens", "100")
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    tokens = err.split("fix: --tokens ")[1].split()[0]
    code, out, err = tunelab_here(*ask, "--tokens", tokens)
    assert code == 0, err
