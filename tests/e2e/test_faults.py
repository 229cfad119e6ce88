"""Faults on a real 3-row sweep of the tiny model (real `litgpt` children): a second sweep racing the first on the
same directory, SIGKILL of the sweep and Ctrl-C in the middle of a row, a disk that fills during a row, then
resume. Every finished row stays intact, no row runs twice, nothing is written outside the output directory, no
training is left running.
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from tests.conftest import ROOT, cpu_env

ROW = """  - id: {id}
    recipe: tiny-llama-1.1b/lora
    set: {{precision: 32-true, train.max_steps: {steps}, train.epochs: {epochs}, data.num_workers: 0,
           eval.final_validation: false, train.global_batch_size: {micro}, train.micro_batch_size: {micro}}}
"""


def write_sweep(path: Path, r2_steps: int, r2_epochs: int = 1, r2_micro: int = 4) -> Path:
    path.write_text(
        "name: faults\nrows:\n"
        + ROW.format(id="r1", steps=2, epochs=1, micro=4)
        + ROW.format(id="r2", steps=r2_steps, epochs=r2_epochs, micro=r2_micro)
        + ROW.format(id="r3", steps=2, epochs=1, micro=4)
    )
    return path


def sweep_cmd(sweep_file: Path, out: Path) -> list[str]:
    return [
        sys.executable,
        "-m",
        "tunelab",
        "sweep",
        str(sweep_file),
        "--out",
        str(out),
        "--model",
        "tiny",
        "--no-report",
    ]


def wait_for(predicate, timeout: float, what: str):
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if predicate():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def training_processes(out: Path) -> list[psutil.Process]:
    found = []
    for p in psutil.process_iter(["cmdline"]):
        try:
            if str(out) in " ".join(p.info["cmdline"] or []):
                found.append(p)
        except psutil.Error:
            continue
    return found


def full_disk_wrapper(mount: Path) -> list[str] | None:
    """A command prefix that runs the sweep with ``mount`` as a 16 KiB tmpfs (a real filesystem that fills up),
    through an unprivileged user + mount namespace; None where the kernel does not allow one."""
    if not shutil.which("unshare"):
        return None
    probe = subprocess.run(
        ["unshare", "-rm", "sh", "-c", f"mount -t tmpfs -o size=16k tmpfs {mount}"], capture_output=True, timeout=30
    )
    if probe.returncode != 0:
        return None
    return ["unshare", "-rm", "sh", "-c", f'mount -t tmpfs -o size=16k tmpfs {mount} && exec "$@"', "sh"]


@pytest.mark.slow  # 5 min on 2 cores (five sweeps, four training rows); CI keeps the corrupt-record resume below, a SIGKILLed run
# (test_runner), a killed launcher (test_distributed) and ENOSPC while building (test_gpu_runbook)
def test_race_interrupt_full_disk_then_resume(tmp_path):
    out = tmp_path / "sw"
    sweep_file = write_sweep(tmp_path / "faults.yaml", r2_steps=100000, r2_epochs=100)  # r2 runs until stopped
    env = cpu_env()

    def start_and_wait_for_r2_training(min_iter: int) -> subprocess.Popen:
        log = out / "r2" / "stdout.log"
        log.unlink(missing_ok=True)  # the log of an earlier attempt must not count
        # SIGINT at its default in the sweep (Python then raises KeyboardInterrupt), as in a terminal: a pytest
        # started in the background by a non-interactive shell inherits SIGINT ignored, and so would the sweep
        proc = subprocess.Popen(
            sweep_cmd(sweep_file, out),
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            # a safety net, not a speed check: r1 and r2's start took up to 180 s under CI's second worker
            wait_for(lambda: log.is_file() and f"iter {min_iter} " in log.read_text(), 900, "r2 to train")
        except AssertionError:
            proc.kill()
            raise
        return proc

    # 1. the first sweep runs r1, then trains r2; a second sweep on the same directory is refused in one line;
    #    then the first is SIGKILLed (no handler runs): its training child dies with it, r2 has no record
    first = start_and_wait_for_r2_training(2)
    try:
        second = subprocess.run(
            sweep_cmd(sweep_file, out), cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
        )
        assert second.returncode == 2 and "Traceback" not in second.stderr
        assert len(second.stderr.strip().splitlines()) == 1 and "is being swept by pid" in second.stderr
    finally:
        first.kill()
        first.wait(timeout=30)
    wait_for(lambda: not training_processes(out), 30, "the training child to die with the sweep")
    assert not (out / "r2" / "record.json").exists()
    r1 = (out / "r1" / "record.json").read_bytes()
    assert json.loads(r1)["status"] == "ok"

    # 2. the same command resumes at r2; Ctrl-C: the row in progress is recorded as interrupted, the sweep says
    #    how to go on, exit 130
    again = start_and_wait_for_r2_training(3)
    try:
        again.send_signal(signal.SIGINT)
        _, err = again.communicate(timeout=60)
    finally:
        if again.poll() is None:
            again.kill()
    assert again.returncode == 130, err[-2000:]
    assert "Traceback" not in err and "resuming faults: 1 of 3 rows already recorded" in err
    assert "stopped during row r2: 1 of 3 rows recorded" in err and "run the same command again" in err
    r2 = json.loads((out / "r2" / "record.json").read_text())
    assert r2["status"] == "killed" and r2["error"].startswith("interrupted:") and r2["iters"] >= 3
    wait_for(lambda: not training_processes(out), 10, "no training process left")

    # 3. r2 made short (the interrupted row runs again); the disk fills while r3 writes its logs
    write_sweep(sweep_file, r2_steps=2)
    (out / "r3").mkdir()
    wrapper = full_disk_wrapper(out / "r3")
    if wrapper is None:  # no user namespaces: r3's log is /dev/full, where every write fails with ENOSPC
        (out / "r3" / "stdout.log").symlink_to("/dev/full")
        wrapper = []
    full = subprocess.run(
        [*wrapper, *sweep_cmd(sweep_file, out)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )
    assert full.returncode == 2, full.stderr[-2000:]
    assert "Traceback" not in full.stderr
    assert "r3: disk full; free space and run the same command again" in full.stderr
    assert json.loads((out / "r2" / "record.json").read_text())["status"] == "ok"
    r2_done = (out / "r2" / "record.json").read_bytes()
    assert not [p for p in out.rglob("*") if p.name.endswith(".tmp")]
    wait_for(lambda: not training_processes(out), 10, "no training process left")

    # 4. space freed (the namespace's filesystem is gone; the /dev/full link removed): resume finishes r3 only,
    #    and the report lists the three rows in order
    (out / "r3" / "stdout.log").unlink(missing_ok=True)
    cmd = [*sweep_cmd(sweep_file, out)[:-1], "--report-dir", str(tmp_path / "report")]
    resume = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert resume.returncode == 0, resume.stderr[-2000:]
    assert "resuming faults: 2 of 3 rows already recorded" in resume.stderr
    for row in ("r1", "r2", "r3"):
        assert json.loads((out / row / "record.json").read_text())["status"] == "ok"
    assert (out / "r1" / "record.json").read_bytes() == r1  # never run twice
    assert (out / "r2" / "record.json").read_bytes() == r2_done
    assert sorted(p.name for p in tmp_path.iterdir()) == ["faults.yaml", "report", "sw"]
    assert sorted(p.name for p in out.iterdir() if not p.name.startswith(".")) == ["r1", "r2", "r3", "sweep.json"]
    csv_rows = (tmp_path / "report" / "results.csv").read_text().strip().splitlines()
    assert [r.split(",")[1] for r in csv_rows[1:]] == ["r1", "r2", "r3"]


def test_a_changed_or_corrupt_record_is_kept_aside_and_rerun(tmp_path):
    """Resume trusts a record only if it is readable and made with the row's current settings; otherwise the old
    file is kept beside it and the row runs again, with a line saying why."""
    import io

    from tunelab import sweep_file
    from tunelab.run import sweep

    base = tmp_path / "sweep.yaml"
    write_sweep(base, r2_steps=2)
    sw = sweep_file.load(base)
    sw.rows = sw.rows[:2]
    out = tmp_path / "sw"
    sweep.run_sweep(sw, out, sweep.SweepOptions(model="tiny", stream=io.StringIO()))
    (out / "r1" / "record.json").write_text('{"status": "ok", "row_')  # truncated
    write_sweep(base, r2_steps=2, r2_micro=2)
    sw = sweep_file.load(base)
    sw.rows = sw.rows[:2]
    assert sw.rows[1].settings["train.micro_batch_size"] == 2  # r2 changed: micro batch 4 -> 2
    log = io.StringIO()
    sweep.run_sweep(sw, out, sweep.SweepOptions(model="tiny", stream=log))
    text = log.getvalue()
    assert "r1: unreadable record" in text and "r2: settings changed" in text
    assert "--train.micro_batch_size 4" in text and "--train.micro_batch_size 2" in text
    for row in ("r1", "r2"):
        rec = json.loads((out / row / "record.json").read_text())
        assert rec["status"] == "ok"
        kept = list((out / row).glob("record.json.*"))
        assert len(kept) == 1 and kept[0].name.startswith(f"record.json.{'corrupt' if row == 'r1' else 'stale'}-")
    assert json.loads((out / "r2" / "record.json").read_text())["micro_batch_size"] == 2
    # the same command again: nothing to do
    log = io.StringIO()
    sweep.run_sweep(sw, out, sweep.SweepOptions(model="tiny", stream=log))
    assert "2 of 2 rows already recorded" in log.getvalue()
