"""What printing needs without rich: lifecycle's own markup tags (:data:`STYLES`,
:data:`TAG`), read by :mod:`.console` and escaped by :func:`.common.escape`, and what
happens when output is lost. (``lifecycle --help`` imports this, not rich.)"""

from __future__ import annotations

import io
import os
import re
import sys
from typing import IO

STYLES = frozenset({"bold", "dim", "italic", "red", "green", "yellow", "cyan", "magenta",
                    "bold red", "bold green", "bold yellow"})
TAG = re.compile(r"(\\*)\[(/?)([a-z ]*)\]")


def is_tag(found: re.Match[str]) -> bool:
    """Whether ``found`` (a match of :data:`TAG`) is one of lifecycle's own tags."""
    closing, style = found.group(2), found.group(3)
    return style in STYLES or (bool(closing) and style == "")


_DROPPED = dict.fromkeys((7, 8, 11, 12, 13))
"""The control characters rich's text drops (bell, backspace, vertical tab, form feed,
carriage return: rich.control.STRIP_CONTROL_CODES)."""


def parse(source: str) -> tuple[str, list[tuple[int, int, str]]]:
    """``source`` read as lifecycle's markup: its text (without the control characters rich
    drops) and each styled span's start, end and style. A tag of :data:`STYLES` opened and
    later closed by ``[/]`` (or ``[/style]``) styles what is between; every other bracket is
    text. A backslash before a tag makes it text (``\\[bold]``), as in rich; backslashes
    anywhere else are text."""
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
    pieces: list[str] = []
    length = 0
    spans: list[tuple[int, int, str]] = []
    starts: dict[int, int] = {}

    def append(piece: str) -> None:
        nonlocal length
        piece = piece.translate(_DROPPED)
        pieces.append(piece)
        length += len(piece)

    position = 0
    for index, (found, literal) in enumerate(tokens):
        append(source[position:found.start()])
        position = found.end()
        slashes = len(found.group(1))
        if literal is not None:
            append(literal)
            continue
        append("\\" * (slashes // 2))
        if index in paired:
            starts[index] = length
        elif index in closers:
            opening = closers[index]
            spans.append((starts[opening], length, tokens[opening][0].group(3)))
        else:
            append(found.group()[slashes:])
    append(source[position:])
    return "".join(pieces), spans


def unstyled(stream: IO[str]) -> bool:
    """Whether rich would print to ``stream`` without styles: it is not a terminal and
    nothing in the environment says to treat it as one (``FORCE_COLOR``,
    ``TTY_COMPATIBLE``; a notebook's variables too, to be safe)."""
    if any(name in os.environ for name in ("FORCE_COLOR", "TTY_COMPATIBLE", "TTY_INTERACTIVE",
                                           "JPY_PARENT_PID", "VSCODE_PID")):
        return False
    if getattr(sys.stdin, "__module__", "").startswith("idlelib"):
        return False
    try:
        return not stream.isatty()
    except (AttributeError, ValueError, OSError):
        return False


def lost_output(exc: Exception) -> None:
    """Printing failed (a closed pipe, a terminal that cannot show a character): the
    command's outcome stands; further output goes nowhere."""
    if isinstance(exc, BrokenPipeError):
        silence(sys.stdout)


def silence(stream: IO[str]) -> None:
    """Nothing more is written to ``stream`` (its descriptor now goes to the null device)."""
    try:
        descriptor = stream.fileno()
    except (OSError, ValueError, io.UnsupportedOperation):
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, descriptor)  # the interpreter's last flush then has nowhere to fail
    os.close(devnull)
