"""The GPU runbook rehearsed on this CPU machine, and what a first GPU run needs before it measures anything:
the carried wheels (checked against the GPU image's package list), the staged runbook (time limit, number and size
of the files that come back, resume), a full disk, random-weight checkpoints built in a child, `python -m litgpt`
everywhere, and the preflight's one-line problems."""

from __future__ import annotations

import errno
import importlib.metadata
import json
import os
import re
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from tests.conftest import ROOT, cpu_env

GPU_DIR = ROOT / "scripts" / "gpu"


def _names(path: Path) -> set[str]:
    out = set()
    for line in path.read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            out.add(re.split(r"[=<>\[ ]", line, maxsplit=1)[0].lower().replace("_", "-"))
    return out


def test_carried_wheels_are_exactly_what_the_gpu_image_lacks():
    """Walk the requirements (markers for Python 3.12 on Linux x86_64) from what tunelab imports on the GPU
    machine: each must be in the image or carried; everything carried must be needed and not in the image."""
    image = _names(GPU_DIR / "gpu-image-packages.txt")
    carried = _names(GPU_DIR / "carry.txt")
    env = {
        "python_version": "3.12",
        "python_full_version": "3.12.3",
        "sys_platform": "linux",
        "platform_system": "Linux",
        "platform_machine": "x86_64",
        "implementation_name": "cpython",
        "os_name": "posix",
        "platform_python_implementation": "CPython",
    }
    roots = [
        "litgpt",
        "jsonargparse[signatures]",
        "lightning",
        "bitsandbytes",
        "deepspeed",
        "nvidia-ml-py",
        "PyYAML",
        "tokenizers",
        "matplotlib",
        "psutil",
        "liger-kernel",
    ]
    needed, todo, missing = set(), [Requirement(r) for r in roots], []
    while todo:
        req = todo.pop()
        name = req.name.lower().replace("_", "-")
        key = (name, tuple(sorted(req.extras)))
        if key in needed:
            continue
        needed.add(key)
        if name in image and name not in carried:
            continue  # the image's own package brings its own needs
        if name not in carried:
            missing.append(name)
            continue
        for raw in importlib.metadata.requires(name) or []:
            sub = Requirement(raw)
            if sub.marker is None or any(sub.marker.evaluate({**env, "extra": e}) for e in (req.extras or {""})):
                todo.append(sub)
    assert not missing, f"needed on the GPU machine, neither in its image nor in carry.txt: {sorted(set(missing))}"
    needed_names = {n for n, _ in needed}
    assert carried <= needed_names, f"carried but not needed: {sorted(carried - needed_names)}"
    assert not (carried & image) - {"huggingface-hub"}, f"carried though the image has it: {carried & image}"
    assert "pydantic" in carried and "pydantic-core" in carried  # deepspeed imports pydantic at import time
    assert "huggingface-hub" not in carried  # shadowing the image's hub breaks `import lightning` there


PRINTED = {
    "tunelab sweep configs/sweeps/lab-part1.yaml",
    "tunelab sweep configs/sweeps/lab-part1.yaml --weights random",
    "OUT=/where/files/come/back bash scripts/gpu/runbook.sh env tiny",
}
"""README commands test_runbook_rehearsal_within_the_device_limits runs in their CPU variant (the runbook's own
TUNELAB_REHEARSAL=1: the tiny model, a few steps; OUT a temporary folder). tests/test_printed_commands.py checks
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


@pytest.mark.slow  # 3 minutes on 2 cores; run before every GPU session: pytest -m slow tests/test_gpu_runbook.py
def test_runbook_rehearsal_within_the_device_limits(tmp_path):
    """The whole runbook end to end (its parts run in CI: the deadline, disk-full and random-weights tests here,
    tunelab bench in tests/test_bench.py, the sweep in tests/test_tune_study.py and tests/test_faults.py). The same stages as on the GPU, with the tiny model: at most 8 files of at most 16 MiB no more than 2 folders
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


def test_nothing_looks_for_the_litgpt_script_beside_the_interpreter():
    """With `pip install --target` (the GPU machine) the `litgpt` console script is not beside sys.executable:
    tests and scripts run `python -m litgpt` / `python -m tunelab`."""
    bad = re.compile(
        r"""with_name\(["']litgpt["']\)|bindir\s*/\s*["'](litgpt|tunelab)["']|^\s*litgpt\s+finetune""", re.M
    )
    offenders = []
    for folder in ("tests", "scripts"):
        for f in (ROOT / folder).rglob("*"):
            if f.suffix in (".py", ".sh") and f.name != Path(__file__).name and bad.search(f.read_text()):
                offenders.append(str(f.relative_to(ROOT)))
    assert not offenders


def test_preflight_says_what_is_missing_in_one_line_each(monkeypatch, tmp_path, capsys):
    import lightning  # noqa: F401 - imported before `which` is stubbed (lightning calls it at import)

    from tunelab.run import preflight

    monkeypatch.setattr(preflight, "REQUIRED", (*preflight.REQUIRED, "no_such_module_for_tunelab"))
    monkeypatch.setattr(preflight.shutil, "which", lambda name: None)
    monkeypatch.setattr(preflight.sys, "executable", str(tmp_path / "bin" / "python"))  # no ninja beside it
    monkeypatch.setattr(preflight.sysconfig, "get_paths", lambda: {"include": str(tmp_path)})
    monkeypatch.setattr(preflight, "pinned", lambda name: "0.0.1" if name == "torch" else None)
    assert preflight.main() == 1
    out = capsys.readouterr().out.splitlines()
    errors = [ln for ln in out if ln.startswith("error: ")]
    assert len(errors) == 1 and "no_such_module_for_tunelab: cannot be imported" in errors[0] and "fix:" in errors[0]
    ds = next(ln for ln in out if "DeepSpeed CPU Adam" in ln)
    assert "a C++ compiler" in ds and "ninja" in ds and "Python headers" in ds
    assert any("pinned in requirements.txt" in ln for ln in out)
    assert out[-1].startswith("preflight: FAILED (1 error(s)")


def test_a_random_checkpoint_is_pruned_after_its_last_row(tmp_path, monkeypatch):
    """--prune-checkpoints: the random-weight checkpoint of an architecture goes once no later row needs it (the
    four models' checkpoints, ~49 GB in bf16, never sit on the disk together)."""
    from tunelab import checkpoints, sweep_file
    from tunelab.run import sweep

    monkeypatch.setattr(checkpoints, "default_dir", lambda name: tmp_path / f"random-{name}")
    for name in ("tiny-llama-1.1b", "open_llama_3b"):
        (tmp_path / f"random-{name}").mkdir()
    rows = {r.id: r for r in sweep_file.load("lab-part1").rows}
    log = open(os.devnull, "w")
    sweep._prune_random_checkpoints(rows["s2"], [rows["s3"], rows["s6"]], log)  # s3 still needs TinyLlama
    assert (tmp_path / "random-tiny-llama-1.1b").is_dir()
    sweep._prune_random_checkpoints(rows["s3"], [rows["s6"]], log)
    assert not (tmp_path / "random-tiny-llama-1.1b").exists() and (tmp_path / "random-open_llama_3b").is_dir()


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
def test_grid_stage_rehearsed_and_resumed(tmp_path):
    """Stage grid (the time model's out-of-sample profiles): one JSON line per (model, micro batch, method) with the
    phases, the host's clock per phase, the kernel time and launches by category; a row "model:micro:lora" runs one
    method; a second call with the lines carried back runs none again."""
    out, runs, results = tmp_path / "out", tmp_path / "runs", tmp_path / "results"
    proc = _runbook(out, runs, results, 500, "grid", timeout=900, GRID="tiny:1 tiny:2 tiny:3:lora")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = [json.loads(s) for s in (out / "profile-grid.jsonl").read_text().splitlines()]
    assert [(r["micro"], r["method"]) for r in lines] == [
        (1, "full"),
        (1, "lora"),
        (2, "full"),
        (2, "lora"),
        (3, "lora"),
    ]
    assert all(r["step_s"] > 0 and r["kernels"] and sum(r["launches"].values()) > 0 for r in lines)
    assert set(lines[0]["phases"]) == set(lines[0]["host_phases"]) == {"forward", "loss", "backward", "optimizer"}
    assert all(v > 0 for r in lines for v in r["host_phases"].values())  # the host's own clock, per phase
    assert all(r["host"]["host_op_us"] > 0 and r["host"]["module_op_us"] > 0 for r in lines)
    assert lines[0]["cpu_ops"]["aten::mm"][0] > 0  # the profiled step's host-side ops: calls, self microseconds
    results.mkdir()
    (results / "profile-grid.jsonl").write_bytes((out / "profile-grid.jsonl").read_bytes())
    again = _runbook(tmp_path / "out2", runs, results, 500, "grid", GRID="tiny:1 tiny:2 tiny:3:lora")
    assert again.returncode == 0 and again.stdout.count("already measured") == 3, again.stdout[-2000:]
    assert (tmp_path / "out2" / "profile-grid.jsonl").read_text() == (out / "profile-grid.jsonl").read_text()


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
        (["--methods", "full,qlora"], "qlora unknown"),
        (["--micro", "0"], "must be 1 or more"),
    ):
        p = subprocess.run(
            [sys.executable, script, *args], cwd=ROOT, env=cpu_env(), capture_output=True, text=True, timeout=300
        )
        assert p.returncode == 2 and p.stdout == "", (args, p.stdout, p.stderr)
        assert p.stderr.count("\n") == 1 and said in p.stderr and "Traceback" not in p.stderr, (args, p.stderr)
    assert outside.read_text() == "keep"
