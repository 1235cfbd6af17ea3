"""``serve``: the read-only web dashboard (the ``serve`` extra)."""

from __future__ import annotations

import ipaddress

import click

from ..errors import LifecycleError
from .common import db_option, err, escape, out

SERVE_EXTRA = "pip install 'lifecycle-fsm[serve]'"


def needs_serve_extra(exc: ModuleNotFoundError) -> LifecycleError:
    return LifecycleError(f"this needs the serve extra ({exc.name} is not installed): "
                          f"{SERVE_EXTRA}")


@click.command()
@click.option("--host", default="127.0.0.1", show_default=True,
              help="The address to listen on: loopback unless told otherwise (the dashboard "
                   "has no login).")
@click.option("--port", default=8470, show_default=True, type=click.IntRange(0, 65535),
              help="The port to listen on.")
@db_option
def serve(host: str, port: int, db_url: str | None) -> None:
    """Serve a read-only web dashboard of the database: machines with their diagrams and
    counts per state, each machine's resources, a resource's history, stuck effects,
    refused risky edges, a live page, each also as ?format=json, and /metrics for
    Prometheus. It never writes to the database."""
    try:
        import uvicorn

        from ..dashboard.app import create_app
    except ModuleNotFoundError as exc:
        raise needs_serve_extra(exc) from None
    app = create_app(db_url)
    shown = app.state.dashboard.db.display_url
    if not _loopback(host):
        err.print(f"[yellow]warning[/]: listening on {escape(host)}, reachable from other "
                  "hosts; the dashboard has no login")
    out.print(f"dashboard of {escape(shown)}, read-only: http://{escape(host)}:{port}/")
    uvicorn.run(app, host=host, port=port, log_level="warning", timeout_graceful_shutdown=5)


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
