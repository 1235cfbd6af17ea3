"""A value a test sets while a process reads it: TARDIS's FakeBatchSystem asks its
``utilisation`` (and ``allocation``) for ``get_value()`` on every call, as it asks TARDIS's own
simulators (``!TardisPeriodicValue``); this one reads the number in a file."""

from __future__ import annotations

from pathlib import Path


class FileValue:
    def __init__(self, path: str) -> None:
        self.path = Path(path)

    def get_value(self) -> float:
        return float(self.path.read_text())
