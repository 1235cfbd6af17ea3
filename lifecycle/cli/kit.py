"""What the command line gives a machine's own commands (the entry-point group
``lifecycle.commands``): each is made by a function of its machine's package, called with this
module, so that a machine's commands reuse the command line's options, engine and reports
without the machines' layer importing the command line's. Nothing here imports more than
``common`` until it is used (``lifecycle --help`` makes every machine's command to read its
help)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .common import db_option as db_option
from .common import err as err
from .common import json_option as json_option
from .common import out as out

if TYPE_CHECKING:
    from collections.abc import Iterable

    from ..engine import Engine
    from ..store import Store


def make_engine(db_url: str | None, *, upgrade: bool = False,
                machines: Iterable[str] | None = None) -> Engine:
    """The command line's engine: every machine's guards, handlers and probes (or those of
    ``machines``), and what $LIFECYCLE_PLUGINS adds and configures."""
    from .context import make_engine as made

    return made(db_url, upgrade=upgrade, machines=machines)


def open_store(db_url: str | None, *, check: bool = True) -> Store:
    """The command's database; its connections close when the command ends."""
    from .context import open_store as opened

    return opened(db_url, check=check)


def plugins() -> list[Any]:
    """The modules $LIFECYCLE_PLUGINS names, imported (errors as the command line says them)."""
    from .context import plugins as found

    return found()
