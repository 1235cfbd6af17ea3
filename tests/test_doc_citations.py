"""Every test the documentation cites (``test_file.py::test_name``, or a test file alone,
``tests/test_file.py``) exists: a renamed test must take its citations along."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CITATION = re.compile(r"(test_\w+\.py)::(test_\w+)")
FILE = re.compile(r"\b(test_\w+\.py)\b")


def _pages() -> list[Path]:
    return sorted([ROOT / "README.md", ROOT / "ARCHITECTURE.md", *(ROOT / "docs").rglob("*.md")])


def _defined(module: Path) -> set[str]:
    tree = ast.parse(module.read_text())
    return {node.name for node in ast.walk(tree)
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)}


def test_every_cited_test_exists() -> None:
    cited = [(page.relative_to(ROOT), module, name) for page in _pages()
             for module, name in CITATION.findall(page.read_text())]
    assert len(cited) > 50, "the citations were not found: has their form changed?"
    defined: dict[str, set[str]] = {}
    missing = []
    for page, module, name in cited:
        path = ROOT / "tests" / module
        if module not in defined:
            defined[module] = _defined(path) if path.exists() else set()
        if name not in defined[module]:
            missing.append(f"{page}: {module}::{name}")
    assert missing == [], "cited tests that do not exist:\n" + "\n".join(missing)


def test_every_cited_test_file_exists() -> None:
    cited = {(page.relative_to(ROOT), module) for page in _pages()
             for module in FILE.findall(page.read_text())}
    assert len({module for _, module in cited}) > 20, "the citations were not found"
    missing = sorted(f"{page}: {module}" for page, module in cited
                     if not (ROOT / "tests" / module).exists())
    assert missing == [], "cited test files that do not exist:\n" + "\n".join(missing)
