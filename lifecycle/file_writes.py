"""Building blocks for idempotent effect handlers that write files.

- :func:`atomic_write`: a file is replaced whole or not at all (temporary file in the same
  directory, fsync, rename, fsync of the directory).
- :func:`verified_append`: before appending a record, the file's size is saved in the
  effect's progress; on a retry, if the bytes at that offset are already the record, or the
  record is anywhere in the file (someone rewrote the log meanwhile, putting lines before
  it) or in its rotated copy (``<path>.old``), nothing is appended again. This is what makes
  a log event exactly-once across crashes.
"""

from __future__ import annotations

import fcntl
import os
import stat
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO

if TYPE_CHECKING:
    from .effects import EffectCall


def atomic_write(path: str | os.PathLike[str], data: bytes, mode: int = 0o644) -> None:
    """Replace ``path`` with ``data`` so that a reader sees the old file or the new one,
    never a part, even across a crash or a power loss."""
    target = Path(path)
    directory = target.parent
    fd, temporary = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(temporary, mode)
        os.replace(temporary, target)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    _fsync_directory(directory)


def _fsync_directory(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def verified_append(call: EffectCall, path: str | os.PathLike[str], record: bytes,
                    *, name: str | None = None) -> bool:
    """Append ``record`` to ``path`` exactly once across retries of the effect ``call``.

    Returns True when it appended, False when an earlier attempt already had. The file is
    locked (``flock``) while appending, so cooperating writers of a shared log interleave
    whole records. The offset is saved in the effect's progress under ``name`` (default: the
    path) before the bytes are written. On a retry whose record is not at that offset, the
    file and its rotated copy ``<path>.old`` are searched for it whole (the record must be
    the same bytes on every attempt: keep it in the effect's progress)."""
    target = Path(path)
    slot = name or f"append:{target}"
    with open(target, "ab+") as handle:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        try:
            size = handle.seek(0, os.SEEK_END)
            offset = call.progress.get(slot)
            if isinstance(offset, int) and not isinstance(offset, bool) and 0 <= offset <= size:
                # read no more than the record's length: what is after it is others' (and a
                # device such as /dev/full never ends)
                handle.seek(offset)
                found = _read_at_most(handle, len(record))
                if found == record:
                    return False  # an earlier attempt wrote it (others may have written after)
                if found and record.startswith(found) and offset + len(found) == size:
                    # an earlier attempt died in the middle of the record: nobody wrote after
                    # it, so the torn bytes are ours to replace
                    handle.truncate(offset)
                    size = offset
                elif _holds(handle, record, size) or _rotated_holds(target, record):
                    return False  # written, then moved: the log was rewritten or rotated
            call.save_progress({slot: size})
            handle.seek(0, os.SEEK_END)
            handle.write(record)
            handle.flush()
            os.fsync(handle.fileno())
            return True
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


def _holds(handle: BinaryIO, record: bytes, size: int, chunk: int = 1 << 20) -> bool:
    """Whether the first ``size`` bytes of a regular file hold ``record`` anywhere (read a
    chunk at a time). A device or a pipe is not searched: it may never end."""
    if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):
        return False
    handle.seek(0)
    carry = b""
    left = size
    while left > 0:
        block = handle.read(min(chunk, left))
        if not block:
            return False
        left -= len(block)
        window = carry + block
        if record in window:
            return True
        carry = window[-(len(record) - 1):] if len(record) > 1 else b""
    return False


def _rotated_holds(target: Path, record: bytes) -> bool:
    rotated = target.with_name(target.name + ".old")
    if not rotated.is_file():
        return False
    with open(rotated, "rb") as handle:
        return _holds(handle, record, os.fstat(handle.fileno()).st_size)


def _read_at_most(handle: BinaryIO, count: int) -> bytes:
    """Up to ``count`` bytes from the handle's position (fewer only at the end)."""
    parts: list[bytes] = []
    left = count
    while left > 0:
        chunk = handle.read(left)
        if not chunk:
            break
        parts.append(chunk)
        left -= len(chunk)
    return b"".join(parts)
