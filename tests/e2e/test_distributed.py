"""Multi-device strategies for real on CPU: 2 processes over gloo under DDP, FSDP (each sharding), FSDP2 and
DeepSpeed ZeRO-2/3 (+ CPU offload), each against the single-process `litgpt finetune_full` run with the same
global batch; two-rank records; a two-"node" torchrun on localhost; the refusals."""

from __future__ import annotations

import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from tests import printed
from tests.conftest import cpu_env, equal_length_dataset
from tests.run.test_distributed import STRATEGIES
from tunelab import cli, record
from tunelab.recipes import resolve
from tunelab.run.runner import RunOptions, _free_port, run

ROOT = Path(__file__).resolve().parents[2]
PRINTED = {p.command for p in printed.readme() if p.command.startswith("tunelab run ")}
"""The README's `tunelab run` lines: this file runs each (tests/e2e/test_printed_commands.py checks they are all here),
on CPU with 2 processes instead of 4 GPUs, on the tiny checkpoint, with the loss-comparison overrides below."""


def printed_run(strategy: str | None) -> list[str]:
    """The README's `tunelab run` line for ``strategy`` (None: the single-device one), else the same line for the
    TinyLlama recipe; as argv after `tunelab`, with 2 devices where it names a count."""
    for command in sorted(PRINTED):
        argv = shlex.split(command)[1:]
        named = argv[argv.index("--strategy") + 1] if "--strategy" in argv else None
        if named == strategy:
            return ["2" if i and argv[i - 1] == "--devices" else a for i, a in enumerate(argv)]
    return ["run", "tiny-llama-1.1b/full", "--strategy", strategy, "--devices", "2"]


def run_cli(argv: list[str], out: Path) -> record.RunRecord:
    assert cli.main([*argv, "--model", "checkpoint", "--out", str(out)]) in (0, 1)
    return record.load(out / "record.json")


def optimizer_config(path: Path, lr: float, cls: str = "torch.optim.AdamW") -> list[str]:
    """A learning rate in the form litgpt honours: the whole optimizer in a YAML file, added with a second
    ``--config`` (``--optimizer.init_args.lr`` is dropped by litgpt's parser; tunelab validate refuses it)."""
    path.write_text(f"optimizer:\n  class_path: {cls}\n  init_args:\n    lr: {lr}\n")
    return ["--config", str(path)]


def common(data_file: Path, ckpt: Path) -> list[str]:
    # fp32, equal-length samples: per-step losses must agree however the global batch of 8 is split; a learning
    # rate of 0.01 (litgpt's recipes: 2e-4) so that three steps move the loss by far more than the tolerance
    return [
        "--precision",
        "32-true",
        "--train.global_batch_size",
        "8",
        "--train.max_steps",
        "3",
        "--train.lr_warmup_steps",
        "1",
        "--data.json_path",
        str(data_file),
        "--data.num_workers",
        "0",
        "--checkpoint_dir",
        str(ckpt),
        *optimizer_config(data_file.with_name("optimizer.yaml"), 0.01),
    ]


def step_losses(run_dir: Path, accumulation: int) -> list[float]:
    import csv

    with open(next(run_dir.glob("litgpt/logs/csv/version_*/metrics.csv")), newline="") as f:
        rows = list(csv.DictReader(f))
    return [float(r["loss"]) for r in rows if r.get("loss") and int(r["iter"]) % accumulation == 0]


@pytest.fixture(scope="module")
def reference(tiny_ckpt, tmp_path_factory):
    """The single-process run: litgpt's own finetune_full (the README's `tunelab run open-llama-7b/full`, on the
    tiny checkpoint), micro 4 x accumulation 2."""
    tmp = tmp_path_factory.mktemp("ref")
    data_file = equal_length_dataset(tiny_ckpt, tmp / "equal.json", n=64)  # 32 training samples: 4 steps
    rec = run_cli([*printed_run(None), *common(data_file, tiny_ckpt), "--train.micro_batch_size", "4"], tmp / "single")
    assert rec.status == "ok", rec.error
    losses = step_losses(tmp / "single", 2)
    assert len(losses) == 3 and abs(losses[-1] - losses[0]) > 0.01 * abs(losses[0])  # moves >> the tolerance
    return data_file, losses


SLOW_STRATEGIES = {
    "fsdp-shard-grad-op",
    "fsdp-hybrid",
    "fsdp-no-shard",
    "fsdp-offload",
    "fsdp-no-wrap",
    "deepspeed-zero2",
    "fsdp",
    "deepspeed-zero3-offload",
}
"""Run with -m slow (12 to 20 s each on 2 cores). FSDP1 and its sharding strategies, CPU offload and whole-model unit
(no auto-wrap): the same loop as FSDP2 with another wrapper (their memory is planned against simulated ranks in
tests/accuracy/test_ranks.py); ZeRO stage 2 and ZeRO-3 with offload: the same DeepSpeed engine and loop as ZeRO-3
with one setting changed. CI keeps DDP, FSDP2 and ZeRO-3. Run them after touching tunelab/parallel.py: HYBRID_SHARD's
run here is what showed FSDP1's own groups averaging nothing on a CPU (tests/run/test_distributed.py keeps only the
refusals of its mesh)."""


@pytest.mark.parametrize(
    "strategy", [pytest.param(s, marks=pytest.mark.slow) if s in SLOW_STRATEGIES else s for s in STRATEGIES]
)
def test_two_processes_match_single_process(strategy, reference, tiny_ckpt, tmp_path):
    data_file, ref = reference
    rec = run_cli(
        [*printed_run(strategy), *common(data_file, tiny_ckpt), "--train.micro_batch_size", "2", "--timeout", "300"],
        tmp_path / strategy,
    )
    assert rec.status == "ok", (rec.error, (tmp_path / strategy / "stderr.log").read_text()[-2000:])
    assert rec.device_count == 2 and sorted(r.rank for r in rec.ranks) == [0, 1]
    assert all(r.peak_rss_bytes > 0 for r in rec.ranks) and rec.tok_s_padded > 0
    assert rec.strategy != "litgpt" and rec.accumulation == 2 and rec.optimizer_steps == 3
    assert step_losses(tmp_path / strategy, 2) == pytest.approx(ref, rel=1e-4, abs=1e-5)
    # the final checkpoint in litgpt's layout, gathered whole from the ranks: every key and shape of the base model
    import torch

    saved = torch.load(tmp_path / strategy / "litgpt" / "final" / "lit_model.pth", weights_only=True)["model"]
    base = torch.load(tiny_ckpt / "lit_model.pth", weights_only=True)
    assert {k: v.shape for k, v in saved.items()} == {k: v.shape for k, v in base.items()}
    assert all(type(v) is torch.Tensor for v in saved.values())  # gathered: no shard (DTensor) saved as a tensor


@pytest.mark.parametrize(
    "strategy",
    # -m slow (20 to 25 s each on 2 cores): DDP wraps a LoRA model as it wraps a full one, FSDP2 and ZeRO-3 shard
    # it by the same rules (tests/accuracy/test_ranks.py plans LoRA under FSDP2 against rank 0)
    [pytest.param(s, marks=pytest.mark.slow) for s in ("ddp", "fsdp2", "deepspeed-zero3")],
)
def test_lora_under_strategies(strategy, tiny_ckpt, tmp_path):
    rec = run(
        resolve("tiny-llama-1.1b/lora"),
        [
            "--devices",
            "2",
            "--train.max_steps",
            "2",
            "--train.micro_batch_size",
            "2",
            "--train.global_batch_size",
            "8",
            "--data.num_workers",
            "0",
            "--checkpoint_dir",
            str(tiny_ckpt),
        ],
        tmp_path / "l",
        RunOptions(model="checkpoint", strategy=strategy, timeout_s=300),
    )
    assert rec.status == "ok", rec.error
    assert rec.n_trainable < rec.n_params and len(rec.ranks) == 2


@pytest.mark.slow  # 45 s on 2 cores: the one run of several nodes (two launchers), not in CI
def test_two_nodes_on_localhost(tiny_ckpt, tmp_path):
    """2 nodes x 1 process: two launchers, one rendezvous, one record with both ranks."""
    out, port = tmp_path / "two-nodes", _free_port()
    cmd = [
        sys.executable,
        "-m",
        "tunelab",
        "run",
        "tiny-llama-1.1b/full",
        "--strategy",
        "ddp",
        "--devices",
        "1",
        "--nnodes",
        "2",
        "--master-port",
        str(port),
        "--out",
        str(out),
        "--precision",
        "32-true",
        "--train.max_steps",
        "2",
        "--train.micro_batch_size",
        "2",
        "--train.global_batch_size",
        "8",
        "--data.num_workers",
        "0",
        "--checkpoint_dir",
        str(tiny_ckpt),
    ]
    nodes = [
        subprocess.Popen(
            [*cmd, "--node-rank", str(k)],
            cwd=ROOT,
            env=cpu_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for k in (1, 0)
    ]
    outs = [p.communicate(timeout=300) for p in nodes]
    assert all(p.returncode == 0 for p in nodes), [o[1][-2000:] for o in outs]
    rec = record.load(out / "record.json")
    assert rec.status == "ok" and rec.device_count == 2 and sorted(r.rank for r in rec.ranks) == [0, 1]
    assert (out / "stdout.node1.log").is_file()


@pytest.mark.gpu
@pytest.mark.parametrize("strategy", ["ddp", "fsdp", "fsdp2", "deepspeed-zero3-offload"])
def test_nccl_strategies_on_gpus(strategy, tiny_ckpt, tmp_path):
    """The same loop over NCCL on 2 GPUs (run on a GPU machine: pytest -m gpu)."""
    import torch

    if torch.cuda.device_count() < 2:
        pytest.skip("needs 2 CUDA GPUs")
    rec = run(
        resolve("tiny-llama-1.1b/full"),
        ["--devices", "2", "--train.max_steps", "3", "--data.num_workers", "0", "--checkpoint_dir", str(tiny_ckpt)],
        tmp_path / strategy,
        RunOptions(model="checkpoint", strategy=strategy, timeout_s=600),
    )
    assert rec.status == "ok", rec.error
    assert len(rec.ranks) == 2 and all(r.peak_allocated_bytes for r in rec.ranks)


def test_killed_launcher_leaves_no_rank_behind(tiny_ckpt, tmp_path):
    """SIGKILL the `tunelab run` parent mid-training: torchrun and every rank go with it (no rank left hanging)."""
    import signal
    import time

    import psutil

    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tunelab",
            "run",
            "tiny-llama-1.1b/lora",
            "--strategy",
            "ddp",
            "--devices",
            "2",
            "--out",
            str(tmp_path / "k"),
            "--data.num_workers",
            "0",
            "--checkpoint_dir",
            str(tiny_ckpt),
        ],
        cwd=ROOT,
        env=cpu_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )

    def command(p) -> str:  # a short-lived child (a helper process) may exit, or be a zombie, while we look
        try:
            return " ".join(p.cmdline())
        except psutil.Error:
            return ""

    t0, ranks = time.time(), []
    while len(ranks) < 2:
        assert time.time() - t0 < 600 and proc.poll() is None  # a guard against a hang, not a deadline
        ranks = [c for c in psutil.Process(proc.pid).children(recursive=True) if "tunelab.run.loop" in command(c)]
        time.sleep(0.2)
    time.sleep(3)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    gone, alive = psutil.wait_procs(ranks, timeout=30)
    assert not alive, [p.pid for p in alive]


@pytest.mark.parametrize(
    "signame",
    [pytest.param(s, marks=pytest.mark.slow) for s in ("SIGINT", "SIGTERM", "SIGKILL")],
)  # -m slow, about 2.5 min each on 2 cores (a litgpt arm, then the fast arm under torchrun); CI keeps a SIGKILLed
# `tunelab run` with ranks (test_killed_launcher_leaves_no_rank_behind) and a SIGKILLed run (tests/e2e/test_runner.py)
def test_a_signalled_bench_leaves_no_process_behind(tmp_path, signame):
    """`tunelab bench` signalled the moment torchrun has spawned its fast arm's rank (the litgpt arm ran first):
    the bench exits and every process it started, torchrun's rank included, is gone within 30 s. SIGINT and SIGTERM
    are the bench's to handle (it kills its run's process group and says so); SIGKILL is not, so the rank must go
    by itself (it asked Linux to kill it with its parent). Behaviour, not one mechanism: with the process-group kill
    and the rank's death signal both removed it still passes (the runner terminates torchrun, which stops its
    workers; a rank whose output pipe closed dies on its next write), so each mechanism is tested where it acts
    (test_killed_launcher_leaves_no_rank_behind, test_a_rank_whose_torchrun_died_during_its_imports_exits_at_once)."""
    import signal
    import time

    import psutil

    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tunelab",
            "bench",
            "tiny-llama-1.1b/lora",
            "--model",
            "tiny",
            "--pairs",
            "1",
            "--train.max_steps",
            "12",
            "--eval.final_validation",
            "false",
            "--data.num_workers",
            "0",
            "--out",
            str(tmp_path / "o"),
            "--report-dir",
            str(tmp_path / "r"),
        ],
        cwd=ROOT,
        env=cpu_env(),
        stdout=subprocess.DEVNULL,
        stderr=(tmp_path / "err").open("w"),  # never a full pipe
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),  # as in a terminal (see test_faults)
    )

    def command(p) -> str:
        try:
            return " ".join(p.cmdline())
        except psutil.Error:
            return ""

    t0, ranks = time.time(), []
    while not ranks:
        assert time.time() - t0 < 600 and proc.poll() is None, (tmp_path / "err").read_text()[-2000:]
        ranks = [c for c in psutil.Process(proc.pid).children(recursive=True) if "tunelab.run.loop" in command(c)]
        time.sleep(0.1)
    started = psutil.Process(proc.pid).children(recursive=True)
    proc.send_signal(getattr(signal, signame))
    proc.wait(timeout=60)
    gone, alive = psutil.wait_procs(started, timeout=30)
    for p in alive:
        p.kill()
    assert not alive, [(p.pid, command(p)[:120]) for p in alive]
    assert proc.returncode != 0


def test_a_rank_whose_torchrun_died_during_its_imports_exits_at_once(tmp_path):
    """torchrun starts each rank in a session of its own, so the run's process group does not reach it; a rank asks
    Linux to kill it with its parent only after its imports, so a torchrun killed in between would leave it training
    as an orphan. The rank checks its parent right after asking: an orphan started by torchrun (its environment
    says so) exits at once with a line; the same process under a living torchrun, or not started by torchrun, runs
    on. Real processes: a shell that starts the rank and exits at once (the rank is re-parented), and torchrun."""
    import time

    probe = (
        "import sys, time; time.sleep(1); from tunelab.run import rank_stats; rank_stats.die_with_parent(); "
        "open(sys.argv[1], 'w').write('alive')"
    )

    def orphan(name: str, torchelastic: bool) -> tuple[Path, Path]:
        mark, err = tmp_path / f"{name}.alive", tmp_path / f"{name}.err"
        env = {k: v for k, v in cpu_env().items() if k != "TORCHELASTIC_RUN_ID"}
        if torchelastic:
            env["TORCHELASTIC_RUN_ID"] = "orphan-test"
        line = f"{shlex.quote(sys.executable)} -c {shlex.quote(probe)} {shlex.quote(str(mark))} 2> {shlex.quote(str(err))} &"
        subprocess.run(["sh", "-c", line + " exit 0"], cwd=ROOT, env=env, check=True, timeout=30)
        return mark, err

    dead, dead_err = orphan("torchrun-rank", True)
    plain, _ = orphan("plain", False)
    t0 = time.time()
    while not plain.exists() or not (dead.exists() or dead_err.read_text()):
        assert time.time() - t0 < 600, "neither process finished its imports in ten minutes"
        time.sleep(0.2)
    time.sleep(1)
    assert "torchrun, which started it, is gone; exiting" in dead_err.read_text() and not dead.exists()
    live = tmp_path / "live.alive"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc_per_node",
            "1",
            "--no-python",
            sys.executable,
            "-c",
            probe,
            str(live),
        ],
        cwd=ROOT,
        env=cpu_env(),
        check=True,
        timeout=300,
        capture_output=True,
    )
    assert live.read_text() == "alive"
