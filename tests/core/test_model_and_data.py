"""The embedded tiny checkpoint, random-weight real architectures, and the shipped dataset."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pytest
import torch

from tunelab import checkpoints, units
from tunelab.data import alpaca as data
from tunelab.paths import DATASET


def test_shipped_dataset_is_the_generator_output():
    shipped = json.loads(DATASET.read_text(encoding="utf-8"))
    assert shipped == data.generate(data.DEFAULT_SIZE, data.DEFAULT_SEED)
    assert 200 <= len(shipped) <= 1000
    assert all(set(r) == {"instruction", "input", "output"} and r["instruction"] and r["output"] for r in shipped)
    assert len({json.dumps(r) for r in shipped}) > 0.9 * len(shipped)  # varied, not one record repeated


def test_tiny_checkpoint_is_accepted_by_litgpt(tiny_ckpt):
    from litgpt import Config
    from litgpt.tokenizer import Tokenizer
    from litgpt.utils import check_valid_checkpoint_dir

    check_valid_checkpoint_dir(tiny_ckpt, raise_error=True)
    config = Config.from_file(tiny_ckpt / "model_config.yaml")
    assert (config.n_layer, config.n_head, config.n_query_groups) == (2, 4, 2)  # GQA, as TinyLlama
    assert (config.mlp_class_name, config.norm_class_name) == ("LLaMAMLP", "RMSNorm")
    tok = Tokenizer(tiny_ckpt)
    ids = tok.encode("Sort these words in alphabetical order.")
    assert ids[0] == tok.bos_id and int(ids.max()) < config.padded_vocab_size
    assert tok.decode(ids[1:]) == "Sort these words in alphabetical order."
    assert json.loads((tiny_ckpt / "tokenizer_config.json").read_text())["tokenizer_class"]
    state = torch.load(tiny_ckpt / "lit_model.pth", weights_only=True)
    assert state["transformer.wte.weight"].shape == (config.padded_vocab_size, config.n_embd)


def test_tiny_build_is_fast_and_deterministic(tmp_path):
    t0 = time.perf_counter()
    a = checkpoints.build("tiny", tmp_path / "a")
    elapsed = time.perf_counter() - t0
    b = checkpoints.build("tiny", tmp_path / "b")
    assert elapsed < 60  # "in seconds" (about 3 s here); generous for a loaded CI machine
    sa, sb = (torch.load(d / "lit_model.pth", weights_only=True) for d in (a, b))
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    assert (a / "tokenizer.json").read_text() == (b / "tokenizer.json").read_text()


def test_real_architecture_with_random_weights(tmp_path):
    """Any litgpt config name builds; a small one here (the same code builds open_llama_7b on a GPU machine)."""
    from litgpt import Config
    from litgpt.utils import check_valid_checkpoint_dir

    out = checkpoints.build("pythia-14m", tmp_path / "pythia")
    check_valid_checkpoint_dir(out, raise_error=True)
    assert Config.from_file(out / "model_config.yaml").name == "pythia-14m"
    state = torch.load(out / "lit_model.pth", weights_only=True)
    assert state["transformer.wte.weight"].dtype == torch.bfloat16
    built = json.loads((out / "tunelab_build.json").read_text())
    from litgpt.model import GPT

    with torch.device("meta"):
        expected = sum(p.numel() for p in GPT(Config.from_name("pythia-14m")).parameters())
    assert built["weights"] == "random" and built["parameters"] == expected


def test_unknown_model_name_is_refused():
    import pytest

    with pytest.raises(ValueError, match="unknown model 'open_llama_8b'"):
        checkpoints.model_config("open_llama_8b")


def test_a_build_without_room_is_refused_before_writing_and_a_failed_save_leaves_nothing(tmp_path, monkeypatch):
    """`build-model open_llama_13b` wrote 26 GB of bf16 weights with no word and no check: on a full disk it left a
    partial lit_model.pth.tmp holding the space, and on this 24 GB machine it is killed for memory while building.
    Now the disk and the available memory are checked against the weights' bytes before anything is written (a
    real architecture says what it writes), and a save that fails removes its partial file."""
    from tunelab.errors import InputError

    usage = shutil.disk_usage(tmp_path)
    monkeypatch.setattr(checkpoints.shutil, "disk_usage", lambda p: usage._replace(free=100_000))
    tiny = checkpoints.count_params(checkpoints.model_config("tiny"))[0] * 4  # float32
    with pytest.raises(InputError, match=rf"weights take {units.size(tiny)} \(float32\) and 100 kB is free there; fix"):
        checkpoints.build("tiny", tmp_path / "full")
    assert not (tmp_path / "full").exists()
    monkeypatch.setattr(checkpoints.shutil, "disk_usage", lambda p: usage)
    monkeypatch.setattr(checkpoints, "_memory_available", lambda: 1_000)
    with pytest.raises(
        InputError, match=rf"tiny: its weights take {units.size(tiny)} of memory .* and 1 kB is available"
    ):
        checkpoints.build("tiny", tmp_path / "small")
    monkeypatch.setattr(checkpoints, "_memory_available", lambda: None)  # unknown: not refused
    # a real architecture's weights in bfloat16 by default: OpenLLaMA 7B's 6.74 B parameters are 13.5 GB
    monkeypatch.setattr(checkpoints.shutil, "disk_usage", lambda p: usage._replace(free=10**15))
    seven = checkpoints._room_for("open_llama_7b", checkpoints.model_config("open_llama_7b"), tmp_path, None)
    assert seven == pytest.approx(2 * 6.74e9, rel=0.01)
    sizes = [units.size(n) for n in (0, 512, 999.4, 999.6, 3.4e6, 13.48e9, 1.2e12, 5e15)]
    assert sizes == ["0 B", "512 B", "999 B", "1 kB", "3.4 MB", "13.5 GB", "1.2 TB", "5,000 TB"]

    def full_disk(obj, path):
        Path(path).write_bytes(b"partial")
        raise OSError(28, "No space left on device", str(path))

    monkeypatch.setattr(torch, "save", full_disk)
    with pytest.raises(OSError, match="No space left"):
        checkpoints.build("tiny", tmp_path / "disk")
    assert not list((tmp_path / "disk").glob("lit_model.pth*")) and not checkpoints.is_complete(tmp_path / "disk")
