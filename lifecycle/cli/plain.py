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
