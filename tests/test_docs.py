"""The repository explains itself: every relative link in README.md, ARCHITECTURE.md and
docs/ resolves to a file of the repository (and, with an anchor, to a heading in it), and
nothing points at material outside the repository. The documentation site (mkdocs.yml)
shows every page of docs/, and the README stays a short way into it."""

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


def _nav_pages(entries: object) -> list[str]:
    """The pages named in a MkDocs nav (a list of pages, {title: page} or {title: [...]})."""
    if isinstance(entries, str):
        return [entries]
    if isinstance(entries, list):
        return [page for entry in entries for page in _nav_pages(entry)]
    if isinstance(entries, dict):
        return [page for value in entries.values() for page in _nav_pages(value)]
    raise AssertionError(f"not a nav entry: {entries!r}")


SITE_ONLY = {"architecture.md", "machines/README.md"}
"""The site's pages that mkdocs_hooks.py adds from outside docs/: ARCHITECTURE.md and
diagrams/README.md."""


def test_the_site_shows_every_page_of_docs() -> None:
    """Every page in docs/ is in mkdocs.yml's nav, and the nav names no page that is not there
    (but SITE_ONLY). `make docs` fails on either too; this says so in `make test`, where a
    new page is usually written."""
    import yaml

    config = yaml.safe_load((REPO / "mkdocs.yml").read_text())
    nav = _nav_pages(config["nav"])
    assert len(nav) == len(set(nav)), f"a page is in the nav twice: {nav}"
    pages = {p.name for p in (REPO / "docs").glob("*.md")} | SITE_ONLY
    assert sorted(pages - set(nav)) == [], "pages of docs/ missing from mkdocs.yml's nav"
    assert sorted(set(nav) - pages) == [], "mkdocs.yml's nav names pages docs/ does not have"


def test_the_readme_stays_short_and_opens_the_site() -> None:
    """The README is the way in: the quick start, what lifecycle is, a first example, and
    links into the site, whose home (docs/README.md) links to every page; the rest lives in
    docs/."""
    text = (REPO / "README.md").read_text()
    assert len(text.splitlines()) <= 250, "README.md has grown past 250 lines: move to docs/"
    opening = text.split("\n## ")[0]
    assert "$ make demo" in opening and "$ make test" in opening
    assert "docs/README.md" in LINK.findall(text)
    home = REPO / "docs" / "README.md"
    linked = {(home.parent / target.partition("#")[0]).resolve()
              for target in LINK.findall(home.read_text())}
    pages = {p.resolve() for p in (REPO / "docs").glob("*.md") if p != home}
    pages.add((REPO / "ARCHITECTURE.md").resolve())
    unlinked = sorted(p.name for p in pages - linked)
    assert unlinked == [], f"pages the site's home (docs/README.md) does not link to: {unlinked}"
