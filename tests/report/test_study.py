"""A tuning study's report (tunelab.report.study) reads back only the probe directories tune-batch makes."""

from __future__ import annotations

import json

from tests.tune.test_tune_study import STUDY, _write
from tunelab.tune import study as tune_study


def test_only_the_probe_directories_tune_batch_makes_are_read_back(tmp_path):
    """mbs8 and a stray mbs008 beside it are one probe, not two best rows; a record whose micro batch is not its
    directory's is kept as an error row that says so."""
    from tunelab import record as record_mod
    from tunelab.report.study import collect

    sf = tune_study.load(_write(tmp_path, json.loads(json.dumps(STUDY))))
    study = sf.studies[0]
    sub = tmp_path / "runs" / study.id / study.settings[0].dir_name
    for name, micro in (("mbs8", 8), ("mbs008", 8), ("mbs4", 2)):
        (sub / name).mkdir(parents=True)
        rec = record_mod.RunRecord(row_id=name, status="ok", micro_batch_size=micro, tok_s_padded=100.0 * micro)
        record_mod.save(rec, sub / name / "record.json")
    (found,) = collect(sf, tmp_path / "runs")
    assert [m for m, _, _ in found.probes] == [4, 8]
    assert (
        found.best == 8 and found.probes[0][1].status == "error" and "micro batch 2, not 4" in found.probes[0][1].error
    )
