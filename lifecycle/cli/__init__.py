"""The ``lifecycle`` command: one module per group of commands.

| module | commands |
|---|---|
| ``resources`` | create, fire, observe, step, update, list, history, verify |
| ``show`` | show (read on the database's own driver where it can) |
| ``machines`` | machines, describe, diagram, diagrams |
| ``effects`` | worker, stuck, retry |
| ``sim`` | replay, simulate, demo |
| ``check`` | check (every interleaving of a machine with its world, within bounds) |
| ``db`` | db upgrade, downgrade, current, history |
| ``serve`` | serve (the read-only web dashboard) |

``common`` holds what they share (consoles, options, errors as one line); ``context`` makes
the engine and resolves a machine named on the command line.

A machine's own commands are its package's (``tardis``, ``reconcile`` and ``hook`` in
``lifecycle/machines/drone_commands.py``, ``queue`` in ``job_exit_commands.py``): each is an
entry point of the group ``lifecycle.commands``, a function that makes the command from
:mod:`.kit` (what the command line gives a machine's commands). The command line names none
of them; a core command's name wins over a machine's.

A command's module is imported when the command runs, not before: ``lifecycle --help``
reads the one-line help of each from :data:`COMMANDS` (a test checks it against the
commands' own) and a machine's command's help from the machines' index
(:mod:`lifecycle.machines.index`, which keeps it once a command was made), and
``lifecycle show`` never loads Alembic or the simulations.
"""

from __future__ import annotations

import importlib

import click

from ..errors import SetupError
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
    'worker': ('effects', 'worker',
             'Carry out the effects of committed transitions, and fire due timers.'),
    'stuck': ('effects', 'stuck',
             'List the resources whose effects failed for good; `lifecycle retry KEY` resumes '
             'one.'),
    'retry': ('effects', 'retry',
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
    'demo': ('sim', 'demo',
             "Run each built-in machine's incident, as it happened and with lifecycle's "
             'machine, on the embedded database (or --db), and show what each race cost.'),
    'db': ('db', 'db',
             'Create and migrate the database schema (Alembic).'),
    'serve': ('serve', 'serve',
             'Serve a read-only web dashboard of the database, and /metrics for Prometheus.'),
}
"""Each command: its module, the function that is it, and its one-line help."""




def machine_commands() -> dict[str, str]:
    """Every machine's command (``module:function``) by name: from the machines' index when
    it is fresh, else from the installed packages' entry points (a core command's name
    wins)."""
    return {name: target for name, (target, _, _) in _machine_commands().items()}


def _machine_commands() -> dict[str, tuple[str, str | None, str | None]]:
    """Each machine's command by name: its entry point, and its short help and help as the
    index keeps them (None, None: not made yet)."""
    from ..machines import commands

    return {name: entry for name, entry in commands().items() if name not in COMMANDS}


def machine_command(name: str, target: str) -> click.Command:
    """The command a machine's package makes with :mod:`.kit`."""
    from . import kit

    module, _, attribute = target.partition(":")
    command = getattr(importlib.import_module(module), attribute)(kit)
    if not isinstance(command, click.Command):
        raise SetupError(f"command {name!r}: its entry point {target!r} made a "
                         f"{type(command).__name__}, not a click command")
    return command


class Commands(OneLineErrors):
    """The commands of :data:`COMMANDS`, and the machines' own, each imported on first use."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*COMMANDS, *machine_commands()})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in self.commands and cmd_name in COMMANDS:
            module, attribute, _help = COMMANDS[cmd_name]
            command = getattr(importlib.import_module(f".{module}", __package__), attribute)
            self.add_command(command, cmd_name)
        elif cmd_name not in self.commands and cmd_name in machine_commands():
            self.add_command(machine_command(cmd_name, machine_commands()[cmd_name]), cmd_name)
        return self.commands.get(cmd_name)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """As click lists them, from :data:`COMMANDS` and from the machines' index (no
        command's module imported); a machine's command the index has no help of yet is
        made once, and its help kept in the index."""
        machines = _machine_commands()  # (the index read once)
        names = sorted({*COMMANDS, *machines})
        limit = formatter.width - 6 - max(len(name) for name in names)
        made: dict[str, tuple[str | None, str | None]] = {}
        for name, (_, short, help_) in machines.items():
            if short is None and help_ is None and (command := self.get_command(ctx, name)):
                made[name] = (command.short_help, command.help or "")
        if made:
            from ..machines import index

            index.add_command_helps(made)
        rows = []
        for name in names:
            if name in COMMANDS:
                command = click.Command(name, help=COMMANDS[name][2])
            else:
                short, help_ = made.get(name) or machines[name][1:]
                command = click.Command(name, short_help=short, help=help_)
            rows.append((name, command.get_short_help_str(limit)))
        with formatter.section("Commands"):
            formatter.write_dl(rows)


@click.group(cls=Commands)
@click.version_option(package_name="lifecycle-fsm")
def main() -> None:
    """Explicit, persisted state machines of computing resources: each transition committed
    with its journal row and its side effects, risky ones only on a fresh observation.

    `lifecycle demo` runs each built-in machine's incident, as it happened and with
    lifecycle's machine; `lifecycle machines` lists the machines."""


__all__ = ["COMMANDS", "machine_command", "machine_commands", "main"]
