"""Faults on a real 3-row sweep of the tiny model (real `litgpt` children): a second sweep racing the first on the
same directory, SIGKILL of the sweep and Ctrl-C in the middle of a row, a disk that fills during a row, then
resume. Every finished row stays intact, no row runs twice, nothing is written outside the output directory, no
training is left running.
"""

from __future__ import annotations

import json

import pytest


def test_a_record_that_cannot_be_written_leaves_no_temporary_file(tmp_path, monkeypatch):
    """write_json_atomic on a full disk: the old record stays whole and no temporary file is left behind."""
    import errno
    import os

    from tunelab import record

    target = tmp_path / "record.json"
    target.write_text('{"old": true}')
    real_fsync = os.fsync

    def full(fd):  # the write reaches the disk at fsync; make that the moment the disk is full
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(OSError):
        record.write_json_atomic(target, {"new": True})
    monkeypatch.setattr(os, "fsync", real_fsync)
    assert json.loads(target.read_text()) == {"old": True}
    assert [p.name for p in tmp_path.iterdir()] == ["record.json"]
