"""The consoles every command prints with (``out``, ``err``) and lifecycle's own markup:
rich, imported when a command first prints (through :mod:`.common`), not by
``lifecycle --help``, which click prints."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.text import Text

from .. import redact
from .plain import TAG, is_tag, lost_output


def markup(source: str) -> Text:
    """``source`` as text, styled where it holds lifecycle's own markup: a tag of
    :data:`STYLES` opened and later closed by ``[/]`` (or ``[/style]``). Every other
    bracket is text. A backslash before a tag makes it text (``\\[bold]``), as in rich;
    backslashes anywhere else are text."""
    tokens = []  # (match, literal text or None for a tag)
    for found in TAG.finditer(source):
        if not is_tag(found):
            continue
        slashes = len(found.group(1))
        tag = found.group()[slashes:]
        tokens.append((found, "\\" * (slashes // 2) + tag if slashes % 2 else None))
    paired: dict[int, int] = {}  # index of an opening tag -> index of its closing tag
    opened: list[int] = []
    for index, (found, literal) in enumerate(tokens):
        if literal is not None:
            continue
        if not found.group(2):
            opened.append(index)
        elif opened and found.group(3) in ("", tokens[opened[-1]][0].group(3)):
            paired[opened.pop()] = index
    closers = {close: start for start, close in paired.items()}
    text = Text()
    starts: dict[int, int] = {}
    position = 0
    for index, (found, literal) in enumerate(tokens):
        text.append(source[position:found.start()])
        position = found.end()
        slashes = len(found.group(1))
        if literal is not None:
            text.append(literal)
            continue
        text.append("\\" * (slashes // 2))
        if index in paired:
            starts[index] = len(text)
        elif index in closers:
            opening = closers[index]
            text.stylize(tokens[opening][0].group(3), starts[opening], len(text))
        else:
            text.append(found.group()[slashes:])
    text.append(source[position:])
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
