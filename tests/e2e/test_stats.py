"""The benchmarks' median interval (tunelab/report/stats.py), and the collector-overhead script that stops on it:
a deadline that leaves no time for a second pair, its JSON rewritten as it goes, bad arguments in one line."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import ROOT, cpu_env


def _overhead(*args: str, tmp_path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "bench_collector_overhead.py"), *args],
        cwd=ROOT,
        env=cpu_env(TMPDIR=str(tmp_path)),
        capture_output=True,
        text=True,
        timeout=600,
    )


@pytest.mark.slow  # 35 s on 2 cores; CI keeps its refusals below
def test_collector_overhead_stops_at_its_deadline_and_keeps_what_it_measured(tmp_path):
    """One real pair (plain litgpt, then tunelab run, tiny model), then no second: the deadline leaves less time
    than the first pair took. The JSON says why it stopped and holds the pair's ratio; no interval from one pair."""
    out = tmp_path / "overhead.json"
    proc = _overhead(
        "--pairs", "3", "--steps", "2", "--micro", "2", "--deadline", "1", "--json-out", str(out), tmp_path=tmp_path
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    got = json.loads(out.read_text())
    assert len(got["ratios"]) == 1 and got["stopped"].startswith("deadline:")
    assert got["ratios"][0] == pytest.approx(got["tok_s"]["with"][0] / got["tok_s"]["without"][0])
    assert got["interval_95"] is None and "needs 6 pairs" in proc.stdout


@pytest.mark.parametrize(
    "args, says",
    [
        (["--pairs", "0"], "--pairs, --steps and --micro must be at least 1"),
        (["--target", "5"], "--target is a fraction of the median"),
        (["--deadline", "-3"], "--deadline is seconds"),
    ],
)
def test_collector_overhead_bad_arguments_in_one_line(args, says, tmp_path):
    proc = _overhead(*args, tmp_path=tmp_path)
    assert proc.returncode == 2 and says in proc.stderr and "Traceback" not in proc.stderr


def test_collector_overhead_refuses_an_output_it_must_not_write_through_and_a_failing_run(tmp_path):
    """--json-out that is a FIFO or a link leading outside is refused before any run (one line, exit 2); a run
    that fails (Lightning refuses the precision) ends the script in one line naming the side, not a traceback."""
    import os

    fifo, link = tmp_path / "fifo", tmp_path / "link"
    os.mkfifo(fifo)
    link.symlink_to(tmp_path.parent / "elsewhere.json")
    for target in (fifo, link):
        proc = _overhead("--json-out", str(target), tmp_path=tmp_path)
        assert proc.returncode == 2 and "--json-out" in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    assert not (tmp_path.parent / "elsewhere.json").exists()
    proc = _overhead("--pairs", "1", "--steps", "1", "--precision", "banana", tmp_path=tmp_path)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines()[-1].startswith("bench_collector_overhead: the without run failed (exit")
