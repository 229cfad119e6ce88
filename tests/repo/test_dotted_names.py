"""Every dotted ``tunelab.`` name the docs and the package's docstrings give resolves to a module, a function, a class,
an attribute or a dataclass field of today's code: a name that moved or no longer exists fails here."""

from __future__ import annotations

import ast
import dataclasses
import importlib
import re

from tests.conftest import ROOT

NAME = re.compile(r"\btunelab(?:\.[A-Za-z_][A-Za-z0-9_]*)+")


def _texts() -> list[tuple[str, str]]:
    """(where, text) of every doc page and every docstring and string statement of the package."""
    out = [
        (str(p.relative_to(ROOT)), p.read_text()) for p in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    ]
    for path in sorted((ROOT / "tunelab").rglob("*.py")):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Expr)
                and isinstance(node.value, ast.Constant)
                and isinstance(node.value.value, str)
            ):
                out.append((str(path.relative_to(ROOT)), node.value.value))
    return out


def resolves(name: str) -> bool:
    """Whether ``name`` is an importable module or an attribute path below one (a dataclass field counts)."""
    parts = name.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for attr in parts[i:]:
            fields = {f.name for f in dataclasses.fields(obj)} if dataclasses.is_dataclass(obj) else set()
            if attr in fields and not hasattr(obj, attr):
                return attr == parts[-1]  # a field without a class default: nothing below it to follow
            if not hasattr(obj, attr):
                return False
            obj = getattr(obj, attr)
        return True
    return False


def test_every_dotted_name_resolves():
    stale = sorted({(where, name) for where, text in _texts() for name in NAME.findall(text) if not resolves(name)})
    assert not stale, stale


def test_a_moved_name_is_caught():
    assert resolves("tunelab.run.runner.Progress") and resolves("tunelab.record.RankStats.driver_allocs")
    assert not resolves("tunelab.runner.Progress") and not resolves("tunelab.tune_batch.variant_name")
