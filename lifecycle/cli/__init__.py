"""The ``lifecycle`` command: one module per group of commands.

| module | commands |
|---|---|
| ``resources`` | create, fire, observe, step, update, show, list, history, verify |
| ``machines`` | machines, describe, diagram, diagrams |
| ``outbox`` | worker, stuck, retry |
| ``sim`` | replay, simulate, reconcile, demo |
| ``db`` | db upgrade, downgrade, current, history |
| ``queue`` | queue show, list (the job queue of ``job_exit``) |
| ``serve`` | serve (the read-only web dashboard) |

``common`` holds what they share (consoles, options, errors as one line); ``context`` makes
the engine and resolves a machine named on the command line.
"""

from __future__ import annotations

import click

from . import db, machines, outbox, queue, resources, serve, sim
from .common import OneLineErrors


@click.group(cls=OneLineErrors)
@click.version_option(package_name="lifecycle-fsm")
def main() -> None:
    """Explicit, persisted state machines of computing resources: each transition committed
    with its journal row and its side effects, risky ones only on a fresh observation.

    `lifecycle demo` runs each built-in machine's incident, as it happened and with
    lifecycle's machine; `lifecycle machines` lists the machines."""


for command in (
    resources.create, resources.fire, resources.observe, resources.step, resources.update,
    resources.show,
    resources.list_, resources.history, resources.verify,
    machines.machines, machines.describe, machines.diagram, machines.diagrams,
    outbox.worker, outbox.stuck, outbox.retry,
    sim.replay, sim.simulate, sim.reconcile, sim.demo,
    db.db, queue.queue, serve.serve,
):
    main.add_command(command)

__all__ = ["main"]
