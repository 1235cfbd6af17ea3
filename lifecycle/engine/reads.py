"""Reading: the resource, its journal and observations, pages of resources, counts, and the
replay that verifies them. Each goes to :mod:`lifecycle.queries` (or
:func:`lifecycle.verify.verify`), which hold the statements; the engine adds what only it
knows: which triggers a state has, by the machine it has compiled."""

from __future__ import annotations

from collections.abc import Iterator

from .. import queries
from ..errors import InvalidInput
from ..graph import stored_triggers
from ..results import JournalEntry, Mismatch, Observation, Resource
from ..verify import verify
from .bulk import BulkWrites
from .checks import argument, looked_up


class Reads(BulkWrites):
    """What the engine reads outside its writes."""

    def get(self, key: str) -> Resource:
        """The resource as it is now, with its newest observation (one statement on the
        thread's held connection, as a fire reads it; the key is checked there)."""
        return queries.get(self.store, key)

    def available_triggers(self, key: str) -> list[str]:
        """The triggers that have a transition from the resource's current state (guards,
        which may depend on the payload, are not evaluated)."""
        resource = self.get(key)
        compiled = self.loaded(resource.machine)
        if compiled is not None:
            return sorted(compiled.triggers_from(resource.state))
        # from the spec alone: its guards need not be loaded to say which edges leave a state
        return stored_triggers(self.spec(resource.machine).to_json(), resource.state)

    def history(self, key: str) -> list[JournalEntry]:
        """The resource's journal, oldest first, each row with the observation it rested on."""
        return queries.history(self.store, looked_up(key))

    def observations(self, key: str) -> list[Observation]:
        """Every observation of the resource, in the order they were recorded."""
        return queries.observations_of(self.store, looked_up(key))

    def resources(self, machine: str | None = None, state: str | None = None, *,
                  limit: int | None = None, after: str | None = None) -> list[Resource]:
        """Resources in (machine, key) order; ``state`` may be a composite state, which
        takes in every state inside it. ``limit`` makes it one page (of at most that many;
        without it, every resource), ``after`` starts it past a position, ``MACHINE:KEY``
        (or a plain key of ``machine``): the last resource of the page before. The position
        need not exist any more; a page costs the same wherever it starts."""
        if limit is None:
            return list(self.iter_resources(machine, state, after=after))
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 0:
            raise InvalidInput(f"invalid limit {limit!r}: a whole number, 0 or more")
        argument(machine, "machine name")
        argument(state, "state")
        start = queries.position(after, machine) if after is not None else None
        return queries.page(self.store, machine, state, limit, start) if limit else []

    def iter_resources(self, machine: str | None = None, state: str | None = None, *,
                       after: str | None = None, page: int = 1000) -> Iterator[Resource]:
        """Every resource (of ``machine``, in ``state``, past ``after``) in (machine, key)
        order, read ``page`` at a time: memory stays flat, and no transaction is held
        between pages (a resource created or moved meanwhile shows or not by its key)."""
        if isinstance(page, bool) or not isinstance(page, int) or page < 1:
            raise InvalidInput(f"invalid page {page!r}: a whole number, 1 or more")
        while True:
            found = self.resources(machine, state, limit=page, after=after)
            yield from found
            if len(found) < page:
                return
            after = f"{found[-1].machine}:{found[-1].key}"

    def counts(self, machine: str | None = None) -> dict[str, dict[str, int]]:
        """How many resources each machine has in each state (kept by the database as
        resources are written: no scan of the resources)."""
        argument(machine, "machine name")
        return queries.counts(self.store, machine)

    def verify(self) -> list[Mismatch]:
        """Replay every resource's journal and compare it with the resource's row (streamed:
        memory does not grow with the journal)."""
        return verify(self.store)
