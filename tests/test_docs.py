"""The README's layout table matches the tree."""

from __future__ import annotations

from tests.conftest import ROOT


def test_readme_layout_names_every_module_and_top_level_folder():
    readme = (ROOT / "README.md").read_text()
    table = readme[readme.index("## Layout"):readme.index("## The recipes")]
    modules = [p.name for p in (ROOT / "tunelab").glob("*.py") if not p.name.startswith("__")]
    missing = [m for m in modules if f"`{m}`" not in table]
    assert not missing, f"README layout lacks {missing}"
    for folder in ("recipes/", "configs/", "data/", "docs/", "scripts/", "reports/", "tests/", "tunelab/"):
        assert folder in table, folder
    assert "configs/lab" not in table and (ROOT / "configs" / "lab").exists() is False


def test_the_project_stands_alone():
    """No tracked file points outside the repository for what a user needs (the lab's record is docs/lab.md)."""
    import subprocess

    files = subprocess.run(["git", "-C", str(ROOT), "ls-files"], capture_output=True, text=True).stdout.split()
    if not files:
        import pytest

        pytest.skip("not a git checkout: the tracked files cannot be listed")
    offenders = [f for f in files if (ROOT / f).is_file() and f.endswith((".md", ".py", ".yaml", ".sh", ".txt"))
                 and "../shared" in (ROOT / f).read_text(errors="replace")]
    offenders = [f for f in offenders if f != "tests/test_docs.py" and not (  # tests may read foreign configs
        f.startswith("tests/") and "../shared/" not in (ROOT / f).read_text().replace("../shared/foreign", ""))]
    assert not offenders, offenders
    assert "| s13 | OpenLLaMA 7B | QLoRA (bnb.nf4) |" in (ROOT / "docs" / "lab.md").read_text()


def test_the_command_show_prints_for_the_tiny_model_runs(tmp_path):
    """`tunelab show` prints a CPU command on the tiny model: it is run as printed, through bash, with litgpt."""
    import os
    import subprocess
    import sys

    from tests.conftest import cpu_env

    shown = subprocess.run([sys.executable, "-m", "tunelab", "show", "tiny-llama-1.1b/qlora"], cwd=ROOT,
                           env=cpu_env(), capture_output=True, text=True, timeout=120)
    assert shown.returncode == 0, shown.stderr
    line = next(ln for ln in shown.stdout.splitlines() if ln.startswith("# on the tiny model (CPU): "))
    command = line.split(": ", 1)[1] + f" --out_dir {tmp_path / 'out'} --eval.final_validation false"
    env = cpu_env(PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""))
    ran = subprocess.run(["bash", "-c", command.replace("litgpt ", f"{sys.executable} -m litgpt ", 1)], cwd=ROOT,
                         env=env, capture_output=True, text=True, timeout=300)
    assert ran.returncode == 0, ran.stderr[-2000:]
    assert (tmp_path / "out" / "final" / "lit_model.pth.lora").is_file()
