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
    assert len(readme.splitlines()) <= 120
    for page in re.findall(r"\]\((docs/[\w-]+\.md)", readme):
        assert (ROOT / page).is_file(), page


def pages() -> list:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def test_every_line_of_the_readme_and_the_docs_fits_120_characters():
    """Tables with long cells are lists; long commands are broken; nothing is read sideways."""
    long = [
        f"{page.relative_to(ROOT)}:{n} ({len(line)})"
        for page in pages()
        for n, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1)
        if len(line) > 120
    ]
    assert not long, long


DOC_WORDS_CEILING = 12_000
"""The README and docs together, in words: at most 12,000 (an hour's read; the rest in the reports)."""
PLANNER_WORDS_CEILING = 3_000
"""docs/planner.md in words: at most 3,000 (the model's terms, equations, weak spots; figures in the reports)."""
LONG_DOCSTRINGS_CEILING = 0
"""Module docstrings over 12 lines: none (the rest in docs/)."""


def test_the_docs_and_the_docstrings_only_shrink_toward_their_caps():
    import ast

    words = sum(len(page.read_text(encoding="utf-8").split()) for page in pages())
    assert words <= DOC_WORDS_CEILING, words
    assert len((ROOT / "docs" / "planner.md").read_text(encoding="utf-8").split()) <= PLANNER_WORDS_CEILING
    long = [
        path
        for path in (ROOT / "tunelab").rglob("*.py")
        if len((ast.get_docstring(ast.parse(path.read_text(encoding="utf-8")), clean=False) or "").splitlines()) > 12
    ]
    assert len(long) <= LONG_DOCSTRINGS_CEILING, sorted(str(p.relative_to(ROOT)) for p in long)
