"""A resource's history as told (lifecycle/story.py), which `lifecycle history` and the
dashboard's resource page both render: the fence under the decision that made it, whatever
JSON the row holds (a fence written by hand need not be the engine's object)."""

from __future__ import annotations

import datetime as dt
from types import SimpleNamespace
from typing import Any

import pytest

from lifecycle.results import JournalEntry, Observation
from lifecycle.story import tell, text

AT = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
SEEN = Observation(7, {"job": "Booting"}, AT, AT, "site")


def _removal(fence: Any) -> JournalEntry:
    return JournalEntry(2, "transition", "remove", "booting", "gone", 2, "v1", "tardis",
                        AT + dt.timedelta(seconds=3), None, {"fresh": True}, SEEN, fence)


def _lines(fence: Any) -> list[str]:
    effect = SimpleNamespace(seq=2, name="terminate", status="done", attempts=1,
                             next_attempt_at=AT, last_error=None, finished_at=AT,
                             progress={"acted": False, "detail": "left alone"})
    telling = tell([_removal(fence)], [SEEN], [effect])
    assert [row.kind for row in telling.rows] == ["observed", "transition"]
    assert telling.day == AT.date()
    return [text(spans) for _, spans in telling.rows[1].details]


@pytest.mark.parametrize(("fence", "said"), [
    ({"observation_id": 7, "expect": {"job": "Booting"}},
     "fence: its effects expect job=Booting"),
    ({"observation_id": 6, "expect": {"job_status": 1}},
     "fence (observation #6): its effects expect job_status=1"),
    ({"observation_id": 7, "expect": "Running"}, "fence: its effects expect Running"),
    (["not", "an", "object"], 'fence: its effects expect ["not", "an", "object"]'),
    ({"observation_id": 7}, "fence: its effects expect nothing"),
])
def test_a_fence_is_told_under_its_decision(fence: Any, said: str) -> None:
    assert _lines(fence) == [
        "guards: fresh=yes", "on observation #7 above, 3.0 s old", said,
        "effect terminate: done at 00:00:00.000 (1 attempt)", "acted=false",
        "detail=left alone"]


def test_a_row_without_a_fence_says_none() -> None:
    assert not any(line.startswith("fence") for line in _lines(None))
