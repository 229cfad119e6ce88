"""The runner and collector, for real: litgpt child processes on the tiny model, a real OOM under a memory limit,
a SIGKILLed run, a timed-out run, and a SIGKILLed sweep that resumes without losing or rerunning a row."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from tests.conftest import cpu_env
from tunelab import record
from tunelab.recipes import resolve
from tunelab.run.runner import RunOptions, run

ROOT = Path(__file__).resolve().parents[2]
FAST = ["--train.max_steps", "3", "--data.num_workers", "0", "--eval.max_iters", "2"]


EXAMPLE = "tunelab run tiny-llama-1.1b/lora --train.max_steps 4"
PRINTED = {EXAMPLE}
"""The `tunelab --help` example test_ok_run_record runs (tests/e2e/test_printed_commands.py checks it is printed)."""


def test_ok_run_record(tmp_path):
    """`tunelab --help`'s example, as printed (the tiny model on CPU, the recipe's checkpoint not downloaded), plus
    a run directory, a row id and no loader processes."""
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            *EXAMPLE.split(),
            "--out",
            str(tmp_path / "r"),
            "--id",
            "ok1",
            "--data.num_workers",
            "0",
            "--eval.max_iters",
            "2",
        ],
        cwd=ROOT,
        env={**cpu_env(), record.ALLOC_CONF_ENV: "expandable_segments:True"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    rec = record.load(tmp_path / "r" / "record.json")
    assert rec.status == "ok" and rec.exit_code == 0 and rec.error is None and rec.row_id == "ok1"
    # the allocator's setting as the run got it; no CUDA: no driver calls counted (unknown, not zero)
    assert rec.allocator_conf == "expandable_segments:True" and rec.ranks[0].driver_allocs == []
    assert rec.driver_mallocs_steady is None and rec.driver_frees_steady is None
    assert rec.model_source == "tiny" and rec.model_name == "tunelab-tiny-llama" and rec.device_type == "cpu"
    assert rec.accumulation == 4 and rec.iters == 16 and rec.optimizer_steps == 4  # micro 4, global 16
    assert len(rec.ranks) == 1 and rec.ranks[0].peak_rss_bytes > 50e6 and rec.peak_allocated_bytes is None
    assert rec.tokens_padded >= rec.tokens_real > 0
    assert rec.tok_s_padded >= rec.tok_s_real > 0 and rec.step_time_s > 0 and rec.warmup_steps_excluded == 1
    assert rec.litgpt_tok_s > 0 and rec.litgpt_training_time_s > 0  # litgpt's own figures kept beside ours
    assert rec.flops_per_token > 0 and "4N_base + 6N_lora" in rec.flops_formula and rec.n_trainable < rec.n_params
    assert rec.mfu is None and rec.gpus == [] and rec.energy_j is None  # CPU: no peak table, no NVML, not faked
    assert rec.sm_clock_steady_mhz is None and rec.sm_clock_max_mhz is None and rec.clock_capped_steady_share is None
    assert rec.host_cpu and 0 < rec.host_op_us < 1000  # the host's eager dispatch speed, measured before launch
    assert rec.device_op_us is None  # no CUDA here: no launch cost recorded
    assert rec.loss_first and rec.loss_last and rec.val_loss_final
    assert rec.resolved_args["train"]["micro_batch_size"] == 4 and rec.versions["litgpt"] == "0.5.13"
    # the plan made before launch, for the settings it launched (the tiny model; no GPU: memory only)
    from tunelab.plan.recipe import plan_recipe

    planned = plan_recipe(
        resolve("tiny-llama-1.1b/lora"),
        ["--train.max_steps", "4", "--checkpoint_dir", rec.resolved_args["checkpoint_dir"]],
        gpu=None,
    )
    assert rec.plan is not None and rec.plan_error is None and rec.plan.gpu is None and rec.plan.seconds is None
    assert rec.plan.peak_allocated_bytes == planned.plan.peak_allocated_bytes > 0
    assert sum(rec.plan.breakdown_bytes.values()) == rec.plan.peak_allocated_bytes
    assert rec.plan.planner.startswith("tunelab ") and "git " in rec.plan.planner
    assert (tmp_path / "r" / "stdout.log").read_text().count("iter ") >= 16
    assert '"status": "ok"' in p.stdout and f"record: {tmp_path / 'r' / 'record.json'}" in p.stdout


def _tunelab_run(recipe: str, out: Path, overrides: list[str]) -> subprocess.CompletedProcess:
    """`tunelab run RECIPE --out OUT OVERRIDES` in a child process on the CPU."""
    return subprocess.run(
        [sys.executable, "-m", "tunelab", "run", recipe, "--out", str(out), *overrides],
        cwd=ROOT,
        env=cpu_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )


def _run_tiny_lora(out: Path, overrides: list[str]) -> record.RunRecord:
    """`tunelab run tiny-llama-1.1b/lora` in a child process on the CPU (no workers, 2 validation batches): the
    record of a run that succeeded."""
    p = _tunelab_run("tiny-llama-1.1b/lora", out, [*FAST[2:], *overrides])
    assert p.returncode == 0, p.stderr[-3000:]
    return record.load(out / "record.json")


def test_litgpt_validation_samples_and_saves_inside_the_loop_are_pauses_not_steps(tmp_path):
    """litgpt's own loop, for real: the validation, the generated sample and each step checkpoint inside ``fit``
    are noted as pauses of the iteration they interrupt, so the steady window holds training alone (a validation of
    6 s inside the window once made an H200 row's mean step 0.213 s against 0.158 s of training). The final
    validation and save, after ``fit``, and its sanity check before the first batch are no pauses of the loop."""
    import json

    rec = _run_tiny_lora(
        tmp_path / "r",
        [
            "--train.max_steps",
            "6",
            "--train.global_batch_size",
            "4",
            "--eval.interval",
            "3",
            "--train.save_interval",
            "2",
        ],
    )
    assert rec.status == "ok" and rec.iters == 6 and rec.accumulation == 1
    stats = json.loads((tmp_path / "r" / "stats" / "rank0.json").read_text())
    # step k ends iteration k - 1: saves after steps 2, 4 and 6; validation and a sample after steps 3 and 6
    assert [index for index, _, _ in stats["pauses"]] == [1, 2, 2, 3, 5, 5, 5]
    assert all(seconds >= 0 for _, seconds, _ in stats["pauses"])
    assert rec.paused_s == pytest.approx(sum(seconds for _, seconds, _ in stats["pauses"]))
    starts = [it[0] for it in stats["iters"]]  # each pause starts inside the iteration it interrupted
    assert all(starts[i] <= start <= starts[i + 1] for i, _, start in stats["pauses"] if i + 1 < len(starts))
    assert all(start + s <= starts[i + 1] for i, s, start in stats["pauses"] if i + 1 < len(starts))  # ends before


def test_a_whole_epoch_with_a_short_last_micro_batch_steps_as_planned_and_validated(tmp_path):
    """A whole epoch of litgpt's own loop, for real, against the step count plan and validate make before it: 40
    training samples at micro 3 are 14 micro batches (the last of 1), and at accumulation 2 they make 7 optimizer
    steps: the short one completes a step (40 // 6 = 6 was the plan's count). Validated at steps 3 and 6, each with
    a sample, and LoRA's loop samples once more when the epoch ends it: 3 samples (the plan counted 2)."""
    from tunelab.plan.recipe import plan_recipe, runtime_terms
    from tunelab.validate import check

    shape = ["--data.init_args.val_split_fraction", "0.9", "--train.micro_batch_size", "3"]
    shape += ["--train.global_batch_size", "6", "--train.max_steps", "null", "--eval.interval", "3"]
    rec = _run_tiny_lora(tmp_path / "r", shape)
    assert rec.status == "ok" and rec.iters == 14 and rec.accumulation == 2 and rec.optimizer_steps == 7
    planned = plan_recipe(resolve("tiny-llama-1.1b/lora"), shape, gpu=None)
    terms = runtime_terms(planned.settings, planned.input, 400.0)
    assert terms.detail["optimizer_steps"] == 7 and terms.detail["train_iterations"] == 14
    printed = (tmp_path / "r" / "stdout.log").read_text()
    assert printed.count("### Instruction:") == 3 and printed.count("Number of epochs 1 reached") == 1
    assert terms.detail["evaluations"] == 2 and terms.detail["samples_generated"] == 3
    said = [p.message for p in check(resolve("tiny-llama-1.1b/lora"), shape).problems]
    assert any("the run's 7 optimizer steps" in m for m in said), said  # the recipe's 10 warm-up steps


def test_fewer_training_samples_than_the_micro_batch_run_as_litgpt_runs_them_and_are_planned(tmp_path):
    """4 training samples at micro 16, 2 epochs: litgpt runs a micro batch of 4 and a step each epoch. plan refused it
    ("16 samples a step, more than the 4 training samples; fix: at most 1 devices", on one device); it now plans
    it as it runs, saying its micro batches are shorter than the recipe's, as validate passes it."""
    from tunelab.plan.recipe import plan_recipe, runtime_terms
    from tunelab.validate import check

    shape = ["--data.init_args.val_split_fraction", "0.99", "--train.micro_batch_size", "16"]
    shape += ["--train.global_batch_size", "16", "--train.max_steps", "null", "--train.epochs", "2"]
    shape += ["--train.lr_warmup_steps", "1"]
    rec = _run_tiny_lora(tmp_path / "r", shape)
    assert rec.status == "ok" and rec.iters == 2 and rec.optimizer_steps == 2
    planned = plan_recipe(resolve("tiny-llama-1.1b/lora"), shape, gpu=None)
    terms = runtime_terms(planned.settings, planned.input, 400.0)
    assert terms.detail["optimizer_steps"] == 2 and terms.detail["train_iterations"] == 2
    assert any("share of the 4 training samples is 4, under the micro batch 16" in n for n in planned.plan.notes)
    assert check(resolve("tiny-llama-1.1b/lora"), shape).blocking() == []


def test_an_optimizers_states_are_planned_as_litgpt_saves_them(tmp_path):
    """litgpt's full fine-tuning with Adagrad, for real: each step checkpoint holds the model and the optimizer's
    state, the final one the model alone. Their difference is Adagrad's one state per parameter, as planned (the plan
    assumed Adam's two for any optimizer it did not name: twice what litgpt saved)."""
    shape = ["--optimizer", "Adagrad", "--train.max_steps", "2", "--train.save_interval", "1"]
    shape += ["--train.lr_warmup_steps", "1", "--data.num_workers", "0", "--eval.max_iters", "2"]
    p = _tunelab_run("tiny-llama-1.1b/full", tmp_path / "r", shape)
    assert p.returncode == 0, p.stderr[-3000:]
    planned = record.load(tmp_path / "r" / "record.json").plan.breakdown_bytes
    saved = {
        name: (tmp_path / "r" / "litgpt" / name / "lit_model.pth").stat().st_size for name in ("step-000001", "final")
    }
    assert planned["optimizer_states"] == planned["weights"]  # one fp32 state per parameter (32-true on the CPU)
    assert saved["step-000001"] - saved["final"] == pytest.approx(planned["optimizer_states"], rel=0.02)


def test_litgpts_lora_loop_on_two_devices_ends_at_max_steps_not_at_its_sample(tmp_path):
    """litgpt's LoRA loop samples on rank 0 alone when its epochs end it: on 2 processes the other rank waited for
    it until the run was killed (300 s, 10 steps done, no checkpoint). ``run`` refuses that before launching, naming
    the max_steps that ends the loop first; with it the same run ends (tunelab's loop under --strategy is not held
    to it: it skips a sample a sharded model cannot take on one rank)."""
    from tunelab.validate import check

    shape = ["--devices", "2", "--data.init_args.val_split_fraction", "0.9", "--train.micro_batch_size", "2"]
    shape += ["--train.global_batch_size", "4", "--train.lr_warmup_steps", "2", "--train.max_steps", "null"]
    p = _tunelab_run("tiny-llama-1.1b/lora", tmp_path / "no", shape)
    lines = [ln for ln in (p.stdout + p.stderr).splitlines() if ln.strip()]
    assert p.returncode != 0 and len(lines) == 1 and "train.max_steps: not set" in lines[0], lines
    assert "fix: set train.max_steps to 10" in lines[0] and not (tmp_path / "no").exists()
    assert check(resolve("tiny-llama-1.1b/lora"), shape).blocking(under_strategy=True) == []
    rec = _run_tiny_lora(tmp_path / "r", [*shape, "--train.max_steps", "10"])
    assert rec.status == "ok" and rec.optimizer_steps == 10 and rec.device_count == 2 and len(rec.ranks) == 2


@pytest.mark.slow  # 30 s on 2 cores; CI keeps a timed-out and a SIGKILLed run (below)
def test_real_oom_under_memory_limit(tmp_path):
    """A 70M-parameter model (random weights) with a 32-sample micro batch cannot allocate within the limit."""
    from tunelab import checkpoints

    ckpt = checkpoints.build("pythia-70m", tmp_path / "pythia")
    rec = run(
        resolve("tiny-llama-1.1b/full"),
        [*FAST, "--checkpoint_dir", str(ckpt), "--train.micro_batch_size", "32", "--train.global_batch_size", "32"],
        tmp_path / "oom",
        RunOptions(model="checkpoint", memory_limit_bytes=int(OOM_LIMIT_GB * 1e9)),
    )
    assert rec.status == "oom", (rec.status, rec.error)
    assert rec.error and any(w in rec.error for w in ("memory", "Memory", "alloc"))
    assert record.load(tmp_path / "oom" / "record.json").status == "oom"
    # the same run without the limit is fine: the limit is the only reason
    ok = run(
        resolve("tiny-llama-1.1b/full"),
        [
            *FAST,
            "--checkpoint_dir",
            str(ckpt),
            "--train.micro_batch_size",
            "1",
            "--train.global_batch_size",
            "1",
            "--train.max_steps",
            "1",
            "--eval.final_validation",
            "false",
        ],
        tmp_path / "fits",
        RunOptions(model="checkpoint", memory_limit_bytes=int(OOM_LIMIT_GB * 1e9)),
    )
    assert ok.status == "ok", ok.error


OOM_LIMIT_GB = 4.0


def test_timeout_kills_a_run(tiny_ckpt, tmp_path):
    rec = run(
        resolve("tiny-llama-1.1b/lora"),
        ["--data.num_workers", "0"],
        tmp_path / "t",
        RunOptions(model="tiny", timeout_s=4),
    )
    assert rec.status == "killed" and "timeout" in rec.error
    assert rec.wall_s < 30


def _child_of(pid: int, timeout: float = 600) -> psutil.Process:
    t0 = time.time()
    while time.time() - t0 < timeout:
        for c in psutil.Process(pid).children(recursive=True):
            try:
                if "tunelab.run.entry" in " ".join(c.cmdline()):
                    return c
            except psutil.NoSuchProcess:
                pass
        time.sleep(0.2)
    raise AssertionError("no training child appeared")


def test_sigkill_of_a_run_becomes_a_killed_row(tiny_ckpt, tmp_path):
    out = tmp_path / "k"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tunelab",
            "run",
            "tiny-llama-1.1b/lora",
            "--model",
            "tiny",
            "--out",
            str(out),
            "--data.num_workers",
            "0",
        ],
        cwd=ROOT,
        env=cpu_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    child = _child_of(proc.pid)
    time.sleep(2)
    child.send_signal(signal.SIGKILL)
    proc.communicate(timeout=120)
    assert proc.returncode == 1
    rec = record.load(out / "record.json")
    assert rec.status == "killed" and rec.error == "killed by signal SIGKILL" and rec.exit_code == -9
