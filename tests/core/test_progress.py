"""The progress line shared by run, sweep and tune-batch."""

from __future__ import annotations

import io

from tunelab.progress import ProgressLine
from tunelab.record import RunRecord
from tunelab.run.runner import Progress


def test_progress_line_counts_runs_and_estimates_the_rest():
    out = io.StringIO()
    line = ProgressLine(3, out, every_s=0)
    line.started(0, "r1 tiny-llama-1.1b/lora")
    line.show(Progress(iter=4, step=1, tok_s=1234.5))
    line.finished(RunRecord(row_id="r1", status="ok", tok_s_padded=2000.0, wall_s=7.0))
    line.started(1, "r2 tiny-llama-1.1b/lora")
    text = out.getvalue().splitlines()
    assert text[0].startswith("[0/3 done, 3 left] r1 tiny-llama-1.1b/lora | iter 0 step 0")
    assert "iter 4 step 1 | 1,234 tok/s" in text[1] and text[1].endswith("remaining ?")
    assert text[2] == "r1: ok | 2,000 tok/s padded | 7 s"
    assert text[3].startswith("[1/3 done, 2 left] r2") and "remaining ~0:00:" in text[3]  # 2 runs x mean time


def test_progress_line_without_a_total():
    out = io.StringIO()
    line = ProgressLine(None, out, every_s=0)
    line.started(2, "probe micro 8")
    assert out.getvalue().startswith("[2 done] probe micro 8 | iter 0 step 0") and "remaining ?" in out.getvalue()


def test_work_without_records_still_estimates_what_remains():
    """plan-families --simulate counts cases, not runs: each completed case feeds the estimate."""
    out = io.StringIO()
    line = ProgressLine(4, out, every_s=0)
    line.started(0, "tiny-llama-1.1b full bf16-true")
    line.completed()
    line.started(1, "tiny-llama-1.1b lora bf16-true")
    last = out.getvalue().splitlines()[-1]
    assert last.startswith("[1/4 done, 3 left] tiny-llama-1.1b lora") and "remaining ~0:00:" in last
    assert line.done == 1 and len(line.durations) == 1
