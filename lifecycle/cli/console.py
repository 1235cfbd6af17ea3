"""The consoles every command prints with (``out``, ``err``) and lifecycle's own markup:
rich, imported when a command first prints (through :mod:`.common`), not by
``lifecycle --help``, which click prints."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.text import Text

from .. import redact
from .plain import lost_output, parse


def markup(source: str) -> Text:
    """``source`` as text, styled where it holds lifecycle's own markup
    (:func:`.plain.parse`)."""
    plain, spans = parse(source)
    text = Text(plain)
    for start, end, style in spans:
        text.stylize(style, start, end)
    return text


_styled = markup  # (render_str's parameter of that name hides the function)


class SafeConsole(Console):
    """A console whose strings are text with lifecycle's own styles (see :func:`markup`),
    and whose printing never raises: a closed pipe or a character the terminal cannot show
    loses output, never the command's outcome."""

    def render_str(self, text: str, *, style: Any = "", justify: Any = None,
                   overflow: Any = None, emoji: bool | None = None,
                   markup: bool | None = None, highlight: bool | None = None,
                   highlighter: Any = None) -> Text:
        text = redact.text(text)  # before the layout measures it (the stream does it too)
        if markup is False or "[" not in text:
            return Text(text, style=style, justify=justify, overflow=overflow)
        styled = _styled(text)
        styled.style, styled.justify, styled.overflow = style, justify, overflow
        return styled

    def print(self, *objects: Any, **options: Any) -> None:
        try:
            super().print(*objects, **options)
        except (OSError, UnicodeError, ValueError) as exc:
            lost_output(exc)


out = SafeConsole(highlight=False, soft_wrap=True, emoji=False)
err = SafeConsole(stderr=True, highlight=False, soft_wrap=True, emoji=False)
