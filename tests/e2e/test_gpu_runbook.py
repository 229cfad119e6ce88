"""The GPU runbook rehearsed on this CPU machine, and what a first GPU run needs before it measures anything:
the carried wheels (checked against the GPU image's package list), the staged runbook (time limit, number and size
of the files that come back, resume), a full disk, random-weight checkpoints built in a child, `python -m litgpt`
everywhere, and the preflight's one-line problems."""

from __future__ import annotations

import errno
import json
import math
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from tests.conftest import ROOT, cpu_env
from tests.repo.test_gpu_runbook import GPU_DIR

PRINTED = {
    "tunelab sweep configs/sweeps/lab-part1.yaml",
    "tunelab sweep configs/sweeps/lab-part1.yaml --weights random",
    "OUT=/where/files/come/back bash scripts/gpu/runbook.sh env tiny",
}
"""README commands test_runbook_rehearsal_within_the_device_limits runs in their CPU variant (the runbook's own
TUNELAB_REHEARSAL=1: the tiny model, a few steps; OUT a temporary folder). tests/e2e/test_printed_commands.py checks
they are the README's."""


def _runbook(out: Path, runs: Path, results: Path, budget: int, *stages: str, timeout: int = 600, **extra: str):
    env = cpu_env(
        **extra,
        OUT=str(out),
        RUNS=str(runs),
        RESULTS=str(results),
        BUDGET=str(budget),
        TUNELAB_REHEARSAL="1",
        PYTHON=sys.executable,
    )
    return subprocess.run(
        ["bash", str(GPU_DIR / "runbook.sh"), *stages],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _returned_files(out: Path) -> list[Path]:
    return [p for p in out.rglob("*") if p.is_file()]


@pytest.mark.slow  # 3 minutes on 2 cores; run before every GPU session: pytest -m slow tests/e2e/test_gpu_runbook.py
def test_runbook_rehearsal_within_the_device_limits(tmp_path):
    """The whole runbook end to end (its parts run alone: the deadline, disk-full and random-weights tests here,
    tunelab bench in tests/e2e/test_bench.py, the sweep in tests/e2e/test_tune_study.py and tests/e2e/test_faults.py;
    of these CI runs disk-full and the corrupt-record resume, the others run with -m slow). The same stages as on the GPU, with the tiny model: at most 8 files of at most 16 MiB no more than 2 folders
    down, the report rewritten after every row, and a second call skips finished rows. The budget is generous: this
    test checks what the stages leave behind, on a machine however busy; how a budget cuts a row and how the next
    call goes on is test_deadline_kills_a_row_that_then_runs_again_on_resume (a row that cannot finish in time)."""
    out, runs, results = tmp_path / "out", tmp_path / "runs", tmp_path / "results"
    proc = _runbook(out, runs, results, 1500, "env", "tiny", "bench", timeout=1800)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "deadline reached" not in proc.stdout + proc.stderr
    files = _returned_files(out)
    assert len(files) <= 8 and all(f.stat().st_size <= 16 * 2**20 for f in files), files
    assert all(len(f.relative_to(out).parts) <= 3 for f in files)
    log = (out / "runbook.log").read_text()
    assert "preflight: ok" in log
    # the README's sweep commands, as the rehearsal runs them: the tiny model in place of random weights (or of
    # the recipe's checkpoint), 3 steps, the TinyLlama rows
    swept = next(ln for ln in log.splitlines() if ln.startswith("runbook: tunelab sweep"))[len("runbook: ") :]
    for command in PRINTED:
        if command.startswith("tunelab sweep"):
            assert swept.startswith(command.replace(" --weights random", "") + " --model tiny --set "), (command, swept)
    with tarfile.open(out / "lab-part1.tgz") as tar:
        names = tar.getnames()
        md = tar.extractfile("lab-part1/report/results.md").read().decode()
    assert {f"lab-part1/{r}/record.json" for r in ("s1", "s2", "s3", "s4", "s5", "s10")} <= set(names)
    assert not [n for n in names if n.endswith((".pth", ".lora"))]  # never weights
    assert "| s4 | tiny-llama-1.1b/full | bf16-true |" in md and "MFU padded" in md and "Not run (8)" in md
    with tarfile.open(out / "bench.tgz") as tar:  # the bench stage: both arms of each recipe, and their report
        names = tar.getnames()
    for slug in ("tiny-llama-1.1b-full",):
        assert {
            f"bench/{slug}/litgpt-0/record.json",
            f"bench/{slug}/fast-0/record.json",
            f"bench/{slug}/report/bench.md",
        } <= set(names), (slug, names)
    overhead = json.loads((out / "collector-overhead.json").read_text())
    assert overhead["ratio_with_over_without"] > 0
    # the next call starts from what came back: nothing is run again
    results.mkdir()
    (results / "lab-part1.tgz").write_bytes((out / "lab-part1.tgz").read_bytes())
    again = _runbook(tmp_path / "out2", tmp_path / "runs2", results, 1500, "tiny")
    assert again.returncode == 0, again.stdout[-3000:]
    assert "resuming lab-part1: 6 of 6 rows already recorded" in again.stdout


@pytest.mark.slow  # 1.5 min on 2 cores; a killed row's record and resume are in CI (test_runner, test_faults)
def test_deadline_kills_a_row_that_then_runs_again_on_resume(tmp_path):
    """A row still running at the command's deadline is recorded as killed 'deadline:' and runs on the next call
    (a plain timeout would be final); the rows after it are listed as not started."""
    base = [
        sys.executable,
        "-m",
        "tunelab",
        "sweep",
        "lab-part1",
        "--model",
        "tiny",
        "--only",
        "s2,s3",
        "--out",
        str(tmp_path / "sw"),
        "--no-report",
        "--set",
        "data.num_workers=0",
    ]
    slow = subprocess.run(
        [*base, "--set", "train.max_steps=100000", "--set", "train.epochs=50", "--deadline", "15"],
        cwd=ROOT,
        env=cpu_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert slow.returncode == 0, slow.stderr[-2000:]
    rec = json.loads((tmp_path / "sw" / "s2" / "record.json").read_text())
    assert rec["status"] == "killed" and rec["error"].startswith("deadline:")
    assert "1 row(s) not started (s3)" in slow.stderr
    fast = subprocess.run(
        [*base, "--set", "train.max_steps=2"], cwd=ROOT, env=cpu_env(), capture_output=True, text=True, timeout=300
    )
    assert fast.returncode == 0, fast.stderr[-2000:]
    assert "resuming" not in fast.stderr  # the deadline-killed row is not 'recorded' for resume
    for row in ("s2", "s3"):
        assert json.loads((tmp_path / "sw" / row / "record.json").read_text())["status"] == "ok"


def test_disk_full_while_building_a_checkpoint_is_a_row_and_stops_the_sweep(tiny_ckpt, tmp_path, monkeypatch):
    """ENOSPC while building a random-weight checkpoint: that row is recorded (error, 'disk full'), the sweep
    stops in one line (DiskFull) without temporary files, and a resume after freeing space runs the rest."""
    from tunelab import sweep_file
    from tunelab.run import runner, sweep

    calls = []

    def full_disk(name, device="cpu", timeout_s=1800):
        calls.append(name)
        raise OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "ckpt" / "lit_model.pth.tmp"))

    monkeypatch.setattr(runner, "build_in_child", full_disk)
    sw = sweep_file.load("lab-part1", ["train.max_steps=2", "data.num_workers=0", "eval.final_validation=false"])
    sw.rows = [r for r in sw.rows if r.id in ("s2", "s4")]
    out = tmp_path / "sw"
    with pytest.raises(sweep.DiskFull, match="s2: disk full; free space and run the same command again"):
        sweep.run_sweep(sw, out, sweep.SweepOptions(model="random", stream=open(os.devnull, "w")))
    rec = json.loads((out / "s2" / "record.json").read_text())
    assert rec["status"] == "error" and "disk full" in rec["error"]
    assert not (out / "s4").exists() and calls == ["tiny-llama-1.1b"]
    assert not [p for p in out.rglob("*") if p.name.endswith(".tmp")]
    # space freed: the same command goes on (the stand-in build now returns the tiny model)
    monkeypatch.setattr(runner, "build_in_child", lambda name, device="cpu", timeout_s=1800: tiny_ckpt)
    sweep.run_sweep(
        sw, out, sweep.SweepOptions(model="random", stream=open(os.devnull, "w"))
    )  # a disk-full row runs again
    for row in ("s2", "s4"):
        assert json.loads((out / row / "record.json").read_text())["status"] == "ok"


@pytest.mark.slow  # 1 min on 2 cores; building a checkpoint is in CI (every test that uses the tiny model builds one)
def test_random_weights_are_built_in_a_child_and_leave_no_weights(tmp_path, monkeypatch):
    """--weights random: the checkpoint is built by a child process (this process never builds it, so it holds no
    GPU memory while the run trains), the benchmark data replaces the small shipped set, litgpt's saves are
    skipped and no weight file is left (a sweep of random-weight runs fills no disk)."""
    from tunelab import checkpoints
    from tunelab.recipes import resolve
    from tunelab.run.runner import RunOptions, run

    def not_here(*a, **k):
        raise AssertionError("checkpoints.build ran in the parent process")

    monkeypatch.setattr(checkpoints, "build", not_here)
    rec = run(
        resolve("tiny-llama-1.1b/lora"),
        [
            "--checkpoint_dir",
            "checkpoints/EleutherAI/pythia-14m",
            "--train.max_steps",
            "2",
            "--data.num_workers",
            "0",
            "--eval.final_validation",
            "false",
            "--precision",
            "32-true",  # the recipe's bf16 is emulated on this CPU: 20-40 s an iteration for this 50k-vocabulary model
        ],
        tmp_path / "r",
        RunOptions(model="random"),
    )
    assert rec.status == "ok", rec.error
    assert rec.model_source == "random" and rec.model_name == "pythia-14m" and rec.saves_skipped
    i = rec.overrides.index("--data.json_path")
    assert rec.overrides[i + 1] == ".tunelab/data/alpaca_benchmark.json" or not Path(
        rec.overrides[i + 1]
    ).is_relative_to(ROOT)  # no machine path when under the checkout
    assert not [p for p in (tmp_path / "r").rglob("*") if p.name.endswith((".pth", ".pth.lora", ".safetensors"))]
    assert "tunelab: LoRA merge skipped" in (tmp_path / "r" / "stdout.log").read_text()


@pytest.mark.slow  # 3 minutes on 2 cores; with the rehearsal above before a GPU session that runs these stages
def test_second_round_stages_rehearsed(tmp_path):
    """The stages issue 27 needs (families, history, overhead) rehearsed with the tiny model: what each returns, in
    the device's limits. families: a record per row run, QLoRA's refusal recorded (no CUDA here), never dropped;
    history: both runs' records and no weights; overhead: the JSON with the pairs it measured and why it stopped."""
    out, runs, results = tmp_path / "out", tmp_path / "runs", tmp_path / "results"
    proc = _runbook(out, runs, results, 1500, "families", "history", "overhead", timeout=1800)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    files = _returned_files(out)
    assert {f.name for f in files} == {"families-gpu.tgz", "history.tgz", "collector-overhead.json", "runbook.log"}
    assert all(f.stat().st_size <= 16 * 2**20 for f in files)
    with tarfile.open(out / "families-gpu.tgz") as tar:
        records = {
            n.split("/")[1]: json.loads(tar.extractfile(n).read()) for n in tar.getnames() if n.endswith("/record.json")
        }
    assert set(records) == {"gemma-2b-lora-mb2", "llama-3.2-1b-full-mb2", "mistral-7b-qlora-mb2"}
    assert records["gemma-2b-lora-mb2"]["status"] == "ok" and records["llama-3.2-1b-full-mb2"]["method"] == "full"
    assert records["mistral-7b-qlora-mb2"]["status"] == "error" and "CUDA" in records["mistral-7b-qlora-mb2"]["error"]
    with tarfile.open(out / "history.tgz") as tar:
        names = tar.getnames()
    assert {"history/Llama-3.2-1B/record.json", "history/TinyLlama-1.1B-intermediate-step-1431k-3T/record.json"} <= set(
        names
    )
    assert not [n for n in names if n.endswith((".pth", ".lora"))]
    overhead = json.loads((out / "collector-overhead.json").read_text())
    assert 1 <= len(overhead["ratios"]) <= 2 and overhead["stopped"] != "running" and overhead["target"] == 0.01


@pytest.mark.slow  # about a minute on 2 cores
def test_fsdp1_lora_stage_rehearsed(tmp_path):
    """Stage fsdp1-lora with the tiny model: each row a record of its own, run under its strategy file (FSDP1's
    ``fsdp`` and ``fsdp2``), in one archive with its report."""
    out, runs, results = tmp_path / "out", tmp_path / "runs", tmp_path / "results"
    proc = _runbook(out, runs, results, 600, "fsdp1-lora", timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert {f.name for f in _returned_files(out)} == {"fsdp1-lora.tgz", "runbook.log"}
    with tarfile.open(out / "fsdp1-lora.tgz") as tar:
        names = tar.getnames()
        records = {n.split("/")[1]: json.loads(tar.extractfile(n).read()) for n in names if n.endswith("/record.json")}
    assert {k: (r["status"], r["strategy_file"], r["method"]) for k, r in records.items()} == {
        "tiny-lora-fsdp1": ("ok", "fsdp", "lora"),
        "tiny-lora-fsdp2": ("ok", "fsdp2", "lora"),
        "7b-lora-fsdp1": ("ok", "fsdp", "lora"),
        "7b-lora-fsdp2": ("ok", "fsdp2", "lora"),
    }
    assert records["7b-lora-fsdp1"]["micro_batch_size"] == 8 and records["tiny-lora-fsdp1"]["micro_batch_size"] == 4
    assert any(n.endswith("report/results.md") for n in names)


@pytest.mark.slow  # about a minute on 2 cores
def test_alloc_stage_rehearsed(tmp_path):
    """Stage alloc with the tiny model (ALLOC_ROWS=s10): the row twice, under torch's allocator as shipped and under
    expandable segments, each its own archive whose record says which; a row already in lab-part1's records is run
    again for it (lab-part1's own records are not touched)."""
    out, runs, results = tmp_path / "out", tmp_path / "runs", tmp_path / "results"
    proc = _runbook(out, runs, results, 900, "alloc", timeout=1200, ALLOC_ROWS="s10")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert {f.name for f in _returned_files(out)} == {"lab-part1-alloc.tgz", "lab-part1-expandable.tgz", "runbook.log"}
    conf = {}
    for arm in ("lab-part1-alloc", "lab-part1-expandable"):
        with tarfile.open(out / f"{arm}.tgz") as tar:
            rec = json.loads(tar.extractfile(f"{arm}/s10/record.json").read())
        assert rec["status"] == "ok" and rec["row_id"] == "s10"
        conf[arm] = rec["allocator_conf"]
    assert conf == {"lab-part1-alloc": None, "lab-part1-expandable": "expandable_segments:True"}
    assert not (runs / "lab-part1").exists()


@pytest.mark.slow  # about a minute on 2 cores
def test_grid_stage_rehearsed_and_resumed(tmp_path):
    """Stage grid (the time model's out-of-sample profiles): one JSON line per (model, micro batch, method) with the
    phases, the host's clock per phase, the kernel time and launches by category, litgpt's generation per token; a row "model:micro:lora,qlora" runs
    those methods (QLoRA's dequantization its own category); a second call with the lines carried back runs none again."""
    out, runs, results = tmp_path / "out", tmp_path / "runs", tmp_path / "results"
    proc = _runbook(out, runs, results, 500, "grid", timeout=900, GRID="tiny:1 tiny:2 tiny:3:lora,qlora")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = [json.loads(s) for s in (out / "profile-grid.jsonl").read_text().splitlines()]
    assert [(r["micro"], r["method"]) for r in lines] == [
        (1, "full"),
        (1, "lora"),
        (2, "full"),
        (2, "lora"),
        (3, "lora"),
        (3, "qlora"),
    ]
    assert all(r["step_s"] > 0 and r["kernels"] and sum(r["launches"].values()) > 0 for r in lines)
    assert set(lines[0]["phases"]) == set(lines[0]["host_phases"]) == {"forward", "loss", "backward", "optimizer"}
    assert all(v > 0 for r in lines for v in r["host_phases"].values())  # the host's own clock, per phase
    assert all(r["host"]["host_op_us"] > 0 and r["host"]["module_op_us"] > 0 for r in lines)
    assert all(r["host"]["litgpt_step_op_us"] > 0 for r in lines)  # litgpt's own step on this CPU, per op
    assert lines[0]["cpu_ops"]["aten::mm"][0] > 0  # the profiled step's host-side ops: calls, self microseconds
    # litgpt's generate per decoded token (seconds, ops dispatched); QLoRA's (bitsandbytes' gemv_4bit) on a GPU only
    # (the time per token is a difference of two timed generations: on a loaded CPU it may come out at or below 0)
    decoded = [r["decode"] for r in lines if r["method"] != "qlora"]
    assert all(math.isfinite(d["s"]) and d["ops"] > 0 and d["new_tokens"] == [8, 24] for d in decoded)
    assert "decode" not in lines[-1]
    qlora = lines[-1]  # litgpt's bnb.nf4: every linear layer's 4-bit weight dequantized in forward and backward
    assert qlora["launches"]["dequantization"] > 0 and "dequantization" not in lines[-2]["launches"]
    results.mkdir()
    (results / "profile-grid.jsonl").write_bytes((out / "profile-grid.jsonl").read_bytes())
    again = _runbook(tmp_path / "out2", runs, results, 500, "grid", GRID="tiny:1 tiny:2 tiny:3:lora,qlora")
    assert again.returncode == 0 and again.stdout.count("already measured") == 3, again.stdout[-2000:]
    assert (tmp_path / "out2" / "profile-grid.jsonl").read_text() == (out / "profile-grid.jsonl").read_text()


@pytest.mark.slow  # 20 s on 2 cores: a script of the GPU runbook, rehearsed with the others
def test_profile_steps_refuses_bad_outputs_and_names_before_measuring(tmp_path):
    """scripts/gpu/profile_steps.py: an output that is a FIFO, a link leading outside or a folder, an unknown model,
    method or size is one line and exit 2, before any model is built; nothing written through the link."""
    import os

    fifo, link, outside = tmp_path / "fifo", tmp_path / "link", tmp_path / "outside.txt"
    os.mkfifo(fifo)
    outside.write_text("keep")
    link.symlink_to(outside)
    script = str(GPU_DIR / "profile_steps.py")
    for args, said in (
        (["--json", str(fifo)], "is a FIFO"),
        (["--json", str(link)], "is a symbolic link"),
        (["--out", str(tmp_path)], "is a directory"),
        (["--model", "no-such-model"], "not a litgpt config name"),
        (["--methods", "full,dora"], "dora unknown"),
        (["--methods", "qlora", "--precision", "32-true"], "run bf16-true"),
        (["--micro", "0"], "must be 1 or more"),
    ):
        p = subprocess.run(
            [sys.executable, script, *args], cwd=ROOT, env=cpu_env(), capture_output=True, text=True, timeout=300
        )
        assert p.returncode == 2 and p.stdout == "", (args, p.stdout, p.stderr)
        assert p.stderr.count("\n") == 1 and said in p.stderr and "Traceback" not in p.stderr, (args, p.stderr)
    assert outside.read_text() == "keep"


def test_the_runbooks_variables_are_checked_before_anything_runs(tmp_path):
    """A number the runbook does arithmetic with that is not digits (text, a sign, an exponent, a command
    substitution bash's arithmetic would run) and an empty folder are one line and exit 2, before any stage or
    install; nothing they name is run or made."""
    cases = {
        "BUDGET": "abc",
        "PAIRS": "-1",
        "STEPS": "1e3",
        "OVERHEAD_MICRO": f"a[$(touch {tmp_path / 'pwned'})]",
        "RUNS": "",
        "RESULTS": " ",
    }
    for var, value in cases.items():
        env = {**cpu_env(), "OUT": str(tmp_path / "out"), var: value}
        p = subprocess.run(
            ["bash", "scripts/gpu/runbook.sh", "env"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
        )
        lines = [ln for ln in (p.stdout + p.stderr).splitlines() if ln.strip()]
        assert p.returncode == 2 and len(lines) == 1 and lines[0].startswith(f"runbook: {var}"), (var, lines)
        assert "fix:" in lines[0]
    assert not (tmp_path / "pwned").exists() and not (tmp_path / "out").exists()


def test_wrapper_host_stage_rehearsed(tmp_path):
    """Stage wrapper-host on this CPU, one short rep: FSDP's wrapper host work and evaluation's share of a training
    op's host time, measured on the machine's own CPU, come back as their JSON and tables, beside the runbook's
    log."""
    out, runs, results = tmp_path / "out", tmp_path / "runs", tmp_path / "results"
    proc = _runbook(out, runs, results, 600, "wrapper-host", timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    names = {"wrapper-host.json", "wrapper-host.md", "eval-host.json", "eval-host.md", "runbook.log"}
    assert {f.name for f in _returned_files(out)} == names
    (case,) = json.loads((out / "wrapper-host.json").read_text())["cases"].values()
    assert case["wrapper"] == "litgpt-fsdp1" and len(case["reps"]) == 1
    assert set(json.loads((out / "eval-host.json").read_text())["methods"]) == {"full", "lora"}


def test_a_qlora_lines_decode_is_timed_on_a_gpu_only_and_a_failure_there_is_recorded(monkeypatch):
    """profile_steps.line_decode: full and LoRA lines decode wherever they run; a QLoRA line's decoded token (through
    bitsandbytes' gemv_4bit) only on a GPU, and an error there becomes the line's record, not the grid's end."""
    import importlib.util
    import types

    spec = importlib.util.spec_from_file_location("profile_steps", GPU_DIR / "profile_steps.py")
    steps = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(steps)
    calls = []
    monkeypatch.setattr(steps, "decode_times", lambda *a: calls.append(a) or {"s": 0.01, "ops": 5})
    cpu, gpu = types.SimpleNamespace(type="cpu"), types.SimpleNamespace(type="cuda")
    assert steps.line_decode("model", "prompt", cpu, "lora") == {"s": 0.01, "ops": 5}
    assert steps.line_decode("model", "prompt", cpu, "qlora") is None and len(calls) == 1
    assert steps.line_decode("model", "prompt", gpu, "qlora") == {"s": 0.01, "ops": 5} and len(calls) == 2

    def fails(*a):
        raise RuntimeError("gemv_4bit: no kernel")

    monkeypatch.setattr(steps, "decode_times", fails)
    assert steps.line_decode("model", "prompt", gpu, "qlora") == {"error": "RuntimeError: gemv_4bit: no kernel"}
    with pytest.raises(RuntimeError):  # the lines that always decoded still stop on a failure
        steps.line_decode("model", "prompt", gpu, "lora")


def test_a_bf16_mixed_line_runs_its_forward_under_autocast_over_fp32_weights():
    """profile_steps at bf16-mixed: the weights and the optimizer stay fp32 and the forward runs under bf16 autocast,
    as Lightning's MixedPrecision runs litgpt's step (its casts are the kernels the line measures); its logits reach
    the loss as fp32, as that plugin converts them; a 32-true line has no such casts."""
    import importlib.util

    import litgpt.utils
    import torch

    spec = importlib.util.spec_from_file_location("profile_steps", GPU_DIR / "profile_steps.py")
    steps = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(steps)
    seen = {}
    real = steps.build

    def build(*args):
        seen["model"] = real(*args)
        return seen["model"]

    loss_dtypes = []
    real_loss = litgpt.utils.chunked_cross_entropy

    def loss(logits, *args, **kw):
        loss_dtypes.append({t.dtype for t in logits})
        return real_loss(logits, *args, **kw)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(steps, "build", build)
        mp.setattr(litgpt.utils, "chunked_cross_entropy", loss)
        lines = {
            p: steps.profile_method("full", "tiny", 2, 64, 1, torch.device("cpu"), p) for p in ("32-true", "bf16-mixed")
        }
        assert {p.dtype for p in seen["model"].parameters()} == {torch.float32}  # the mixed line's weights
    casts = {p: line["cpu_ops"].get("aten::_to_copy", [0])[0] for p, line in lines.items()}
    assert casts["bf16-mixed"] > casts["32-true"] + 10, casts  # autocast's casts of weights and activations
    assert lines["bf16-mixed"]["step_s"] > 0 and lines["bf16-mixed"]["decode"]["ops"] > 0
    assert loss_dtypes and all(d == {torch.float32} for d in loss_dtypes)  # converted after the autocast forward
