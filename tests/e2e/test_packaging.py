"""`pip install .` (a wheel, not editable) gives a working tunelab outside the checkout: the package, its
multi-device loop, and the recipes, configs and data it reads."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import ROOT, cpu_env


@pytest.mark.slow  # 40 s on 2 cores (a wheel built and installed in a fresh environment); CI installs the
# project editable (.ci/run)
def test_the_wheel_works_outside_the_checkout(tmp_path):
    """The wheel is built from this checkout and installed alone into an empty directory (its dependencies come
    from the test's environment: no network here); every command then runs from a directory that is not the
    checkout, so nothing can be read from the source tree."""
    wheels, site, work = tmp_path / "wheels", tmp_path / "site", tmp_path / "work"
    work.mkdir()
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(wheels), str(ROOT)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    (wheel,) = wheels.glob("tunelab-*.whl")
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(site), str(wheel)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    env = cpu_env(PYTHONPATH=str(site), TUNELAB_HOME=str(tmp_path / "home"))

    def tunelab(*args):
        return subprocess.run(
            [sys.executable, "-m", "tunelab", *args], cwd=work, env=env, capture_output=True, text=True, timeout=300
        )

    where = subprocess.run(
        [
            sys.executable,
            "-c",
            "import tunelab.paths as p, tunelab.run.loop as t; print(p.__file__, p.INSTALLED, t.__name__)",
        ],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert where.returncode == 0, where.stderr
    path, installed, _ = where.stdout.split()
    assert path.startswith(str(site)) and installed == "True"

    ls = tunelab("ls", "--json")
    assert ls.returncode == 0, ls.stderr
    assert len(json.loads(ls.stdout)) == len(list((ROOT / "recipes").glob("*/*.yaml")))
    plan = tunelab("plan", "open-llama-7b/lora", "--gpu", "A100-80GB", "--strategy", "fsdp-no-wrap", "--json")
    assert plan.returncode == 0, plan.stderr
    assert json.loads(plan.stdout)["fits"] is True
    valid = tunelab("validate", "tiny-llama-1.1b/lora")  # the shipped data file is found inside the package
    assert valid.returncode == 0 and "ok  tiny-llama-1.1b/lora" in valid.stdout, valid.stdout + valid.stderr
    acc = tunelab("plan-accuracy")
    assert acc.returncode == 0, acc.stderr
    assert (work / "reports" / "planner-accuracy" / "accuracy.md").is_file()  # outputs go where the user is
    assert not list(site.glob("tunelab/_files/reports"))
    shipped = site / "tunelab" / "_files" / "configs" / "published"  # each check set with the YAMLs its rows plan
    assert (shipped / "litgpt-resource-tables" / "lora.yaml").is_file()
    assert (shipped / "litgpt-config-hub" / "tiny-llama" / "lora.yaml").is_file()
    assert (shipped.parent / "measured" / "alpaca-lengths.yaml").is_file()  # the lengths every plan's tokens scale by


def test_importing_the_plan_model_loads_no_torch_nor_litgpt():
    """Every module of plan/model/ imported in a fresh interpreter: neither torch, litgpt nor numpy is loaded (the
    model computes from typed inputs; tracing is plan/trace/'s)."""
    code = (
        "import importlib, pkgutil, sys, tunelab.plan.model as m\n"
        "[importlib.import_module('tunelab.plan.model.' + x.name) for x in pkgutil.iter_modules(m.__path__)]\n"
        "print(len(list(pkgutil.iter_modules(m.__path__))), sorted({k.split('.')[0] for k in sys.modules} & "
        "{'torch', 'litgpt', 'numpy'}))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, env=cpu_env())
    assert out.returncode == 0, out.stderr
    count, loaded = out.stdout.split(" ", 1)
    assert int(count) >= 9 and loaded.strip() == "[]", out.stdout
