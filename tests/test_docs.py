"""The README's layout table matches the tree."""

from __future__ import annotations

from tests.conftest import ROOT


def test_readme_layout_names_every_module_and_top_level_folder():
    readme = (ROOT / "README.md").read_text()
    table = readme[readme.index("## Layout"):readme.index("## The recipes")]
    modules = [p.name for p in (ROOT / "tunelab").glob("*.py") if not p.name.startswith("__")]
    missing = [m for m in modules if f"`{m}`" not in table]
    assert not missing, f"README layout lacks {missing}"
    for folder in ("recipes/", "configs/", "data/", "scripts/", "reports/", "tests/", "tunelab/"):
        assert folder in table, folder
    assert "configs/lab" not in table and (ROOT / "configs" / "lab").exists() is False
