"""The docs match the tree: the module map, the README's layout and links, no pointer outside the project."""

from __future__ import annotations

import re

from tests.conftest import ROOT


def test_the_module_map_names_every_module_and_the_readme_every_folder():
    """docs/architecture.md's module map names every module of the package; the README's layout every top-level
    folder; the README stays a five-minute read."""
    arch = (ROOT / "docs" / "architecture.md").read_text()
    modules = [
        str(p.relative_to(ROOT))
        for p in (ROOT / "tunelab").rglob("*.py")
        if not (p.parent.name == "cli" and p.stem not in ("__init__", "common"))
        and not (p.name == "__init__.py" and p.parent.name != "cli")
    ]  # a package's docstring only
    missing = [m for m in modules if f"`{m}`" not in arch]
    assert not missing, f"docs/architecture.md lacks {missing}"
    readme = (ROOT / "README.md").read_text()
    table = readme[readme.index("## Layout") :]
    for folder in ("recipes/", "configs/", "data/", "docs/", "scripts/", "reports/", "tests/", "tunelab/"):
        assert f"`{folder}" in table, folder
    assert len(readme.splitlines()) <= 150
    for page in re.findall(r"\]\((docs/[\w-]+\.md)", readme):
        assert (ROOT / page).is_file(), page
