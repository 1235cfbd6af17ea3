"""lifecycle's loggers. A library logs and the application decides where to: lifecycle's
top logger has a ``NullHandler``, so nothing is printed unless the application configures
logging. It is added with the first logger a module asks for, so that a program that never
logs (``lifecycle show``) does not import :mod:`logging`."""

from __future__ import annotations

import logging


def logger(name: str) -> logging.Logger:
    """The logger of module ``name`` (a ``lifecycle.`` one)."""
    top = logging.getLogger(__name__.partition(".")[0])
    if not any(isinstance(handler, logging.NullHandler) for handler in top.handlers):
        top.addHandler(logging.NullHandler())
    return logging.getLogger(name)
