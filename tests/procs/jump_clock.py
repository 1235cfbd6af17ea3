"""A clock two processes share that a test can move forward at once: the wall clock and the
process's monotonic clock, both plus the seconds written in a file (none while it does not
exist). A worker whose engine has it takes its leases' time and its own monotonic time from
it (``Engine(clock=...)``, ``WorkerCore.monotonic``), so a test that stops a worker process
(SIGSTOP), moves the clock past its lease and wakes it (SIGCONT) sees what a pause that long
does, without waiting for it."""

from __future__ import annotations

import datetime as dt
import os
import time
from pathlib import Path

UTC = dt.UTC


class JumpClock:
    """The wall and monotonic clocks plus the offset in ``path`` (read again when the file
    changed: one stat a call)."""

    __slots__ = ("_offset", "_path", "_seen")

    def __init__(self, path: Path | str) -> None:
        self._path = str(path)
        self._seen: tuple[int, int, int] | None = None
        self._offset = 0.0

    def offset(self) -> float:
        try:
            stat = os.stat(self._path)
        except FileNotFoundError:
            return 0.0
        if (stat.st_ino, stat.st_mtime_ns, stat.st_size) != self._seen:
            self._offset = float(Path(self._path).read_text() or 0)
            self._seen = (stat.st_ino, stat.st_mtime_ns, stat.st_size)
        return self._offset

    def now(self) -> dt.datetime:
        return dt.datetime.now(UTC) + dt.timedelta(seconds=self.offset())

    def monotonic(self) -> float:
        return time.monotonic() + self.offset()


def jump(path: Path, seconds: float) -> None:
    """Move every JumpClock of ``path`` forward by ``seconds`` (written whole, then renamed
    into place: a reader never sees half of it)."""
    before = float(path.read_text()) if path.exists() else 0.0
    if seconds < 0:
        raise ValueError("time does not go backwards")
    part = path.with_name(path.name + ".part")
    part.write_text(repr(before + seconds))
    part.replace(path)
