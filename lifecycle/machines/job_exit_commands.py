"""``lifecycle queue``: the job queue in lifecycle's database, which the ``job_exit`` machine
updates (step c). A command of the machine's own, named in the entry-point group
``lifecycle.commands``; the command line calls :func:`queue` with what it gives a machine's
commands (:class:`~lifecycle.machines.builtin.CommandLine`)."""

from __future__ import annotations

import json

import click

from .builtin import CommandLine


def queue(cli: CommandLine) -> click.Command:
    """The ``queue`` group of commands."""

    @click.group()
    def queue() -> None:
        """The job queue the job_exit machine updates."""

    @queue.command()
    @click.argument("job")
    @cli.db_option
    @click.option("--json", "as_json", is_flag=True, help="Print JSON.")
    def show(job: str, db_url: str | None, as_json: bool) -> None:
        """Show job JOB (CLUSTER.PROC): its ad in the queue, and how many times its
        completion was recorded."""
        _show(cli, job, db_url, as_json)

    return queue


def _show(cli: CommandLine, job: str, db_url: str | None, as_json: bool) -> None:
    from rich.markup import escape
    from rich.table import Table

    from ..adapters.htcondor import JOB_STATUS_NAMES, JobId, literal
    from ..adapters.job_queue import queue_ad
    from ..errors import NotFound

    try:
        job_id = JobId.parse(job)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="JOB") from None
    store = cli.open_store(db_url)
    found = queue_ad(store, job_id)
    if found is None:
        raise NotFound(f"job {job_id} is not in the job queue of {store.display_url}")
    if as_json:
        print(json.dumps(found.to_json(), indent=2, ensure_ascii=False))
        return
    status = JOB_STATUS_NAMES.get(found.job_status, "unknown")
    summary = Table(show_header=False, box=None)
    summary.add_row("job", str(found.job))
    summary.add_row("status", f"[bold]{found.job_status}[/] ({status})")
    summary.add_row("updates", f"{found.updates} (times its completion was recorded)")
    summary.add_row("submitted", found.submitted_at.isoformat())
    if found.updated_at is not None:
        summary.add_row("updated", f"{found.updated_at.isoformat()} by "
                                   f"{escape(found.updated_by or '?')}")
    cli.out.print(summary)
    ad = Table("attribute", "value", title="ad", title_justify="left")
    for name in sorted(found.ad, key=str.lower):
        value = found.ad[name]
        shown = literal(value) if isinstance(value, bool | int | float | str) else json.dumps(
            value)
        ad.add_row(escape(name), escape(shown))
    cli.out.print(ad)
