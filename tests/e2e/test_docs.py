"""The docs match the tree: the module map, the README's layout and links, no pointer outside the project."""

from __future__ import annotations

import pytest

from tests.conftest import ROOT


def test_the_project_stands_alone():
    """No tracked file points outside the repository for what a user needs (the lab's record is docs/lab.md)."""
    import subprocess

    files = subprocess.run(["git", "-C", str(ROOT), "ls-files"], capture_output=True, text=True).stdout.split()
    if not files:
        import pytest

        pytest.skip("not a git checkout: the tracked files cannot be listed")
    offenders = [
        f
        for f in files
        if (ROOT / f).is_file()
        and f.endswith((".md", ".py", ".yaml", ".sh", ".txt"))
        and "../shared" in (ROOT / f).read_text(errors="replace")
    ]
    offenders = [
        f
        for f in offenders
        if f != "tests/e2e/test_docs.py"
        and not (  # tests may read foreign configs
            f.startswith("tests/") and "../shared/" not in (ROOT / f).read_text().replace("../shared/foreign", "")
        )
    ]
    assert not offenders, offenders
    assert "| s13 | OpenLLaMA 7B | QLoRA (bnb.nf4) |" in (ROOT / "docs" / "lab.md").read_text()


BY_HAND = (
    "litgpt finetune_lora --config recipes/tiny-llama-1.1b/lora.yaml --train.max_steps 4 --eval.max_iters 4 "
    '--data.num_workers 0 --out_dir out/try "$(tunelab build-model tiny)"'
)
PRINTED = {BY_HAND}
"""The README line this file runs through bash (tests/e2e/test_printed_commands.py checks it is the README's)."""


@pytest.mark.slow  # 2 min on 2 cores; CI runs `tunelab run` on the tiny model (test_runner) and litgpt's parser over every
# recipe (tests/core/test_settings.py)
def test_the_readme_line_for_the_tiny_model_runs_through_bash(tmp_path):
    """The README's by-hand command, run by bash as printed (the `$(tunelab build-model tiny)` substitution
    included, real `litgpt`), its output in a temporary folder instead of the checkout's out/try."""
    import os
    import subprocess
    import sys

    from tests import printed
    from tests.conftest import cpu_env

    assert BY_HAND in {p.command for p in printed.readme()}
    command = BY_HAND.replace("--out_dir out/try", f"--out_dir {tmp_path / 'try'}")
    env = cpu_env(PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""))
    ran = subprocess.run(
        ["bash", "-c", command.replace("litgpt ", f"{sys.executable} -m litgpt ", 1)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert ran.returncode == 0, ran.stderr[-2000:]
    assert (tmp_path / "try" / "final" / "lit_model.pth.lora").is_file()
