"""The ``lifecycle`` command: one module per group of commands.

| module | commands |
|---|---|
| ``resources`` | create, fire, observe, step, update, list, history, verify |
| ``show`` | show (read on the database's own driver where it can) |
| ``machines`` | machines, describe, diagram, diagrams |
| ``outbox`` | worker, stuck, retry |
| ``sim`` | replay, simulate, reconcile, demo |
| ``check`` | check (every interleaving of a machine with its world, within bounds) |
| ``tardis`` | tardis (a drone pool on asyncio, from a TARDIS configuration) |
| ``db`` | db upgrade, downgrade, current, history |
| ``queue`` | queue show, list (the job queue of ``job_exit``) |
| ``serve`` | serve (the read-only web dashboard) |

``common`` holds what they share (consoles, options, errors as one line); ``context`` makes
the engine and resolves a machine named on the command line.

A command's module is imported when the command runs, not before: ``lifecycle --help``
reads the one-line help of each from :data:`COMMANDS` (a test checks it against the
commands' own), and ``lifecycle show`` never loads Alembic or the simulations.
"""

from __future__ import annotations

import importlib

import click

from .common import OneLineErrors

COMMANDS: dict[str, tuple[str, str, str]] = {
    'create': ('resources', 'create',
             'Create resource KEY of MACHINE (a built-in name or a spec file).'),
    'fire': ('resources', 'fire',
             'Fire TRIGGER on resource KEY (MACHINE:KEY when the key is in several machines).'),
    'observe': ('resources', 'observe',
             'Record STATUS (a JSON object) as an observation of resource KEY.'),
    'step': ('resources', 'step',
             'Take the first eventless transition of KEY whose guards hold.'),
    'update': ('resources', 'update',
             "Merge DATA (a JSON object) into resource KEY's data: a new version and a journal "
             'row, no change of state.'),
    'show': ('show', 'show',
             'Show resource KEY: its state, version, data and the triggers it can take.'),
    'list': ('resources', 'list_',
             'List resources, of one MACHINE or of all, in (machine, key) order, a page at a '
             'time.'),
    'history': ('resources', 'history',
             'Show the journal of resource KEY, oldest first, with the observations of it in '
             'the order they were recorded and the outcome of each effect under the row that '
             'asked for it.'),
    'verify': ('resources', 'verify',
             "Replay every resource's journal; exit 1 if any does not end where its resource "
             'is.'),
    'machines': ('machines', 'machines',
             'List the built-in machines and those the database knows.'),
    'describe': ('machines', 'describe',
             "Show a machine's states and transitions."),
    'diagram': ('machines', 'diagram',
             'Draw MACHINE (a built-in name, a spec file, or a stored machine) as a state '
             'diagram.'),
    'diagrams': ('machines', 'diagrams',
             'Write diagrams/<machine>.mmd, .dot and .svg for every built-in machine, and '
             'diagrams/README.md showing each Mermaid diagram.'),
    'worker': ('outbox', 'worker',
             'Carry out the effects of committed transitions, and fire due timers.'),
    'stuck': ('outbox', 'stuck',
             'List the resources whose effects failed for good; `lifecycle retry KEY` resumes '
             'one.'),
    'retry': ('outbox', 'retry',
             "Put KEY's failed effects back in the queue, due now, with fresh attempts."),
    'replay': ('sim', 'replay',
             'Replay scenario FILES (or every *.yaml/*.yml/*.json in a directory), each on a '
             'fresh database with a simulated clock; exit 1 at the first failing expectation '
             'of any.'),
    'check': ('check', 'check',
             'Explore every interleaving of MACHINE with its world, breadth first, up to the '
             "bounds; print each broken invariant's shortest counterexample; exit 1 if any."),
    'simulate': ('sim', 'simulate',
             "Run simulation NAME: the incident's race as it happened and with lifecycle's "
             'machine, on temporary databases.'),
    'reconcile': ('sim', 'reconcile',
             "Run a drone pool's heartbeat: the site's and the pool's status of every live "
             'drone in one call each, recorded as observations, then one step of every drone.'),
    'demo': ('sim', 'demo',
             "Run each built-in machine's incident, as it happened and with lifecycle's "
             'machine, on the embedded database (or --db), and show what each race cost.'),
    'tardis': ('tardis', 'tardis',
             "Run the drones of a TARDIS site CONFIGURATION (YAML: `Sites`, each site's "
             '`MachineTypes` and settings, `BatchSystem`) on asyncio, through TARDIS\'s own '
             'site and batch-system adapters: the worker\'s effects (deploy, integrate, drain, '
             'stop, terminate) as tasks, then each site\'s status of every live drone, recorded '
             'as observations, then one step of every drone at once.'),
    'db': ('db', 'db',
             'Create and migrate the database schema (Alembic).'),
    'queue': ('queue', 'queue',
             'The job queue the job_exit machine updates.'),
    'serve': ('serve', 'serve',
             'Serve a read-only web dashboard of the database, and /metrics for Prometheus.'),
    'hook': ('hook', 'hook',
             "Programs HTCondor runs as hooks: `prepare-job` for a drone's startd."),
}
"""Each command: its module, the function that is it, and its one-line help."""


class Commands(OneLineErrors):
    """The commands of :data:`COMMANDS`, each imported on first use."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in self.commands and cmd_name in COMMANDS:
            module, attribute, _help = COMMANDS[cmd_name]
            command = getattr(importlib.import_module(f".{module}", __package__), attribute)
            self.add_command(command, cmd_name)
        return self.commands.get(cmd_name)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """As click lists them, from :data:`COMMANDS` (no module imported)."""
        names = self.list_commands(ctx)
        limit = formatter.width - 6 - max(len(name) for name in names)
        rows = [(name, click.Command(name, help=COMMANDS[name][2]).get_short_help_str(limit))
                for name in names]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


@click.group(cls=Commands)
@click.version_option(package_name="lifecycle-fsm")
def main() -> None:
    """Explicit, persisted state machines of computing resources: each transition committed
    with its journal row and its side effects, risky ones only on a fresh observation.

    `lifecycle demo` runs each built-in machine's incident, as it happened and with
    lifecycle's machine; `lifecycle machines` lists the machines."""


__all__ = ["COMMANDS", "main"]
