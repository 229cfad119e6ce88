"""tunelab.run.sweep.archive: what a lent machine sends back holds no path of that machine, and no weights."""

import json
import tarfile

from tunelab.run.sweep import archive


def test_the_archive_names_the_checkout_relatively_and_leaves_weights_and_binaries_as_they_are(tmp_path):
    root = tmp_path / "checkout"
    sweep = root / "runs" / "lab-part1"
    (sweep / "s2" / "litgpt" / "final").mkdir(parents=True)
    ckpt = f"{root}/.tunelab/checkpoints/random-tiny-llama-1.1b"
    (sweep / "s2" / "record.json").write_text(
        json.dumps({"litgpt_argv": ["--checkpoint_dir", ckpt], "x": "/elsewhere/y"})
    )
    (sweep / "s2" / "stdout.log").write_text(f"loading {ckpt}/lit_model.pth\n")
    (sweep / "s2" / "litgpt" / "final" / "hyperparameters.yaml").write_text(f"checkpoint_dir: {ckpt}\n")
    (sweep / "s2" / "litgpt" / "final" / "lit_model.pth").write_bytes(b"weights " + ckpt.encode())
    png = b"\x89PNG\r\n" + f"{root}/".encode() + bytes(range(256))
    (sweep / "s2" / "plot.png").write_bytes(png)
    out = archive(sweep, tmp_path / "out" / "lab-part1.tgz", root=root)
    with tarfile.open(out) as tar:
        members = {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}
    assert set(members) == {
        "lab-part1/s2/record.json",
        "lab-part1/s2/stdout.log",
        "lab-part1/s2/litgpt/final/hyperparameters.yaml",
        "lab-part1/s2/plot.png",
    }  # the weights stay behind
    rec = json.loads(members["lab-part1/s2/record.json"])
    assert rec == {
        "litgpt_argv": ["--checkpoint_dir", ".tunelab/checkpoints/random-tiny-llama-1.1b"],
        "x": "/elsewhere/y",
    }
    assert members["lab-part1/s2/stdout.log"] == b"loading .tunelab/checkpoints/random-tiny-llama-1.1b/lit_model.pth\n"
    assert str(root).encode() not in members["lab-part1/s2/litgpt/final/hyperparameters.yaml"]
    assert members["lab-part1/s2/plot.png"] == png  # a binary member is copied byte for byte
