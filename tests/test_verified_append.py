"""A log event is written exactly once even when the log was rewritten or rotated between
the attempt that wrote it and the retry after a crash: the retry looks for the event itself,
not only at the offset where it once was."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from lifecycle.file_writes import verified_append

RECORD = b"005 (001.000.000) 2026-05-01T00:00:00 Job terminated.\n\t(1) Normal termination\n...\n"
OTHER = b"000 (002.000.000) 2026-05-01T00:00:01 Job submitted from host: <x>\n...\n"


class Call:
    """What verified_append needs of an effect call: its saved progress."""

    def __init__(self) -> None:
        self.progress: dict[str, Any] = {}

    def save_progress(self, values: dict[str, Any]) -> None:
        self.progress.update(values)


def _written_then_crashed(log: Path) -> Call:
    """An attempt that appended the event and died before its commit."""
    call = Call()
    log.write_bytes(OTHER)
    assert verified_append(call, log, RECORD) is True  # type: ignore[arg-type]
    return call


@pytest.mark.parametrize("rewrite", ["prefixed", "prefixed twice", "moved up"])
def test_a_log_rewritten_around_the_event_gets_it_once(tmp_path: Path, rewrite: str) -> None:
    log = tmp_path / "job.log"
    call = _written_then_crashed(log)
    original = log.read_bytes()
    log.write_bytes({"prefixed": OTHER + original,
                     "prefixed twice": OTHER + OTHER + original,
                     "moved up": RECORD + OTHER + OTHER}[rewrite])
    assert verified_append(call, log, RECORD) is False  # type: ignore[arg-type]
    assert log.read_bytes().count(RECORD) == 1


def test_a_rotated_log_holding_the_event_is_not_written_again(tmp_path: Path) -> None:
    log = tmp_path / "job.log"
    call = _written_then_crashed(log)
    log.rename(tmp_path / "job.log.old")
    log.write_bytes(OTHER)
    assert verified_append(call, log, RECORD) is False  # type: ignore[arg-type]
    assert log.read_bytes() == OTHER


@pytest.mark.parametrize("rewrite", ["truncated", "replaced by another job's lines"])
def test_a_log_that_lost_the_event_gets_it_again(tmp_path: Path, rewrite: str) -> None:
    log = tmp_path / "job.log"
    call = _written_then_crashed(log)
    log.write_bytes(b"" if rewrite == "truncated" else OTHER * 3)
    assert verified_append(call, log, RECORD) is True  # type: ignore[arg-type]
    assert log.read_bytes().count(RECORD) == 1


def test_the_search_finds_an_event_across_read_chunks(tmp_path: Path) -> None:
    """Found across the boundary of the reads (a log of several MiB)."""
    log = tmp_path / "job.log"
    call = _written_then_crashed(log)
    filler = b"x" * ((1 << 20) - 10)                   # the event straddles the first MiB
    log.write_bytes(filler + RECORD + OTHER * 1000)
    assert verified_append(call, log, RECORD) is False  # type: ignore[arg-type]


@pytest.mark.parametrize("torn_at", [1, len(RECORD) // 2, len(RECORD) - 1])
def test_a_record_torn_by_a_crash_is_replaced_whole(tmp_path: Path, torn_at: int) -> None:
    """An attempt that died in the middle of its write left part of the record at the end
    of the log: the retry writes the record over it, so a reader finds the record once and
    no fragment before it."""
    log = tmp_path / "job.log"
    call = _written_then_crashed(log)
    log.write_bytes(OTHER + RECORD[:torn_at])  # what the disk kept of the attempt
    assert verified_append(call, log, RECORD) is True  # type: ignore[arg-type]
    assert log.read_bytes() == OTHER + RECORD


def test_a_torn_record_that_others_wrote_after_is_left_and_written_again(
        tmp_path: Path) -> None:
    """Once another writer appended after the torn bytes, they are not ours to cut: the
    record is appended whole after what the others wrote."""
    log = tmp_path / "job.log"
    call = _written_then_crashed(log)
    log.write_bytes(OTHER + RECORD[:10] + OTHER)
    assert verified_append(call, log, RECORD) is True  # type: ignore[arg-type]
    assert log.read_bytes() == OTHER + RECORD[:10] + OTHER + RECORD
