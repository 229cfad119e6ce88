"""tunelab/plan/trace/trace_cache.py: a trace is made once across processes (read back from the cache directory), made
again for another key or a file that does not read, and never written through what is not a plain file."""

from __future__ import annotations

import json
import os

from tunelab.plan.model import kernels
from tunelab.plan.trace import compiled, kernel_trace
from tunelab.plan.trace.trace_cache import cached_json, tuples


def test_a_trace_is_made_once_and_made_again_when_its_file_does_not_read(tmp_path, monkeypatch):
    monkeypatch.setenv("TUNELAB_HOME", str(tmp_path))
    made = []

    def make():
        made.append(1)
        return {"forward": [["matmul", "bfloat16", [2, 3], [3, 4], "mm"]]}

    first = cached_json("traces", ["a", 1], make, "trace")
    assert cached_json("traces", ["a", 1], make, "trace") == first and len(made) == 1  # read back, not made
    assert tuples(first) == {"forward": (("matmul", "bfloat16", (2, 3), (3, 4), "mm"),)}
    cached_json("traces", ["a", 2], make, "trace")
    assert len(made) == 2  # another key
    (file,) = [p for p in (tmp_path / "traces").iterdir() if json.loads(p.read_text())["key"].startswith('["a", 1')]
    file.write_text('{"key": ')  # a partial write
    assert cached_json("traces", ["a", 1], make, "trace") == first and len(made) == 3
    file.unlink()
    os.mkfifo(file)  # a FIFO in its place: neither read (it would block) nor written through
    assert cached_json("traces", ["a", 1], make, "trace") == first and len(made) == 4
    assert file.is_fifo()


def test_a_link_is_never_followed_and_a_number_that_is_not_finite_is_not_trusted(tmp_path, monkeypatch):
    """A cache file that is a symbolic link to a file outside (holding a forged value for the same key) is not read
    and the file outside is not written; a cache folder that is a link is neither read nor written; a hand-edited
    NaN makes the trace again."""
    monkeypatch.setenv("TUNELAB_HOME", str(tmp_path / "home"))
    made = []

    def make():
        made.append(1)
        return {"bytes": [1.5, 2]}

    first = cached_json("traces", ["b"], make, "trace")
    (file,) = (tmp_path / "home" / "traces").iterdir()
    good = json.loads(file.read_text())
    outside = tmp_path / "outside.json"
    outside.write_text(json.dumps({**good, "value": {"bytes": [9e9, 9]}}))
    file.unlink()
    file.symlink_to(outside)
    assert cached_json("traces", ["b"], make, "trace") == first and len(made) == 2  # made again, not read
    assert json.loads(outside.read_text())["value"] == {"bytes": [9e9, 9]} and file.is_symlink()
    file.unlink()
    file.write_text(json.dumps(good).replace("1.5", "NaN"))
    assert cached_json("traces", ["b"], make, "trace") == first and len(made) == 3
    assert json.loads(file.read_text()) == good  # rewritten whole
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / file.name).write_text(json.dumps({**good, "value": {"bytes": [9e9, 9]}}))
    folder = tmp_path / "home" / "traces"
    file.unlink()
    folder.rmdir()
    folder.symlink_to(elsewhere)  # the folder itself a link: neither read through nor written into
    assert cached_json("traces", ["b"], make, "trace") == first and len(made) == 4
    assert cached_json("traces", ["c"], make, "trace") == first and len(made) == 5
    assert sorted(p.name for p in elsewhere.iterdir()) == [file.name]


def test_a_compiled_blocks_kernels_come_back_from_the_cache_as_traced(tmp_path, monkeypatch):
    """The cached kernels of a compiled block equal a fresh trace, tuples included (what the timing compares)."""
    from litgpt import Config

    monkeypatch.setenv("TUNELAB_HOME", str(tmp_path))
    c = Config(
        n_layer=1,
        n_embd=64,
        n_head=4,
        n_query_groups=2,
        vocab_size=64,
        padded_vocab_size=64,
        block_size=256,
        mlp_class_name="LLaMAMLP",
        intermediate_size=128,
        norm_class_name="RMSNorm",
        bias=False,
        rotary_percentage=1.0,
        parallel_residual=False,
    )
    compiled._block_kernels.cache_clear()
    traced = compiled.block_kernels(c, "full", "bf16-true")
    compiled._block_kernels.cache_clear()
    monkeypatch.setattr(compiled, "trace_block", lambda *a, **k: (_ for _ in ()).throw(AssertionError("traced")))
    assert compiled.block_kernels(c, "full", "bf16-true") == traced
    compiled._block_kernels.cache_clear()


def test_an_edited_or_poisoned_entry_is_traced_again(tmp_path, monkeypatch):
    """A value changed by hand (its checksum no longer matches), a template whose arrays do not have the shapes
    its kernel list needs (the checksum recomputed to match, as a deliberate poisoner would), and an entry swapped
    in from another key are each traced again (two writers at once: tests/e2e/test_planner.py)."""
    import dataclasses
    import hashlib

    from litgpt import Config

    monkeypatch.setenv("TUNELAB_HOME", str(tmp_path))
    made = []

    def make():
        made.append(1)
        return {"bytes": [1, 2]}

    cached_json("traces", ["d"], make, "trace")
    (file,) = (tmp_path / "traces").iterdir()
    raw = json.loads(file.read_text())
    file.write_text(json.dumps({**raw, "value": {"bytes": [1, 3]}}))  # edited, checksum left as it was
    assert cached_json("traces", ["d"], make, "trace") == {"bytes": [1, 2]} and len(made) == 2
    cached_json("traces", ["f"], lambda: {"bytes": [7, 7]}, "trace")
    (other,) = [p for p in (tmp_path / "traces").iterdir() if p != file]
    file.write_text(other.read_text())  # another key's entry swapped into this one's place
    assert cached_json("traces", ["d"], make, "trace") == {"bytes": [1, 2]} and len(made) == 3

    monkeypatch.setattr(kernel_trace, "_TEMPLATES", {})
    c = dataclasses.replace(Config.from_name("pythia-14m"), n_layer=1)
    first = kernel_trace.cached_template(kernels.Step(c, "full", "bf16-true", 2, 64))
    (path,) = (tmp_path / "kernel-templates").iterdir()
    raw = json.loads(path.read_text())
    poisoned = {**raw["value"], "bytes": raw["value"]["bytes"][:-1]}  # one kernel's row dropped
    digest = hashlib.sha256(json.dumps(poisoned, sort_keys=True).encode()).hexdigest()
    path.write_text(json.dumps({**raw, "sum": digest, "value": poisoned}))
    traced = []
    real = kernel_trace.record_step
    monkeypatch.setattr(kernel_trace, "record_step", lambda *a, **k: traced.append(a) or real(*a, **k))
    monkeypatch.setattr(kernel_trace, "_TEMPLATES", {})
    again = kernel_trace.cached_template(kernels.Step(c, "full", "bf16-true", 2, 64))
    assert traced and (again.bytes == first.bytes).all()
