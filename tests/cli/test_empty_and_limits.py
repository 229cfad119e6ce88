"""One rule for list and path options, limits said, devices the batch cannot feed refused, an advise answer that
replaces the previous one (the reliability round's empty, out-of-range and stale cases), in process."""

from __future__ import annotations

import json

import pytest

from tests.conftest import tunelab_here
from tunelab.paths import RECIPES_DIR


@pytest.mark.parametrize(
    "args, option",
    [
        (["advise", "tiny-llama-1.1b", "--gpus", ""], "--gpus"),
        (["advise", "tiny-llama-1.1b", "--precision", " , "], "--precision"),
        (["advise", "tiny-llama-1.1b", "--strategies", ""], "--strategies"),
        (["advise", "tiny-llama-1.1b", "--write", ""], "--write"),
        (["plan-accuracy", "--out", ""], "--out"),
        (["plan-strategies", "--worlds", ""], "--worlds"),
        (["plan-families", "--families", ","], "--families"),
        (["run", "tiny-llama-1.1b/lora", "--out", ""], "--out"),
    ],
)
def test_an_empty_list_or_path_is_refused_in_one_line(args, option, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # an empty path taken as "here" would write into this folder
    code, out, err = tunelab_here(*args)
    lines = [ln for ln in (out + err).splitlines() if ln.strip()]
    assert code == 2 and len(lines) == 1 and option in lines[0], lines
    assert "empty path" in lines[0] or "names nothing" in lines[0]
    assert list(tmp_path.iterdir()) == []


def test_an_option_that_does_not_apply_or_a_limit_the_search_does_not_reach_is_said():
    code, _, err = tunelab_here("advise", "tiny-llama-1.1b/full", "--method", "qlora")
    assert code == 2 and "tiny-llama-1.1b/full is a full recipe" in err
    code, _, err = tunelab_here("advise", "tiny-llama-1.1b", "--max-devices", "64")
    assert code == 2 and "between 1 and 16" in err
    code, _, err = tunelab_here("plan", "tiny-llama-1.1b/full", "--tokens-per-sample", "0.5")  # planned 0.00 M tokens
    assert code == 2 and "between 2 and 1e+07" in err
    code, _, err = tunelab_here("advise", "tiny-llama-1.1b", "--tokens", "0")  # the bound it states excludes 0
    assert code == 2 and "give a token count above 0 and at most 1e+15" in err
    # QLoRA alone where nothing would be planned for it (it was "nothing fits" over empty reasons)
    code, _, err = tunelab_here("advise", "tiny-llama-1.1b/qlora", "--precision", "bf16-mixed,16-mixed")
    assert code == 2 and len(err.splitlines()) == 1 and "QLoRA trains under a true precision" in err, err
    for qlora in (["tiny-llama-1.1b/qlora"], ["tiny-llama-1.1b", "--method", "qlora"]):
        code, _, err = tunelab_here("advise", *qlora, "--nodes", "2", "--internode", "ib-ndr-8x")
        assert code == 2 and len(err.splitlines()) == 1 and "--nodes 2: QLoRA trains on one device" in err, err


def test_devices_the_batch_or_the_data_cannot_feed_are_refused():
    code, _, err = tunelab_here("plan", "tiny-llama-1.1b/full", "--devices", "100000", "--strategy", "fsdp")
    assert code == 2 and "100,000 devices, more than the 200 training samples" in err and "at most 200 devices" in err
    data = ["--data.val_split_fraction", "0.99", "--train.global_batch_size", "128"]
    code, out, err = tunelab_here("validate", "tiny-llama-1.1b/full", "--devices", "8", *data)
    assert code == 1 and "devices: 8 devices, more than the 4 training samples" in out + err, err
    # an epoch without an optimizer step: refused with or without --gpu (the memory plan alone planned it), as validate
    empty = ["--data.val_split_fraction", "0.97", "--train.global_batch_size", "256", "--train.micro_batch_size", "4"]
    for gpu in ([], ["--gpu", "H100-SXM"]):
        code, out, err = tunelab_here("plan", "tiny-llama-1.1b/full", "--devices", "4", *empty, *gpu)
        assert code == 2 and "an epoch has no optimizer step" in err and not out, (gpu, out, err)
    # fewer samples than devices x micro batch: shorter micro batches, as litgpt runs them (tests/e2e/test_runner.py)
    code, out, err = tunelab_here("plan", "tiny-llama-1.1b/full", "--data.val_split_fraction", "0.99", "--verbose")
    assert code == 0 and "share of the 4 training samples is 4, under the micro batch 16" in out, err
    code, _, err = tunelab_here("plan", "tiny-llama-1.1b/full", "--devices", "4")  # litgpt's own FSDP asserts it
    assert code == 2 and "train.global_batch_size: 16 is smaller than" in err
    # tunelab's loop takes one micro batch on each device when they outnumber the global batch's: planned
    code, out, err = tunelab_here("plan", "tiny-llama-1.1b/lora", "--devices", "8", "--strategy", "ddp", "--verbose")
    assert code == 0 and "16 is less than a micro batch on each device (8 x 4): tunelab's loop steps every 32" in out, (
        err
    )
    # QLoRA on several devices, which validate and run refuse, was planned (litgpt's FSDP or a strategy file)
    for strategy in ([], ["--strategy", "fsdp"], ["--strategy", "ddp"]):
        code, _, err = tunelab_here("plan", "tiny-llama-1.1b/qlora", "--devices", "2", *strategy)
        assert code == 2 and len(err.splitlines()) == 1 and "quantize: bnb.nf4 on 2 devices" in err, err
    # on one device too: tunelab's loop, which runs every strategy file, refuses QLoRA (as `run --strategy` does)
    code, _, err = tunelab_here("plan", "tiny-llama-1.1b/qlora", "--devices", "1", "--strategy", "ddp")
    assert code == 2 and "quantize=bnb.nf4 under ddp" in err, err


def test_advise_write_replaces_what_an_earlier_answer_left(tmp_path):
    """A first answer on several devices leaves strategy.yaml; a second that picks one device removes it (and the
    other method's recipe), so the folder holds one answer."""
    from tunelab.plan import advise

    out = tmp_path / "w"
    out.mkdir()
    for name in ("strategy.yaml", "full.yaml", "launch.txt"):
        (out / name).write_text("an earlier answer\n")
    code, _, err = tunelab_here(
        "advise", "tiny-llama-1.1b/lora", "--gpus", "H100-SXM", "--max-devices", "1", "--write", out
    )
    assert code == 0, err
    assert sorted(f.name for f in out.iterdir()) == ["launch.txt", "lora.yaml"]
    assert "an earlier answer" not in (out / "launch.txt").read_text()
    assert set(advise.WRITTEN) >= {"strategy.yaml", "full.yaml", "lora.yaml", "qlora.yaml", "launch.txt"}


def test_a_bench_whose_deadline_leaves_no_run_says_so_and_writes_no_report(tmp_path):
    code, out, err = tunelab_here(
        "bench",
        "tiny-llama-1.1b/full",
        "--model",
        "tiny",
        "--deadline",
        "0.5",
        "--out",
        tmp_path / "runs",
        "--report-dir",
        tmp_path / "report",
    )
    lines = [ln for ln in err.splitlines() if ln.strip() and not ln.startswith("deadline reached")]
    assert code == 2 and len(lines) == 1 and "--deadline 0.5: no run could start" in lines[0], (out, err)
    assert not (tmp_path / "report").exists() and not list((tmp_path / "runs").glob("*/record.json"))


def test_qlora_at_mixed_precision_is_refused_and_a_t4_hint_does_not_suggest_it():
    """litgpt refuses quantization under mixed precision (validate said so; plan planned it: 16-mixed QLoRA of
    OpenLLaMA 7B on a T4, 38 GB with an autocast weight cache no run ever holds), and the T4's bfloat16 hint named
    16-mixed to a QLoRA recipe."""
    for precision in ("16-mixed", "bf16-mixed"):
        code, _, err = tunelab_here("plan", "tiny-llama-1.1b/qlora", "--precision", precision)
        assert code == 2 and len(err.splitlines()) == 1, err
        assert f"precision: {precision} with quantize bnb.nf4: litgpt refuses" in err and "fix:" in err, err
    code, out, err = tunelab_here("plan", "tiny-llama-1.1b/qlora", "--gpu", "T4")
    assert code == 0 and "fix: --precision 16-true" in out and "16-mixed" not in out, (out, err)
    code, out, _ = tunelab_here("plan", "tiny-llama-1.1b/lora", "--gpu", "T4")
    assert code == 0 and "fix: --precision 16-mixed or 16-true" in out


def test_plan_refuses_under_a_strategy_file_what_run_refuses():
    """`run --strategy` refuses QLoRA under any strategy file and 16-mixed in tunelab's loop (no gradient scaler);
    plan planned both (`plan tiny-llama-1.1b/qlora --strategy fast`: 7.24 GB, "FITS", a fast path that never runs).
    Now one line each, the strategy named, as run says it; without a strategy file both still plan."""
    for recipe, extra, said in (
        ("tiny-llama-1.1b/qlora", ["--strategy", "fast"], "quantize=bnb.nf4 under single"),
        ("tiny-llama-1.1b/qlora", ["--strategy", "ddp"], "quantize=bnb.nf4 under ddp"),
        ("tiny-llama-1.1b/lora", ["--strategy", "ddp", "--devices", 2, "--precision", "16-mixed"], "gradient scaler"),
    ):
        code, out, err = tunelab_here("plan", recipe, "--gpu", "T4", *extra)
        assert code == 2 and not out and len(err.splitlines()) == 1, (out, err)
        assert f"--strategy {extra[1]}: " in err and said in err and "fix:" in err, err
    for recipe, extra in (("tiny-llama-1.1b/qlora", []), ("tiny-llama-1.1b/lora", ["--precision", "16-mixed"])):
        code, out, err = tunelab_here("plan", recipe, "--gpu", "T4", *extra)
        assert code == 0 and "FITS" in out, (out, err)
    # advise leaves them out and says so: on stderr beside --json, whose stdout stays one JSON list
    code, out, err = tunelab_here("advise", "tiny-llama-1.1b/lora", "--gpus", "T4", "--max-devices", 2, "--json")
    assert code == 0 and {c["world"] for c in json.loads(out)} == {1}, err
    assert err.startswith("not planned: ddp at 16-mixed, ") and "gradient scaler" in err, err


def test_validate_checks_a_recipe_under_a_strategy_file_as_run_would():
    """`validate --strategy` was read as a litgpt override ("strategy: litgpt finetune_lora has no such argument");
    it now checks each recipe under the file as `run --strategy` does, one line each with the file and the strategy,
    and an unknown strategy is one line before any recipe is read."""
    code, out, _ = tunelab_here("validate", "tiny-llama-1.1b/qlora", "tiny-llama-1.1b/lora", "--strategy", "ddp")
    lines = out.splitlines()
    assert code == 1 and lines[0].startswith("recipes/tiny-llama-1.1b/qlora.yaml: --strategy ddp: quantize=bnb.nf4")
    assert lines[1:] == ["ok  tiny-llama-1.1b/lora  (finetune_lora)", "1 of 2 recipes valid"], lines
    code, out, _ = tunelab_here("validate", "tiny-llama-1.1b/lora", "--strategy", "fast", "--devices", 2)
    assert code == 1 and "--strategy fast: name: single runs one device, not 2" in out and "fix:" in out, out
    code, out, err = tunelab_here("validate", "tiny-llama-1.1b/lora", "--strategy", "nope")
    assert code == 2 and not out and len(err.splitlines()) == 1 and "no strategy 'nope'" in err, (out, err)
    # what stops litgpt's own loop only (its LoRA sample on rank 0 alone) is said, and does not fail it, as in run
    code, out, _ = tunelab_here("validate", "tiny-llama-1.1b/lora", "--strategy", "ddp", "--devices", 2)
    assert code == 0 and "(litgpt's own loop; not under --strategy)" in out and "ok  tiny-llama-1.1b/lora" in out, out
    assert tunelab_here("validate", "tiny-llama-1.1b/lora", "--devices", 2)[0] == 1


def test_an_override_litgpt_has_no_argument_for_is_refused_by_plan():
    """plan read overrides with its own fast resolver, which set any key: a misspelt `--train.micro_batchsize 8`
    planned the recipe's micro batch 16 without a word, `--nodes 2` was kept as a key nobody reads. Now one line,
    as validate says it; the keys of data and optimizer classes, which depend on the class, still pass."""
    for bad in (["--train.micro_batchsize", "8"], ["--nodes", "2"], ["--trian.epochs=2"]):
        code, out, err = tunelab_here("plan", "tiny-llama-1.1b/full", *bad)
        key = bad[0].split("=")[0]
        assert code == 2 and len(err.splitlines()) == 1 and not out, (out, err)
        assert f"recipes/tiny-llama-1.1b/full.yaml: {key}: litgpt finetune_full has no such argument" in err, err
    ok = ["--train.micro_batch_size", "8", "--optimizer.lr", "1e-4", "--data.num_workers", "0", "--eval.interval", "3"]
    code, out, err = tunelab_here("plan", "tiny-llama-1.1b/full", *ok)
    assert code == 0 and "micro batch 8" in out, err
    code, _, err = tunelab_here("plan", "tiny-llama-1.1b/lora", "--lora_r", "4", "--quantize", "bnb.nf4")
    assert code == 0, err


def test_a_config_file_among_the_overrides_is_read_as_litgpt_reads_it(tmp_path):
    """`--config FILE` (litgpt's own, the way to set a whole optimizer) was set as a key nobody read: plan ignored a
    paged 8-bit AdamW and planned AdamW's states. Now its keys apply where it stands, each checked as an override."""
    paged = tmp_path / "paged.yaml"
    paged.write_text("optimizer:\n  class_path: bitsandbytes.optim.PagedAdamW8bit\n  init_args:\n    lr: 0.01\n")
    plain = tunelab_here("plan", "tiny-llama-1.1b/full", "--json")
    code, out, err = tunelab_here("plan", "tiny-llama-1.1b/full", "--config", str(paged), "--json")
    assert plain[0] == 0 and code == 0, err
    states = [json.loads(o)["breakdown_bytes"]["optimizer_states"] for o in (plain[1], out)]
    assert states[1] < states[0] / 10, states  # paged: only its small tensors on the device
    later = tunelab_here("plan", "tiny-llama-1.1b/full", f"--config={paged}", "--optimizer", "AdamW", "--json")[1]
    assert json.loads(later)["breakdown_bytes"]["optimizer_states"] == states[0]  # a later override wins
    bad = tmp_path / "bad.yaml"
    bad.write_text("train:\n  micro_batchsize: 3\n")
    code, _, err = tunelab_here("plan", "tiny-llama-1.1b/full", "--config", str(bad))
    assert code == 2 and f"{bad}: train.micro_batchsize: litgpt finetune_full has no such argument" in err, err
    # a group given as something else than a mapping was an internal AttributeError ("unexpected")
    listed = tmp_path / "listed.yaml"
    listed.write_text("train: [1, 2]\n")
    for args in (["--train", "[1, 2]"], ["--eval", "5"], ["--config", str(listed)]):
        code, _, err = tunelab_here("plan", "tiny-llama-1.1b/full", *args)
        assert code == 2 and len(err.splitlines()) == 1 and "a group of fields" in err and "fix:" in err, err
        assert "unexpected" not in err


def test_a_plan_where_not_one_sample_fits_says_what_would_shrink_it():
    """'largest micro batch that fits: 0' was the whole answer where micro batch 1 does not fit (OpenLLaMA 13B QLoRA
    on a T4); now what shrinks the peak, less what the plan already has or cannot take (QLoRA: one device)."""
    code, out, err = tunelab_here("plan", "open-llama-13b/qlora", "--gpu", "T4", "--precision", "16-true")
    said = "not even micro batch 1 fits: --activation-checkpointing (block inputs only), a GPU with more memory"
    assert code == 0 and said in out.splitlines()[1] and "fits: 0" not in out, (out, err)
    code, out, err = tunelab_here("plan", "open-llama-13b/full", "--gpu", "T4", "--activation-checkpointing")
    said = "not even micro batch 1 fits: more devices under a sharding --strategy, a GPU with more memory"
    assert code == 0 and said in out.splitlines()[1], (out, err)
    code, out, _ = tunelab_here("plan", "open-llama-13b/qlora", "--gpu", "T4", "--precision", "16-true", "--verbose")
    assert "not even micro batch 1 fits: --activation" in next(ln for ln in out.splitlines() if "verdict:" in ln)
    code, out, _ = tunelab_here("plan", "tiny-llama-1.1b/full", "--gpu", "T4", "--precision", "16-true")
    assert "largest micro batch that fits: 5" in out.splitlines()[1], out
    # checkpointing only where the activations are what does not fit; a 32-bit run is told of bf16-true
    code, out, _ = tunelab_here("plan", "open-llama-7b/full", "--gpu", "A100-80GB", "--precision", "32-true")
    said = "fits: --precision bf16-true (half the bytes of weights and states), more devices under a sharding"
    assert said in out.splitlines()[1], out


@pytest.mark.parametrize(
    "args",
    [
        ["run", "tiny-llama-1.1b/lora", "--out"],
        ["sweep", "configs/sweeps/lab-part1.yaml", "--report-dir"],
        ["report", "runs", "--out"],
        ["tune-batch", "tiny-llama-1.1b/lora", "--out"],
        ["build-model", "tiny", "--out"],
        ["plan-accuracy", "--out"],
    ],
)
def test_an_output_folder_that_is_a_file_is_refused_before_anything_runs(args, tmp_path):
    """`run --out` naming a file ended in "recfile.txt: File exists; fix: check the path and its permissions" (the
    option unnamed); every output folder option now says what it got, in argparse's line, before anything runs."""
    taken = tmp_path / "taken.txt"
    taken.write_text("mine\n")
    code, out, err = tunelab_here(*args, taken)
    lines = [ln for ln in (out + err).splitlines() if ln.strip()]
    assert code == 2 and len(lines) == 1 and f"argument {args[-1]}: " in lines[0], lines
    assert "exists and is not a folder" in lines[0] and taken.read_text() == "mine\n"


def test_a_recipe_without_a_precision_is_planned_at_litgpts_pick():
    """litgpt trains a recipe without a precision at bf16-mixed (16-mixed on a GPU without bfloat16); the plan took
    bf16-true (an H100 LoRA plan 8.90 GB where the run holds 14.08), and planned a QLoRA that litgpt refuses (its
    pick is mixed). A null max_seq_length is planned at the block size, said as such (it said "the recipe's")."""
    for gpu, picked in (("H100-SXM", "bf16-mixed"), ("T4", "16-mixed")):
        code, out, err = tunelab_here("plan", "tiny-llama-1.1b/lora", "--precision", "null", "--gpu", gpu, "--json")
        assert code == 0 and json.loads(out)["precision"] == picked, err
    code, _, err = tunelab_here("plan", "tiny-llama-1.1b/qlora", "--precision", "null")
    assert code == 2 and "precision: not set (litgpt then picks bf16-mixed" in err and "fix:" in err, err
    code, out, err = tunelab_here("plan", "tiny-llama-1.1b/lora", "--train.max_seq_length", "null", "--json")
    assert code == 0 and json.loads(out)["seq_len"] == 2048, err
    assert "the model's block size: train.max_seq_length is not set" in json.loads(out)["seq_len_source"]


@pytest.mark.parametrize("fraction", ["1.5", "1", "-0.25"])
def test_a_validation_share_outside_0_to_1_is_refused_by_plan_and_validate(fraction):
    """`data.val_split_fraction: 1.5` was planned over -200 training samples and passed validate (with a warning
    about -13 optimizer steps); litgpt's data module dies in torch's random_split after the model is built."""
    for command in ("plan", "validate"):
        code, out, err = tunelab_here(
            command, "tiny-llama-1.1b/lora", f"--data.init_args.val_split_fraction={fraction}"
        )
        said = [ln for ln in (out + err).splitlines() if "data.val_split_fraction" in ln]
        assert code != 0 and len(said) == 1 and "is not a share of the data" in said[0] and "fix:" in said[0], (
            out,
            err,
        )


@pytest.mark.parametrize(
    "override, key, said",
    [
        ("--train.max_seq_length=1", "train.max_seq_length", "nothing to predict"),
        ("--lora_alpha=0", "lora_alpha", "add nothing and get no gradient"),
        ("--lora_dropout=1.5", "lora_dropout", "not a probability"),
        ("--data.init_args.val_split_fraction=0", "data.val_split_fraction", "0 holds out no validation sample"),
        ("--data.init_args.val_split_fraction=0.002", "data.val_split_fraction", "0.002 of 400 samples holds out no"),
    ],
)
def test_what_litgpt_would_train_to_nothing_or_nan_is_refused_by_plan_and_validate(override, key, said, tmp_path):
    """Each ran to the end with a record marked ok (a loss of 0, a NaN validation loss, adapters that never move),
    or failed in torch's Dropout after the model was built; now one line from plan, validate and run, before any
    model is built. 0.2% of the tiny recipe's 400 samples is 0.8: torch's random_split gives validation none."""
    for command in ("plan", "validate", "run"):
        extra = ["--out", tmp_path / "r"] if command == "run" else []
        code, out, err = tunelab_here(command, "tiny-llama-1.1b/lora", override, *extra)
        lines = [ln for ln in (out + err).splitlines() if ln.strip()]
        assert code != 0 and len(lines) == 1 and f"{key}: " in lines[0] and said in lines[0], (command, lines)
        assert "fix: " in lines[0]
    assert not (tmp_path / "r").exists()
    code, out, err = tunelab_here("validate", "tiny-llama-1.1b/lora", "--data.init_args.val_split_fraction=0.005")
    assert code == 0, (out, err)  # 2 of 400 held out


def test_plan_refuses_an_optimizer_litgpt_cannot_build_from_overrides():
    """`--optimizer SGD --optimizer.momentum 0.9` on a recipe whose optimizer is class_path/init_args: litgpt's parser
    leaves ``{momentum: 0.9}``, no class to build (validate says so); plan counted states for an optimizer 'None'."""
    code, out, err = tunelab_here("plan", "tiny-llama-1.1b/full", "--optimizer", "SGD", "--optimizer.momentum", "0.9")
    lines = [ln for ln in (out + err).splitlines() if ln.strip()]
    assert code == 2 and len(lines) == 1 and "optimizer.class_path: is missing" in lines[0], lines


def test_num_nodes_0_is_refused_by_validate_as_by_plan():
    """`num_nodes: 0` passed validate (``0 or 1``) and failed in Fabric at launch."""
    for command in ("validate", "plan"):
        code, out, err = tunelab_here(command, "tiny-llama-1.1b/lora", "--num_nodes=0")
        assert code != 0 and "num_nodes: " in out + err and "fix: " in out + err, (command, out, err)


@pytest.mark.parametrize(
    "override, key, said",
    [
        (["--lora_dropout", "abc"], "lora_dropout", "Expected a <class 'float'>"),
        (["--lora_alpha", "x"], "lora_alpha", "litgpt's parser refuses the value"),
        (["--logger_name", "foo"], "logger_name", "it takes one of csv, tensorboard, wandb, mlflow, litlogger"),
        (["--seed", "x"], "seed", "Expected a <class 'int'>"),
        (["--optimizer", "Foo"], "optimizer", "'Foo' cannot be imported"),  # planned as two states of Adam's
        (["--optimizer", "torch.optim.Optimizer"], "optimizer", "the base class"),
    ],
)
def test_plan_refuses_what_litgpts_parser_refuses_as_validate_does(override, key, said, tmp_path):
    """plan read the recipe with tunelab's own resolver and planned a non-numeric lora_dropout or an unknown logger
    (validate and run refused them): one line now, from litgpt's own parser, in both. A recipe file outside
    recipes/ is parsed too, without overrides."""
    for command in ("plan", "validate"):
        code, out, err = tunelab_here(command, "tiny-llama-1.1b/lora", *override)
        lines = [ln for ln in (out + err).splitlines() if ln.strip()]
        assert code != 0 and len(lines) == 1, (command, lines)
        assert f"{key}: " in lines[0] and said in lines[0] and "fix: " in lines[0], (command, lines)
    mine = tmp_path / "lora.yaml"
    shipped = RECIPES_DIR.joinpath("tiny-llama-1.1b/lora.yaml").read_text()
    assert "\nlora_dropout: 0.05\n" in shipped
    mine.write_text(shipped.replace("\nlora_dropout: 0.05\n", "\nlora_dropout: abc\n"))
    code, out, err = tunelab_here("plan", str(mine))
    assert code != 0 and "lora_dropout: litgpt's parser refuses the value" in out + err, (out, err)
    assert tunelab_here("plan", "tiny-llama-1.1b/lora", "--lora_dropout", "0.1")[0] == 0


def test_a_logger_whose_package_is_missing_stops_litgpts_run_not_tunelabs_loop(monkeypatch):
    """litgpt builds the logger after the model: `--logger_name wandb` without wandb failed there. An error where
    the run is launched, a warning for a recipe checked to run elsewhere; tunelab's loop keeps its own log."""
    import importlib.util

    from tunelab import validate
    from tunelab.recipes import resolve

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real(name, *a))
    recipe = resolve("tiny-llama-1.1b/lora")
    here = validate.check(recipe, ["--logger_name", "wandb"], device="cpu")
    assert [p.key for p in here.problems if p.severity == "error"] == ["logger_name"]
    assert len(here.blocking()) == 1 and "pip install wandb" in here.blocking()[0]
    assert here.blocking(under_strategy=True) == []
    elsewhere = validate.check(recipe, ["--logger_name", "wandb"])
    assert elsewhere.ok and [p.severity for p in elsewhere.problems if p.key == "logger_name"] == ["warning"]
    assert validate.check(recipe, ["--logger_name", "csv"], device="cpu").ok


def test_bench_refuses_what_its_fast_arm_would_refuse_before_either_arm_trains(tmp_path):
    """`bench tiny-llama-1.1b/qlora` trained litgpt's arm first and then saw the fast arm refused (QLoRA under a
    strategy file); now one line, nothing written."""
    code, out, err = tunelab_here("bench", "tiny-llama-1.1b/qlora", "--out", tmp_path / "b")
    assert code == 2 and not out and len(err.splitlines()) == 1, (out, err)
    assert "--strategy fast: quantize=bnb.nf4 under single" in err and not (tmp_path / "b").exists()


def test_a_sweep_archive_named_other_than_tgz_is_refused_before_any_row(tmp_path):
    """`sweep --archive out.zip` wrote a gzipped tar under a .zip name; now refused before any row runs."""
    argv = ["sweep", "lab-part1", "--only", "s2", "--model", "tiny", "--out", tmp_path / "runs"]
    code, out, err = tunelab_here(*argv, "--archive", tmp_path / "out.zip")
    assert code == 2 and len(err.splitlines()) == 1 and "does not end in .tgz or .tar.gz" in err, (out, err)
    assert not (tmp_path / "out.zip").exists() and not list(tmp_path.glob("runs/*/record.json"))


def test_a_recipe_with_devices_auto_is_told_to_name_a_count_and_advised_at_the_counts_advise_tries(tmp_path):
    """`devices: auto` (litgpt: every GPU it finds) read "'auto' must be a positive integer; fix: set --devices to 1
    or more" in plan, and advise refused the recipe the same way although it tries its own device counts."""
    import yaml

    from tunelab.paths import RECIPES_DIR

    config = yaml.safe_load((RECIPES_DIR / "tiny-llama-1.1b" / "lora.yaml").read_text())
    path = tmp_path / "auto.yaml"
    path.write_text(yaml.safe_dump({**config, "devices": "auto"}))
    code, out, err = tunelab_here("plan", path)
    assert code == 2 and not out and "devices: 'auto' takes every GPU litgpt finds" in err and "fix:" in err, err
    code, out, err = tunelab_here("advise", path, "--gpus", "H100-SXM", "--max-devices", 2, "--json")
    assert code == 0 and {c["world"] for c in json.loads(out)} == {1, 2}, err


def test_a_global_batch_litgpt_floors_is_said_in_the_plan():
    """A global batch of 30 at micro 8 on one device: litgpt floors the accumulation to 3 (24 samples a step),
    validate refuses it; plan planned it without a word."""
    code, out, err = tunelab_here(
        "plan", "tiny-llama-1.1b/full", "--train.global_batch_size", 30, "--train.micro_batch_size", 8, "--json"
    )
    notes = [n for n in json.loads(out)["notes"] if "floors the accumulation" in n]
    assert code == 0 and notes == [
        "train.global_batch_size 30 is not micro batch x devices x accumulation: litgpt floors the accumulation "
        "to 3, 24 samples a step (validate refuses it)"
    ], err
    code, out, _ = tunelab_here("plan", "tiny-llama-1.1b/full", "--json")  # 16 = 16 x 1 x 1: nothing said
    assert not [n for n in json.loads(out)["notes"] if "floors" in n]


def _alpaca(path, n):
    path.write_text(json.dumps([{"instruction": f"q{i}", "input": "", "output": "a b c"} for i in range(n)]))
    return path


def test_a_data_folder_with_a_validation_share_is_refused_before_launch(tmp_path):
    """litgpt's JSON module reads a folder's train.json and val.json and refuses a val_split_fraction beside them:
    the recipes set one (0.5), so `--data.json_path FOLDER` ended after launch in jsonargparse's "Does not validate
    against any of the Union subtypes". Now one line from validate, plan and run; null passes."""
    folder = tmp_path / "data"
    folder.mkdir()
    _alpaca(folder / "train.json", 90), _alpaca(folder / "val.json", 10)
    for command in ("validate", "plan", "run"):
        extra = ["--out", tmp_path / "r"] if command == "run" else []
        code, out, err = tunelab_here(command, "tiny-llama-1.1b/lora", "--data.json_path", folder, *extra)
        lines = [ln for ln in (out + err).splitlines() if ln.strip() and ": warning: " not in ln]
        assert code != 0 and len(lines) == 1 and "data.val_split_fraction: is 0.5, but" in lines[0], (command, lines)
    assert not (tmp_path / "r").exists()
    code, out, err = tunelab_here(
        "validate", "tiny-llama-1.1b/lora", "--data.json_path", folder, "--data.val_split_fraction", "null"
    )
    assert code == 0, (out, err)


def test_a_single_file_without_a_share_is_split_as_litgpt_splits_it(tmp_path):
    """A JSON file and no val_split_fraction: litgpt holds out 5% (its JSON module's own default, with a warning), so
    100 samples train 95 (the plan counted all 100 as training)."""
    from litgpt.data import JSON

    from tunelab.recipes import resolve as recipe
    from tunelab.settings import resolve, split_sizes

    data = _alpaca(tmp_path / "one.json", 100)
    with pytest.warns(UserWarning, match="val_split_fraction=0.05"):
        module = JSON(json_path=data, val_split_fraction=None)
    module.connect(tokenizer=None, batch_size=1, max_seq_length=64)  # the split needs no tokens
    module.setup()
    settings = resolve(
        recipe("tiny-llama-1.1b/lora"), ["--data.json_path", str(data), "--data.val_split_fraction", "null"]
    )
    assert (
        split_sizes(100, settings.val_split_fraction)
        == (len(module.train_dataset), len(module.test_dataset))
        == (95, 5)
    )
    code, out, err = tunelab_here(
        "validate", "tiny-llama-1.1b/lora", "--data.json_path", data, "--data.val_split_fraction", "null"
    )
    assert code == 0, (out, err)


def test_a_data_module_litgpt_does_not_have_is_refused_by_plan_and_advise():
    """`plan --data Alpac` planned the lab's 2,000 samples for a module litgpt's parser refuses, and advise planned
    databricks-dolly-15k for `--data Dolly`, which the pinned litgpt no longer ships. Every data module of known size
    is one litgpt exports; a class of the user's own still plans (its size assumed, and said)."""
    from tunelab.litgpt_source import data_classes
    from tunelab.settings import DATA_MODULE_SIZES

    assert {name.rsplit(".", 1)[1] for name in DATA_MODULE_SIZES} <= data_classes()
    for args in (["plan", "tiny-llama-1.1b/lora", "--data", "Alpac"], ["advise", "tiny-llama-1.1b", "--data", "Dolly"]):
        code, out, err = tunelab_here(*args)
        lines = [ln for ln in (out + err).splitlines() if ln.strip()]
        assert code != 0 and len(lines) == 1 and ("fix: one of" in lines[0] or "neither a file" in lines[0]), lines
    code, out, err = tunelab_here("plan", "tiny-llama-1.1b/lora", "--data.class_path", "mypackage.MyData")
    assert code == 0, (out, err)


def test_plan_warns_in_its_short_answer_where_litgpts_own_loop_would_hang():
    """LoRA in litgpt's own loop on several devices samples on rank 0 alone (in the loop, and when its epochs end
    it): the plan says so in its ten lines, with the fix validate gives; not where max_steps ends the loop and
    eval.interval is beyond it, nor under a strategy file (tunelab's loop), nor on one device."""
    code, out, _ = tunelab_here("plan", "tiny-llama-1.1b/lora", "--devices", 2)
    warned = [ln for ln in out.splitlines() if ln.startswith("warning: litgpt's loop would hang: ")]
    assert code == 0 and len(warned) == 1 and "train.max_steps: not set" in warned[0], out
    assert "fix: set train.max_steps to 12" in warned[0]
    code, out, _ = tunelab_here("plan", "tiny-llama-1.1b/lora", "--devices", 2, "--eval.interval", 5)
    assert code == 0 and "eval.interval: 5 falls inside the 12-step run on 2 devices" in out, out
    for quiet in (["--devices", 2, "--train.max_steps", 12], ["--devices", 2, "--strategy", "ddp"], ["--devices", 1]):
        code, out, _ = tunelab_here("plan", "tiny-llama-1.1b/lora", *quiet)
        assert code == 0 and "would hang" not in out, (quiet, out)


def _batch_overrides(rng) -> list[str]:
    """A random run shape: devices, micro and global batch, held-out share, epochs, max_steps (strategy or none)."""
    devices, micro = rng.choice([1, 2, 4, 8, 16, 32]), rng.choice([1, 2, 4, 16, 64])
    fitting = devices * micro * rng.choice([1, 2, 4])  # half the shapes: a global batch litgpt accepts
    shape = {
        "--devices": devices,
        "--train.micro_batch_size": micro,
        "--train.global_batch_size": rng.choice([fitting, rng.choice([1, 4, 16, 64, 256, 1024])]),
        "--data.val_split_fraction": rng.choice([0.01, 0.5, 0.9, 0.97, 0.99, 0.995]),
        "--train.epochs": rng.choice([1, 2, 3]),
        "--train.max_steps": rng.choice(["null", 1, 5, 50]),
        "--train.lr_warmup_steps": 1,
    }
    strategy = rng.choice([[], ["--strategy", "ddp"], ["--strategy", "fsdp"], ["--strategy", "deepspeed-zero2"]])
    return [str(a) for kv in shape.items() for a in kv] + strategy


def test_plan_never_refuses_a_run_validate_passes():
    """plan refused 4 training samples at micro 16 on one device ("fix: at most 1 devices") that litgpt runs and
    validate passed. Over 40 random shapes (about 20 s): whatever plan refuses, validate refuses too (the converse is
    by design: plan plans what it can count and notes or warns what validate refuses)."""
    import random

    rng = random.Random(41)
    for _ in range(40):
        recipe, overrides = rng.choice(["tiny-llama-1.1b/full", "tiny-llama-1.1b/lora"]), _batch_overrides(rng)
        planned = tunelab_here("plan", recipe, *overrides)
        if planned[0] != 0:
            validated = tunelab_here("validate", recipe, *overrides)
            assert validated[0] != 0, (recipe, overrides, planned[2])


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("- name: fsdp\n", "a strategy is a YAML mapping of keys to values, got a list; fix: "),
        ("name: fsdp\nshard: all\n", "unknown key(s) ['shard']; fix: remove them or use one of ["),
        ("name: ../../evil\n", "name: '../../evil' is not a strategy; fix: one of ('single', "),
        ("name: fsdp\nsharding_strategy: EVERYTHING\n", "sharding_strategy: 'EVERYTHING' is not a choice; fix: one of"),
        ("name: ddp\nbucket_cap_mb: 0\n", "bucket_cap_mb: 0 is out of range; fix: a value from 1 to 100,000"),
        ("name: fsdp\nmixed_precision: {param_dtype: int8}\n", "mixed_precision: param_dtype: 'int8' is not a"),
        ("", "fix: "),
    ],
)
def test_a_bad_strategy_file_is_one_line_naming_the_file_the_key_and_the_fix(tmp_path, text, words):
    """Each refusal of a strategy file names the file and the key, what is wrong and a fix, in one line on stderr
    before anything is planned (some said what was wrong and left the fix out)."""
    path = tmp_path / "mine.yaml"
    path.write_text(text)
    code, out, err = tunelab_here("plan", "tiny-llama-1.1b/lora", "--devices", 2, "--strategy", str(path))
    assert code == 2 and not out and len(err.splitlines()) == 1, (out, err)
    assert "mine.yaml" in err and words in err and "; fix: " in err, err


@pytest.mark.parametrize("command", ["plan-accuracy", "plan-families", "bench", "build-model", "report"])
def test_an_output_folder_that_is_a_dangling_link_is_refused_in_one_line(command, tmp_path, monkeypatch):
    """A folder option given a link to nothing: one line naming it, nothing made through the link."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "out").symlink_to(tmp_path / "gone" / "away")
    first = {"bench": ["tiny-llama-1.1b/full"], "build-model": ["tiny"], "report": [str(tmp_path)]}
    code, out, err = tunelab_here(command, *first.get(command, []), "--out", "out")
    lines = [ln for ln in (out + err).splitlines() if ln.strip()]
    assert code == 2 and len(lines) == 1 and "'out' is a link to nothing; fix:" in lines[0], lines
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]
