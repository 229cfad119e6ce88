"""`tunelab bench` on CPU: litgpt's own command and tunelab's fast path side by side on the tiny model, the report
written from the records, and the records reused by a second call."""

from __future__ import annotations

import csv
import shlex

import pytest

from tests import printed
from tests.tune.test_bench import bench
from tunelab.report.bench import COLUMNS

BENCH = "tunelab bench tiny-llama-1.1b/full --pairs 1 --train.max_steps 8"
PRINTED = {BENCH}
"""The docs' and --help's CPU bench line: run here as printed (the tiny model), its output in a temporary folder."""


@pytest.mark.slow  # 1.5 min on 2 cores; CI keeps both arms' parts: litgpt's run (test_runner) and the fast loop (test_fast)
def test_bench_runs_both_arms_and_reports_the_ratio(tmp_path):
    assert BENCH in {p.command for p in printed.everything()}
    argv = [
        *shlex.split(BENCH)[1:],
        "--model",
        "tiny",
        "--data.num_workers",
        "0",
        "--out",
        str(tmp_path / "runs"),
        "--report-dir",
        str(tmp_path / "report"),
    ]
    out = bench(argv)
    md = (tmp_path / "report" / "bench.md").read_text()
    assert "CPU rehearsal" in md and "Speed-up, fast / litgpt real tokens/s" in md and md in out
    with open(tmp_path / "report" / "bench.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0]) == COLUMNS and [r["arm"] for r in rows] == ["litgpt", "fast"]
    assert all(r["status"] == "ok" and float(r["tok_s_real"]) > 0 for r in rows)
    litgpt, fast = rows
    assert (
        litgpt["strategy"] == "litgpt"
        and fast["strategy"].startswith("single (")
        and float(fast["first_iteration_s"]) > 0
    )
    assert float(fast["padding_pct"]) < float(litgpt["padding_pct"])  # length grouping
    # the fast arm's compiled graphs, read from inductor's cache or compiled anew; litgpt's arm compiles none
    assert int(fast["compile_cache_hits"]) + int(fast["compile_cache_misses"]) > 0 and not litgpt["compile_cache_hits"]
    assert (tmp_path / "report" / "loss.png").stat().st_size > 0
    again = bench(argv)  # the records answer the same command: nothing runs again
    assert "Speed-up" in again
    # past a deadline (a lent machine's command limit) the runs recorded earlier still make the report
    late = bench([*argv, "--deadline", "0.5"])
    assert "Speed-up" in late and late.count(" | 1 of 1 | ") == 2


@pytest.mark.slow
def test_bench_best_micro_batches_on_cpu(tmp_path):
    """--best-micro: tune-batch per arm (capped at micro 2 here), then a pair at each arm's best."""
    out = bench(
        [
            "bench",
            "tiny-llama-1.1b/full",
            "--pairs",
            "1",
            "--best-micro",
            "--max-micro",
            "2",
            "--model",
            "tiny",
            "--train.max_steps",
            "4",
            "--data.num_workers",
            "0",
            "--out",
            str(tmp_path / "r"),
            "--report-dir",
            str(tmp_path / "rep"),
        ]
    )
    assert "Each at its best micro batch" in out


def test_a_second_bench_on_one_folder_and_a_report_dir_that_is_a_file_are_refused_before_training(tmp_path):
    """bench holds a lock on --out (two benches there would slow each other and share directories): a second is
    one line naming the holder; a --report-dir that is a file is refused before either arm trains."""
    from tests.conftest import one_line_problems, tunelab_cli
    from tunelab.files import exclusive_lock

    out = tmp_path / "runs"
    out.mkdir()
    argv = [*shlex.split(BENCH)[1:], "--model", "tiny", "--out", out]
    held = exclusive_lock(out / ".lock")
    try:
        proc = tunelab_cli(*argv, "--report-dir", tmp_path / "report")  # contained even if it ran
    finally:
        held.close()
    assert one_line_problems("second bench", proc, "another bench is running there") is None
    assert f"pid {__import__('os').getpid()}" in proc.stderr
    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    proc = tunelab_cli(*argv, "--report-dir", a_file)
    assert one_line_problems("report dir is a file", proc, "--report-dir") is None
    assert not list(out.glob("*/record.json")) and not list(out.glob("**/record.json"))  # nothing trained
