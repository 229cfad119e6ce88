"""Every command the project prints for a user to type is run by a test (tests/printed.py says where they are
printed): here, or by the test named in RULES, which runs it and lists it in its module's PRINTED. Where this
2-core CPU machine without a GPU or network cannot run a command as printed, the rule says what its CPU variant
changes and why; the few that cannot run at all say why and check what can be checked. A printed command no rule
matches fails, and so does a rule no printed command uses: docs and tests change together.

Sample outputs the README shows after `$ tunelab ls` and `$ tunelab plan ...` are compared with what the commands
print now (`...` elides lines, `<- ...` is an annotation)."""

from __future__ import annotations

import contextlib
import glob
import io
import re
import shlex
import subprocess
import sys
import tarfile
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests import printed
from tests.conftest import ROOT, cpu_env, tunelab_here


@dataclass(frozen=True)
class Rule:
    pattern: str
    """A regular expression the whole printed command matches."""
    how: str
    """'here' (test_printed_command_runs), 'here, slow' (the same behind the slow marker), a test module whose
    PRINTED lists the command ('by tests/e2e/test_x.py'), or 'not run'."""
    why: str
    """What the CPU variant changes and why; for 'not run', why and what is checked instead."""


RULES = [
    Rule(r"tunelab ls", "here", "as printed"),
    Rule(r"tunelab show \S+", "here", "as printed"),
    Rule(r"tunelab validate .*", "here", "as printed (a glob expanded as the shell would)"),
    Rule(r"tunelab plan .*", "here", "as printed"),
    Rule(r"tunelab advise .*", "here", "as printed"),
    Rule(r"tunelab build-model tiny", "here", "as printed (it builds into the checkout's .tunelab/ cache)"),
    Rule(
        r"tunelab build-model open_llama_7b --device cuda",
        "here",
        "7B parameters of float32 random weights (27 GB) exceed this machine's 24 GiB and it has no CUDA: the same "
        "code path (a litgpt config name -> random weights + the benchmark tokenizer) with pythia-14m on CPU",
    ),
    Rule(
        r"tunelab report runs/lab-part1",
        "here",
        "the records of the committed H100 sweep (reports/2026-11-23-lab-part1-h100/records.tgz) stand in for "
        "runs/lab-part1, the report goes to a temporary folder",
    ),
    Rule(
        r"tunelab run tiny-llama-1\.1b/lora --train\.max_steps 4",
        "by tests/e2e/test_runner.py",
        "as printed (the tiny model on CPU), its run directory in a temporary folder, 2 validation batches",
    ),
    Rule(
        r"tunelab run tiny-llama-1\.1b/full --strategy fast --devices 1",
        "by tests/e2e/test_fast.py",
        "the tiny model on CPU for 6 steps, 2 validation batches",
    ),
    Rule(
        r"tunelab bench tiny-llama-1\.1b/full --pairs 1 --train\.max_steps 8",
        "by tests/e2e/test_bench.py",
        "as printed on the tiny model, records and report in a temporary folder",
    ),
    Rule(
        r"tunelab bench tiny-llama-1\.1b/full --weights random --pairs 3 --best-micro --gpu H100-SXM",
        "not run",
        "TinyLlama's random weights and a batch-size search need a GPU; the same code path (tune-batch per arm, then "
        "a pair at each arm's best) runs on the tiny model in tests/e2e/test_bench.py (slow marker, micro capped at 2)",
    ),
    Rule(
        r"tunelab run \S+( --strategy \S+ --devices 4)?",
        "by tests/e2e/test_distributed.py",
        "2 CPU processes over gloo instead of 4 GPUs, the tiny checkpoint, fp32 and a fixed global batch so that the "
        "loss curve can be compared with the single-device run",
    ),
    Rule(
        r"tunelab sweep configs/sweeps/lab-part1\.yaml( --weights random)?",
        "by tests/e2e/test_gpu_runbook.py",
        "the runbook's rehearsal runs this sweep with the tiny model (not random weights of 1.1B-13B models) for "
        "3 steps, TinyLlama's rows",
    ),
    Rule(
        r"OUT=\S+ bash scripts/gpu/runbook\.sh env tiny",
        "by tests/e2e/test_gpu_runbook.py",
        "TUNELAB_REHEARSAL=1: the same stages with the tiny model, OUT a temporary folder",
    ),
    Rule(
        r"tunelab tune-batch tiny-llama-1\.1b/full --gpu H100-SXM",
        "here",
        "the tiny model, micro batches up to 2, 2 steps per probe (the planner's H100 start, 47, is capped)",
    ),
    Rule(
        r"tunelab tune-study lab-part3 --only cpu-example",
        "by tests/e2e/test_tune_study.py",
        "every setting capped at micro batch 1 (one probe each)",
    ),
    Rule(
        r"tunelab tune-study lab-part3 --only tiny-llama-1\.1b-full --weights random",
        "here, slow",
        "the tiny model instead of TinyLlama's random weights, micro batch 1 (3 probes, ~35 s: slow marker)",
    ),
    Rule(
        r"litgpt download \S+",
        "here",
        "no model hub here: litgpt's own parser reads the command (--print_config) and the repo is where a "
        "recipe's checkpoint_dir points",
    ),
    Rule(
        r"litgpt finetune_(full|lora) --config recipes/\S+\.yaml.*",
        "by tests/e2e/test_train_cpu.py",
        "parsed here by the pinned litgpt's parser as printed; trained on the tiny model by "
        "test_recipe_trains_on_cpu (the show line + the Override's arguments, which hold every README variant's)",
    ),
    Rule(
        r'litgpt finetune_lora --config recipes/tiny-llama-1\.1b/lora\.yaml .* "\$\(tunelab build-model tiny\)"',
        "by tests/e2e/test_docs.py",
        "run through bash as printed, --out_dir in a temporary folder",
    ),
    Rule(
        r"bash scripts/setup\.sh",
        "not run",
        "installs torch and the pinned stack from the package registry (a minute or more); CI installs with the "
        "same pip commands (checked here against .ci/run)",
    ),
    Rule(r"ruff (check|format --check) \.", "here", "as printed: lint and format of the checkout"),
    Rule(r"\. \.venv/bin/activate", "not run", "a shell built-in for the user's shell; the suite runs inside it"),
    Rule(r"python -m pytest -q( -n 2 --dist loadfile)?", "not run", "the suite itself"),
    Rule(
        r"sbatch scripts/slurm/tunelab-multinode\.sbatch \S+ \S+",
        "not run",
        "needs a SLURM cluster; its torchrun launch across nodes is run by tests/e2e/test_distributed.py "
        "(two nodes on localhost); here: bash -n and the recipe and strategy it names exist",
    ),
    Rule(
        r"bash scripts/gpu/fetch_wheels\.sh",
        "not run",
        "downloads 48 MB of wheels from the registry; tests/e2e/test_gpu_runbook.py checks the list it downloads "
        "against the GPU image's packages; here: bash -n",
    ),
]


def rule_for(command: str) -> Rule | None:
    # the most specific rule wins: the last one that matches (the by-hand README line before the generic one)
    matching = [r for r in RULES if re.fullmatch(r.pattern, command)]
    return matching[-1] if matching else None


PRINTED = printed.everything()
HERE = sorted({p.command for p in PRINTED if (r := rule_for(p.command)) and r.how.startswith("here")})


def _delegate_module(rule: Rule):
    import importlib

    return importlib.import_module(rule.how.split("by ", 1)[1].removesuffix(".py").replace("/", "."))


def test_every_printed_command_has_a_rule_and_every_rule_a_command():
    assert len(PRINTED) > 60 and {p.source.split()[0] for p in PRINTED} >= {
        "README.md",
        "tunelab",
        "recipes/tiny-llama-1.1b/full.yaml",
    }
    unmatched = sorted({f"{p.source}: {p.command}" for p in PRINTED if rule_for(p.command) is None})
    assert not unmatched, "printed commands no rule runs (add one to RULES):\n" + "\n".join(unmatched)
    unused = [r.pattern for r in RULES if not any(rule_for(p.command) is r for p in PRINTED)]
    assert not unused, f"rules no printed command uses (remove them): {unused}"
    for p in PRINTED:
        rule = rule_for(p.command)
        assert rule.why, rule
        if rule.how.startswith("by "):
            assert any(_covers(c, p.command) for c in _delegate_module(rule).PRINTED), (p.source, p.command, rule.how)


def _covers(run: str, command: str) -> bool:
    """``run`` is ``command`` or ``command`` with more arguments after it (every `--key value` of it, in run)."""
    if run == command:
        return True
    a, b = printed.split(run), printed.split(command)
    if a[:4] != b[:4]:  # litgpt finetune_x --config FILE
        return False
    pairs = {(x, y) for x, y in zip(a, a[1:]) if x.startswith("--")}
    return all((x, y) in pairs for x, y in zip(b[4:], b[5:]) if x.startswith("--"))


def test_setup_sh_installs_as_ci_does_and_the_scripts_not_run_parse():
    def pip_lines(path: Path) -> list[str]:
        return [ln.strip() for ln in path.read_text().splitlines() if ln.strip().startswith("python -m pip install")]

    assert pip_lines(ROOT / "scripts" / "setup.sh") == pip_lines(ROOT / ".ci" / "run") != []
    for script in ("scripts/slurm/tunelab-multinode.sbatch", "scripts/gpu/fetch_wheels.sh", "scripts/setup.sh"):
        assert subprocess.run(["bash", "-n", str(ROOT / script)]).returncode == 0, script
    from tunelab.recipes import resolve
    from tunelab.strategies import load_strategy

    for p in PRINTED:
        if p.command.startswith("sbatch "):
            _, _, recipe, strategy = p.command.split()
            resolve(recipe)
            load_strategy(strategy)


def _tunelab(argv: list[str]) -> tuple[int, str]:
    rc, out, _ = tunelab_here(*argv)
    return rc, out


def _samples() -> dict[str, list[str]]:
    """The docs' `$ command` sample outputs: command -> its lines (`...` dropped, `<- ...` annotations cut), every
    page's sample of one command together."""
    text = "\n".join((ROOT / page).read_text() for page in printed.DOCS)
    found: dict[str, list[str]] = {}
    for body in re.findall(r"^[ \t]*```text\n(.*?)^[ \t]*```", text, re.M | re.S):
        current = None
        for line in body.splitlines():
            if line.strip().startswith("$ "):
                current = " ".join(line.strip()[2:].split())
                found.setdefault(current, [])
            elif current and line.strip() and line.strip() != "...":
                found[current].append(" ".join(line.split("<-")[0].split()))
    return found


def _check_sample(command: str, out: str) -> None:
    sample = _samples().get(command)
    if sample:
        printed_now = {" ".join(ln.split()) for ln in out.splitlines()}
        stale = [ln for ln in sample if ln not in printed_now]
        assert not stale, f"the docs' sample of `{command}` is not what it prints now: {stale}"


@pytest.mark.parametrize(
    "command", [pytest.param(c, marks=pytest.mark.slow) if rule_for(c).how == "here, slow" else c for c in HERE]
)
def test_printed_command_runs(command, tmp_path):
    argv = shlex.split(command)
    if argv[0] == "litgpt":
        return _litgpt_download(argv)
    if argv[0] == "ruff":
        p = subprocess.run(
            [sys.executable, "-m", "ruff", *argv[1:]], cwd=ROOT, capture_output=True, text=True, timeout=300
        )
        assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-1000:]
        return
    argv = argv[1:]
    if argv[0] == "validate":
        argv = [x for a in argv for x in (sorted(glob.glob(a, root_dir=ROOT)) if "*" in a else [a])]
        rc, out = _tunelab(argv)
        assert rc == 0 and "error" not in out, out
    elif argv[0] in ("ls", "show", "plan", "advise"):
        rc, out = _tunelab(argv)
        assert rc == 0 and out.strip(), out
        _check_sample(command, out)
        if argv[0] == "show":
            assert "# launch:   litgpt finetune_" in out and "# on the tiny model (CPU): litgpt" in out
    elif argv[:2] == ["build-model", "tiny"]:
        rc, out = _tunelab(argv)
        assert rc == 0 and (Path(out.strip().splitlines()[-1]) / "model_config.yaml").is_file(), out
    elif argv[0] == "build-model":  # see RULES: pythia-14m on CPU
        rc, out = _tunelab(["build-model", "pythia-14m", "--out", str(tmp_path / "m")])
        assert rc == 0 and (tmp_path / "m" / "lit_model.pth").is_file(), out
    elif argv[0] == "report":
        with tarfile.open(ROOT / "reports" / "2026-11-23-lab-part1-h100" / "records.tgz") as tar:
            tar.extractall(tmp_path, filter="data")
        rc, out = _tunelab(["report", str(tmp_path / "lab-part1"), "--out", str(tmp_path / "report")])
        assert rc == 0, out
        md = (tmp_path / "report" / "results.md").read_text()
        assert "NVIDIA H100" in md and "| s4 | tiny-llama-1.1b/full | bf16-true |" in md
    else:  # tune-batch, tune-study: child processes, through the real CLI
        extra = {
            "tune-batch": [
                "--model",
                "tiny",
                "--max-micro",
                "2",
                "--steps",
                "2",
                "--data.num_workers",
                "0",
                "--out",
                str(tmp_path / "tb"),
            ],
            "tune-study": ["--model", "tiny", "--max-micro", "1", "--out", str(tmp_path / "ts"), "--no-report"],
        }
        argv = [a for a in argv if a not in ("--weights", "random")] if argv[0] == "tune-study" else argv
        p = subprocess.run(
            [sys.executable, "-m", "tunelab", *argv, *extra[argv[0]]],
            cwd=ROOT,
            env=cpu_env(),
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]
        if argv[0] == "tune-batch":
            assert "largest micro batch that fits: 2" in p.stdout, p.stdout
        else:
            assert p.stdout.count("largest micro batch that fits: 1") == 3, p.stdout


def _litgpt_download(argv: list[str]) -> None:
    """litgpt's own CLI parses the printed command (no download: --print_config), in this process."""
    from unittest import mock

    from litgpt.__main__ import main

    from tunelab.recipes import discover

    buf = io.StringIO()
    with (
        mock.patch.object(sys, "argv", [*argv, "--print_config"]),
        contextlib.redirect_stdout(buf),
        pytest.raises(SystemExit) as done,
    ):
        main()
    assert done.value.code in (0, None) and f"repo_id: {argv[2]}" in buf.getvalue(), buf.getvalue()
    assert any(r.get("checkpoint_dir") == f"checkpoints/{argv[2]}" for r in discover()), argv


@pytest.mark.parametrize("command", sorted({p.command for p in PRINTED if p.command.startswith("litgpt finetune_")}))
def test_printed_litgpt_line_is_accepted_by_litgpts_parser(command, tiny_ckpt):
    """As printed (the tiny checkpoint in place of `$(tunelab build-model tiny)`): litgpt's parser of the pinned
    command accepts it, and tunelab's rules find no error in it for the GPU the recipe's header names."""
    from tunelab.recipes import resolve
    from tunelab.validate import check

    argv = printed.split(command, tiny_ckpt)
    recipe = resolve(argv[3])
    assert argv[1] == recipe.command
    gpu = re.search(r"^# Check: .*--gpu (\S+)", recipe.path.read_text(), re.M).group(1)
    on_cpu = "--precision" in argv and argv[argv.index("--precision") + 1] == "32-true"
    result = check(recipe, argv[4:], gpu=None if on_cpu else gpu, device="cpu" if on_cpu else None)
    errors = [str(p) for p in result.problems if p.severity == "error"]
    assert result.resolved is not None and not errors, errors
