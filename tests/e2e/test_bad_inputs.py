"""Bad input, tried as a hostile but realistic user would, against the real ``tunelab`` CLI as subprocesses: every
case is refused in one line with a non-zero exit, names what is wrong, and prints no Python traceback; nothing
from a file runs as code; nothing is written outside the output directory.

The cases run a few at a time (each is its own process: the exit code and the output are the real ones).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.conftest import REFUSAL_HALVES, ROOT, beside_checkout, cpu_env, refusals_of_half, tunelab_cli

R = "tiny-llama-1.1b/lora"
DATA = ROOT / "data" / "alpaca_tunelab.json"


tunelab = tunelab_cli


def _files(tmp: Path) -> dict[str, Path]:
    """The crafted files the cases point at."""
    f = {}

    def write(name, text):
        p = tmp / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
        f[name] = p
        return p

    row = "  - id: a\n    recipe: tiny-llama-1.1b/lora\n"
    write("rows-int.yaml", "name: x\nrows: 5\n")
    write("set-list.yaml", f"name: x\nrows:\n{row}    set: [1, 2]\n")
    write("timeout-text.yaml", f"name: x\ntimeout_s: abc\nrows:\n{row}")
    write("syntax.yaml", f"name: x\nrows:\n{row}    set: {{train.micro_batch_size: [1\n")
    write("long-id.yaml", "name: x\nrows:\n  - id: " + "a" * 5000 + "\n    recipe: tiny-llama-1.1b/lora\n")
    write("devices-neg.yaml", f"name: x\nrows:\n{row}    set: {{devices: -1}}\n")
    write("single-on-2.yaml", f"name: x\nrows:\n{row}    strategy: fast\n    set: {{devices: 2}}\n")
    write("tag.yaml", f"name: !!python/object/apply:os.system ['touch {tmp}/pwned-sweep']\nrows:\n{row}")
    bomb = "name: x\na0: &a0 [1, 1, 1, 1, 1, 1, 1, 1, 1]\n" + "".join(
        f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]\n" for i in range(1, 30)
    )
    write("bomb.yaml", bomb + f"rows:\n{row}")
    write("deep.yaml", f"name: x\nextra: {'[' * 3000}{']' * 3000}\nrows:\n{row}")  # past Python's recursion limit
    write("deep-recipe.yaml", "checkpoint_dir: " + "{a: " * 3000 + "1" + "}" * 3000 + "\n")
    write("case-ids.yaml", f"name: x\nrows:\n{row}  - id: A\n    recipe: tiny-llama-1.1b/lora\n")
    write("text.yaml", "just words\n")
    write("meta-broken/sweep.json", "{bad")  # an output folder whose sweep index is not one tunelab wrote
    write("meta-list/sweep.json", "[1]")
    write("strategies/broken.yaml", "name: fsdp\nsharding_strategy: [FULL_SHARD\n")
    write("strategies/wrong-type.yaml", "name: deepspeed\nzero_stage: three\n")
    write("strategy-broken.yaml", f"name: x\nrows:\n{row}    strategy: {tmp}/strategies/broken.yaml\n")
    write("strategy-type.yaml", f"name: x\nrows:\n{row}    strategy: {tmp}/strategies/wrong-type.yaml\n")
    write("escape.yaml", "name: x\nrows:\n  - id: ../../escaped_row\n    recipe: tiny-llama-1.1b/lora\n")
    write("name-escape.yaml", f"name: ../../../../x\nrows:\n{row}")
    # crafted checkpoint directories (model_config.yaml as a YAML tag, a list, unknown keys)
    write("ckpt-tag/model_config.yaml", f"name: !!python/object/apply:os.system ['touch {tmp}/pwned-config']\n")
    write("ckpt-list/model_config.yaml", "- 1\n- 2\n")
    write("ckpt-keys/model_config.yaml", "name: x\nn_layer: 2\nnot_a_field: 1\n")
    # a checkpoint of a model litgpt knows (by its directory's name) whose tokenizer files are broken
    for name, content in (("tok-bytes", bytes(range(256)) * 20), ("tok-config", b"{not json")):
        p = tmp / name / "tiny-llama-1.1b"
        p.mkdir(parents=True)
        (p / "tokenizer.json").write_bytes(content if name == "tok-bytes" else b'{"model": {}}')
        if name == "tok-config":
            (p / "tokenizer_config.json").write_bytes(content)
        f[name] = p
    write("a-file", "not a directory\n")
    write("strategy-as-recipe.yaml", "name: deepspeed\nzero_stage: 3\n")
    write("lora.yaml", "precision: bf16-true\nlora_r: 8\n")  # no checkpoint_dir
    write("adapter.yaml", "checkpoint_dir: checkpoints/TinyLlama/TinyLlama-1.1B-intermediate-step-1431k-3T\n")
    write("old-report/strategies.csv", "family,method\nTinyLlama 1.1B,full\n")
    return f


def cases(tmp: Path, f: dict[str, Path]) -> list[tuple[str, list, str]]:
    """(label, argv, a fragment the one line must hold)."""
    return [
        # numbers, range-checked where they are parsed
        ("memory limit -1", ["run", R, "--memory-limit-gb", "-1"], "--memory-limit-gb"),
        ("memory limit 0", ["run", R, "--memory-limit-gb", "0"], "--memory-limit-gb"),
        ("timeout 0", ["run", R, "--timeout", "0"], "--timeout"),
        ("sweep timeout -1", ["sweep", "lab-part1", "--timeout", "-1"], "--timeout"),
        ("nnodes 0", ["run", R, "--nnodes", "0"], "--nnodes"),
        (
            "node rank beyond nnodes",
            ["run", R, "--strategy", "ddp", "--nnodes", "2", "--node-rank", "2"],
            "--node-rank",
        ),
        ("plan devices 0", ["plan", R, "--devices", "0"], "--devices"),
        ("plan a strategy file", ["plan", f["strategy-as-recipe.yaml"]], "a strategy file (name: deepspeed)"),
        ("run a strategy file", ["run", f["strategy-as-recipe.yaml"]], "as --strategy"),
        ("plan a sweep file", ["plan", "configs/sweeps/qlora-time.yaml"], "tunelab sweep configs/sweeps/qlora-time"),
        ("validate a sweep file", ["validate", "configs/sweeps/lab-part1.yaml"], "a sweep file (name: lab-part1)"),
        ("plan without checkpoint_dir", ["plan", f["lora.yaml"], "--gpu", "L4"], "lora.yaml: checkpoint_dir: not set"),
        ("plan an adapter", ["plan", f["adapter.yaml"], "--gpu", "L4"], "method adapter (litgpt finetune_adapter)"),
        ("advise an adapter", ["advise", f["adapter.yaml"], "--gpus", "L4"], "not litgpt's adapters"),
        ("advise 64 nodes, no network", ["advise", R, "--gpus", "L4", "--nodes", "64"], "--nodes 64: a run on several"),
        ("mfu range 0 0", ["plan", R, "--mfu-range", "0", "0"], "--mfu-range"),
        ("mfu range reversed", ["plan", R, "--mfu-range", "0.5", "0.2"], "--mfu-range"),
        ("tokens -5", ["plan", R, "--tokens", "-5"], "--tokens"),
        ("calibrate missing", ["plan", R, "--calibrate", tmp / "nope"], "--calibrate"),
        ("plan micro batch 0", ["plan", R, "--train.micro_batch_size", "0"], "micro_batch_size"),
        ("plan save interval x", ["plan", R, "--gpu", "H100-SXM", "--train.save_interval", "x"], "train.save_interval"),
        ("plan save interval nan", ["plan", R, "--gpu", "H100-SXM", "--train.save_interval", ".nan"], "save_interval"),
        ("plan eval interval 0", ["plan", R, "--gpu", "H100-SXM", "--eval.interval", "0"], "eval.interval"),
        ("plan save rate 0", ["plan", R, "--gpu", "H100-SXM", "--save-gbs", "0"], "--save-gbs"),
        ("plan save rate inf", ["plan", R, "--gpu", "H100-SXM", "--save-gbs", "inf"], "--save-gbs"),
        (
            "plan unknown model",
            ["plan", R, "--checkpoint_dir", "checkpoints/foo/NotAModel"],
            "'NotAModel' is not a model litgpt knows",
        ),
        ("run QLoRA without a GPU", ["run", "tiny-llama-1.1b/qlora", "--out", tmp / "qlora-run"], "bnb.nf4 on CPU"),
        ("tune-batch steps 0", ["tune-batch", R, "--steps", "0"], "--steps"),
        ("tune-batch start -4", ["tune-batch", R, "--start", "-4"], "--start"),
        ("build-model device", ["build-model", "tiny", "--device", "nope"], "--device"),
        ("data n -1", ["data", "generate", "--n", "-1"], "--n"),
        ("data seed -1", ["data", "generate", "--seed", "-1"], "--seed: '-1' is out of range; fix: give a seed"),
        ("data out under a file", ["data", "generate", "--out", f["a-file"] / "x.json"], "--out"),
        (
            "sweep out is a file",
            ["sweep", "lab-part1", "--only", "s2", "--model", "tiny", "--out", f["a-file"]],
            "a-file",
        ),
        ("report of nothing", ["report", tmp / "no-such-sweep"], "no-such-sweep: no such sweep directory; fix:"),
        ("report of a file", ["report", f["a-file"]], "a-file: is not a directory; fix:"),
        (
            "archive under a file",
            ["sweep", "lab-part1", "--only", "s2", "--model", "tiny", "--archive", f["a-file"] / "x.tgz"],
            "--archive",
        ),
        ("validate devices 0", ["validate", R, "--devices", "0"], "devices"),
        ("optimizer os.system", ["validate", R, "--optimizer", "os.system"], "optimizer"),
        ("optimizer this.AdamW", ["validate", R, "--optimizer", "this.AdamW"], "optimizer"),
        # sweep files
        ("rows: 5", ["sweep", f["rows-int.yaml"]], "rows"),
        ("set: [1, 2]", ["sweep", f["set-list.yaml"]], "set"),
        ("timeout_s: abc", ["sweep", f["timeout-text.yaml"]], "timeout_s"),
        ("YAML syntax", ["sweep", f["syntax.yaml"]], "syntax.yaml:5"),
        ("5,000-character id", ["sweep", f["long-id.yaml"]], "5000 characters"),
        ("devices -1 in a row", ["sweep", f["devices-neg.yaml"]], "devices"),
        # a one-device strategy (name: single) on several devices: ranks that never average a gradient
        ("single strategy on 2, sweep", ["sweep", f["single-on-2.yaml"]], "name: single runs one device"),
        ("single strategy on 2, plan", ["plan", R, "--devices", "2", "--strategy", "fast"], "--strategy fast"),
        ("single strategy on 2, run", ["run", R, "--devices", "2", "--strategy", "fast"], "name: single"),
        ("plan micro 1e12", ["plan", R, "--train.micro_batch_size", "1000000000000"], "train.global_batch_size"),
        # empty lists that used to mean "everything"; a link option named in its error
        ("plan-families --families ,", ["plan-families", "--families", ","], "--families"),
        ("plan-strategies --strategies ,", ["plan-strategies", "--strategies", ","], "--strategies"),
        ("plan-strategies --worlds 1", ["plan-strategies", "--worlds", "1"], "--worlds"),
        ("plan-strategies --out a file", ["plan-strategies", "--out", f["a-file"]], "--out"),
        ("plan-strategies --families Nope", ["plan-strategies", "--families", "Nope"], "--families Nope"),
        (
            "plan-strategies --keep a broken table",
            ["plan-strategies", "--keep", "--out", f["old-report/strategies.csv"].parent, "--worlds", "2"],
            "not a strategies table",
        ),
        (
            "plan --internode smoke",
            [
                "plan",
                R,
                "--gpu",
                "H100-SXM",
                "--devices",
                "2",
                "--num_nodes",
                "2",
                "--strategy",
                "ddp",
                "--internode",
                "smoke",
            ],
            "--internode smoke",
        ),
        ("python tag", ["sweep", f["tag.yaml"]], "tag"),
        ("alias bomb", ["sweep", f["bomb.yaml"]], "alias"),
        ("3,000 levels deep, sweep", ["sweep", f["deep.yaml"]], "deep.yaml:2: nested more than 64 levels deep; fix:"),
        ("3,000 levels deep, recipe", ["plan", f["deep-recipe.yaml"]], "nested more than 64 levels deep; fix:"),
        (
            "3,000 levels deep, override",
            ["plan", R, "--train.micro_batch_size", "[" * 3000 + "]" * 3000],
            "characters ...] ]]]]",  # the 6,000-character value echoed with its middle elided, its fix kept
        ),
        ("ids that differ in case", ["sweep", f["case-ids.yaml"]], "duplicate row id(s) ['A', 'a']"),
        ("recipe of plain text", ["plan", f["text.yaml"]], "got str; fix: give a recipe"),
        *(
            (
                f"resume over a {kind} sweep.json",
                ["sweep", "lab-part1", "--only", "s2", "--model", "tiny", "--out", f[f"meta-{kind}/sweep.json"].parent],
                "sweep.json: not a sweep index this command wrote",
            )
            for kind in ("broken", "list")
        ),
        ("strategy YAML broken", ["sweep", f["strategy-broken.yaml"]], "broken.yaml:2"),
        ("strategy wrong type", ["sweep", f["strategy-type.yaml"]], "zero_stage"),
        ("row id escapes", ["sweep", f["escape.yaml"]], "not a plain name"),
        ("sweep name escapes", ["sweep", f["name-escape.yaml"]], "not a plain name"),
        # crafted model_config.yaml
        (
            "tokenizer of random bytes",
            ["plan", R, "--checkpoint_dir", f["tok-bytes"], "--dataset", DATA],
            "tokenizer.json",
        ),
        (
            "tokenizer_config not JSON",
            ["plan", R, "--checkpoint_dir", f["tok-config"], "--dataset", DATA],
            "tokenizer_config",
        ),
        ("model_config tag", ["plan", R, "--checkpoint_dir", f["ckpt-tag/model_config.yaml"].parent], "tag"),
        ("model_config list", ["plan", R, "--checkpoint_dir", f["ckpt-list/model_config.yaml"].parent], "mapping"),
        (
            "model_config keys",
            ["validate", R, "--checkpoint_dir", f["ckpt-keys/model_config.yaml"].parent],
            "not_a_field",
        ),
    ]


THROUGH_LITGPT = {
    "run QLoRA without a GPU",
    "build-model device",
    "validate devices 0",
    "optimizer os.system",
    "optimizer this.AdamW",
    "devices -1 in a row",
    "single strategy on 2, run",
    "tokenizer of random bytes",
    "tokenizer_config not JSON",
    "model_config keys",
}
"""The cases refused after litgpt is imported (its parser, a tokenizer, a model: 6 to 8 s of CPU each, most of this
sweep's time): -m slow. CI runs the others (under a second each) and litgpt's parser over bad values in-process
(tests/cli/test_hostile.py)."""


@REFUSAL_HALVES
def test_every_bad_input_is_one_line_and_a_nonzero_exit(tmp_path, half):
    f = _files(tmp_path)
    every = cases(tmp_path, f)
    assert len(every) >= 40
    before = beside_checkout()
    refusals_of_half(every, THROUGH_LITGPT, half, tunelab, workers=4)
    # nothing ran from a file, nothing was written outside the working directory, the alias bomb never expanded
    assert not list(tmp_path.glob("pwned*"))
    assert beside_checkout() == before
    assert not (ROOT / "runs" / "x").exists() and not (tmp_path / "qlora-run").exists()


def test_a_missing_recipe_or_sweep_is_refused_before_torch_is_imported():
    """A name that resolves to nothing is refused in well under a second: no command imports torch or litgpt (2.6 and
    6 s of CPU) before it has checked its own arguments (``python -X importtime`` lists every module imported)."""
    for args in (
        ["run", "nope"],
        ["sweep", "nope.yaml"],
        ["plan", "nope"],
        ["validate", "nope"],
        ["tune-batch", "nope"],
        ["bench", "nope"],
        ["report", "nope"],
    ):
        proc = subprocess.run(
            [sys.executable, "-X", "importtime", "-m", "tunelab", *args],
            cwd=ROOT,
            env=cpu_env(),
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert proc.returncode != 0 and "nope" in proc.stdout + proc.stderr, (args, proc.stderr[-300:])
        imported = {line.rsplit("|", 1)[-1].strip() for line in proc.stderr.splitlines() if "|" in line}
        assert "tunelab.cli" in imported, args  # the listing is read: it names the modules imported
        assert not imported & {"torch", "litgpt", "lightning"}, (args, imported & {"torch", "litgpt", "lightning"})


def test_abbreviations_are_never_taken_for_other_options():
    """``--data`` is a litgpt override, not an abbreviation of ``plan --dataset``."""
    proc = tunelab("plan", "open-llama-7b/lora", "--gpu", "A100-80GB", "--data", "Alpaca", "--json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["fits"] is True


def test_pickled_code_in_a_checkpoint_never_runs(tiny_ckpt, tmp_path):
    """A lit_model.pth whose pickle calls os.system (litgpt's lazy loader would run it) is refused before
    launch, without running it: every weight file is opened with torch.load(weights_only=True) semantics."""
    import shutil

    import torch

    ckpt = tmp_path / "ckpt"
    shutil.copytree(tiny_ckpt, ckpt)
    marker = tmp_path / "pwned"

    class Payload:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    torch.save({"transformer.wte.weight": Payload()}, ckpt / "lit_model.pth")
    proc = tunelab(
        "run", R, "--model", "checkpoint", "--checkpoint_dir", ckpt, "--precision", "32-true", "--out", tmp_path / "run"
    )
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "lit_model.pth is not plain tensor data" in proc.stderr
    assert not marker.exists() and not (tmp_path / "run" / "stdout.log").exists()


def test_report_over_a_bad_record_keeps_the_row(tmp_path):
    """A truncated record, or one whose overrides are numbers, is a row of the report that says so (nothing
    dropped), not a traceback."""
    sweep = tmp_path / "sw"
    (sweep / "r1").mkdir(parents=True)
    (sweep / "r1" / "record.json").write_text('{"status": "ok", "row_id": "r1", "tok_')
    (sweep / "r2").mkdir(parents=True)  # overrides that are numbers broke the report's markdown
    (sweep / "r2" / "record.json").write_text('{"status": "ok", "row_id": "r2", "overrides": [1, 2.5]}')
    proc = tunelab("report", sweep, "--out", tmp_path / "rep")
    assert proc.returncode == 0, proc.stderr
    md = (tmp_path / "rep" / "results.md").read_text()
    assert "r1" in md and "unreadable record.json" in md
    assert "overrides holds something that is not text" in md


def test_a_data_module_that_cannot_download_is_one_line_and_leaves_nothing(tmp_path):
    """Offline (declared here with TUNELAB_OFFLINE=1, as HF_HUB_OFFLINE=1 does for Hugging Face), `--data Alpaca`
    is refused before launch in one line saying what to do; no data/alpaca directory is left behind."""
    import subprocess as sp

    before = sorted(p.name for p in (ROOT / "data").iterdir())
    proc = sp.run(
        [
            sys.executable,
            "-m",
            "tunelab",
            "run",
            R,
            "--model",
            "tiny",
            "--data",
            "Alpaca",
            "--out",
            str(tmp_path / "run"),
        ],
        cwd=ROOT,
        env=cpu_env(TUNELAB_OFFLINE="1"),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    lines = [ln for ln in (proc.stdout + proc.stderr).splitlines() if ln.strip()]
    assert len(lines) == 1 and "Alpaca downloads" in lines[0] and "--data JSON --data.json_path FILE" in lines[0]
    assert sorted(p.name for p in (ROOT / "data").iterdir()) == before
    assert not (tmp_path / "run" / "stdout.log").exists()
