"""tunelab.run.rank_stats: the caching allocator's driver calls, noted per iteration and counted over the steady
window by the collector (CUDA's counters stand in for a function that returns them: no GPU here)."""

import json

import pytest

from tunelab.record import RunRecord, driver_calls_in, read_rank_file
from tunelab.run import collect, rank_stats


def run_loop(monkeypatch, tmp_path, counts: list) -> dict:
    """Iterations whose starts see ``counts`` (cudaMalloc, cudaFree) in turn, the last one at exit; the rank file
    as written."""
    monkeypatch.setattr(rank_stats, "_ITERS", [])
    monkeypatch.setattr(rank_stats, "_PAUSES", [])
    monkeypatch.setattr(rank_stats, "_DRIVER", [])
    seen = iter(counts)
    monkeypatch.setattr(rank_stats, "driver_counts", lambda: next(seen))
    monkeypatch.setenv("TUNELAB_STATS_DIR", str(tmp_path))
    monkeypatch.setenv("RANK", "0")
    for k in range(len(counts) - 1):
        rank_stats.record_iteration(100.0 + k, 500, 400)
    rank_stats.write()
    return json.loads((tmp_path / "rank0.json").read_text())


def test_driver_calls_are_noted_when_they_change_and_counted_over_the_steady_window(monkeypatch, tmp_path):
    """Twelve iterations at accumulation 2 (five whole steps: the first warm-up, so the window is iterations 2 to
    9): the model's memory taken before iteration 0, one segment in the warm-up (seen at iteration 2's start: not
    the window's), two for a longer batch in iteration 4, one freed and taken again in iteration 8; the exit adds
    nothing. The window holds 3 cudaMalloc and 1 cudaFree."""
    counts = [(10, 0)] * 2 + [(11, 0)] * 3 + [(13, 0)] * 4 + [(14, 1)] * 4
    data = run_loop(monkeypatch, tmp_path, counts)
    assert data["driver_allocs"] == [[0, 10, 0], [2, 11, 0], [5, 13, 0], [9, 14, 1], [12, 14, 1]]
    stats, log = read_rank_file(data)
    rec = RunRecord(sweep="t", row_id="r", recipe="x", accumulation=2, ranks=[stats])
    collect._speed(rec, [log], len(log))
    assert rec.warmup_steps_excluded == 1
    assert (rec.driver_mallocs_steady, rec.driver_frees_steady) == (3, 1)


def test_without_cuda_nothing_is_noted(monkeypatch, tmp_path):
    """No CUDA (the counts read None): no entries, and the record's counts stay unknown, not zero."""
    data = run_loop(monkeypatch, tmp_path, [None] * 6)
    assert data["driver_allocs"] == []
    stats, log = read_rank_file(data)
    rec = RunRecord(sweep="t", row_id="r", recipe="x", accumulation=1, ranks=[stats])
    collect._speed(rec, [log], len(log))
    assert rec.driver_mallocs_steady is None and rec.driver_frees_steady is None


def test_a_window_the_entries_do_not_cover_is_unknown():
    """Counts between two iteration starts: the last entry at or before each; None where no entry reaches back to
    the window's start or on to its end (a rank killed before its exit note)."""
    entries = [[0, 10, 0], [5, 12, 0], [9, 13, 1], [12, 13, 1]]
    assert driver_calls_in(entries, 2, 11) == (3, 1)
    assert driver_calls_in(entries, 5, 9) == (1, 1)
    assert driver_calls_in(entries, 6, 8) == (0, 0)
    assert driver_calls_in(entries[:3], 2, 11) is None
    assert driver_calls_in(entries[1:], 2, 11) is None


@pytest.mark.parametrize("bad", [[[0, 1]], [[0, -1, 0]], [[0, 1.5, 0]], [["0", 1, 0]], [5]])
def test_a_malformed_driver_log_is_refused_in_one_line(bad):
    with pytest.raises(ValueError, match="driver_allocs is not a list of"):
        read_rank_file({"rank": 0, "driver_allocs": bad})


def test_the_loops_report_travels_in_its_rank_file_not_its_printout(monkeypatch, tmp_path):
    """tunelab's loop notes its performance report (litgpt's Training Time, Tok/sec, Memory Used, the final
    validation, the parameter counts) into rank 0's file; the record takes them from there even when nothing was
    printed, and from litgpt's printout only for litgpt's own script (no such figures in its rank file)."""
    monkeypatch.setattr(rank_stats, "_STATE", {"exception": None})
    rank_stats.note_report(trainable_params=1_000, frozen_params=9_000)
    rank_stats.note_report(report_training_time_s=12.5, report_tok_s=4321.0, report_memory_gb=None)
    rank_stats.note_report(report_val_loss=1.75)
    stats, log = read_rank_file(run_loop(monkeypatch, tmp_path, [None] * 3))
    rec = RunRecord(sweep="t", row_id="r", recipe="x", accumulation=1, ranks=[stats])
    collect._litgpt_figures(rec, "", tmp_path)
    assert (rec.litgpt_training_time_s, rec.litgpt_tok_s, rec.litgpt_memory_gb) == (12.5, 4321.0, None)
    assert (rec.n_trainable, rec.n_params, rec.val_loss_final) == (1_000, 10_000, 1.75)
    printed = "| - Training Time             :  3.00 s\n| - Tok/sec                   :  7.00 tok/s\n"
    monkeypatch.setattr(rank_stats, "_STATE", {"exception": None})  # litgpt's own script: nothing noted
    stats, _ = read_rank_file(run_loop(monkeypatch, tmp_path, [None] * 3))
    rec = RunRecord(sweep="t", row_id="r", recipe="x", accumulation=1, ranks=[stats])
    collect._litgpt_figures(rec, printed, tmp_path)
    assert (rec.litgpt_training_time_s, rec.litgpt_tok_s) == (3.0, 7.0)
