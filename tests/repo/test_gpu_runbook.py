"""The GPU runbook rehearsed on this CPU machine, and what a first GPU run needs before it measures anything:
the carried wheels (checked against the GPU image's package list), the staged runbook (time limit, number and size
of the files that come back, resume), a full disk, random-weight checkpoints built in a child, `python -m litgpt`
everywhere, and the preflight's one-line problems."""

from __future__ import annotations

import importlib.metadata
import os
import re
from pathlib import Path

from packaging.requirements import Requirement

from tests.conftest import ROOT

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


def test_nothing_looks_for_the_litgpt_script_beside_the_interpreter():
    """With `pip install --target` (the GPU machine) the `litgpt` console script is not beside sys.executable:
    tests and scripts run `python -m litgpt` / `python -m tunelab`."""
    bad = re.compile(
        r"""with_name\(["']litgpt["']\)|bindir\s*/\s*["'](litgpt|tunelab)["']|^\s*litgpt\s+finetune""", re.M
    )
    offenders = []
    for folder in ("tests", "scripts"):
        for f in (ROOT / folder).rglob("*"):
            if f.suffix in (".py", ".sh") and f.resolve() != Path(__file__).resolve() and bad.search(f.read_text()):
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
