"""Report columns and units from a real (small) sweep with an OOM row; FLOPs and MFU against hand arithmetic."""

from __future__ import annotations

import csv

from tunelab.report.sweep import COLUMNS, write_report
from tunelab.run.sweep import SweepOptions, run_sweep
from tunelab.sweep_file import load

SWEEP = """name: mini
lab_hardware: 1x A100 80GB
rows:
  - id: small
    recipe: tiny-llama-1.1b/full
    set: {train.max_steps: 2, data.num_workers: 0, train.micro_batch_size: 4, eval.max_iters: 2}
    lab: {status: ok, memory_gb: 30.41, time_s: 137.04, tok_s: 7646.24}
  - id: huge
    recipe: tiny-llama-1.1b/full
    set: {train.max_steps: 1, data.num_workers: 0, train.micro_batch_size: 32, train.global_batch_size: 32,
          checkpoint_dir: CKPT}
    lab: {status: oom}
"""


def test_report_columns_units_and_failed_rows(tmp_path):
    from tunelab import checkpoints

    big = checkpoints.build("pythia-70m", tmp_path / "pythia")
    (tmp_path / "mini.yaml").write_text(SWEEP.replace("CKPT", str(big)))
    sweep = load(tmp_path / "mini.yaml")
    # the whole sweep under a 4 GB address-space limit: the 70M model at micro 32 runs out of memory
    sweep_dir = run_sweep(sweep, tmp_path / "runs", SweepOptions(model="auto", memory_limit_bytes=int(4e9)))
    out = write_report(sweep_dir, tmp_path / "report")

    with open(out / "results.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0].keys()) == COLUMNS
    by_id = {r["row_id"]: r for r in rows}
    assert by_id["small"]["status"] == "ok" and float(by_id["small"]["tok_s_padded"]) > 0
    assert by_id["huge"]["status"] == "oom" and "allocate" in by_id["huge"]["error"]  # the OOM row is kept
    assert by_id["small"]["lab_memory_gb"] == "30.41" and by_id["small"]["lab_hardware"] == "1x A100 80GB"
    assert by_id["small"]["mfu"] == "" and by_id["small"]["energy_j"] == ""  # CPU: absent, not zero

    md = (out / "results.md").read_text()
    assert "Example report: embedded tiny model" in md
    for words in (
        "GB = 1e9 bytes",
        "max_memory_allocated",
        "max_memory_reserved",
        "num_alloc_retries",
        "padding included",
        "warm-up steps",
        "summed over ranks",
        "device: ",
        "litgpt 0.5.13",
        "lab figures: 1x A100 80GB",
    ):
        assert words in md, words
    assert "| huge | tiny-llama-1.1b/full | 32-true | 32/32 | oom |" in md
    assert "**huge** (tiny-llama-1.1b/full): oom" in md
    for png in ("memory.png", "throughput.png"):
        assert (out / png).stat().st_size > 5_000
