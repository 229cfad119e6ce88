"""The run-record schema: round trip, refusal of unknown fields, atomic writes, a docstring on every field."""

from __future__ import annotations

import ast
import dataclasses
import inspect
import json

import pytest

from tunelab import record
from tunelab.record import GPUSample, RankStats, RunRecord, StoredPlan


def full_record() -> RunRecord:
    return RunRecord(
        sweep="s",
        row_id="r1",
        recipe="tiny-llama-1.1b/lora",
        command="finetune_lora",
        overrides=["--train.max_steps", "2"],
        resolved_args={"train": {"micro_batch_size": 4}},
        status="oom",
        error="torch.OutOfMemoryError: CUDA out of memory",
        ranks=[
            RankStats(rank=0, device="cuda:0", peak_allocated_bytes=10, peak_reserved_bytes=20, num_alloc_retries=1),
            RankStats(rank=1, device="cuda:1", peak_allocated_bytes=11, exception="MemoryError: x"),
        ],
        gpus=[GPUSample(index=0, name="NVIDIA H100", util_mean=90.0, util_std=3.0, energy_j=12.5, samples=8)],
        tok_s_padded=123.4,
        mfu=0.41,
        versions={"torch": "2.13.0"},
        plan=StoredPlan(
            planner="tunelab 0.1.0, git abc",
            gpu="H100-SXM",
            peak_allocated_bytes=9,
            breakdown_bytes={"weights": 4, "activations": 5},
            fits=True,
            seconds=1.5,
            seconds_by_cause={"matmul": 1.0, "host launches": 0.5},
        ),
    )


def test_round_trip_through_json(tmp_path):
    rec = full_record()
    path = record.save(rec, tmp_path / "record.json")
    again = record.load(path)
    assert again == rec
    assert isinstance(again.ranks[1], RankStats) and again.ranks[1].exception == "MemoryError: x"
    assert isinstance(again.gpus[0], GPUSample) and again.gpus[0].energy_j == 12.5
    assert isinstance(again.plan, StoredPlan) and again.plan.breakdown_bytes == {"weights": 4, "activations": 5}
    assert list(tmp_path.iterdir()) == [path]  # no temp file left behind


def test_unknown_field_and_bad_status_refused():
    d = full_record().to_dict()
    with pytest.raises(ValueError, match="unknown keys"):
        RunRecord.from_dict({**d, "tokens_per_second": 1})
    with pytest.raises(ValueError, match="status"):
        RunRecord.from_dict({**d, "status": "maybe"})


def test_atomic_write_keeps_old_file_when_serialisation_fails(tmp_path):
    path = tmp_path / "x.json"
    record.write_json_atomic(path, {"a": 1})

    class Boom:
        def __str__(self):
            raise RuntimeError("boom")

    with pytest.raises(RuntimeError):
        record.write_json_atomic(path, {"a": Boom()})
    assert json.loads(path.read_text()) == {"a": 1}


def test_a_saved_figure_is_closed_whether_it_was_written_or_not(tmp_path):
    """Every report plot goes through files.save_figure: it writes the PNG atomically and closes the figure, so a
    report that draws many (plan-accuracy, a sweep's) holds none open; a write refused (a folder where the file
    goes) closes it too and leaves the folder as it was."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from tunelab.files import FileRefused, save_figure

    fig, _ = plt.subplots()
    assert save_figure(fig, tmp_path / "a.png").read_bytes().startswith(b"\x89PNG")
    assert fig.number not in plt.get_fignums()
    (tmp_path / "b.png").mkdir()
    fig, _ = plt.subplots()
    with pytest.raises(FileRefused, match="is a directory"):
        save_figure(fig, tmp_path / "b.png")
    assert fig.number not in plt.get_fignums() and (tmp_path / "b.png").is_dir()


@pytest.mark.parametrize(
    "plan,words",
    [
        ([1], "plan: a JSON object expected"),
        ({"peak_allocated_bytes": -1}, "not a finite non-negative"),
        ({"breakdown_bytes": {"weights": "many"}}, "breakdown_bytes['weights']"),
        ({"seconds_by_cause": {"matmul": float("nan")}}, "seconds_by_cause['matmul']"),
        ({"gpu": 3}, "gpu is a int"),
        ({"tflops": 1.0}, "unknown keys"),
    ],
)
def test_a_stored_plan_is_read_through_the_schema(plan, words):
    """A record's plan is checked as the rest of it is: one ValueError naming the field, never a traceback later
    in a report that reads it."""
    with pytest.raises(ValueError, match=__import__("re").escape(words)):
        RunRecord.from_dict({**full_record().to_dict(), "plan": plan})


@pytest.mark.parametrize("cls", [RunRecord, RankStats, GPUSample, StoredPlan])
def test_every_field_has_a_docstring(cls):
    tree = ast.parse(inspect.getsource(cls))
    body = tree.body[0].body
    documented = set()
    for node, nxt in zip(body, body[1:]):
        if isinstance(node, ast.AnnAssign) and isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant):
            documented.add(node.target.id)
    missing = {f.name for f in dataclasses.fields(cls)} - documented
    assert not missing, f"{cls.__name__} fields without a docstring: {sorted(missing)}"


def test_rank_files_are_read_through_the_schema():
    """A rank file holds RankStats fields plus the iteration log; anything else is an error the collector notes,
    not a field dropped silently."""
    import pytest

    from tunelab.record import read_rank_file

    stats, iters = read_rank_file(
        {
            "rank": 1,
            "device": "cuda:1",
            "peak_allocated_bytes": 5,
            "cuda_error": None,
            "iters": [[1.0, 16, 12], [2.0, 16, 10]],
            "pauses": [[0, 0.25], [0, 0.5, 1.25], [1, 0.1, 2.5]],
        }
    )
    assert stats.rank == 1 and stats.peak_allocated_bytes == 5
    # [start, padded, real, paused inside, the pauses whose start was kept] (a file of before: without the start)
    assert iters == [[1.0, 16, 12, 0.75, [(1.25, 1.75)]], [2.0, 16, 10, 0.1, [(2.5, 2.6)]]]
    for bad in ([[0]], [[0, -1.0]], [["0", 1.0]], [[0, float("nan")]], [[0, 1.0, float("inf")]], [[0, 1.0, 2, 3]]):
        with pytest.raises(ValueError, match="pauses"):
            read_rank_file({"rank": 0, "pauses": bad})
    with pytest.raises(ValueError, match="unknown keys \\['surprise'\\]"):
        read_rank_file({"rank": 0, "surprise": 1})


def test_steady_state_leaves_the_pauses_out():
    """A validation or save inside the loop (a pause noted on the iteration it interrupted) is not training time:
    the iteration and step times and tok/s exclude it; without the subtraction tok/s falls to 57 (the median step
    hides one slow step)."""
    from tunelab.record import steady_state

    starts = [0.0, 1.0, 2.0, 5.0, 6.0, 7.0, 8.0]  # iteration 2 took 3 s, 2 of them a validation
    log = [[t, 100, 80, 2.0 if i == 2 else 0.0] for i, t in enumerate(starts)]
    steady = steady_state([log], 1, len(log))
    assert steady["iter_time_s"] == 1.0 and steady["step_time_s"] == 1.0 and steady["window"] == (1.0, 8.0)
    assert steady["tok_s_real"] == 80 * 5 / 5.0  # 5 counted iterations of 1 s each (the first is warm-up)


def test_the_collector_leaves_out_a_litgpt_validation_its_probes_missed():
    """Should the pause probes miss litgpt's validation (a litgpt whose functions they no longer find), the steps
    its eval.interval names are left out of the steady window rather than counted as training; a rank file that
    noted its pauses keeps every step, each less its pause."""
    from tunelab.record import RunRecord
    from tunelab.run.collect import _speed

    starts = [float(t) for t in (0, 1, 2, 8, 9, 10, 16, 17, 18)]  # after steps 3 and 6 a validation: 5 s each
    log = [[t, 100, 80, 0.0] for t in starts]
    args = {"eval": {"interval": 3}, "train": {"save_interval": None}}
    rec = RunRecord(strategy="litgpt", resolved_args=args, accumulation=1, optimizer_steps=9, device_count=1)
    _speed(rec, [log], 9)
    assert rec.step_time_mean_s == 1.0 and rec.tok_s_real == 80.0  # steps 3 and 6 (iterations 2 and 5) left out
    noted = [[t, 100, 80, 5.0 if i in (2, 5) else 0.0] for i, (t, *_) in enumerate(log)]
    rec = RunRecord(strategy="litgpt", resolved_args=args, accumulation=1, optimizer_steps=9, device_count=1)
    _speed(rec, [noted], 9)
    assert rec.step_time_mean_s == 1.0 and rec.warmup_steps_excluded == 1
    rec = RunRecord(strategy="fast.yaml", resolved_args=args, accumulation=1, optimizer_steps=9, device_count=1)
    _speed(rec, [log], 9)  # tunelab's loop notes its own pauses: nothing to infer
    assert rec.step_time_mean_s == pytest.approx((1 + 6 + 1 + 1 + 6 + 1 + 1) / 7)


def test_mean_step_holds_the_wait_the_median_hides():
    """A loop that reads the loss every 6 steps queues ahead of the GPU: most steps look short (0.1 s, the host's
    launches) and the step holding the read waits for the backlog (0.8 s). Over the 12 counted steps the mean is
    0.217 s, the median 0.1 (the figure the fast path's bench rows were compared with before); the rate of micro
    batches and the padded tokens per micro batch come from the same steps."""
    from tunelab.record import steady_state

    t, log = 0.0, []
    for step in range(13):  # 13 steps of 2 iterations; the first is warm-up
        for i in range(2):
            log.append([t, 100 + 20 * i, 80])
            t += 0.75 if (step % 6 == 5 and i == 1) else 0.05
    log.append([t, 100, 80])  # the successor that ends the last counted iteration
    steady = steady_state([log], 2, len(log))
    assert steady["warmup_steps_excluded"] == 1 and steady["step_time_s"] == pytest.approx(0.1)
    assert steady["step_time_mean_s"] == pytest.approx((10 * 0.1 + 2 * 0.8) / 12)
    assert steady["padded_per_iteration"] == pytest.approx(110)
    assert steady["iterations_s"] == pytest.approx(24 / (10 * 0.1 + 2 * 0.8))


def test_the_window_ends_where_the_device_finished_not_at_a_host_timestamp_with_work_queued():
    """A loop that queues ahead: the host fetched its last batch at 4.0 s, the device finished that work at 6.0 s
    (the rank's synchronised end). The window ends at 6.0 and counts the last iteration: 5 iterations of real tokens
    over 6.0 - 1.0 s. Ending on the host's last timestamp (the old window: 3 iterations over 3 s, the last one dropped)
    reads a rate a quarter higher than the device ran."""
    from tunelab.record import steady_state

    log = [[float(t), 100, 80, 0.0] for t in range(5)]  # fetches at 0..4 s, the first iteration warm-up
    synced = steady_state([log], 1, len(log), ends=[6.0])
    assert synced["window"] == (1.0, 6.0)
    assert synced["tok_s_real"] == pytest.approx(80 * 4 / 5.0)  # iterations 1-4, the last one ending at 6.0
    host = steady_state([log], 1, len(log))  # no synchronised end recorded (litgpt's own loop, older records)
    assert host["window"] == (1.0, 4.0) and host["tok_s_real"] == pytest.approx(80.0)
    assert host["tok_s_real"] == pytest.approx(synced["tok_s_real"] * 1.25)
    assert steady_state([log], 1, len(log), ends=[3.0])["window"][1] == 4.0  # an end before the last fetch: ignored


def test_a_record_is_not_reused_after_its_strategy_file_changed_in_a_key_its_description_hides(tmp_path):
    """DDP's description is 'DDP' whatever its bucket size; a record keeps every key of the strategy file, so a bench,
    sweep or probe made under bucket_cap_mb 25 is not taken for one under 50 (it runs again, the old record set
    aside by the caller). A record from before records kept the keys is judged by its description, as before."""
    from tunelab.run.resume import resume_state, strategy_label, strategy_settings

    path = tmp_path / "ddp.yaml"
    path.write_text("name: ddp\nbucket_cap_mb: 25\n")
    label, before = strategy_label(str(path)), strategy_settings(str(path))
    rec = RunRecord(recipe="tiny-llama-1.1b/full", status="ok", strategy=label, strategy_settings=before)
    record.save(rec, tmp_path / "record.json")
    args = (tmp_path / "record.json", "tiny-llama-1.1b/full", [])
    assert resume_state(*args, label, before) == (True, None)
    path.write_text("name: ddp\nbucket_cap_mb: 50\n")
    assert strategy_label(str(path)) == label  # the description cannot tell them apart
    assert resume_state(*args, label, strategy_settings(str(path))) == (
        False,
        "strategy file changed (bucket_cap_mb: 25 -> 50)",
    )
    record.save(dataclasses.replace(rec, strategy_settings=None), tmp_path / "record.json")
    assert resume_state(*args, label, strategy_settings(str(path))) == (True, None)


def test_a_record_made_on_another_device_is_not_reused(tmp_path):
    """Records travel (a GPU session carries the last session's archive back in): one made on an H100 answers no run
    on this machine's device, which bench, sweep and tune-batch would otherwise report as measured here; a record
    of this device is reused, and one from before records named their device is judged as before."""
    from tunelab.run.gpu_monitor import this_device
    from tunelab.run.resume import resume_state

    args = (tmp_path / "record.json", "tiny-llama-1.1b/full", [])
    rec = RunRecord(recipe="tiny-llama-1.1b/full", status="ok", device_name="NVIDIA H100 80GB HBM3")
    record.save(rec, tmp_path / "record.json")
    assert resume_state(*args) == (False, f"device changed (NVIDIA H100 80GB HBM3 -> {this_device()})")
    record.save(dataclasses.replace(rec, device_name=this_device()), tmp_path / "record.json")
    assert resume_state(*args) == (True, None)
    record.save(dataclasses.replace(rec, device_name=None), tmp_path / "record.json")
    assert resume_state(*args) == (True, None)


def test_a_record_made_under_another_allocator_setting_is_not_reused(tmp_path, monkeypatch):
    """PYTORCH_CUDA_ALLOC_CONF changes a step's trips to the driver and the reserved peak: a record made under
    ``expandable_segments:True`` answers no run without it, and the reverse; the same setting (or none on both
    sides, as every record from before the field) is reused."""
    from tunelab.run.resume import resume_state

    monkeypatch.delenv(record.ALLOC_CONF_ENV, raising=False)
    args = (tmp_path / "record.json", "tiny-llama-1.1b/full", [])
    rec = RunRecord(recipe="tiny-llama-1.1b/full", status="ok", allocator_conf="expandable_segments:True")
    record.save(rec, tmp_path / "record.json")
    assert resume_state(*args) == (False, "allocator setting changed (expandable_segments:True -> None)")
    monkeypatch.setenv(record.ALLOC_CONF_ENV, "expandable_segments:True")
    assert resume_state(*args) == (True, None)
    record.save(dataclasses.replace(rec, allocator_conf=None), tmp_path / "record.json")
    assert resume_state(*args) == (False, "allocator setting changed (None -> expandable_segments:True)")
    monkeypatch.delenv(record.ALLOC_CONF_ENV)
    assert resume_state(*args) == (True, None)


def test_a_compiled_run_recorded_before_limit_hits_were_counted_is_run_again(tmp_path):
    """A fast-path record from before the recompile-limit hits were counted (its LoRA blocks may have run eagerly
    without a word, as the H200 bench's did) answers no run; one that counted them (0) is reused."""
    from tunelab.run.resume import resume_state
    from tunelab.strategies import load_strategy

    settings = load_strategy("fast").settings()
    rec = RunRecord(recipe="tiny-llama-1.1b/lora", status="ok", strategy_settings=settings, recompile_limit_hits=0)
    data = rec.to_dict()
    path = tmp_path / "record.json"
    record.save(rec, path)
    assert resume_state(path, "tiny-llama-1.1b/lora", []) == (True, None)
    del data["recompile_limit_hits"]
    path.write_text(json.dumps(data))
    done, why = resume_state(path, "tiny-llama-1.1b/lora", [])
    assert not done and "recompile-limit hits" in why


def test_the_steady_windows_nvml_figures_leave_the_pauses_out():
    """A validation inside the steady window (GPU idle, 100 W, against 95% and 400 W training): the window's
    utilisation, power and energy are training's; the pause's samples and time are left out. Before, a window of 8 s
    holding a 2 s validation read 73% busy and 325 W."""
    from tunelab.record import RunRecord, steady_state
    from tunelab.run.collect import _gpu_figures
    from tunelab.run.gpu_monitor import GPUMonitor

    starts = [0.0, 1.0, 2.0, 5.0, 6.0, 7.0, 8.0, 9.0]  # iteration 2: 1 s of training, then a 2 s validation
    log = [[t, 100, 80, 2.0 if i == 2 else 0.0, [(3.0, 5.0)] if i == 2 else []] for i, t in enumerate(starts)]
    steady = steady_state([log], 1, len(log))
    assert steady["window"] == (1.0, 9.0) and steady["pauses"] == [(3.0, 5.0)]
    m = GPUMonitor()
    training = lambda t: not 3.0 <= t <= 5.0  # noqa: E731
    times = [k / 10 for k in range(101)]  # 10 samples a second; the energy counter integrates the power (mJ)
    watts = [400.0 if training(t) else 100.0 for t in times]
    energy = [sum(w * 100.0 for w in watts[:k]) for k in range(len(times))]
    m._samples = [[(t, 95 if training(t) else 0, w, 0, e, None, None) for t, w, e in zip(times, watts, energy)]]
    win = m.window(*steady["window"], skip=steady["pauses"])[0]
    assert win.util_mean == 95 and win.power_mean_w == 400.0
    assert win.energy_j == pytest.approx(400.0 * 6.0)  # 8 s of window less the 2 s pause, at the training rate
    both = m.window(*steady["window"])[0]
    assert both.util_mean < 80 and both.power_mean_w < 350
    rec = RunRecord(sweep="t", row_id="r", recipe="x")
    _gpu_figures(rec, m.window(0.0, 10.0), steady, m)  # the collector's step: the record's steady figures
    assert rec.gpu_util_steady_mean == 95 and rec.power_steady_w == 400.0
