"""A run's outputs, tried as a hostile user would (issue: outputs never written through a link, never left
half-written where litgpt loads them, never mixed with an earlier run's; one run per output folder at a time).

Real ``tunelab run`` processes on the tiny model (litgpt's own ``finetune_lora`` behind tunelab's entry), a real
file-size limit on the child, real links and FIFOs; `litgpt generate` loads the final checkpoint a run reports ok.
The cases refused before training are checked in process (tests/run/test_outputs.py has the helpers' own cases)."""

from __future__ import annotations

import os
import resource
import subprocess
import sys
from pathlib import Path

import torch

from tests.conftest import ROOT, cpu_env, run_litgpt
from tunelab import record
from tunelab.files import exclusive_lock

RUN = ["tiny-llama-1.1b/lora", "--train.max_steps", "2", "--data.num_workers", "0", "--eval.max_iters", "1"]


def _run(out: Path, limit_bytes: int | None = None) -> subprocess.CompletedProcess:
    def cap():  # a file-size limit on tunelab and its child: a write past it fails (EFBIG), as on a quota
        if limit_bytes:
            resource.setrlimit(resource.RLIMIT_FSIZE, (limit_bytes, limit_bytes))

    return subprocess.run(
        [sys.executable, "-m", "tunelab", "run", *RUN, "--out", str(out)],
        cwd=ROOT,
        env=cpu_env(),
        capture_output=True,
        text=True,
        timeout=600,
        preexec_fn=cap,
    )


def test_an_earlier_run_is_moved_aside_and_the_new_final_loads(tmp_path):
    """An --out holding an earlier LoRA run's final/ (merged model, adapters) and a longer run's step checkpoint:
    the new run moves them whole to earlier/ (named in the record and on stderr), writes its own final/ (a merged
    model, not the earlier one litgpt would have kept as "already merged"), and `litgpt generate` loads it."""
    out = tmp_path / "r"
    earlier_final = out / "litgpt" / "final"
    earlier_final.mkdir(parents=True)
    (earlier_final / "lit_model.pth").write_bytes(b"an earlier run's merged model")
    (earlier_final / "lit_model.pth.lora").write_bytes(b"an earlier run's adapters")
    (out / "litgpt" / "step-000100").mkdir()
    (out / "litgpt" / "step-000100" / "lit_model.pth.lora").write_bytes(b"an earlier run's step 100")
    p = _run(out)
    assert p.returncode == 0, p.stderr[-3000:]
    rec = record.load(out / "record.json")
    assert rec.status == "ok" and rec.earlier_outputs and rec.earlier_outputs.startswith("earlier/litgpt-")
    kept = out / rec.earlier_outputs
    assert (kept / "final" / "lit_model.pth").read_bytes() == b"an earlier run's merged model"
    assert (kept / "step-000100" / "lit_model.pth.lora").read_bytes() == b"an earlier run's step 100"
    assert "moved to" in p.stderr and rec.earlier_outputs in p.stderr
    assert not (out / "litgpt" / "step-000100").exists()  # --resume would have taken the earlier run's step
    final = out / "litgpt" / "final"
    merged = torch.load(final / "lit_model.pth", mmap=True, weights_only=True)
    assert "transformer.h.0.attn.qkv.weight" in merged and not any("lora_" in k for k in merged)
    assert not list(final.glob(".*"))  # no temporary file or staging folder left beside the outputs
    gen = run_litgpt(["generate", str(final), "--prompt", "hello", "--max_new_tokens", "4"])
    assert gen.returncode == 0, gen.stderr[-2000:]


def test_a_merge_cut_by_a_file_size_limit_leaves_no_half_file_and_no_ok(tmp_path):
    """A file-size limit that the merged model (about 319 kB) exceeds and nothing else does: the merge fails, no
    truncated lit_model.pth is left where litgpt loads it, and the record does not say ok. Run again without the
    limit, the same command merges (the cut attempt moved aside), where litgpt's merge_lora kept a cut file."""
    out = tmp_path / "r"
    p = _run(out, limit_bytes=200_000)
    rec = record.load(out / "record.json")
    assert rec.status != "ok", (rec.status, p.stderr[-2000:])
    assert not (out / "litgpt" / "final" / "lit_model.pth").exists()
    assert not [f for f in (out / "litgpt" / "final").iterdir() if f.name.startswith(".")]
    p = _run(out)
    assert p.returncode == 0, p.stderr[-3000:]
    rec = record.load(out / "record.json")
    assert rec.status == "ok" and rec.earlier_outputs
    torch.load(out / "litgpt" / "final" / "lit_model.pth", mmap=True, weights_only=True)  # whole


def test_links_inside_the_output_folder_are_refused_before_training(tmp_path):
    """final/ a link to a folder elsewhere, final/model_config.yaml or prompt_style.yaml a link to a file elsewhere,
    a FIFO in final/: one line naming it before litgpt is launched, and nothing written where they lead."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep.yaml").write_text("mine\n")
    cases = {}
    linked_final = tmp_path / "linked-final"
    (linked_final / "litgpt").mkdir(parents=True)
    (linked_final / "litgpt" / "final").symlink_to(outside, target_is_directory=True)
    cases["final"] = linked_final
    for name in ("model_config.yaml", "prompt_style.yaml"):
        case = tmp_path / f"linked-{name}"
        (case / "litgpt" / "final").mkdir(parents=True)
        (case / "litgpt" / "final" / name).symlink_to(outside / "keep.yaml")
        cases[name] = case
    fifo = tmp_path / "fifo"
    (fifo / "litgpt" / "final").mkdir(parents=True)
    os.mkfifo(fifo / "litgpt" / "final" / "tokenizer.json")
    cases["fifo"] = fifo
    for label, out in cases.items():
        p = _run(out)
        lines = [ln for ln in (p.stdout + p.stderr).splitlines() if ln.strip()]
        assert p.returncode != 0 and len(lines) == 1, (label, lines[-5:])
        assert "inside the run's output folder" in lines[0] and "fix:" in lines[0], label
        assert not (out / "stdout.log").exists() and not (out / "record.json").exists(), label  # nothing launched
    assert sorted(f.name for f in outside.iterdir()) == ["keep.yaml"]
    assert (outside / "keep.yaml").read_text() == "mine\n"


def test_a_second_run_into_a_held_folder_is_refused(tmp_path):
    """Another run holds the output folder (its lock): a second `tunelab run --out` there is one line naming it, and
    leaves the first run's logs and record untouched."""
    out = tmp_path / "r"
    out.mkdir()
    (out / "stdout.log").write_text("the first run's log\n")
    lock = exclusive_lock(out / ".lock")
    try:
        p = _run(out)
    finally:
        lock.close()
    lines = [ln for ln in (p.stdout + p.stderr).splitlines() if ln.strip()]
    assert p.returncode != 0 and len(lines) == 1 and "another run is writing into this folder" in lines[0], lines
    assert f"pid {os.getpid()}" in lines[0]
    assert (out / "stdout.log").read_text() == "the first run's log\n" and not (out / "record.json").exists()


def test_a_disk_that_fills_during_the_merge_leaves_no_half_file(tmp_path):
    """The run's folder is a 400 KiB tmpfs (a real filesystem, in a user and mount namespace): training, the
    adapters and the config files fit (about 260 kB), the merged model (about 319 kB) does not. The merge fails on
    the full disk, nothing is left under lit_model.pth, the record (written once the failed merge's temporary file
    is gone) does not say ok. What the run left is read inside the namespace, where the tmpfs lives."""
    import shlex

    import pytest

    from tests.e2e.test_faults import full_disk_wrapper

    out = tmp_path / "small"
    out.mkdir()
    if full_disk_wrapper(out) is None:
        pytest.skip("this kernel allows no unprivileged user and mount namespace (unshare -rm): no tmpfs to fill")
    run = shlex.join([sys.executable, "-m", "tunelab", "run", *RUN, "--out", str(out)])
    look = shlex.join(
        [
            sys.executable,
            "-c",
            (
                "import json, pathlib, sys; o = pathlib.Path(sys.argv[1]); f = o / 'litgpt' / 'final'; "
                "print('FINAL', sorted(p.name for p in f.iterdir()) if f.is_dir() else []); "
                "print('STATUS', json.loads((o / 'record.json').read_text())['status'])"
            ),
            str(out),
        ]
    )
    script = f"mount -t tmpfs -o size=400k tmpfs {shlex.quote(str(out))} && {{ {run}; echo EXIT=$?; {look}; }}"
    p = subprocess.run(
        ["unshare", "-rm", "sh", "-c", script], cwd=ROOT, env=cpu_env(), capture_output=True, text=True, timeout=600
    )
    said = p.stdout + p.stderr
    assert "EXIT=0" not in said and "EXIT=" in said, said[-3000:]
    final = next(ln for ln in p.stdout.splitlines() if ln.startswith("FINAL"))
    assert "'lit_model.pth'" not in final and not any(".tmp" in n for n in final.split("'")), final
    assert "'lit_model.pth.lora'" in final  # the adapters were saved before the disk filled
    assert "STATUS ok" not in p.stdout and "STATUS " in p.stdout, said[-3000:]
