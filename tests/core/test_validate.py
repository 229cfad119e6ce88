"""`tunelab validate`: every bad input is refused with one line naming the file, the key and the fix."""

from __future__ import annotations

import json

import pytest

from tunelab.recipes import resolve
from tunelab.validate import check

# (recipe, overrides, options, key, words expected in the message)
BAD = [
    (
        "tiny-llama-1.1b/full",
        ["--train.global_batch_size", "30", "--train.micro_batch_size", "8"],
        {},
        "train.global_batch_size",
        "floor it to 24",
    ),
    (
        "open-llama-7b/lora",
        ["--devices", "4", "--train.global_batch_size", "8", "--eval.interval", "1000"],
        {},
        "train.global_batch_size",
        "smaller than",
    ),
    ("tiny-llama-1.1b/lora", ["--train.lr_warmup_steps", "0"], {}, "train.lr_warmup_steps", "divides by it"),
    ("tiny-llama-1.1b/lora", ["--train.lr_warmup_steps", "null"], {}, "train.lr_warmup_steps", "divides by it"),
    ("open-llama-7b/qlora", ["--devices", "2", "--eval.interval", "1000"], {}, "quantize", "single-device"),
    ("open-llama-7b/qlora", ["--precision", "bf16-mixed"], {}, "precision", "mixed precision"),
    # no precision: litgpt picks bf16-mixed (16-mixed without bfloat16), then refuses it with quantization
    ("open-llama-7b/qlora", ["--precision", "null"], {}, "precision", "not set (litgpt then picks bf16-mixed"),
    ("open-llama-7b/qlora", ["--optimizer", "SGD"], {}, "optimizer", "PagedAdamW"),
    ("open-llama-7b/qlora", [], {"device": "cpu"}, "quantize", "need a CUDA GPU"),
    ("tiny-llama-1.1b/full", ["--quantize", "bnb.nf4"], {}, "quantize", "only for LoRA/adapter"),
    (
        "tiny-llama-1.1b/lora",
        ["--checkpoint_dir", "checkpoints/acme/not-a-model"],
        {},
        "checkpoint_dir",
        "not a model litgpt knows",
    ),
    ("tiny-llama-1.1b/lora", [], {"gpu": "V100-32GB"}, "precision", "no bfloat16"),
    ("tiny-llama-1.1b/lora", ["--train.max_seq_length", "4096"], {}, "train.max_seq_length", "block size 2048"),
    ("tiny-llama-1.1b/lora", ["--precision", "16-true"], {"device": "cpu"}, "precision", "NaN"),
    ("tiny-llama-1.1b/lora", ["--precision", "bf16"], {}, "precision", "full Lightning precision name"),
    ("tiny-llama-1.1b/lora", ["--train.epochs", "null"], {}, "train.epochs", "set train.epochs >= 1"),
    ("tiny-llama-1.1b/full", ["--train.save_interval", "0"], {}, "train.save_interval", "ZeroDivisionError"),
    ("tiny-llama-1.1b/lora", ["--eval.interval", "0"], {}, "eval.interval", "modulo"),
    (
        "tiny-llama-1.1b/lora",
        [
            "--lora_query",
            "false",
            "--lora_key",
            "false",
            "--lora_value",
            "false",
            "--lora_projection",
            "false",
            "--lora_mlp",
            "false",
            "--lora_head",
            "false",
        ],
        {},
        "lora_query",
        "nothing would be trained",
    ),
    ("tiny-llama-1.1b/lora", ["--devices", "2", "--eval.interval", "5"], {}, "eval.interval", "hang"),
    ("tiny-llama-1.1b/lora", ["--optimizer", "Adamz"], {}, "optimizer", "cannot be imported"),
    # litgpt's parser keeps these beside init_args and litgpt never reads them: the run would train at 2e-4
    ("tiny-llama-1.1b/full", ["--optimizer.init_args.lr", "0.01"], {}, "optimizer.lr", "ignores this override"),
    ("tiny-llama-1.1b/lora", ["--optimizer.lr", "0.01"], {}, "optimizer.lr", "--config FILE"),
    # refused by litgpt's own validate_args once the model is being set up: here before anything is built
    ("tiny-llama-1.1b/full", ["--train.max_norm", "1.0"], {}, "train.max_norm", "does not support"),
    ("tiny-llama-1.1b/lora", ["--train.lr_warmup_fraction", "0.1"], {}, "train", "Choose one"),
    ("tiny-llama-1.1b/lora", ["--data.json_path", "missing.json"], {}, "data.json_path", "does not exist"),
    ("tiny-llama-1.1b/lora", [], {"gpu": "Z9000"}, "--gpu", "unknown GPU"),
    # refused by litgpt's own parser
    ("tiny-llama-1.1b/lora", ["--train.micro_batch_size", "x"], {}, "train.micro_batch_size", "refuses the value"),
    ("tiny-llama-1.1b/lora", ["--train.bogus", "1"], {}, "train.bogus", "no such argument"),
    ("tiny-llama-1.1b/lora", ["--quantize", "bnb.nf5"], {}, "quantize", "refuses the value"),
]


@pytest.mark.parametrize("ref,overrides,options,key,words", BAD, ids=[f"{b[3]}:{b[4]}" for b in BAD])
def test_bad_input_refused(ref, overrides, options, key, words):
    result = check(resolve(ref), overrides, **options)
    assert not result.ok
    hits = [p for p in result.problems if p.key == key and words in p.message + p.fix]
    assert hits, [str(p) for p in result.problems]
    line = str(hits[0])
    assert "\n" not in line and line.startswith(f"recipes/{ref}.yaml: {key}: ") and "; fix: " in line


def test_a_gpu_without_bfloat16_is_answered_with_a_precision_the_method_runs_at():
    """QLoRA's fix on a T4 named 16-mixed first, which litgpt refuses with quantization; LoRA keeps both."""
    for method, fix in (("qlora", "use 16-true on this GPU"), ("lora", "use 16-mixed (or 16-true) on this GPU")):
        result = check(resolve(f"tiny-llama-1.1b/{method}"), [], gpu="T4")
        assert [p.fix for p in result.problems if p.key == "precision"] == [fix], [str(p) for p in result.problems]


def test_warmup_longer_than_run_is_a_warning_only():
    result = check(resolve("tiny-llama-1.1b/lora"), ["--train.lr_warmup_steps", "50"])
    assert result.ok
    assert any(p.severity == "warning" and p.key == "train.lr_warmup_steps" for p in result.problems)


def test_resolved_arguments_apply_litgpt_defaults_and_overrides():
    result = check(resolve("open-llama-7b/lora"), ["--train.micro_batch_size", "2"])
    assert result.ok
    r = result.resolved
    assert r["train"]["micro_batch_size"] == 2 and r["train"]["max_norm"] is None  # litgpt's default filled in
    json.dumps(r, default=str)  # plain data, ready for a run record


def test_warmup_equal_to_max_steps_is_refused_because_litgpt_divides_by_zero_there():
    """litgpt's own scheduler (called here, in-process) dies at the last step when lr_warmup_steps == max_steps
    (CosineAnnealingLR with T_max=0; a tune-batch probe hit it on the H100); validate refuses it before launch."""
    import torch
    from litgpt.finetune.full import get_lr_scheduler

    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1)
    sched = get_lr_scheduler(opt, warmup_steps=2, max_steps=2)
    with pytest.raises(ZeroDivisionError):
        for _ in range(2):
            opt.step()
            sched.step()
    r = check(resolve("tiny-llama-1.1b/full"), ["--train.max_steps", "4", "--train.lr_warmup_steps", "4"])
    assert [p.key for p in r.problems if p.severity == "error"] == ["train.lr_warmup_steps"]
    assert "ZeroDivisionError" in str(r.problems[0])
    r = check(resolve("tiny-llama-1.1b/full"), ["--train.max_steps", "4", "--train.lr_warmup_steps", "3"])
    assert not [p for p in r.problems if p.severity == "error"]
    # the schedule spans min(epochs x steps per epoch, max_steps): one step an epoch (micro = global = the 200
    # training samples) under one warm-up step dies as well, max_steps or not; litgpt counts a short last batch, so
    # 150 samples at micro 100 are two steps an epoch
    whole = ["--train.micro_batch_size", "200", "--train.global_batch_size", "200", "--train.lr_warmup_steps", "1"]
    r = check(resolve("tiny-llama-1.1b/full"), [*whole, "--train.max_steps", "3"])
    assert [p.key for p in r.problems if p.severity == "error"] == ["train.lr_warmup_steps"], r.problems
    assert "the 1 optimizer steps litgpt's schedule spans" in str(next(p for p in r.problems if p.severity == "error"))
    assert check(resolve("tiny-llama-1.1b/full"), [*whole, "--train.epochs", "2"]).ok
    short = [
        "--data.val_split_fraction",
        "0.625",
        "--train.micro_batch_size",
        "100",
        "--train.global_batch_size",
        "100",
    ]
    assert check(resolve("tiny-llama-1.1b/full"), [*short, "--train.lr_warmup_steps", "1"]).ok  # 150: two steps
    # at global 200 those two micro batches make one step (the short one completes it): not refused as none; at
    # global 300 (three micro batches a step) an epoch has none
    one = [*short[:-1], "200", "--train.lr_warmup_steps", "1", "--train.epochs", "2"]
    r = check(resolve("tiny-llama-1.1b/full"), one)
    assert r.ok and not [p for p in r.problems if p.key == "train.global_batch_size"], r.problems
    r = check(resolve("tiny-llama-1.1b/full"), [*short[:-1], "300"])
    said = [str(p) for p in r.problems if p.severity == "error"]
    assert len(said) == 1 and "an epoch has no optimizer step" in said[0] and "at most 200" in said[0], said


def test_a_config_override_that_is_no_regular_file_is_refused_before_litgpts_parser(tmp_path):
    """The form validate recommends for a learning rate is a second ``--config FILE``: a FIFO there would block
    litgpt's parser forever; it is one line naming --config instead (and a missing file too). A link to a file that
    is no YAML mapping (here one of passwd-like lines) was handed to the parser, whose line echoed the file: refused
    first now, as the plan reads a --config, without its contents."""
    import os

    fifo = tmp_path / "opt.yaml"
    os.mkfifo(fifo)
    lines = tmp_path / "outside"
    lines.write_text("root:x:0:0:root:/root:/bin/bash\ndaemon:x:1:1:daemon:/usr/sbin\n")
    (tmp_path / "link.yaml").symlink_to(lines)
    missing = tmp_path / "missing.yaml"
    for overrides in (
        ["--config", str(fifo)],
        [f"--config={fifo}"],
        ["--config", str(missing)],
        ["--config", str(tmp_path / "link.yaml")],
    ):
        result = check(resolve("tiny-llama-1.1b/full"), overrides)
        assert not result.ok and [p.key for p in result.problems] == ["--config"], result.problems
        assert "\n" not in str(result.problems[0]) and "; fix: " in str(result.problems[0])
        assert "root:x" not in str(result.problems[0])


def test_the_parsers_caller_check_sees_the_frames_inspect_sees_and_still_refuses_parse_known_args():
    """litgpt's parser runs with jsonargparse's caller check given frames without their source (validate's
    ``_FramesOnly``): the same frames ``inspect.stack`` gives, innermost first, and the check still refuses
    ``parse_known_args`` called from outside jsonargparse."""
    import inspect

    from tunelab import validate

    def here():
        return [r[0] for r in validate._FramesOnly().stack()], [r.frame for r in inspect.stack()]

    ours, inspects = here()
    assert ours and ours == inspects
    parser = validate.litgpt_parser()
    import jsonargparse._core

    assert isinstance(jsonargparse._core.inspect, validate._FramesOnly)
    with pytest.raises(NotImplementedError):
        parser.parse_known_args(["finetune_lora"])


def test_no_validation_batch_is_a_warning_as_litgpts_validate_averages_none():
    """litgpt's own ``validate`` (called here) with eval.max_iters 0 averages no batch: a NaN loss at every
    validation inside the loop (the final one covers the whole set): a warning, the run trains as asked."""
    import math

    from litgpt.args import EvalArgs
    from litgpt.finetune.lora import validate as litgpt_validate

    class Quiet:
        def print(self, *args, **kwargs) -> None:
            pass

    class Model:
        def eval(self) -> None:
            pass

        def train(self) -> None:
            pass

    assert math.isnan(float(litgpt_validate(Quiet(), Model(), [{"input_ids": None}] * 3, EvalArgs(max_iters=0))))
    r = check(resolve("tiny-llama-1.1b/lora"), ["--eval.max_iters", "0"])
    said = [p for p in r.problems if p.key == "eval.max_iters"]
    assert r.ok and len(said) == 1 and said[0].severity == "warning" and "NaN" in said[0].message, r.problems
    assert not [
        p
        for p in check(resolve("tiny-llama-1.1b/lora"), ["--eval.max_iters", "1"]).problems
        if p.key == "eval.max_iters"
    ]


def test_loras_epoch_end_sample_on_several_devices_is_refused_unless_max_steps_ends_the_loop():
    """litgpt's LoRA loop samples on rank 0 alone when its epochs end it; on several devices the other ranks wait
    forever (a real 2-process run in tests/e2e/test_runner.py). max_steps at or under the epochs' steps ends the
    loop first; full fine-tuning samples on every rank; one device has no one to wait."""
    shape = ["--data.init_args.val_split_fraction", "0.9", "--train.micro_batch_size", "2"]
    shape += ["--train.global_batch_size", "4", "--train.lr_warmup_steps", "2"]

    def errors(recipe, *extra):
        return [str(p) for p in check(resolve(recipe), [*shape, *extra]).problems if p.key == "train.max_steps"]

    two = ["--devices", "2"]
    said = errors("tiny-llama-1.1b/lora", *two, "--train.max_steps", "null")
    assert len(said) == 1 and "rank 0 alone" in said[0] and "set train.max_steps to 10" in said[0], said
    assert [e for e in errors("tiny-llama-1.1b/lora", *two, "--train.max_steps", "11") if "rank 0 alone" in e]
    assert errors("tiny-llama-1.1b/lora", *two, "--train.max_steps", "10") == []
    assert errors("tiny-llama-1.1b/lora", *two, "--train.max_steps", "4") == []
    assert errors("tiny-llama-1.1b/lora", "--devices", "1", "--train.max_steps", "null") == []
    assert errors("tiny-llama-1.1b/full", *two, "--train.max_steps", "null") == []


@pytest.mark.parametrize(
    ("init", "key"),
    [("momentum: .nan", "momentum"), ("lr: .inf", "lr"), ("betas: [0.9, -.inf]", "betas")],
)
def test_an_optimizer_argument_that_is_not_finite_is_refused(tmp_path, init, key):
    """torch's SGD takes momentum NaN (its check is ``momentum < 0``) and any optimizer an infinite learning rate:
    the first step turns every weight to NaN or inf, which validate passed (and the plan counted the momentum's state
    for it)."""
    config = tmp_path / "opt.yaml"
    lr = "" if key == "lr" else "    lr: 0.1\n"
    config.write_text(f"optimizer:\n  class_path: torch.optim.SGD\n  init_args:\n{lr}    {init}\n")
    result = check(resolve("tiny-llama-1.1b/full"), ["--config", str(config)])
    said = [str(p) for p in result.problems if p.severity == "error"]
    assert not result.ok and len(said) == 1 and f"optimizer.init_args.{key}: is " in said[0] and "fix: " in said[0]


@pytest.mark.parametrize(
    ("class_path", "init", "words"),
    [
        ("torch.optim.AdamW", "lr: -0.001", "refuses them: Invalid learning rate: -0.001"),
        ("torch.optim.AdamW", "lr: 0.001\n    betas: [0.9, 1.5]", "Invalid beta parameter at index 1: 1.5"),
        ("torch.optim.AdamW", "lr: 0.001\n    eps: -1.0", "Invalid epsilon value: -1.0"),
        ("torch.optim.AdamW", "lr: 0.001\n    betas: [0.9]", "takes 2 betas (its default: [0.9, 0.999]), got [0.9]"),
        ("bitsandbytes.optim.AdamW", "lr: 0.001\n    betas: [0.9]", "AdamW takes 2 betas"),  # builds; its step fails
        ("bitsandbytes.optim.AdEMAMix", "lr: 0.001\n    betas: [0.9, 0.99]", "AdEMAMix takes 3 betas"),
        ("torch.optim.AdamW", "lr: 0.001\n    betas: 5", "refuses them: TypeError: 'int' object is not subscr"),
        ("torch.optim.SGD", "lr: 0.1\n    betas: [0.9, 0.95]", "torch.optim.SGD takes no 'betas' (it takes lr, "),
        ("bitsandbytes.optim.PagedAdamW", "lr: -1", "bitsandbytes.optim.PagedAdamW refuses them: Invalid learning"),
        ("torch.optim.AdamW", "lr: 0.001\n    fused: true\n    weight_decay: 0.1", None),
        ("bitsandbytes.optim.AdamW8bit", "lr: 0.001\n    betas: [0.9, 0.95]", None),
    ],
)
def test_what_the_optimizer_class_refuses_is_refused_before_the_model_is_built(tmp_path, class_path, init, words):
    """torch's and bitsandbytes' optimizers check their arguments when built, which litgpt does after the model: a
    negative learning rate or eps, betas outside [0, 1), a key the class does not take, each ended a run that had
    loaded its model, where validate had said ok. The class is built here on one CPU parameter (its own check);
    what it takes passes (``fused`` chooses the device's implementation and stays out of the probe). Betas of
    another length than the class's default: bitsandbytes builds with them and fails at its first step."""
    config = tmp_path / "opt.yaml"
    config.write_text(f"optimizer:\n  class_path: {class_path}\n  init_args:\n    {init}\n")
    result = check(resolve("tiny-llama-1.1b/full"), ["--config", str(config)])
    said = [str(p) for p in result.problems if p.severity == "error"]
    if words is None:
        assert result.ok, said
        return
    assert not result.ok and len(said) == 1 and "optimizer.init_args: " in said[0] and words in said[0], said
    assert "fix: " in said[0] and "unexpected" not in said[0]
