"""A resource's history told as lines a person reads: its journal rows and the observations
of it in the order they were written, each decision with its guards' verdicts, the
observation it rested on and the fence it gave its effects, and under each row what its
effects did (their outcome, and what their handler saved: a drone's terminate keeps
``acted`` and the site's answer).

``lifecycle history`` prints the telling in a terminal, the dashboard's resource page as
HTML: one telling, two renderings. Each line is spans of text with a style name
(:data:`STYLES`), which each renderer maps to its own (a terminal colour, a CSS class).
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from .results import DONE, FAILED, GAVE_UP, PENDING, JournalEntry, Observation

STYLES = ("plain", "bold", "dim", "refused", "observed", "fence", "done", "failed", "waiting")
"""The styles of a span: the row's name (``bold``), a refusal (``refused``), an observation
(``observed``), a fence (``fence``), an effect's status (``done``, ``failed``,
``waiting``), who did it (``dim``)."""

EVENTLESS = "(eventless)"


@dataclass(frozen=True, slots=True)
class Span:
    text: str
    style: str = "plain"


Line = tuple[int, tuple[Span, ...]]
"""A line under a heading: its extra indent (0, or 2 for a line under a line) and spans."""


@dataclass(frozen=True, slots=True)
class Told:
    """One row of the telling: a journal row (``seq`` set) or a run of alike observations
    (``seq`` None, ``kind`` ``observed``)."""

    seq: int | None
    at: dt.datetime
    kind: str
    heading: tuple[Span, ...]
    details: tuple[Line, ...]

    def to_json(self) -> dict[str, Any]:
        """The row as JSON: each line as its spans, ``{"text", "style"}``."""
        def spans(line: tuple[Span, ...]) -> list[dict[str, str]]:
            return [{"text": span.text, "style": span.style} for span in line]
        return {"seq": self.seq, "at": self.at.isoformat(), "kind": self.kind,
                "heading": spans(self.heading),
                "details": [{"indent": extra, "spans": spans(line)}
                            for extra, line in self.details]}


class EffectOutcome(Protocol):
    """What the telling reads of an effect (a row of ``lifecycle_effects``)."""

    seq: int
    name: str
    status: str
    attempts: int
    next_attempt_at: dt.datetime
    last_error: str | None
    progress: Mapping[str, Any] | None
    finished_at: dt.datetime | None


def text(spans: Iterable[Span]) -> str:
    return "".join(span.text for span in spans)


def time_text(value: dt.datetime, clock_only: bool = False) -> str:
    """``00:03:29.381`` (``clock_only``: every time told is of one day), else
    ``2026-01-01T00:03:29.381Z``."""
    if clock_only:
        return str(value.strftime("%H:%M:%S.%f")[:-3])
    return str(value.isoformat(timespec="milliseconds").replace("+00:00", "Z"))


def value_text(value: Any) -> str:
    """A value as a person reads it: a string as it is, anything else as JSON."""
    if isinstance(value, str):
        return value
    return json.dumps(value, sort_keys=True, ensure_ascii=False)


def key_values(document: Any) -> list[str]:
    """``key=value`` lines of a JSON object, sorted by key (any other value, written by hand
    into a database, as one line of JSON)."""
    if document is None:
        return []
    if not isinstance(document, Mapping):
        return [value_text(document)]
    return [f"{key}={value_text(value)}" for key, value in sorted(document.items())]


def document_text(document: Any) -> str:
    """A JSON object as one line, ``key=value, key=value``."""
    return ", ".join(key_values(document))


def plural(count: int, noun: str, many: str | None = None) -> str:
    """``1 resource``, ``2 resources``."""
    return f"{count:,} {noun if count == 1 else (many or noun + 's')}"


@dataclass(frozen=True, slots=True)
class Telling:
    """The rows, and the one day all their times fall on (None: they span several), for
    which times are told as the clock's alone."""

    rows: list[Told]
    day: dt.date | None

    def time(self, value: dt.datetime) -> str:
        return time_text(value, self.day is not None)


def tell(entries: Sequence[JournalEntry], seen: Sequence[Observation],
         effects: Iterable[EffectOutcome]) -> Telling:
    """The history of one resource: its journal ``entries`` (oldest first, each with the
    observation it was decided on), the observations of it ``seen``, and its ``effects``."""
    days = {e.at.date() for e in entries} | {o.recorded_at.date() for o in seen}
    day = next(iter(days)) if len(days) == 1 else None
    by_seq: dict[int, list[EffectOutcome]] = {}
    for effect in effects:
        by_seq.setdefault(effect.seq, []).append(effect)
    rows: list[Told] = []
    above: int | None = None  # the observation told on the row above, if any
    for item in _timeline(entries, seen):
        if isinstance(item, JournalEntry):
            rows.append(_entry(item, by_seq.get(item.seq, []), day is not None, above))
            above = None
        else:
            rows.append(_observed(item, day is not None))
            above = item[-1].id
    return Telling(rows, day)


def _timeline(entries: Sequence[JournalEntry], seen: Sequence[Observation]
              ) -> list[JournalEntry | list[Observation]]:
    """Journal rows and observations in the order they were written (an observation
    recorded at the instant of a decision comes first: a decision can rest on it), with
    consecutive observations alike (same source, same status) taken together."""
    pending = sorted(seen, key=lambda o: (o.recorded_at, o.id))
    timeline: list[JournalEntry | list[Observation]] = []

    def add(observation: Observation) -> None:
        last = timeline[-1] if timeline else None
        if isinstance(last, list) and (last[-1].source, last[-1].status) == (
                observation.source, observation.status):
            last.append(observation)
        else:
            timeline.append([observation])

    at = 0
    for entry in entries:
        while at < len(pending) and pending[at].recorded_at <= entry.at:
            add(pending[at])
            at += 1
        timeline.append(entry)
    for observation in pending[at:]:
        add(observation)
    return timeline


def _lines(items: Iterable[str], extra: int = 0) -> list[Line]:
    return [(extra, (Span(item),)) for item in items]


def _observed(run: list[Observation], one_day: bool) -> Told:
    first, last = run[0], run[-1]
    said = f" by {first.source} (#{first.id}"
    if len(run) > 1:
        said += (f"; the same {len(run)} times in all, the last at "
                 f"{time_text(last.recorded_at, one_day)}, #{last.id}")
    said += ")"
    true_at = time_text(first.observed_at, one_day)
    if true_at != time_text(first.recorded_at, one_day):  # a report of an earlier moment
        said += f", true at {true_at}"
    return Told(None, first.recorded_at, "observed", (Span("observed", "observed"), Span(said)),
                tuple(_lines(key_values(first.status))))


def _heading(entry: JournalEntry) -> tuple[Span, ...]:
    if entry.kind == "transition":
        spans = [Span(entry.trigger or EVENTLESS, "bold")]
    elif entry.kind == "refusal":
        spans = [Span("refused ", "refused"), Span(entry.trigger or EVENTLESS)]
    else:
        spans = [Span(entry.kind, "bold")]
    if entry.kind in ("create", "adopt"):
        spans.append(Span(f" in {entry.dest}"))
    elif entry.source and (entry.source != entry.dest or entry.kind == "transition"):
        spans.append(Span(f": {entry.source} -> {entry.dest}"))
    if entry.actor:
        spans.append(Span(f", by {entry.actor}", "dim"))
    return tuple(spans)


def _entry(entry: JournalEntry, effects: list[EffectOutcome], one_day: bool,
           above: int | None) -> Told:
    details: list[Line] = []
    if entry.guards:  # every guard the decision asked: why this edge and not another
        details += _lines([f"guards: {verdicts(entry.guards)}"])
    details += _lines(key_values(entry.payload))
    details += _rested_on(entry, one_day, above)
    for effect in effects:
        details.append((0, effect_spans(effect, one_day)))
        details += _lines(key_values(effect.progress), 2)
    return Told(entry.seq, entry.at, entry.kind, _heading(entry), tuple(details))


def _rested_on(entry: JournalEntry, one_day: bool, above: int | None) -> list[Line]:
    """The observation the decision rested on, and the fence it gave its effects."""
    seen = entry.observation
    if seen is None:
        if entry.kind == "refusal":
            return _lines(["on no observation: none was recorded, and no probe answered"])
        return []
    age = (entry.at - seen.observed_at).total_seconds()
    if seen.id == above:  # its status is on the lines just above
        lines = _lines([f"on observation #{seen.id} above, {age:.1f} s old"])
    else:
        lines = _lines([f"on observation #{seen.id} by {seen.source}, {age:.1f} s old "
                        f"(true at {time_text(seen.observed_at, one_day)}):"])
        lines += _lines(key_values(seen.status), 2)
    fence = entry.fence
    if fence is not None:
        fence = fence if isinstance(fence, Mapping) else {"expect": fence}
        other = fence.get("observation_id")
        which = f" (observation #{other})" if other not in (None, seen.id) else ""
        expect = document_text(fence.get("expect")) or "nothing"
        lines.append((0, (Span("fence", "fence"), Span(f"{which}: its effects expect {expect}"))))
    return lines


def effect_spans(effect: EffectOutcome, one_day: bool) -> tuple[Span, ...]:
    """``effect terminate: done at 00:03:29.381 (1 attempt)``, the status styled."""
    style = {DONE: "done", FAILED: "failed", GAVE_UP: "failed"}.get(effect.status, "waiting")
    rest = ""
    if effect.status in (DONE, GAVE_UP) and effect.finished_at is not None:
        rest += f" at {time_text(effect.finished_at, one_day)}"
    elif effect.status == PENDING:
        rest += f", due {time_text(effect.next_attempt_at, one_day)}"
    rest += f" ({plural(effect.attempts, 'attempt')})"
    if effect.last_error and effect.status != DONE:
        rest += f": {effect.last_error}"
    return (Span(f"effect {effect.name}: "), Span(effect.status, style), Span(rest))


def verdicts(guards: Mapping[str, bool] | None) -> str:
    """``fresh=yes, no_demand=yes``: each guard asked, by name."""
    return ", ".join(f"{name}={'yes' if ok else 'no'}"
                     for name, ok in sorted((guards or {}).items()))


__all__ = ["EVENTLESS", "STYLES", "EffectOutcome", "Line", "Span", "Telling", "Told",
           "document_text", "effect_spans", "key_values", "plural", "tell", "text",
           "time_text", "value_text", "verdicts"]
