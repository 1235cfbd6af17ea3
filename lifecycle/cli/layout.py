"""Output that reads at any terminal width: names are never cut, documents are ``key=value``
lines, and a table too wide for the terminal becomes one block per row.

A table's name columns (states, triggers, guards) are never wrapped inside a name: a cell
holds one name per line, and only free text (a description) wraps. When even that does not
fit the terminal, :func:`fitted` prints the same rows as blocks: a heading line, then each
value on a line of its own, indented."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from rich.cells import cell_len
from rich.console import Console, Group, RenderableType
from rich.padding import Padding
from rich.table import Table
from rich.text import Text

from ..story import Span, Told, key_values, value_text

FREE_TEXT_WIDTH = 24
"""The narrowest a column of free text may be in a table; narrower, the rows become blocks."""


def lines(items: Iterable[str]) -> Text:
    """Names, one per line (so that a table never breaks a name)."""
    return Text("\n".join(items))


def table(*headers: str, free: Sequence[str] = (), title: str | None = None,
          **options: Any) -> Table:
    """A table whose columns named in ``free`` wrap (at least :data:`FREE_TEXT_WIDTH` wide)
    and whose other columns keep each line whole."""
    made = Table(title=title, title_justify="left", **options)
    for header in headers:
        if header in free:
            made.add_column(header, overflow="fold", min_width=FREE_TEXT_WIDTH)
        else:
            made.add_column(header, no_wrap=True, overflow="fold")
    return made


def drop_empty(made: Table, keep: int = 1) -> Table:
    """``made`` without the columns (after the first ``keep``) in which every cell is
    empty."""
    for index in reversed(range(keep, len(made.columns))):
        if not any(str(cell) for cell in made.columns[index].cells):
            made.columns.pop(index)
    return made


def fits(console: Console, made: Table) -> bool:
    """Whether ``made`` can be drawn within the console's width with every line of its
    name columns whole and each free-text column at least as wide as it asks."""
    widths = []
    for column in made.columns:
        if column.no_wrap:
            lines = [line for cell in (column.header, *column.cells)
                     for line in (str(cell).splitlines() or [""])]
            widths.append(max(cell_len(line) for line in lines))
        else:
            widths.append(column.min_width or 1)
    padding = 2 * len(widths)
    edges = len(widths) + 1 if made.box is not None and made.show_edge else len(widths) - 1
    return sum(widths) + padding + max(edges, 0) <= console.width


Detail = Text | str | tuple[int, Text | str]
"""A line under a heading: text, or (extra indent, text) for a line under a line."""


def block(heading: Text | str, details: Iterable[Detail], indent: int = 4) -> Group:
    """A heading line and its details below it, indented; a long detail wraps under
    itself."""
    body = []
    for detail in details:
        extra, line = detail if isinstance(detail, tuple) else (0, detail)
        body.append(Padding(line if isinstance(line, Text) else Text(line),
                            (0, 0, 0, indent + extra), expand=False))
    return Group(heading if isinstance(heading, Text) else Text(heading), *body)


def fitted(console: Console, wide: Table, blocks: Sequence[RenderableType]) -> RenderableType:
    """``wide`` when it fits the console, else ``blocks`` under the table's title."""
    if fits(console, wide):
        return wide
    title = [Text(str(wide.title), style="italic")] if wide.title else []
    return Group(*title, *blocks)


STYLES = {"plain": "", "bold": "bold", "dim": "dim", "refused": "bold red", "observed": "cyan",
          "fence": "magenta", "done": "green", "failed": "red", "waiting": "yellow"}
"""The terminal's style of each of :data:`lifecycle.story.STYLES`."""


def spans_text(spans: Iterable[Span]) -> Text:
    """Spans of the story as one styled line."""
    return Text.assemble(*((span.text, STYLES[span.style]) for span in spans))


def told(row: Told) -> Group:
    """A row of a resource's history: its heading, and its details indented below."""
    return block(spans_text(row.heading),
                 [(extra, spans_text(spans)) for extra, spans in row.details], indent=2)


__all__ = ["FREE_TEXT_WIDTH", "STYLES", "block", "drop_empty", "fits", "fitted", "key_values",
           "lines", "spans_text", "table", "told", "value_text"]
