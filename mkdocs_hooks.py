"""MkDocs hooks for lifecycle's documentation site (mkdocs.yml names this file).

The pages in docs/ are written to read on GitHub as well as in the site, so their links are
relative paths in the repository: to another page (``glossary.md#fence``), and to files
outside docs/ (``../tests/test_readme.py``, ``../ARCHITECTURE.md``). The site keeps the
first, and these hooks take care of the second:

- ARCHITECTURE.md, at the repository's top, is a page of the site (``architecture.md``),
  and so are the diagrams of the built-in machines (``diagrams/``, as ``machines/``, with
  each SVG shown): read from where they are, their links turned into the site's.
- A link to any other file of the repository goes to that file in the repository on the web
  (``repo_url`` in mkdocs.yml); while the project names none, the link becomes its text
  with the file's path.
- A link to a file the repository does not have is a warning, which ``mkdocs build
  --strict`` turns into a failed build (broken links inside the site MkDocs finds itself).
"""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path
from typing import Any

import griffe
from mkdocs.structure.files import File, Files

REPO = Path(__file__).resolve().parent
INCLUDED = {"ARCHITECTURE.md": "architecture.md", "diagrams": "machines"}
"""Files and folders outside docs/ that are part of the site: repository path -> site path
(tests/test_docs.py knows the pages too)."""
SVG_LINK = re.compile(r"^\[SVG\]\((\w+)\.svg\)")

LINK = re.compile(r"(!?)\[([^\]]*)\]\(([^)\s]+)\)")
FENCE = re.compile(r"^\s*(```|~~~)")
log = logging.getLogger("mkdocs.hooks.lifecycle")


def _included() -> dict[Path, str]:
    """Each file of the repository that the site includes -> its path in the site."""
    found = {}
    for source, target in INCLUDED.items():
        path = REPO / source
        for file in sorted(path.iterdir()) if path.is_dir() else [path]:
            found[file.resolve()] = f"{target}/{file.name}" if path.is_dir() else target
    return found


def on_files(files: Files, config: Any) -> Files:
    for path, target in _included().items():
        files.append(File.generated(config, target, abs_src_path=str(path)))
    return files


def on_page_markdown(markdown: str, page: Any, config: Any, files: Files) -> str:
    docs = Path(config["docs_dir"]).resolve()
    source = Path(page.file.abs_src_path).resolve()
    here = (docs / page.file.src_uri).parent  # where the page is in the site
    included = _included()

    def rewrite(match: re.Match[str]) -> str:
        bang, text, target = match.groups()
        if re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
            return match[0]
        path, _, anchor = target.partition("#")
        linked = (source.parent / path).resolve()
        if docs in (linked, *linked.parents):
            relative = os.path.relpath(linked, here)
        elif linked in included:
            relative = os.path.relpath(docs / included[linked], here)
        elif REPO in (linked, *linked.parents) and linked.exists():
            in_repo = linked.relative_to(REPO).as_posix()
            if config.get("repo_url"):
                kind = "tree" if linked.is_dir() else "blob"
                url = f"{config['repo_url'].rstrip('/')}/{kind}/main/{in_repo}"
                return f"{bang}[{text}]({url}{'#' + anchor if anchor else ''})"
            return text if in_repo in text else f"{text} (`{in_repo}`)"
        else:
            log.warning(f"{page.file.src_uri}: the link {target!r} names no file of the "
                        "repository")
            return match[0]
        relative = Path(relative).as_posix()
        return f"{bang}[{text}]({relative}{'#' + anchor if anchor else ''})"

    lines, fenced = [], False
    for line in markdown.split("\n"):
        if FENCE.match(line):
            fenced = not fenced
        lines.append(line if fenced else LINK.sub(rewrite, line))
        svg = None if fenced else SVG_LINK.match(line)
        if svg and source.parent == REPO / "diagrams":  # the diagram itself, not only a link
            lines.append(f"\n![{svg[1]}]({svg[1]}.svg)\n")
    return "\n".join(lines)


ROLE = re.compile(r":(?:class|meth|func|attr|mod|obj|exc|data):`~?([^`]+)`")


class SphinxRoles(griffe.Extension):
    """A griffe extension (mkdocs.yml, mkdocstrings' ``extensions``): the docstrings name
    code with Sphinx's roles (``:class:`~lifecycle.worker.Worker```), which Markdown does not
    know; each becomes the code it names (``Worker``), as ``~`` asks, or the whole path."""

    def on_object(self, *, obj: Any, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = ROLE.sub(self._code, obj.docstring.value)

    @staticmethod
    def _code(match: re.Match[str]) -> str:
        name = match[1]
        return f"`{name.rsplit('.', 1)[-1] if '`~' in match[0] else name}`"


CODE = re.compile(r"<code>(.*?)</code>", re.S)


def on_page_content(html: str, page: Any, config: Any, files: Files) -> str:
    """A ``|`` in code in a table is written ``\\|`` (GitHub's tables drop the backslash);
    Python-Markdown's keep it in code, so it goes here."""
    return CODE.sub(lambda m: f"<code>{m[1].replace(chr(92) + '|', '|')}</code>", html)
