"""Shared fixtures: the embedded tiny checkpoint (built once per session) and a real `litgpt` subprocess runner; and
the rule of the layers: a test under a stage's folder (the unit layer) starts no child process."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

os.environ.setdefault("OMP_NUM_THREADS", "1")
"""One compute thread per process, for the test processes and every child they start (inherited): the suite runs
two workers on two cores, and torch's default (one OpenMP thread per core in each process) oversubscribes them;
OpenMP threads spin while they wait, burning the core another process needs. Three tiny `tunelab run`s at once on
this 2-core machine: 76 s at torch's default, 31 s at one thread each. Set OMP_NUM_THREADS to run otherwise."""


def _private_temp() -> Path:
    """A temp folder of this test process's own, made the temp folder of the process (``TMPDIR``, ``tempfile``) and so
    of every child it starts: what the suite's processes leave in a temp folder lands there, and the checks that
    nothing was written outside compare it (:func:`beside_checkout`), not the machine's shared temp folder, which
    other programs write to. Inductor keeps its compile cache where it was (its default under the shared folder)
    unless ``TORCHINDUCTOR_CACHE_DIR`` says otherwise."""
    import getpass
    import tempfile

    # the machine's temp folder as the first test process found it (xdist's workers inherit its TMPDIR)
    shared = Path(os.environ.setdefault("TUNELAB_TESTS_SHARED_TEMP", tempfile.gettempdir()))
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(shared / f"torchinductor_{getpass.getuser()}"))
    private = Path(tempfile.mkdtemp(prefix="tunelab-tests-", dir=shared))
    os.environ["TMPDIR"] = str(private)
    tempfile.tempdir = None  # gettempdir() reads TMPDIR again
    return private


PRIVATE_TEMP = _private_temp()
"""This test process's own temp folder (:func:`_private_temp`)."""
SHARED_TEMP = Path(os.environ["TUNELAB_TESTS_SHARED_TEMP"]).resolve()
"""The machine's temp folder, which other programs on a shared machine write to."""


UNIT_LAYER = ("core", "data", "plan", "run", "report", "tune", "cli", "repo")
"""The folders of the unit layer: one per stage of the package (``tests/plan/`` tests ``tunelab/plan/``), ``cli``
for commands run in-process (``tunelab_here``: refusals, printed JSON), ``repo`` for checks over the tree. Child-process
runs live in ``tests/e2e/``; the plan against rank 0's simulated step of real models at full width in
``tests/accuracy/``."""


LONGEST_FIRST = (
    "accuracy/test_ranks.py",
    "e2e/test_activations.py",
    "cli/test_hostile.py",
    "plan/test_advise.py",
    "plan/test_runtime.py",
    "e2e/test_fast.py",
    "e2e/test_distributed.py",
    "accuracy/test_simulate.py",
    "e2e/test_planner.py",
    "e2e/test_printed_commands.py",
)
"""Files of a minute or more of the default run (2026-11-28, fresh clone), collected first. pytest-xdist's
``--dist loadfile`` hands files to the workers in collection order as each frees up: the longest first leaves the
short ones for the end, so one core does not finish a long file alone while the other waits. Where two files plan
the same models, the one that traces them comes well before the other (plan/test_advise before the README's 7B
advise in printed commands; plan/test_runtime before plan-accuracy in e2e/test_planner), so their kernel templates
are traced once, not on both cores at once. Scheduling only: each file's own order is kept, and no file depends on
another having run."""


def pytest_unconfigure(config):
    """The private temp folder goes with the process that made it."""
    import shutil

    shutil.rmtree(PRIVATE_TEMP, ignore_errors=True)


def pytest_collection_modifyitems(config, items):
    first = {name: i for i, name in enumerate(LONGEST_FIRST)}

    def rank(item) -> int:
        path = Path(item.fspath)
        under = path.is_relative_to(ROOT / "tests")
        return first.get(path.relative_to(ROOT / "tests").as_posix(), len(first)) if under else len(first)

    items.sort(key=rank)  # stable: the rest in collection order, each file's own order kept


@pytest.fixture(autouse=True)
def _the_unit_layer_starts_no_process(request, monkeypatch):
    """Under a unit-layer folder, starting a child process (subprocess, multiprocessing) fails the test with where
    it belongs: what runs the real thing in a child goes to ``tests/e2e/``, so that the unit layer runs alone in a few
    minutes."""
    if Path(str(request.node.path)).parent.name not in UNIT_LAYER:
        yield
        return
    import multiprocessing.process

    def refuse(*args, **kwargs):
        raise AssertionError(f"{request.node.nodeid} starts a child process: its place is tests/e2e/")

    monkeypatch.setattr(subprocess.Popen, "__init__", refuse)
    monkeypatch.setattr(multiprocessing.process.BaseProcess, "start", refuse)
    yield


def cpu_env(**extra) -> dict:
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", PYTHONUNBUFFERED="1", JSONARGPARSE_DEPRECATION_WARNINGS="off")
    env.update(extra)
    return env


def tunelab_cli(*args, cwd=ROOT, timeout=120) -> subprocess.CompletedProcess:
    """The real ``tunelab`` CLI as a subprocess on CPU (arguments str()-ed), its output captured."""
    return subprocess.run(
        [sys.executable, "-m", "tunelab", *map(str, args)],
        cwd=cwd,
        env=cpu_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def tunelab_here(*args) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of ``tunelab ARGS`` run in this process (arguments str()-ed): the CLI's own code
    without a child's imports, for the unit layer; argparse's exits give their code."""
    import contextlib
    import io

    from tunelab import cli

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = cli.main([str(a) for a in args])
        except SystemExit as e:  # argparse's own exits
            code = e.code if isinstance(e.code, int) else 1
    return code, out.getvalue(), err.getvalue()


def one_line_problems(label: str, proc, fragment: str) -> str | None:
    """What is wrong with a refusal (None: nothing): a zero exit, a hang, a traceback or an "unexpected" line,
    more than one line, or a line without ``fragment``."""
    out = (proc.stdout + proc.stderr).strip()
    lines = [ln for ln in out.splitlines() if ln.strip()]
    problems = []
    if proc.returncode == 0:
        problems.append("exit 0")
    if "HANG" in out:
        problems.append("hang")
    if "Traceback" in out or "unexpected" in out:
        problems.append("traceback or unexpected")
    if len(lines) != 1:
        problems.append(f"{len(lines)} lines")
    if fragment not in out:
        problems.append(f"no {fragment!r}")
    return f"{label}: {', '.join(problems)}: {out[-400:]!r}" if problems else None


REFUSAL_HALVES = pytest.mark.parametrize(
    "half", ["tunelab's own", pytest.param("through litgpt", marks=pytest.mark.slow)]
)  # -m slow: the cases refused after litgpt's import (6 to 8 s of CPU each); CI keeps the cases tunelab refuses itself
"""The two halves of a refusal sweep, as the ``half`` parameter of its test (see ``refusals_of_half``)."""


def refusals_of_half(cases: list, through_litgpt: set, half: str, run, workers: int) -> None:
    """Run one half of a refusal sweep (``cases``: (label, argv, fragment); ``through_litgpt``: the labels of the
    cases refused after litgpt's import) with ``run(*argv)``, ``workers`` at a time; fail naming every case not
    refused in one line with its fragment, and every label of ``through_litgpt`` that names no case."""
    assert through_litgpt <= {label for label, _, _ in cases}, through_litgpt - {label for label, _, _ in cases}
    todo = [c for c in cases if (c[0] in through_litgpt) == (half == "through litgpt")]
    with ThreadPoolExecutor(max_workers=workers) as pool:
        results = list(pool.map(lambda c: run(*c[1]), todo))
    failures = [m for (label, _, frag), p in zip(todo, results) if (m := one_line_problems(label, p, frag))]
    assert not failures, "\n".join(failures)


@pytest.fixture(scope="session")
def tiny_ckpt(tmp_path_factory) -> Path:
    from tunelab import checkpoints

    return checkpoints.build("tiny", tmp_path_factory.mktemp("ckpt") / "tiny")


@pytest.fixture(scope="module")
def configs():
    """litgpt's Configs of TinyLlama and Llama 3.2 1B (a 32k and a 128k vocabulary): the simulated step's cases in
    tests/plan/test_simulate.py and tests/accuracy/test_simulate.py."""
    from litgpt import Config

    return {name: Config.from_name(name) for name in ("tiny-llama-1.1b", "Llama-3.2-1B")}


def run_litgpt(args: list[str], timeout: int = 300) -> subprocess.CompletedProcess:
    """Run the real `litgpt` CLI of this environment as a child process (``python -m litgpt``: the console script
    is not beside the interpreter when litgpt is installed with ``pip --target``), from the repository root."""
    return subprocess.run(
        [sys.executable, "-m", "litgpt", *args],
        cwd=ROOT,
        env=cpu_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def read_metrics(out_dir: Path) -> list[dict]:
    files = sorted(Path(out_dir).glob("logs/csv/version_*/metrics.csv"))
    assert files, f"no metrics.csv under {out_dir}"
    with open(files[-1], newline="") as f:
        return list(csv.DictReader(f))


def equal_length_dataset(ckpt: Path, path: Path, n: int = 40) -> Path:
    """Records whose prompt + response have one token count, so no micro batch has padding or a different
    number of target tokens (litgpt averages the loss per micro batch, then over the accumulation steps)."""
    from litgpt.prompts import Alpaca
    from litgpt.tokenizer import Tokenizer

    from tunelab.data import alpaca as data

    tok, style = Tokenizer(ckpt), Alpaca()
    by_len: dict[int, list] = {}
    for r in data.generate(3000, seed=7):
        length = len(tok.encode(style.apply(r["instruction"], input=r["input"]) + r["output"], eos=True))
        by_len.setdefault(length, []).append(r)
    records = max(by_len.values(), key=len)
    assert len(records) >= n, "not enough equal-length records"
    path.write_text(json.dumps(records[:n]))
    return path


def beside_checkout() -> set:
    """What a test compares before and after to show that a command wrote nothing outside: the names in the
    checkout's own ``reports/`` and ``runs/`` (a command under test that runs writes into its temp folder, never
    into the repository), in the checkout's parent (unless that is the machine's shared temp folder, which other programs write to: a CI clone in
    /tmp) and in this process's private temp folder (:data:`PRIVATE_TEMP`), less the temporaries torch, Python and
    gcc make there for the suite's own processes (torchrun's torchelastic_*, multiprocessing's pymp-*, inductor's
    C++ builds)."""
    import re

    def listed(folder: Path, tag: str) -> set:
        names = {n for n in os.listdir(folder) if not n.startswith(("torchelastic_", "pymp-", "tmp", "torchinductor_"))}
        return {f"{tag}{n}" for n in names if not re.fullmatch(r"cc[A-Za-z0-9]{6}(\.\w+)+", n)}

    parent = set() if ROOT.parent.resolve() == SHARED_TEMP else listed(ROOT.parent, "")
    own = set().union(*(listed(ROOT / d, f"{d}/") for d in ("reports", "runs") if (ROOT / d).is_dir()))
    return parent | own | listed(PRIVATE_TEMP, "temp/")


@pytest.fixture
def link_table(monkeypatch, tmp_path):
    """Make ``configs/hardware/links.yaml`` read as the text given (``link_table(text)``), the table's cache cleared
    before and after."""
    from tunelab.plan.model import comm

    def use(text: str) -> None:
        links = tmp_path / "links.yaml"
        links.write_text(text)
        monkeypatch.setattr(comm, "LINK_TABLE", links)
        comm.table.cache_clear()

    yield use
    comm.table.cache_clear()
