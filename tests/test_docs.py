"""The repository explains itself: every relative link in README.md, ARCHITECTURE.md and
docs/ resolves to a file of the repository (and, with an anchor, to a heading in it), and
nothing points at material outside the repository."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PAGES = [REPO / "README.md", REPO / "ARCHITECTURE.md", *sorted((REPO / "docs").glob("*.md"))]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def anchors(page: Path) -> set[str]:
    """GitHub's anchors of a page's headings."""
    found = set()
    for line in page.read_text().splitlines():
        if line.startswith("#"):
            title = line.lstrip("#").strip().lower()
            title = re.sub(r"[^\w\- ]", "", title.replace("`", ""))
            found.add(title.replace(" ", "-"))
    return found


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_relative_links_resolve(page: Path) -> None:
    broken = []
    for target in LINK.findall(page.read_text()):
        if re.match(r"^[a-z]+:", target):  # https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        linked = (page.parent / path).resolve() if path else page
        if not linked.exists() or REPO not in (linked, *linked.parents):
            broken.append(f"{target}: no such file in the repository")
        elif anchor and linked.suffix == ".md" and anchor not in anchors(linked):
            broken.append(f"{target}: no heading #{anchor} in {linked.relative_to(REPO)}")
    assert not broken, f"{page.relative_to(REPO)}:\n" + "\n".join(broken)


def test_nothing_points_outside_the_repository() -> None:
    sources = [*PAGES, *sorted((REPO / "lifecycle").rglob("*.py")),
               REPO / "pyproject.toml"]
    outside = [f"{p.relative_to(REPO)}:{n}" for p in sources
               for n, line in enumerate(p.read_text().splitlines(), 1)
               if "../shared" in line or "shared/seeds" in line or "shared/domain" in line]
    assert not outside, outside


def test_no_merge_conflict_is_left_in_the_sources() -> None:
    """A conflict resolved in a hurry leaves its markers where no parser looks (a page)."""
    sources = [*PAGES, *sorted((REPO / "lifecycle").rglob("*.py")),
               *sorted((REPO / "tests").rglob("*.py")), *sorted((REPO / "benchmarks").glob("*.py")),
               *sorted((REPO / "migrations").rglob("*.py")), REPO / "pyproject.toml",
               REPO / "Makefile"]
    markers = ("<<<<<<< ", ">>>>>>> ", "||||||| ")
    left = [f"{p.relative_to(REPO)}:{n}" for p in sources
            for n, line in enumerate(p.read_text().splitlines(), 1)
            if line.startswith(markers) or line == "======="]
    assert not left, left
