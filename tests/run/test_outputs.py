"""The output helpers a run writes through (tunelab.run.outputs) and the runner's checks of its output folder, in
process: a cut archive is not whole, a staged write that fails leaves nothing, a link in the way is refused, and the
walk of an earlier folder finds a link or FIFO however deep (real runs: tests/e2e/test_outputs.py)."""

from __future__ import annotations

import os

import pytest
import torch

from tunelab.files import FileRefused
from tunelab.run import outputs, runner


def test_whole_names_a_missing_or_cut_weight_file(tmp_path):
    final = tmp_path / "final"
    final.mkdir()
    torch.save({"w": torch.zeros(1000)}, final / "lit_model.pth")
    (final / "model_config.yaml").write_text("name: x\n")
    assert outputs.whole(final, "full") is None
    assert "lit_model.pth.lora: missing" in outputs.whole(final, "lora")
    data = (final / "lit_model.pth").read_bytes()
    (final / "lit_model.pth").write_bytes(data[: len(data) // 2])  # a save cut short: no closing directory
    assert "not whole" in outputs.whole(final, "full")


def test_a_staged_write_is_all_or_nothing_and_never_through_a_link(tmp_path):
    folder = tmp_path / "final"

    def fails(stage):
        (stage / "prompt_style.yaml").write_text("half")
        raise OSError(28, "No space left on device")

    with pytest.raises(OSError):
        outputs.staged(folder, fails)
    assert list(folder.iterdir()) == []  # neither the file nor the staging folder
    elsewhere = tmp_path / "elsewhere.yaml"
    elsewhere.write_text("mine")
    (folder / "prompt_style.yaml").symlink_to(elsewhere)
    with pytest.raises(FileRefused):
        outputs.staged(folder, lambda stage: (stage / "prompt_style.yaml").write_text("new"))
    assert elsewhere.read_text() == "mine"
    linked = tmp_path / "linked"
    linked.symlink_to(tmp_path / "target-dir", target_is_directory=True)
    (tmp_path / "target-dir").mkdir()
    with pytest.raises(FileRefused):
        outputs.staged(linked, lambda stage: (stage / "x").write_text("x"))
    assert list((tmp_path / "target-dir").iterdir()) == []


def test_the_walk_of_an_output_folder_finds_what_is_not_plain(tmp_path):
    litgpt = tmp_path / "litgpt"
    deep = litgpt / "step-000002" / "sub"
    deep.mkdir(parents=True)
    (deep / "ok.txt").write_text("x")
    assert runner._not_plain(litgpt) is None and runner._not_plain(tmp_path / "absent") is None
    os.mkfifo(deep / "pipe")
    assert runner._not_plain(litgpt) == deep / "pipe"
    assert runner.blocker_kind(deep / "pipe") == "a FIFO (named pipe)"


def test_an_earlier_output_folder_is_moved_whole(tmp_path):
    (tmp_path / "litgpt" / "final").mkdir(parents=True)
    (tmp_path / "litgpt" / "final" / "lit_model.pth").write_bytes(b"old")
    moved = runner._own_output_folder(tmp_path)
    assert moved.startswith("earlier/litgpt-") and (tmp_path / moved / "final" / "lit_model.pth").read_bytes() == b"old"
    assert not (tmp_path / "litgpt").exists()
    (tmp_path / "litgpt").mkdir()
    assert runner._own_output_folder(tmp_path) is None  # an empty folder is the run's own
