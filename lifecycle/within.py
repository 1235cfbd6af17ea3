"""Writes of a caller's own in a fire's transaction: the hook the worker and timers use.

``Engine.fire(..., within=hook)`` runs ``hook.before`` after the resource was read and
before the decision, and ``hook.after`` once the outcome is known, both in the fire's one
transaction (a :class:`lifecycle.store.Transaction`: statements, rows, value conversions):
what they write commits with the transition (or the refusal), or not at all. That is how an
effect's outcome is recorded exactly once with the trigger it fires, and a timer is marked
fired with the transition it caused. No I/O in them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .results import FireResult

if TYPE_CHECKING:
    from .store import Transaction


class Within:
    """Writes a caller adds to a fire's transaction: ``before`` may withhold the fire (its
    reason, or None to go on); ``after`` sees the outcome, fired or refused. If the fire is
    decided again (another writer moved the resource first), both run again in the new
    transaction, the first one's writes having been rolled back."""

    def before(self, tx: Transaction, resource_id: int) -> str | None:
        return None

    def after(self, tx: Transaction, result: FireResult) -> None:
        return None


__all__ = ["Within"]
